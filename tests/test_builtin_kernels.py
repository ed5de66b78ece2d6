"""The builtin Triton generator: every test subproblem generates a ModelNew that matches its Model."""

from __future__ import annotations

import ast
import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from mkevolve.builtin.kernels import (UnsupportedOps, UnsupportedSubproblem, generate_kernel,
                                      variant_count)
from mkevolve.builtin.kernels.cleanup import drop_unused_assignments
from mkevolve.builtin.kernels.configs import NOMINAL_SMS, TARGETS, k_split
from mkevolve.problem import load_problem

from builtin_matching import DEVICE, ON_GPU, TARGET, assert_matches, import_generated

SUBPROBLEMS = Path(__file__).resolve().parent / "subproblems"
ATTENTION_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "attention_small"
ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = sorted(p.stem for p in SUBPROBLEMS.glob("*.py") if p.stem != "fold")
VIEW_METHODS = {"contiguous", "reshape", "view", "t", "transpose", "permute", "squeeze", "unsqueeze", "flatten",
                "unflatten", "expand", "narrow", "select", "chunk", "split"}


@pytest.mark.parametrize("stem", SUPPORTED)
def test_generated_kernel_matches_reference(stem, tmp_path):
    path = SUBPROBLEMS / f"{stem}.py"
    assert_matches(path, generate_kernel(path, 0, TARGET), tmp_path)


@pytest.mark.parametrize("stem", ["linear_gelu", "conv2d_bias_relu", "softmax", "groupnorm", "groupnorm_mean"])
def test_every_variant_is_correct(stem, tmp_path):
    path = SUBPROBLEMS / f"{stem}.py"
    count = variant_count(path, TARGET)
    assert count >= 2
    for variant in range(count):
        generated = generate_kernel(path, variant, TARGET)
        assert generated.variant == variant
        assert_matches(path, generated, tmp_path)


def test_reductions_of_whole_groups_never_write_the_normalized_tensor():
    """A mean (and a max) over a GroupNorm's groups reduces each group in the kernel that normalizes it, then
    the groups: level2/23's and 27's GroupNorm had written the normalized tensor and re-read it for the mean."""
    generated = generate_kernel(SUBPROBLEMS / "groupnorm_mean.py", 0, TARGET)
    assert "row reduction" in generated.description and "(full rows)" not in generated.description


def test_a_long_row_s_mean_and_variance_take_one_walk_that_survives_a_large_offset(tmp_path):
    """Rows longer than a block (the looped kernel) get their mean and variance from one walk, by Welford's
    update. For values of mean 100 and spread 1, a sum of squares less a squared sum would cancel 4 of fp32's 7
    digits (1e4 against 1) and miss PyTorch's two-pass LayerNorm by about 1e-3; the walk must match it."""
    path = tmp_path / "offset_layernorm.py"
    path.write_text(
        "import torch\nimport torch.nn.functional as F\n\n\n"
        "class Model(torch.nn.Module):\n    def forward(self, x):\n        return F.layer_norm(x, (37,))\n\n\n"
        "def get_inputs():\n    return [torch.randn(5, 37) + 100.0]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    for variant in range(variant_count(path, TARGET)):
        generated = generate_kernel(path, variant, TARGET)
        assert "_looped" in generated.source and "tl.reduce((avg" in generated.source
        # one reciprocal per pass, not a division per value (1.5 times slower at level2/23's size, H100)
        assert "* (1.0 / (r0 // BLOCK_R + 1))" in generated.source and "_div(dev" not in generated.source
        assert_matches(path, generated, tmp_path)


def test_short_rows_go_several_to_a_program(tmp_path):
    """Rows of 4 values (a GroupNorm of 4-channel groups): one [BLOCK_O, BLOCK_R] tile holds many of them,
    rather than a program per row that leaves nearly all of its threads idle."""
    path = SUBPROBLEMS / "groupnorm_small_groups.py"
    generated = generate_kernel(path, 0, TARGET)
    assert "_packed[(_cdiv(O, block_o),)]" in generated.source and "axis=1" in generated.source
    assert_matches(path, generated, tmp_path)


def test_gemm_variants_state_their_precision():
    path = SUBPROBLEMS / "linear_gelu.py"
    precisions = [generate_kernel(path, v, TARGET).precision for v in range(variant_count(path, TARGET))]
    assert precisions[0] == ("tf32x3" if TARGET == "cuda" else "ieee")   # the interpreter's dots are exact
    assert "tf32x3" in precisions
    assert set(precisions) <= {"ieee", "tf32x3"}


def test_a_gemm_with_few_output_tiles_and_a_long_k_splits_k(tmp_path):
    """[4, 520] @ [520, 40]: one output tile, so one program would walk all of K. The split-K variant sums K in
    chunks on several programs, then adds the chunks and applies the epilogue in a second launch; it is offered
    only where a GEMM splits (linear_gelu's K of 40 does not), and it matches the reference."""
    path = SUBPROBLEMS / "linear_split_k.py"
    variants = [generate_kernel(path, v, TARGET) for v in range(variant_count(path, TARGET))]
    split = [g for g in variants if "K split over programs" in g.description]
    assert len(split) == 1 and "_split[(tiles, chunks)]" in split[0].source and "_finish[(tiles,)]" in split[0].source
    tile = next(v.split_k for v in TARGETS[TARGET] if v.split_k is not None)
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count if ON_GPU else NOMINAL_SMS["cpu"]
    chunks, chunk, _ = k_split(4, 40, 520, sms, tile.block_n, tile.block_k, tile.block_m)
    assert chunks > 1 and chunks * chunk > 520      # several chunks, the last one short
    assert_matches(path, split[0], tmp_path)
    linear_gelu = SUBPROBLEMS / "linear_gelu.py"
    assert not any("K split" in generate_kernel(linear_gelu, v, TARGET).description
                   for v in range(variant_count(linear_gelu, TARGET)))


def test_kernels_without_tl_dot_report_no_precision():
    path = SUBPROBLEMS / "softmax.py"
    generated = generate_kernel(path, 0, TARGET)
    assert generated.precision == "none"
    assert "tl.dot" not in generated.source
    assert all(generate_kernel(path, v, TARGET).precision == "none" for v in range(variant_count(path, TARGET)))


def test_cuda_target_autotunes_and_tries_tf32x3_dots_before_the_ieee_fallback():
    """On a GPU the first check of a GEMM or convolution is often the only one a time budget leaves."""
    first, fallback = (generate_kernel(SUBPROBLEMS / "linear_gelu.py", v, "cuda") for v in (0, 1))
    assert "@triton.autotune" in first.source
    assert (first.precision, fallback.precision) == ("tf32x3", "ieee")
    assert 'input_precision="tf32x3"' in first.source and 'input_precision="ieee"' in fallback.source
    ast.parse(first.source)


@pytest.mark.parametrize("eval_mode", [False, True])
def test_batchnorm_uses_batch_or_running_statistics(eval_mode, tmp_path):
    path = SUBPROBLEMS / "batchnorm2d.py"
    assert_matches(path, generate_kernel(path, 0, TARGET), tmp_path, eval_mode)


@pytest.mark.parametrize("variant", range(variant_count(SUBPROBLEMS / "batchnorm2d.py", TARGET)))
def test_batchnorm_training_updates_running_statistics(variant, tmp_path):
    """Every variant, the split one included (its chunks' statistics combined in a second launch): the
    output and the running statistics match an fp64 reference, on an input whose mean (100) is large
    against its spread (1), where a one-pass E[x^2] - E[x]^2 in fp32 would lose the variance's digits."""
    generated = generate_kernel(SUBPROBLEMS / "batchnorm2d.py", variant, TARGET)
    module = import_generated(generated, tmp_path, f"batchnorm_stats_{variant}")
    problem = load_problem(SUBPROBLEMS / "batchnorm2d.py")
    torch.manual_seed(0)
    reference = problem.model_cls(4).to(DEVICE).double()
    torch.manual_seed(0)
    candidate = module.ModelNew(4).to(DEVICE)
    torch.manual_seed(1)
    x = torch.randn(3, 4, 5, 6, device=DEVICE) + 100.0
    with torch.no_grad():
        expected = reference(x.double())
        actual = candidate(x)
    torch.testing.assert_close(actual.double(), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(candidate.bn.running_mean.double(), reference.bn.running_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(candidate.bn.running_var.double(), reference.bn.running_var, atol=1e-5, rtol=1e-5)


def test_batchnorm_training_statistics_add_in_fp64_in_every_variant(tmp_path):
    """A batch of values near 1 with a spread of 1e-3: an error in the mean is multiplied by about 300 (1 /
    sqrt(var + eps)) in every output. Added in fp64, the statistics are the same in every variant, so the
    outputs are bit for bit, and within eager fp32's error against fp64; added in fp32, the looped variant
    (more adds per lane) erred 3.6 times as much as eager."""
    path = SUBPROBLEMS / "batchnorm2d.py"
    reference = load_problem(path).model_cls(4).to(DEVICE)
    torch.manual_seed(1)
    x = (1.0 + 0.001 * torch.randn(8, 4, 30, 30)).to(DEVICE)
    with torch.no_grad():
        expected = copy.deepcopy(reference).double()(x.double())
        eager_error = (copy.deepcopy(reference)(x).double() - expected).abs().max()
        outputs = []
        for variant in range(variant_count(path, TARGET)):
            module = import_generated(generate_kernel(path, variant, TARGET), tmp_path, f"batchnorm_fp64_{variant}")
            candidate = module.ModelNew(4).to(DEVICE)
            candidate.load_state_dict(reference.state_dict())
            outputs.append(candidate(x))
    assert len(outputs) >= 3
    assert all(torch.equal(out, outputs[0]) for out in outputs[1:])
    assert (outputs[0].double() - expected).abs().max() <= eager_error


def test_batchnorm_training_is_two_launches():
    """The statistics and both running-statistics updates in one kernel, the normalisation in a second:
    where the row kernels took 7 launches, a small batch's time."""
    source = generate_kernel(SUBPROBLEMS / "batchnorm2d.py", 0, TARGET).source
    train = source[source.index("def _forward_train"):source.index("def _forward_eval")]
    assert re.findall(r"= (_\w+)_launch\(", train) == ["_batch_stats_kernel_0", "_pointwise_kernel_1"]


def test_module_attributes_are_read_at_run_time():
    """pointwise_chain's configs differ in `scale`: the kernel takes it as an argument, not a literal."""
    source = generate_kernel(SUBPROBLEMS / "pointwise_chain.py", 0, TARGET).source
    assert "self.scale" in _forward_source(source)
    assert "0.75" not in source.split("class ModelNew")[0]


def test_a_layer_without_a_template_is_unsupported_with_a_clear_message():
    with pytest.raises(UnsupportedSubproblem, match=r"no kernel template for: nn\.Fold$"):
        generate_kernel(SUBPROBLEMS / "fold.py", 0, TARGET)
    with pytest.raises(UnsupportedSubproblem, match="Fold"):
        variant_count(SUBPROBLEMS / "fold.py", TARGET)


def test_every_op_without_a_template_is_named_at_once(tmp_path):
    path = tmp_path / "scan.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.mode(torch.relu(x), dim=1, keepdim=True).values + torch.logcumsumexp(x, dim=1)"
        " + x.cummax(dim=1).values"
        "\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 8)]\n\n\ndef get_init_inputs():\n    return []\n")
    with pytest.raises(UnsupportedOps) as caught:
        variant_count(path, TARGET)
    assert caught.value.ops == ("torch.mode", "torch.logcumsumexp", "Tensor.cummax")


DROPOUT = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, features, p):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        x = F.dropout(self.fc(x), p=0.5, training=False)
        return torch.relu(self.dropout(x))


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16, 0.2]
"""


def test_dropout_in_training_mode_gets_no_kernel_and_says_why(tmp_path):
    path = tmp_path / "linear_dropout.py"
    path.write_text(DROPOUT)
    with pytest.raises(UnsupportedSubproblem, match=r"Dropout with p=0\.2 in training mode .*--eval"):
        generate_kernel(path, 0, TARGET, mode="train")
    module = import_generated(generate_kernel(path, 0, TARGET), tmp_path, "both_modes")
    with pytest.raises(NotImplementedError, match="training mode"):
        module.ModelNew(16, 0.2).to(DEVICE)(torch.randn(4, 16, device=DEVICE))


def test_dropout_in_eval_mode_and_functional_dropout_turned_off_are_the_identity(tmp_path):
    path = tmp_path / "linear_dropout.py"
    path.write_text(DROPOUT)
    assert_matches(path, generate_kernel(path, 0, TARGET, mode="eval"), tmp_path, eval_mode=True)


def test_unknown_target_and_variant_are_rejected():
    path = SUBPROBLEMS / "softmax.py"
    with pytest.raises(ValueError, match="target"):
        generate_kernel(path, 0, "rocm")
    with pytest.raises(ValueError, match="variant"):
        generate_kernel(path, variant_count(path, TARGET), TARGET)


def _forward_functions(source: str) -> list[ast.FunctionDef]:
    tree = ast.parse(source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    return [n for n in model.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"]


def _forward_source(source: str) -> str:
    return "\n".join(ast.unparse(f) for f in _forward_functions(source))


@pytest.mark.parametrize("stem", SUPPORTED)
def test_forward_only_launches_kernels_and_views(stem):
    """forward calls launchers, view/contiguous methods and its own mode branches; no torch math."""
    source = generate_kernel(SUBPROBLEMS / f"{stem}.py", 0, TARGET).source
    assert "@triton.jit" in source
    launches = 0
    for function in _forward_functions(source):
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert node.value.id not in ("torch", "F", "nn"), f"{stem}: forward uses {ast.unparse(node)}"
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name):
                assert node.func.id.endswith("_launch"), f"{stem}: forward calls {node.func.id}"
                launches += 1
            else:
                assert isinstance(node.func, ast.Attribute)
                method = node.func.attr
                assert method in VIEW_METHODS or method.startswith("_forward_"), f"{stem}: forward calls .{method}"
    assert launches >= 1


def _unread_locals(source: str) -> list[str]:
    unread = []
    for function in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)):
        read = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        unread += [f"{function.name}: {t.id}" for n in ast.walk(function) if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name) and t.id not in read]
    return unread


@pytest.mark.parametrize("stem", SUPPORTED)
def test_generated_code_computes_nothing_it_does_not_read(stem):
    path = SUBPROBLEMS / f"{stem}.py"
    for target in ("cuda", "cpu"):
        for variant in range(variant_count(path, target)):
            assert _unread_locals(generate_kernel(path, variant, target).source) == []


@pytest.mark.parametrize("stem", SUPPORTED)
def test_launchers_do_host_arithmetic_in_plain_python(stem):
    """triton.cdiv and triton.next_power_of_2 cost microseconds per host call; launchers use the file's own."""
    for variant in range(variant_count(SUBPROBLEMS / f"{stem}.py", "cuda")):
        source = generate_kernel(SUBPROBLEMS / f"{stem}.py", variant, "cuda").source
        assert "triton.cdiv" not in source and "triton.next_power_of_2" not in source


def test_host_helpers_agree_with_triton():
    from mkevolve.builtin.kernels.module_source import HOST_HELPERS
    helpers: dict = {}
    exec(HOST_HELPERS, helpers)
    assert [helpers["_next_power_of_2"](n) for n in range(2000)] == [triton.next_power_of_2(n) for n in range(2000)]
    assert all(helpers["_cdiv"](a, b) == triton.cdiv(a, b) for a in range(300) for b in range(1, 40))


def test_remembered_strides_follow_each_tensor_s_own_layout():
    """The launchers' stride helper remembers answers per (shape, strides): two tensors of one shape and
    different layouts still get their own strides, and a broadcast dim gets 0."""
    from mkevolve.builtin.kernels.module_source import HOST_HELPERS
    helpers: dict = {}
    exec(HOST_HELPERS, helpers)
    frame, groups = (4, 6, 5), ((0,), (1,), (2,))
    dense, transposed = torch.empty(4, 6, 5), torch.empty(5, 6, 4).permute(2, 1, 0)
    broadcast = torch.empty(6, 1)
    for _ in range(2):  # the second round is answered from what the first remembered
        assert helpers["_group_strides"](dense, frame, groups) == (30, 5, 1)
        assert helpers["_group_strides"](transposed, frame, groups) == (1, 4, 24)
        assert helpers["_group_strides"](broadcast, list(frame), groups) == (0, 1, 0)
    assert helpers["_group_sizes"](frame, ((0, 1), (2,))) == (24, 5)
    assert helpers["_broadcast_shape"](torch.Size([6, 1]), torch.Size([4, 1, 5])) == (4, 6, 5)


def test_sizes_used_in_div_and_mod_are_constexpr():
    """A broadcast parameter is indexed by `offs % n1`: with n1 constexpr that compiles to a multiply and shift."""
    source = generate_kernel(SUBPROBLEMS / "pointwise_chain.py", 0, "cuda").source
    kernel = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name.endswith("_0"))
    constexpr = {a.arg for a in kernel.args.args if a.annotation is not None
                 and ast.unparse(a.annotation) == "tl.constexpr"}
    divisors = {n.right.id for n in ast.walk(kernel) if isinstance(n, ast.BinOp)
                and isinstance(n.op, (ast.Mod, ast.FloorDiv)) and isinstance(n.right, ast.Name)}
    assert divisors and divisors <= constexpr


def test_cleanup_keeps_side_effects_and_never_empties_a_block():
    source = ("def f(n):\n    unused = tl.minimum(n, 4)\n    kept = launch[grid](n)\n"
              "    for i in range(n):\n        only = i * 2\n    return n\n")
    cleaned = drop_unused_assignments(source)
    assert "unused" not in cleaned and "kept = launch[grid](n)" in cleaned and "only = i * 2" in cleaned


def test_helper_module_forward_is_not_copied():
    """RMSNorm (the problem's own module) is needed by __init__; its torch-math forward is dropped."""
    source = generate_kernel(SUBPROBLEMS / "rmsnorm.py", 0, TARGET).source
    tree = ast.parse(source)
    helper = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RMSNorm")
    assert [n.name for n in helper.body if isinstance(n, ast.FunctionDef)] == ["__init__"]
    assert "torch.sqrt" not in source


def test_main_block_checks_against_the_reference(tmp_path):
    """The generated file run as a script compares itself with the subproblem given on the command line."""
    generated = generate_kernel(SUBPROBLEMS / "softmax.py", 0, TARGET)
    script = tmp_path / "softmax_kernel.py"
    script.write_text(generated.source)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(script), str(SUBPROBLEMS / "softmax.py")], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "config 0: matches the reference" in run.stdout
    if not torch.cuda.is_available():  # no made-up GPU numbers on a CPU
        assert "config 0: GPU time, GB/s and roofline fraction unknown: no CUDA device" in run.stdout
        assert " ms" not in run.stdout


def test_main_block_of_a_dot_kernel_names_its_throughput(tmp_path):
    """A file whose kernels call tl.dot reports TFLOP/s; every input config is checked and reported."""
    script = tmp_path / "pointwise_kernel.py"
    script.write_text(generate_kernel(SUBPROBLEMS / "linear_gelu.py", 0, TARGET).source)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(script), str(SUBPROBLEMS / "linear_gelu.py")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    if not torch.cuda.is_available():
        assert run.stdout.splitlines() == ["config 0: matches the reference",
                                           "config 0: GPU time, TFLOP/s and roofline fraction unknown: no CUDA device"]


SIGNATURE_LINE = re.compile(r"^    (\w+)(: tl\.constexpr)?,( +)# \S")
# one problem per kernel kind: pointwise, matmul, rows, conv (all three templates), pool, adaptive_pool,
# attention, concat, gather (slices and along)
SIGNATURE_CASES = ([SUBPROBLEMS / f"{s}.py" for s in ("pointwise_chain", "linear_gelu", "layernorm", "conv2d_bias_relu",
                                                       "depthwise_conv2d", "conv_transpose2d", "maxpool2d",
                                                       "adaptive_pools", "batchnorm2d")]
                   + [ATTENTION_FIXTURES / f"{s}.py" for s in ("sdpa_float_mask", "cat_tokens", "embedding", "gather")])


@pytest.mark.parametrize("path", SIGNATURE_CASES, ids=lambda p: p.stem)
def test_kernel_signatures_have_one_commented_parameter_per_line(path):
    """As in the Triton tutorials: `def kernel(`, then `name,  # what it is` per parameter, comments aligned."""
    source = generate_kernel(path, 0, "cuda").source
    lines = source.splitlines()
    kernels = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and "_kernel_" in n.name
               and not n.name.endswith("_launch")]
    assert kernels
    for kernel in kernels:
        args = [a.arg for a in kernel.args.args]
        assert lines[kernel.lineno - 1] == f"def {kernel.name}(", kernel.name
        params = lines[kernel.lineno:kernel.lineno + len(args)]
        assert lines[kernel.lineno + len(args)] == "):", kernel.name
        matches = [SIGNATURE_LINE.match(line) for line in params]
        assert all(matches), [line for line, m in zip(params, matches) if not m]
        assert [m.group(1) for m in matches] == args
        assert len({m.end(3) for m in matches}) == 1, f"{kernel.name}: comments not in one column"
        pointers = [line.split("# ", 1)[1] for line, m in zip(params, matches) if m.group(1).endswith("_ptr")]
        launches = source.count(f"{kernel.name.partition('_split')[0]}_launch(") - 1
        if launches == 1:  # a kernel shared by several launches may have no one shape to give
            assert all("[" in comment for comment in pointers), f"{kernel.name}: a pointer without a shape"


def test_a_kernel_shared_by_several_launches_comments_roles_not_tensors():
    """repeated_mlp's hidden layers share one GEMM kernel: its pointers cannot name one layer's tensors."""
    source = generate_kernel(ROOT / "problems" / "repeated_mlp.py", 0, "cuda").source
    shared = source[source.index("def _matmul_kernel_1("):source.index("def _matmul_kernel_1_launch(")]
    assert "# A [M, K]\n" in shared and "self.blocks" not in shared
    first = source[source.index("def _matmul_kernel_0("):source.index("def _matmul_kernel_0_launch(")]
    assert "# B [K, N]: self.blocks[0].weight.t() [32, 32]" in first


@pytest.mark.parametrize("stem", SUPPORTED)
def test_a_generated_file_carries_only_the_helpers_it_uses(stem):
    """Every top-level function of the file is called somewhere else in it: no unused host or jit helpers."""
    for target in ("cuda", TARGET):
        tree = ast.parse(generate_kernel(SUBPROBLEMS / f"{stem}.py", 0, target).source)
        functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        for function in functions:
            elsewhere = [n for node in tree.body if node is not function for n in ast.walk(node)]
            assert any(isinstance(n, ast.Name) and n.id == function.name for n in elsewhere), function.name


def test_the_self_check_without_its_reference_says_how_to_run_it(tmp_path):
    """A `solve` result has no ../subkernel_problems/ beside it: the self-check asks for the problem file."""
    kernel = tmp_path / "solution.py"
    kernel.write_text(generate_kernel(SUBPROBLEMS / "linear_gelu.py", 0, TARGET).source)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(kernel)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and "usage:" in done.stderr and "PROBLEM.py" in done.stderr


def test_the_meta_trace_warm_up_starts_one_thread_per_process():
    import threading

    from mkevolve.builtin.kernels import trace

    trace.warm_up_in_background()
    trace.warm_up_in_background()
    warming = [t for t in threading.enumerate() if t.name == "meta-trace-warm-up"]
    assert trace._warm_up_started.is_set() and len(warming) <= 1
    for thread in warming:
        thread.join(60)
        assert not thread.is_alive()


PAD_TO_MATCH = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, skip):
        diff = skip.size(2) - x.size(2)
        return F.pad(x, (0, 0, diff // 2, diff - diff // 2), mode="{mode}") + skip


def get_inputs():
    return [torch.randn(2, 3, 5, 4), torch.randn(2, 3, 8, 4)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_a_pad_computed_from_shapes_is_named_as_unsupported(mode, tmp_path):
    """A U-Net's pad to its skip connection's size is computed from shapes at run time: an unsupported
    subproblem, named, rather than a kernel that pads by the first config's amounts."""
    path = tmp_path / "pad_to_match.py"
    path.write_text(PAD_TO_MATCH.replace("{mode}", mode))
    with pytest.raises(UnsupportedSubproblem, match="pad depends on tensor shapes"):
        generate_kernel(path, 0, TARGET)


@pytest.mark.parametrize("use", ["x * torch.arange(x.shape[-1], device=x.device)",
                                 "x + torch.arange(x.shape[-1], device=x.device, dtype=torch.float32) * 0.5",
                                 "x + torch.arange(0.0, 4.0, device=x.device, dtype=torch.int64)",
                                 "torch.arange(x.shape[-1], device=x.device, dtype=torch.int32)"])
def test_torch_arange_read_as_numbers_gets_a_kernel_of_its_own(use, tmp_path):
    """Before, refused: only an embedding's positions (a slice of its table) were read."""
    path = tmp_path / "arange_use.py"
    path.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                    f"        return {use}\n\n\ndef get_inputs():\n    return [torch.randn(3, 4)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    generated = generate_kernel(path, 0, TARGET)
    assert "_arange_kernel_" in generated.source
    assert_matches(path, generated, tmp_path)


_INDEX_PROBLEM = """import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(6, 4)

    def forward(self, x, index):
        return {use}


def get_inputs():
    return [torch.randn(3, 6), torch.randint(0, 6, (3, 6))]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("use, reason", [
    ("x + (index + 1 > 2)", "add produces torch.int64; only float32"),     # compares an integer sum
    ("x, index[:, :2]", "returns an integer tensor"),                       # an identity kernel would be fp32
    ("index.float() @ x.t()", "an integer tensor is an operand of a GEMM"),  # tl.dot takes no int64
])
def test_integer_tensors_are_refused_by_name_where_no_kernel_takes_them(use, reason, tmp_path):
    """Kernels compute and write float32: none computes or returns an integer tensor, and a template that
    loads its operands as they are (a GEMM's) takes none."""
    path = tmp_path / "integer_use.py"
    path.write_text(_INDEX_PROBLEM.format(use=use))
    with pytest.raises(UnsupportedSubproblem, match=reason):
        generate_kernel(path, 0, TARGET)


def test_indexing_with_two_index_tensors_is_refused_by_name(tmp_path):
    """`x[rows, cols]` picks single elements, which no gather here writes: refused, where one index tensor
    among whole-dim slices (`table[index]`, integer_buffers.py) is a gather."""
    path = tmp_path / "two_indices.py"
    path.write_text(_INDEX_PROBLEM.replace("def forward(self, x, index):", "def forward(self, x, index, rows):")
                    .format(use="x[rows, index[0]]")
                    .replace("torch.randint(0, 6, (3, 6))]", "torch.randint(0, 6, (3, 6)), torch.randint(0, 3, (6,))]"))
    with pytest.raises(UnsupportedSubproblem, match="other than one integer index among whole-dim slices"):
        generate_kernel(path, 0, TARGET)


@pytest.mark.parametrize("use", [
    "torch.where(index != 2, x, 0.0) + (index >= 4) * x",         # a loss's `target != ignore_index`
    "(1.0 - (index > 2).float()) * -10000.0 + x * index",          # an attention mask made a bias; a product
    "index.float().mean(dim=1) + torch.exp(index / 6.0).sum()",   # reduced and through a math function
])
def test_an_integer_input_compared_or_read_as_numbers(use, tmp_path):
    """Integer inputs in comparisons, and promoted to float32 where PyTorch promotes them."""
    path = tmp_path / "integer_numbers.py"
    path.write_text(_INDEX_PROBLEM.format(use=use))
    assert_matches(path, generate_kernel(path, 0, TARGET), tmp_path)


def test_indices_outside_the_table_read_zero_and_nothing_outside_it(tmp_path):
    """A loss's ignore_index (-100) reaches gathers as an index (class_losses.py): the kernels mask such an
    index, where a load at it would read memory before the table."""
    path = tmp_path / "lookups.py"
    path.write_text(_INDEX_PROBLEM.format(use="self.table(index), torch.gather(x, 1, index)"))
    module = import_generated(generate_kernel(path, 0, TARGET), tmp_path, "lookups")
    model = module.ModelNew().to(DEVICE)
    x = torch.randn(3, 6, device=DEVICE)
    index = torch.tensor([[0, -100, 5, 6, -1, 2]] * 3, device=DEVICE)
    with torch.no_grad():
        rows, picked = model(x, index)
    outside = (index < 0) | (index >= 6)
    assert torch.equal(rows[outside], torch.zeros_like(rows[outside]))
    assert torch.equal(picked[outside], torch.zeros_like(picked[outside]))
    inside = ~outside
    assert torch.equal(rows[inside], model.table.weight[index[inside]])
    assert torch.equal(picked[inside], x.gather(1, index.clamp(0, 5))[inside])


def test_a_convolution_shared_by_layers_of_several_paddings_fills_no_border_for_an_unpadded_one():
    """A 1x1 layer's input needs no zero border: the launcher takes the channels-last copy alone, where it
    filled a zeroed tensor first (a memset and a copy per launch); conv_shared_padding.py checks both paths."""
    source = generate_kernel(SUBPROBLEMS / "conv_shared_padding.py", 0, TARGET).source
    assert "if padding[0] == 0 and padding[1] == 0:\n        x_cl = x.movedim(1, -1).contiguous()" in source


def test_a_convolution_with_a_padding_mode_pads_in_a_kernel_of_its_own_then_convolves_unpadded():
    generated = generate_kernel(SUBPROBLEMS / "conv_padding_modes.py", 0, TARGET)
    assert generated.description.startswith("reflect pad of dims 2 to 3; direct convolution")
    for mode in ("circular pad of dim 2", "replicate pad of dims 2 to 3"):
        assert mode in generated.description
    assert "PAD0=0, PAD1=0" in generated.source          # the convolution itself pads nothing


@pytest.mark.parametrize("call, reason", [("F.interpolate(x, scale_factor=2, mode='bicubic')", "mode='bicubic'"),
                                          ("F.interpolate(x, size=(8, 8), mode='bilinear', antialias=True)",
                                           "antialias=True"),
                                          ("torch.roll(x, 3)", "roll without dims")])
def test_resampling_or_reordering_it_cannot_write_is_named(call, reason, tmp_path):
    path = tmp_path / "resize.py"
    path.write_text("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                    f"class Model(nn.Module):\n    def forward(self, x):\n        return {call}\n\n\n"
                    "def get_inputs():\n    return [torch.randn(1, 2, 4, 4)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    with pytest.raises(UnsupportedSubproblem, match=reason):
        generate_kernel(path, 0, TARGET)
