"""Cheating detection: static rules, the runtime guard and output checks, over the test corpus."""

import ast
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import CORPUS
from mkevolve.problem import build_model, flatten_outputs, import_file, load_problem, make_inputs
from mkevolve.verify.cheating import (
    RuntimeGuard,
    Rule,
    dot_precision,
    output_violations,
    static_violations,
)

CHEATS = sorted((CORPUS / "cheats").glob("*.py"))
HONEST = sorted((CORPUS / "honest").glob("*.py"))
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def corpus_constants(path: Path) -> dict[str, str]:
    """PROBLEM / EXPECTED_RULE / CAUGHT_BY, read without importing the file."""
    constants = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    constants[target.id] = node.value.value
    return constants


def line_of(path: Path, needle: str) -> int:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if needle in text:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def rules_of(violations) -> set[Rule]:
    return {v.rule for v in violations}


def static_rules(source: str) -> set[Rule]:
    return rules_of(static_violations(source))


def ids(paths):
    return [p.stem for p in paths]


# ---------------------------------------------------------------------------------------------
# The corpus itself
# ---------------------------------------------------------------------------------------------

def test_corpus_covers_every_rule_with_well_formed_files():
    problems = {p.stem for p in (CORPUS / "problems").glob("*.py")}
    assert problems == {"batch_norm", "elementwise", "gemm_epilogue", "row_reduction"}
    for path in HONEST:
        assert corpus_constants(path)["PROBLEM"] == path.stem
    covered = set()
    for path in CHEATS:
        constants = corpus_constants(path)
        assert ast.get_docstring(ast.parse(path.read_text())), path
        assert constants["PROBLEM"] in problems, path
        assert constants["CAUGHT_BY"] in ("static", "runtime", "output", "sandbox", "harness", "judge", "gpu"), path
        rule = Rule(constants["EXPECTED_RULE"])
        assert path.stem.startswith(rule.name.lower() + "_"), path
        # The stages of the isolated evaluation each report only their own rules. A cheat the isolation
        # neutralises rather than detects states the verdict it gets instead (EXPECTED_STATUS), and
        # EXPECTED_RULE then names the rule it breaks in spirit.
        status = constants.get("EXPECTED_STATUS", "cheating")
        assert status in ("cheating", "incorrect", "ok"), path
        assert status == "cheating" or constants["CAUGHT_BY"] == "judge", path
        # the judge: wrong late calls, forged results, and the measured precision rule (error against fp64)
        only = {"sandbox": {Rule.SANDBOX}, "judge": {Rule.TIMED_OUTPUT, Rule.FORGED_RESULT, Rule.PRECISION},
                "gpu": {Rule.NON_TRITON_KERNEL, Rule.HOST_COPY, Rule.PRECISION},
                "harness": {Rule.PRECISION}}   # the candidate harness's own reading of PyTorch's switches
        if status == "cheating":
            assert rule in only.get(constants["CAUGHT_BY"], {rule}), path
        covered.add(rule)
    # The LLM judge's rule is no program's finding: tests/test_llm_judge.py replays its verdicts.
    assert covered == set(Rule) - {Rule.LLM_JUDGE}


# ---------------------------------------------------------------------------------------------
# Static rules
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", CHEATS, ids=ids(CHEATS))
def test_static_verdict_on_cheat(path):
    constants = corpus_constants(path)
    violations = static_violations(path.read_text(), str(path))
    expected = Rule(constants["EXPECTED_RULE"])
    if constants["CAUGHT_BY"] == "static":
        # The first finding (by line) is the one a verdict reports: it must be the intended rule.
        assert violations and violations[0].rule is expected, [v.describe() for v in violations]
        assert all(v.message for v in violations)
    else:
        # Labelled as only detectable at run time: the label must stay true.
        assert expected not in rules_of(violations)


@pytest.mark.parametrize("path", HONEST, ids=ids(HONEST))
def test_honest_solution_has_no_static_violations(path):
    assert static_violations(path.read_text(), str(path)) == []


@pytest.mark.parametrize("stem, rule, needle", [
    ("torch_compute_matmul", Rule.TORCH_COMPUTE, "torch.matmul("),
    ("torch_compute_matmul_operator", Rule.TORCH_COMPUTE, "x @ self"),
    ("torch_compute_layer_call", Rule.TORCH_COMPUTE, "self.linear(x)"),
    ("torch_compute_compile", Rule.TORCH_COMPUTE, "@torch.compile"),
    ("monkeypatch_cuda_event", Rule.MONKEYPATCH, "setattr(torch.cuda"),
    ("monkeypatch_perf_counter", Rule.MONKEYPATCH, "time.perf_counter = "),
    ("try_except_fallback", Rule.TRY_EXCEPT, "try:"),
    ("precision_bare_dot", Rule.PRECISION, "tl.dot(x, w)"),
    ("reference_access_exec", Rule.REFERENCE_ACCESS, "exec("),
    ("reference_access_import_problem", Rule.REFERENCE_ACCESS, "from elementwise import"),
    ("no_triton_kernel_operators", Rule.NO_TRITON_KERNEL, "def forward"),
    ("no_launch_unused_kernel", Rule.NO_LAUNCH, "def silu_kernel"),
])
def test_static_violation_points_at_the_offending_line(stem, rule, needle):
    path = CORPUS / "cheats" / f"{stem}.py"
    lines = {v.line for v in static_violations(path.read_text()) if v.rule is rule}
    assert line_of(path, needle) in lines


HONEST_IDIOMS = '''
import math
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

DOT_PRECISION = "tf32x3"


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4)], key=["n"])
@triton.jit
def scale_kernel(x_ptr, w_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n).to(tl.float32)
    w = tl.load(w_ptr + tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :])
    acc = tl.dot(w, w, input_precision=DOT_PRECISION)
    tl.store(out_ptr + offsets, x * scale + tl.sum(acc), mask=offsets < n)


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        out = torch.empty_like(x)
        n = x.numel()
        scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, w, out, n, math.sqrt(2.0))
        return out


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.blocks = nn.ModuleList()
        self.weight = nn.Parameter(torch.randn(16, 16) / math.sqrt(16))
        nn.init.zeros_(self.linear.bias)
        self.register_buffer("folded", self.linear.weight.t().contiguous() * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.is_contiguous() and x.dtype == torch.float32, x.dtype
        shape = x.shape
        flat = x.reshape(-1).view(-1)
        device = torch.device(x.device)
        ranks = torch.arange(x.shape[-1], device=device, dtype=torch.int64)
        scratch = torch.empty_like(x, memory_format=torch.contiguous_format).zero_()
        seen = {tuple(shape), x.size(0), x.stride(0), x.numel(), x.dim(), ranks.data_ptr()}
        buffers = [torch.zeros(4, device=device), torch.full((2,), -math.inf), torch.ones(1)]
        out = _Scale.apply(flat, self.weight)
        torch.cuda.is_available()
        return out.view(shape).unsqueeze(0).squeeze(0).permute(*range(len(shape))).contiguous()


if __name__ == "__main__":
    import time
    model = ModelNew(16)
    sample = torch.randn(4, 16)
    try:
        start = time.perf_counter()
        torch.testing.assert_close(model(sample), F.relu(sample @ model.linear.weight.t()))
    except AssertionError:
        pass
    torch.cuda.synchronize = None
'''


def test_common_honest_idioms_are_not_flagged():
    assert static_violations(HONEST_IDIOMS) == []


FORWARD_TEMPLATE = '''
import torch
import triton
import triton.language as tl
from torch import nn
{imports}

@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = torch.sigmoid

    def forward(self, x):
        out = torch.empty_like(x)
        {statement}
        copy_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
        return out
'''


@pytest.mark.parametrize("imports, statement, rule", [
    ("", "y = torch.einsum('ij,jk->ik', x, x)", Rule.TORCH_COMPUTE),
    ("", "y = self.act(x)", Rule.TORCH_COMPUTE),
    ("", "y = self.fc.forward(x)", Rule.TORCH_COMPUTE),
    ("", "y = x.clamp_(min=0)", Rule.TORCH_COMPUTE),
    ("", "y = torch.Tensor.add(x, x)", Rule.TORCH_COMPUTE),
    ("", "y = getattr(torch, 'tan' + 'h')(x)", Rule.TORCH_COMPUTE),
    ("", "y = getattr(torch, 'tanh')(x)", Rule.TORCH_COMPUTE),
    ("", "y = nn.Linear(4, 4)(x)", Rule.TORCH_COMPUTE),
    ("from torch import matmul as mm", "y = mm(x, x)", Rule.TORCH_COMPUTE),
    ("", "y = torch.nn.functional.gelu(x)", Rule.TORCH_COMPUTE),
    ("", "y = x.tolist()", Rule.TORCH_COMPUTE),
    ("import xformers.ops", "pass", Rule.TORCH_COMPUTE),
    ("from torch.utils.cpp_extension import load_inline", "pass", Rule.TORCH_COMPUTE),
    ("import contextlib", "with contextlib.suppress(Exception): pass", Rule.TRY_EXCEPT),
    ("import os", "os.environ['TRITON_F32_DEFAULT'] = 'tf32'", Rule.MONKEYPATCH),
    ("", "copy_kernel.add_pre_run_hook(print)", Rule.MONKEYPATCH),
    ("", "triton.Config({}, pre_hook=print)", Rule.MONKEYPATCH),
    ("", "torch.Tensor.__add__ = torch.Tensor.__sub__", Rule.MONKEYPATCH),
    ("", "torch.backends.cuda.matmul.allow_tf32 = True", Rule.PRECISION),
    ("", "y = x.to(torch.bfloat16)", Rule.PRECISION),
    ("", "torch.set_float32_matmul_precision('high')", Rule.PRECISION),
    ("", "y = globals()['Model']", Rule.REFERENCE_ACCESS),
    ("", "y = __import__('gc')", Rule.REFERENCE_ACCESS),
    ("", "y = eval('x + 1')", Rule.REFERENCE_ACCESS),
    ("from reference import helper", "pass", Rule.REFERENCE_ACCESS),
    ("import importlib", "pass", Rule.REFERENCE_ACCESS),
    ("", "y = getattr(x, 'f_back')", Rule.REFERENCE_ACCESS),
    ("import os", "os.fork()", Rule.THREADS),
    ("import multiprocessing", "pass", Rule.THREADS),
    ("", "y = torch._make_subclass(torch.Tensor, x)", Rule.TENSOR_SUBCLASS),
    ("", "y = torch.__dict__['tanh'](x)", Rule.TORCH_COMPUTE),
    ("", "y = vars(torch)['tanh'](x)", Rule.TORCH_COMPUTE),
    ("import operator", "y = operator.matmul(x, x)", Rule.TORCH_COMPUTE),
    ("", "graph = torch.cuda.CUDAGraph()", Rule.TORCH_COMPUTE),
])
def test_static_rule_forms(imports, statement, rule):
    source = FORWARD_TEMPLATE.format(imports=imports, statement=statement)
    violations = static_violations(source)
    assert rule in rules_of(violations), [v.describe() for v in violations]
    line = line_of_text(source, statement if statement != "pass" else imports)
    assert any(v.line == line for v in violations if v.rule is rule)


def line_of_text(source: str, needle: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), start=1) if needle in text)


def test_problem_name_import_is_reference_access():
    source = FORWARD_TEMPLATE.format(imports="import gemm_epilogue as helpers", statement="pass")
    assert Rule.REFERENCE_ACCESS not in static_rules(source)
    found = static_violations(source, problem_name="gemm_epilogue")
    assert Rule.REFERENCE_ACCESS in rules_of(found)


def test_precision_rules_follow_the_reference_dtype():
    half = FORWARD_TEMPLATE.format(imports="", statement="y = x.to(torch.float16)")
    assert Rule.PRECISION in static_rules(half)
    assert static_violations(half, reference_dtype=torch.float16) == []
    bf16 = FORWARD_TEMPLATE.format(imports="", statement="y = x.bfloat16()")
    assert Rule.PRECISION in rules_of(static_violations(bf16, reference_dtype=torch.float16))


def test_main_block_is_not_checked():
    source = FORWARD_TEMPLATE.format(imports="", statement="pass") + (
        'if __name__ == "__main__":\n'
        "    import gc\n"
        "    try:\n"
        "        print(torch.matmul(torch.ones(2, 2), torch.ones(2, 2)).half())\n"
        "    except RuntimeError:\n"
        "        raise\n"
    )
    assert static_violations(source) == []


def test_launch_only_in_main_block_is_no_launch():
    source = FORWARD_TEMPLATE.format(imports="", statement="pass").replace(
        "        copy_kernel[(1,)](x, out, x.numel(), BLOCK=1024)\n", "")
    source += '\nif __name__ == "__main__":\n    copy_kernel[(1,)](None, None, 0, BLOCK=16)\n'
    assert static_rules(source) == {Rule.NO_LAUNCH}


def dot_source(*arguments: str) -> str:
    calls = "\n".join(f"    acc += tl.dot(a, b{arg})" for arg in arguments) or "    pass"
    return (f"import triton\nimport triton.language as tl\nTF = 'tf32x3'\n\n@triton.jit\n"
            f"def k(a, b, acc, p: tl.constexpr):\n{calls}\n")


@pytest.mark.parametrize("arguments, expected", [
    ((), None),
    ((", input_precision='ieee'",), "ieee"),
    ((", input_precision=TF",), "tf32x3"),
    ((", input_precision='ieee'", ", input_precision='tf32x3'"), "tf32x3"),
    ((", input_precision='ieee'", ""), "tf32"),
    ((", allow_tf32=False",), "ieee"),
    ((", allow_tf32=True", ", input_precision='ieee'"), "tf32"),
    ((", input_precision=p",), "unknown"),
    ((", None, 'IEEE'",), "ieee"),
])
def test_dot_precision(arguments, expected):
    assert dot_precision(dot_source(*arguments)) == expected


@pytest.mark.parametrize("argument, accepted", [
    (", input_precision='ieee'", True),
    (", input_precision='tf32x3'", True),
    (", allow_tf32=False", True),
    ("", False),
    (", input_precision='tf32'", False),
    (", input_precision='bf16x3'", False),
    (", input_precision=p", False),
])
def test_dot_precision_rule(argument, accepted):
    violations = [v for v in static_violations(dot_source(argument)) if v.rule is Rule.PRECISION]
    assert (violations == []) == accepted
    if not accepted:
        assert "ieee" in violations[0].message and violations[0].line == 7


# ---------------------------------------------------------------------------------------------
# Runtime guard
# ---------------------------------------------------------------------------------------------

def load_case(path: Path):
    """ModelNew, the reference Model (same seed, same weights) and two copies of the inputs."""
    problem = load_problem(CORPUS / "problems" / f"{corpus_constants(path)['PROBLEM']}.py")
    solution = import_file(path)
    config = problem.configs[0]
    init = config.get_init_inputs()
    model = build_model(problem.path, solution.ModelNew, init, 0, DEVICE, True, "ModelNew")
    reference = build_model(problem.path, problem.model_cls, init, 0, DEVICE, True)
    inputs, reference_inputs = (make_inputs(problem.path, config, 1, DEVICE) for _ in range(2))
    return model, reference, inputs, reference_inputs


def guarded_run(path: Path):
    """Run one forward of a corpus solution under a guard; also the reference's output."""
    model, reference, inputs, reference_inputs = load_case(path)
    guard = RuntimeGuard(str(path))
    with torch.no_grad():
        with guard:
            out = model(*inputs)
        expected = reference(*reference_inputs)
    return guard, flatten_outputs(out), inputs, expected


@pytest.mark.parametrize("path", HONEST, ids=ids(HONEST))
def test_honest_solution_passes_the_runtime_guard(path):
    guard, outputs, inputs, expected = guarded_run(path)
    assert guard.launches > 0
    assert guard.violations == []
    assert output_violations(outputs, inputs) == []
    torch.testing.assert_close(outputs[0], expected, atol=1e-4, rtol=1e-4)


# Cheats that are safe to import in-process (none patches global state), with the rule the
# runtime guard must find; the statically caught ones show the guard backs the source checks.
RUNTIME_CASES = {
    "torch_compute_hidden_getattr": Rule.TORCH_COMPUTE,
    "torch_compute_children_dispatch": Rule.TORCH_COMPUTE,
    "torch_compute_matmul": Rule.TORCH_COMPUTE,
    "torch_compute_aten_ops": Rule.TORCH_COMPUTE,
    "torch_compute_functional_softmax": Rule.TORCH_COMPUTE,
    "torch_compute_tensor_methods": Rule.TORCH_COMPUTE,
    "no_launch_dead_branch": Rule.NO_LAUNCH,
    "no_launch_unused_kernel": Rule.NO_LAUNCH,
    "no_triton_kernel_operators": Rule.NO_LAUNCH,
    "precision_half_inputs": Rule.PRECISION,
    "threads_background_launch": Rule.THREADS,
    "threads_executor": Rule.THREADS,
}


def test_runtime_cases_include_every_runtime_only_cheat():
    runtime_only = {p.stem for p in CHEATS if corpus_constants(p)["CAUGHT_BY"] == "runtime"}
    assert runtime_only <= set(RUNTIME_CASES)


@pytest.mark.parametrize("stem", sorted(RUNTIME_CASES))
def test_runtime_guard_catches_cheat(stem):
    guard, _, _, _ = guarded_run(CORPUS / "cheats" / f"{stem}.py")
    assert guard.violations and guard.violations[0].rule is RUNTIME_CASES[stem], [
        v.describe() for v in guard.violations]
    assert all(v.message for v in guard.violations)


def test_runtime_violation_points_at_the_solution_line():
    path = CORPUS / "cheats" / "torch_compute_hidden_getattr.py"
    guard, _, _, _ = guarded_run(path)
    assert [v.line for v in guard.violations] == [line_of(path, "y = product(")]
    layer_path = CORPUS / "cheats" / "torch_compute_children_dispatch.py"
    layer_guard, _, _, _ = guarded_run(layer_path)
    assert {v.line for v in layer_guard.violations} == {line_of(layer_path, "x = stage(x)")}
    assert any("Linear" in v.message for v in layer_guard.violations)


@pytest.mark.parametrize("stem, rule", [
    ("output_alias_inplace", Rule.OUTPUT_ALIAS),
    ("tensor_subclass_output", Rule.TENSOR_SUBCLASS),
])
def test_output_check_catches_cheat(stem, rule):
    guard, outputs, inputs, _ = guarded_run(CORPUS / "cheats" / f"{stem}.py")
    assert guard.launches == 1
    assert rule in rules_of(output_violations(outputs, inputs))


def installed_state():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return (JITFunction.__dict__["run"], InterpretedFunction.__dict__["run"], threading.Thread.start,
            len(nn.modules.module._global_forward_hooks), torch._C._len_torch_dispatch_stack())


class Exploding(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def test_guard_cleans_up_when_forward_raises():
    before = installed_state()
    guard = RuntimeGuard()
    with pytest.raises(ValueError, match="boom"):
        with guard:
            assert installed_state() != before
            Exploding()(torch.ones(2))
    assert installed_state() == before
    assert guard.violations == []  # an exception is its own verdict: no NO_LAUNCH on top


def test_guards_nest_and_can_be_reused():
    path = HONEST[0]
    model, _, inputs, _ = load_case(path)
    before = installed_state()
    outer, inner = RuntimeGuard(str(path)), RuntimeGuard(str(path))
    with torch.no_grad(), outer:
        model(*inputs)
        with inner:
            model(*inputs)
    assert (outer.launches, inner.launches) == (2, 1)
    assert outer.violations == inner.violations == []
    with torch.no_grad(), inner:
        pass
    assert inner.launches == 0 and rules_of(inner.violations) == {Rule.NO_LAUNCH}
    assert installed_state() == before


def test_guard_flags_pre_run_hooks_on_a_launched_kernel():
    path = CORPUS / "honest" / "elementwise.py"
    model, _, inputs, _ = load_case(path)
    model.forward.__globals__["silu_kernel"].add_pre_run_hook(lambda *args, **kwargs: None)
    guard = RuntimeGuard(str(path))
    with torch.no_grad(), guard:
        model(*inputs)
    assert rules_of(guard.violations) == {Rule.MONKEYPATCH}


class LowPrecisionBuffer(nn.Module):
    def forward(self, x):
        return torch.empty(x.shape, dtype=torch.bfloat16), torch.empty(x.shape, dtype=torch.float16)


def test_runtime_precision_follows_the_reference_dtype():
    fp32 = RuntimeGuard()
    with fp32:
        LowPrecisionBuffer()(torch.ones(2))
    assert [v.rule for v in fp32.violations] == [Rule.NO_LAUNCH, Rule.PRECISION, Rule.PRECISION]
    fp16 = RuntimeGuard(reference_dtype=torch.float16)
    with fp16:
        LowPrecisionBuffer()(torch.ones(2))
    assert [v.rule for v in fp16.violations] == [Rule.NO_LAUNCH, Rule.PRECISION]
    assert "bfloat16" in fp16.violations[1].message


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------

class _Marked(torch.Tensor):
    pass


def test_output_violations():
    x = torch.randn(8, 8)
    assert output_violations([torch.empty_like(x), 3, None], [x, 2]) == []
    assert rules_of(output_violations([x.view(-1)], [x])) == {Rule.OUTPUT_ALIAS}
    assert rules_of(output_violations([x[4:]], [torch.ones(1), x])) == {Rule.OUTPUT_ALIAS}
    assert rules_of(output_violations([torch.empty(2).as_subclass(_Marked)], [x])) == {Rule.TENSOR_SUBCLASS}
    assert rules_of(output_violations([x.numpy()], [])) == {Rule.TENSOR_SUBCLASS}
    assert output_violations([torch.empty(0)], [torch.empty(0)]) == []


def test_setup_code_may_use_torch_freely():
    source = FORWARD_TEMPLATE.format(imports="", statement="pass") + (
        "\nSCALE = torch.sigmoid(torch.ones(1))\n"
        "torch.backends.cuda.matmul.allow_tf32 = False\n\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(4, 4).softmax(dim=-1)]\n"
    )
    assert static_violations(source) == []
    assert static_rules(source.replace("allow_tf32 = False", "allow_tf32 = True")) == {Rule.PRECISION}


TRUSTED_HELPER = '''
import torch
from torch import nn

LAYER = nn.Linear(4, 4)


def pytorch_alternative(x):
    return LAYER(torch.sigmoid(x))
'''


class UsesHelper(nn.Module):
    def __init__(self, helper):
        super().__init__()
        self.helper = helper

    def forward(self, x):
        return self.helper.pytorch_alternative(x)


def test_trusted_files_may_compute_with_pytorch(tmp_path):
    helper_path = tmp_path / "alternative.py"
    helper_path.write_text(TRUSTED_HELPER)
    model = UsesHelper(import_file(helper_path))
    trusted = RuntimeGuard(trusted_files=[str(helper_path)])
    with torch.no_grad(), trusted:
        model(torch.ones(2, 4))
    assert rules_of(trusted.violations) == {Rule.NO_LAUNCH}
    untrusted = RuntimeGuard(str(helper_path))
    with torch.no_grad(), untrusted:
        model(torch.ones(2, 4))
    compute = [v for v in untrusted.violations if v.rule is Rule.TORCH_COMPUTE]
    assert {v.line for v in compute} == {line_of(helper_path, "return LAYER(")}
    assert any("Linear" in v.message for v in compute) and any("sigmoid" in v.message for v in compute)
