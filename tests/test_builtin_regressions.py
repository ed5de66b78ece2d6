"""Regressions in the builtin Triton generator, each on a shrunk problem that runs on CPU.

1. ConvTranspose3d + mean over channels: the kernels must compile (checked by compiling every launched kernel
   for an sm_90 target offline, which needs no GPU) and match.
2. Grouped and depthwise Conv2d, and conv subproblems with several input configs: a correct kernel each.
3. leaky_relu with a non-default slope, in every spelling (keyword, positional, module, in-place), fused into
   a row kernel's epilogue or a pointwise kernel.
4. aten.slice and aten.expand_as, which a level 3 decomposition writes (NetVLAD): a kernel, not a decline.
5. Module state written in forward (VanillaRNN's `self.hidden.copy_(x)`): the kernel writes the attribute in
   place; whole builtin runs of shrunk level 3 problems end with every subkernel in Triton.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from torch import nn

from mkevolve.builtin.kernels import UnsupportedSubproblem, generate_kernel, variant_count
from mkevolve.builtin.kernels.builders import Builder
from mkevolve.builtin.kernels.calls import Call
from mkevolve.builtin.kernels.ir import Input, Program
from mkevolve.builtin.kernels.lower import FUNCTIONS
from mkevolve.cli import main
from mkevolve.problem import call_inputs, import_file, load_problem
from mkevolve.run_layout import BEST
from mkevolve.solution import Manifest

from builtin_matching import DEVICE, ON_GPU, TARGET, assert_variant_matches, run_both


# --- helpers ----------------------------------------------------------------------------------------

def _write_problem(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def _first_config_outputs(path: Path, tmp_path: Path) -> tuple[tuple, tuple]:
    """Model's and variant 0's ModelNew's outputs (tuples, the kernel's on the CPU) on the first input config;
    for outputs that a close-match assertion cannot take as they are (int64 positions, NaNs)."""
    module = import_file(_save(generate_kernel(path, 0, TARGET).source, tmp_path, f"{path.stem}_kernel"),
                         prefix="generated")
    problem = load_problem(path)
    inputs = call_inputs(path, problem.configs[0].get_inputs, "get_inputs")
    with torch.no_grad():
        expected = problem.model_cls()(*inputs)
        actual = module.ModelNew().to(DEVICE)(*[t.to(DEVICE) for t in inputs])
    return tuple(expected), tuple(a.cpu() for a in actual)


def _save(source: str, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def _assert_all_variants_match(path: Path, tmp_path: Path) -> None:
    count = variant_count(path, TARGET)
    assert count >= 1
    for variant in range(count):
        assert_variant_matches(path, variant, tmp_path)


# --- offline compilation: what the interpreter never does ---------------------------------------------

# Run in a fresh process: with TRITON_INTERPRET=1, Triton's own @jit library functions are interpreter objects,
# which its compiler cannot read. The parent sends [(generated file, kernel name, signature, constexprs,
# options)] on stdin; any CompilationError fails the process with its message.
_COMPILE_SCRIPT = """
import json, sys
import importlib.util
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

modules = {}
for path, name, signature, constexprs, options in json.load(sys.stdin):
    if path not in modules:
        spec = importlib.util.spec_from_file_location(f"generated_{len(modules)}", path)
        modules[path] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[path])
    kernel = getattr(modules[path], name)
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn  # an @triton.autotune wrapper holds the JITFunction
    constants = {(int(i),): v for i, v in constexprs.items()}
    triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32), options=options)
    print("compiled", name)
"""

_TENSOR_TYPES = {torch.float32: "*fp32", torch.float64: "*fp64", torch.int64: "*i64", torch.int32: "*i32",
                 torch.bool: "*i1"}


def _argument_type(value) -> str:
    """Triton's specialisation of a launch argument (ints equal to 1 become constexprs, as at a real launch)."""
    if isinstance(value, torch.Tensor):
        return _TENSOR_TYPES[value.dtype]
    if isinstance(value, bool):
        return "u1"
    if isinstance(value, int):
        return "constexpr" if value == 1 else ("i32" if -2**31 <= value < 2**31 else "i64")
    if isinstance(value, float):
        return "fp32"
    if value is None:
        return "constexpr"
    raise TypeError(f"launch argument of type {type(value).__name__}")


def _recorded_launches(path: Path, module, monkeypatch) -> list[tuple[InterpretedFunction, tuple, dict]]:
    """Run ModelNew in the interpreter and record every kernel launch: (kernel, args, kwargs)."""
    launches = []
    original = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(InterpretedFunction, "run", recording_run)
        run_both(path, module)
    return launches


def _launch_spec(file: Path, kernel: InterpretedFunction, args: tuple, kwargs: dict) -> list:
    names = list(inspect.signature(kernel.fn).parameters)
    values = list(args) + [kwargs[n] for n in names[len(args):]]
    annotations = inspect.get_annotations(kernel.fn)
    signature, constexprs = {}, {}
    for index, (name, value) in enumerate(zip(names, values)):
        constexpr = "constexpr" in str(annotations.get(name, ""))
        signature[name] = "constexpr" if constexpr else _argument_type(value)
        if signature[name] == "constexpr":
            constexprs[str(index)] = value
    options = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages")}
    return [str(file), kernel.fn.__name__, signature, constexprs, options]


def _compile_offline(specs: list[list]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], input=json.dumps(specs), env=env,
                          capture_output=True, text=True, timeout=600)


def _assert_compiles(specs: list[list]) -> None:
    done = _compile_offline(specs)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("compiled") == len(specs)


def _launch_specs(path: Path, source: str, tmp_path: Path, monkeypatch, tag: str) -> list[list]:
    """Every kernel launch of the generated ModelNew, as _COMPILE_SCRIPT takes it."""
    file = _save(source, tmp_path, f"{path.stem}_{tag}")
    module = import_file(file, prefix="generated")
    return [_launch_spec(file, *launch) for launch in _recorded_launches(path, module, monkeypatch)]


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="records launches in the interpreter")
def test_short_rows_packed_several_to_a_program_compile_for_sm_90(tmp_path, monkeypatch):
    path = Path(__file__).resolve().parent / "subproblems" / "groupnorm_small_groups.py"
    specs = _launch_specs(path, generate_kernel(path, 0, TARGET).source, tmp_path, monkeypatch, "packed")
    assert any(name.endswith("_packed") for _, name, *_ in specs)
    _assert_compiles(specs)


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="records launches in the interpreter")
def test_batch_norm_statistics_compile_for_sm_90(tmp_path, monkeypatch):
    """One program per channel (variant 0) and channels split over several programs with a combining
    launch (the split variant): every launch compiles for an H200."""
    path = Path(__file__).resolve().parent / "subproblems" / "batchnorm2d.py"
    specs = []
    for variant in (0, 2):
        source = generate_kernel(path, variant, TARGET).source
        specs += _launch_specs(path, source, tmp_path, monkeypatch, f"stats{variant}")
    names = {name for _, name, *_ in specs}
    assert {"_batch_stats_kernel_0", "_batch_stats_kernel_0_combine"} <= names
    _assert_compiles(specs)


# --- 1. ConvTranspose3d + mean over channels ------------------------------------------------------------

CONV_TRANSPOSE_MEAN = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, 3{geometry})

    def forward(self, x):
        x = self.conv_transpose(x)
        x = x.mean(dim=1{keepdim})
        return x


def get_inputs():
    return [torch.randn(1, {cin}, 2, 3, 2)]


def get_init_inputs():
    return [{cin}, {cout}]
"""


def _conv_transpose_mean(keepdim: bool, strided: bool, channels: tuple[int, int]) -> str:
    return CONV_TRANSPOSE_MEAN.format(geometry=", stride=2, padding=1" if strided else "",
                                      keepdim=", keepdim=True" if keepdim else "", cin=channels[0], cout=channels[1])


# (3, 4) channels take the direct template, (8, 8) the implicit-GEMM one
@pytest.mark.parametrize("channels", [(3, 4), (8, 8)], ids=["direct", "implicit_gemm"])
@pytest.mark.parametrize("strided", [True, False], ids=["stride2_pad1", "stride1"])
@pytest.mark.parametrize("keepdim", [True, False], ids=["keepdim", "no_keepdim"])
@pytest.mark.slow
def test_conv_transpose3d_mean_compiles_and_matches(keepdim, strided, channels, tmp_path, monkeypatch):
    path = _write_problem(tmp_path, "ct3_mean", _conv_transpose_mean(keepdim, strided, channels))
    specs = []
    for variant in range(variant_count(path, TARGET)):
        generated = assert_variant_matches(path, variant, tmp_path)
        if not ON_GPU:  # on a GPU, running the kernels compiled them
            launched = _launch_specs(path, generated.source, tmp_path, monkeypatch, f"v{variant}")
            assert {"_conv", "_rows"} <= {name.split("_kernel_")[0] for _, name, *_ in launched}
            specs += launched
    if specs:
        _assert_compiles(specs)


def test_offline_compilation_catches_a_kernel_that_does_not_compile(tmp_path):
    """The compile check above is not vacuous: a type error the interpreter tolerates is a CompilationError."""
    source = '''
import triton
import triton.language as tl


@triton.jit
def _broken(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for i in range(n):
        offs = offs.to(tl.float32)   # a loop-carried value changing type
    tl.store(x_ptr + tl.arange(0, BLOCK), offs)
'''
    file = _save(source, tmp_path, "broken")
    spec = [str(file), "_broken", {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"2": 16}, {}]
    done = _compile_offline([spec])
    assert done.returncode != 0
    assert "Loop-carried variable" in done.stderr


# --- 2. grouped and depthwise convolutions, several input configs ------------------------------------------

GROUPED_CONV = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride={stride}, padding=1, groups=groups)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(1, {cin}, 5, 6)]


def get_init_inputs():
    return [{cin}, {cout}, {groups}]
"""

GROUPED_CASES = {
    "grouped_direct": dict(cin=8, cout=12, groups=2, stride=1),     # 4 input channels per group: FMA template
    "grouped_implicit_gemm": dict(cin=16, cout=16, groups=2, stride=2),   # 8 per group: tl.dot template
    "depthwise": dict(cin=6, cout=6, groups=6, stride=1),
    "depthwise_multiplier": dict(cin=3, cout=6, groups=3, stride=2),
}


@pytest.mark.parametrize("case", sorted(GROUPED_CASES))
def test_grouped_and_depthwise_conv2d(case, tmp_path):
    path = _write_problem(tmp_path, case, GROUPED_CONV.format(**GROUPED_CASES[case]))
    _assert_all_variants_match(path, tmp_path)


# What a multi-config problem file ends with; `_with_configs` appends the config entries.
_CONFIG_ACCESSORS = '''


def get_inputs():
    return get_input_configs()[0]["get_inputs"]()


def get_init_inputs():
    return get_input_configs()[0]["get_init_inputs"]()


def get_input_configs():
    return [
'''


CONV_MODEL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, groups=groups)

    def forward(self, x):
        return self.conv(x)

"""


def _with_configs(model: str, configs: list[tuple[list, tuple[int, ...]]]) -> str:
    """A problem file: `model`, and one input config per (init arguments, input shape)."""
    lines = "\n".join(f'        {{"get_init_inputs": lambda: {init}, "get_inputs": lambda: [torch.randn{shape}]}},'
                      for init, shape in configs)
    return model.rstrip() + _CONFIG_ACCESSORS + lines + "\n    ]\n"


def _conv_configs(configs: list[tuple[list[int], tuple[int, ...]]]) -> str:
    return _with_configs(CONV_MODEL, configs)


SHARED_GROUPS_CONFIGS = {
    "dense": [([3, 4, 1], (2, 3, 6, 6)), ([3, 4, 1], (1, 3, 9, 5)), ([5, 2, 1], (1, 5, 4, 7))],
    "grouped": [([4, 6, 2], (2, 4, 5, 5)), ([4, 6, 2], (1, 4, 7, 3))],
    "depthwise": [([4, 4, 4], (2, 4, 6, 5)), ([4, 4, 4], (1, 4, 3, 8))],
}


@pytest.mark.parametrize("case", sorted(SHARED_GROUPS_CONFIGS))
def test_conv_with_several_input_configs(case, tmp_path):
    path = _write_problem(tmp_path, f"conv_configs_{case}", _conv_configs(SHARED_GROUPS_CONFIGS[case]))
    assert len(load_problem(path).configs) == len(SHARED_GROUPS_CONFIGS[case])
    _assert_all_variants_match(path, tmp_path)


# Groups that follow the channel count, so they differ between configs (a MobileNet's depthwise layers
# sharing one subproblem): the launcher reads them off the shapes, one kernel file serves every instance.
VARYING_GROUPS_CONFIGS = {
    "depthwise": [([4, 4, 4], (2, 4, 6, 5)), ([6, 6, 6], (1, 6, 3, 8))],                 # direct template
    "grouped_outer_product": [([16, 16, 2], (1, 16, 5, 5)), ([24, 24, 3], (1, 24, 4, 6))],  # 8 channels/group
    "grouped_implicit_gemm": [([32, 32, 2], (1, 32, 5, 5)), ([64, 64, 4], (1, 64, 4, 4))],  # 16 channels/group
}


@pytest.mark.parametrize("case", sorted(VARYING_GROUPS_CONFIGS))
def test_conv_whose_groups_differ_between_configs(case, tmp_path):
    path = _write_problem(tmp_path, f"varying_{case}", _conv_configs(VARYING_GROUPS_CONFIGS[case]))
    source = generate_kernel(path, 0, TARGET).source
    assert "G = x.shape[1] // w.shape[1]" in source
    _assert_all_variants_match(path, tmp_path)


# A MobileNet's dense convolutions in one subproblem: an RGB stem, 16-, 24- and 32-channel layers, and a
# depthwise one. Each instance needs another template, so the file holds one kernel per template.
MIXED_TEMPLATE_CONFIGS = [([3, 16, 1], (2, 3, 6, 6)), ([16, 16, 1], (1, 16, 5, 5)), ([24, 16, 1], (1, 24, 4, 5)),
                          ([32, 16, 1], (1, 32, 3, 4)), ([4, 4, 4], (1, 4, 5, 4))]


def test_conv_instances_get_the_template_that_fits_each(tmp_path, monkeypatch):
    path = _write_problem(tmp_path, "mixed_templates", _conv_configs(MIXED_TEMPLATE_CONFIGS))
    specs = []
    for variant in range(variant_count(path, TARGET)):
        generated = assert_variant_matches(path, variant, tmp_path)
        if not ON_GPU:  # on a GPU, running the kernels compiled them
            specs += _launch_specs(path, generated.source, tmp_path, monkeypatch, f"v{variant}")
    source = generated.source
    for header in ("# Direct", "# Outer-product", "# Implicit-GEMM"):
        assert header in source
    assert "if C_in_g % 16 == 0:\n        return _conv_kernel_0_gemm_launch(" in source
    assert "return _conv_kernel_0_gemm_spanning_launch(" in source
    # each instance ran the kernel of its own template: 5 instances, 4 kernels, every one launched
    launched = {name for _, name, *_ in specs}
    assert not specs or launched == {f"_conv_kernel_0_{t}" for t in ("direct", "outer", "gemm", "gemm_spanning")}
    if specs:
        _assert_compiles(specs)


STRIDED_MODEL = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels, stride, padding, kernel_size=3):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride=stride, padding=padding, bias=False)

    def forward(self, x):
        return torch.relu(self.conv(x))

"""


@pytest.mark.parametrize("channels", [3, 8, 16])   # direct, outer-product and implicit-GEMM templates
def test_conv_whose_stride_and_padding_differ_between_configs(channels, tmp_path):
    """A ResNet's or MobileNet's blocks: one subproblem, instances with stride 1 and 2 and a 1x1 one; the
    launcher takes the instance's stride, padding and dilation from its module and the kernel size from
    its weight."""
    configs = [([channels, 1, 1], (2, channels, 6, 5)), ([channels, 2, 1], (1, channels, 7, 8)),
               ([channels, 2, 0], (1, channels, 9, 6)), ([channels, 1, 0, 1], (1, channels, 4, 5))]
    path = _write_problem(tmp_path, f"strided_{channels}", _with_configs(STRIDED_MODEL, configs))
    source = generate_kernel(path, 0, TARGET).source
    assert "self.conv.stride, self.conv.padding, self.conv.dilation" in source
    _assert_all_variants_match(path, tmp_path)


# --- 3. leaky_relu's slope ----------------------------------------------------------------------------------

LEAKY = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, features, scale):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.act = nn.LeakyReLU({module_args})
        self.scale = scale

    def forward(self, x):
        {body}


def get_inputs():
    return [torch.randn(4, 3, 16)]


def get_init_inputs():
    return [16, 1.5]
"""

# name -> (nn.LeakyReLU arguments, forward body). Inputs are standard normal, so a wrong slope on the
# negative half is far outside the tolerance.
LEAKY_CASES = {
    # the reported case: LayerNorm's row kernel with leaky_relu and the scale in its epilogue
    "layernorm_keyword": ("", "x = self.norm(x)\n        x = torch.nn.functional.leaky_relu(x, negative_slope=0.2)"
                              "\n        return x * self.scale"),
    "layernorm_positional": ("", "return F.leaky_relu(self.norm(x), 0.2) * self.scale"),
    "layernorm_module": ("0.2", "return self.act(self.norm(x)) * self.scale"),
    "layernorm_module_keyword_inplace": ("negative_slope=0.2, inplace=True",
                                        "return self.act(self.norm(x)) * self.scale"),
    "layernorm_functional_inplace": ("", "return F.leaky_relu(self.norm(x), 0.2, True) * self.scale"),
    "layernorm_functional_inplace_keyword": (
        "", "return F.leaky_relu(self.norm(x), negative_slope=0.2, inplace=True) * self.scale"),
    "layernorm_underscore_keyword": ("", "return F.leaky_relu_(self.norm(x), negative_slope=0.2) * self.scale"),
    "layernorm_underscore_positional": ("", "return F.leaky_relu_(self.norm(x), 0.2) * self.scale"),
    "pointwise_keyword": ("", "return F.leaky_relu(x * self.scale, negative_slope=0.3) + 1.0"),
    "softmax_epilogue_keyword": ("", "return F.leaky_relu(torch.softmax(x, dim=-1) - 0.1, negative_slope=3.0)"),
    # an in-place op's input read afterwards must see the mutation
    "inplace_input_read_after": ("", "y = x * self.scale\n        z = F.leaky_relu(y, 0.2, inplace=True)"
                                     "\n        return y + z"),
    "inplace_module_input_read_after": ("0.2, True", "y = x * self.scale\n        z = self.act(y)"
                                                     "\n        return y + z"),
    "inplace_statement": ("", "y = x * self.scale\n        F.leaky_relu_(y, 0.2)\n        return y * 2.0"),
}


@pytest.mark.parametrize("case", sorted(LEAKY_CASES))
def test_leaky_relu_slope_is_honoured(case, tmp_path):
    module_args, body = LEAKY_CASES[case]
    path = _write_problem(tmp_path, case, LEAKY.format(module_args=module_args, body=body))
    assert_variant_matches(path, 0, tmp_path)


def test_leaky_relu_slope_reaches_the_kernel_source():
    """The slope is in the emitted expression, not torch's default 0.01."""
    path = Path(__file__).resolve().parent / "subproblems" / "layernorm_leaky_relu.py"
    source = generate_kernel(path, 0, TARGET).source.split("class ModelNew")[0]
    assert "0.2" in source
    assert "0.01" not in source


@pytest.mark.parametrize("op", ["leaky_relu", "softplus", "elu", "threshold", "hardshrink"])
def test_a_keyword_the_lowering_does_not_know_is_refused(op):
    """fx records `F.leaky_relu(x, 0.2)` with the slope as keyword `negative_slope`; a handler that matched
    keywords by another name dropped it for the default. A keyword no handler reads is now an error."""
    program = Program()
    x = program.add(Input(((4, 16),), index=0, name="x"))
    call = Call(op, [x], {"negative_slop": 0.2})
    with pytest.raises(UnsupportedSubproblem, match="negative_slop"):
        FUNCTIONS[op](Builder(program, [nn.Module()]), call)


def test_every_keyword_of_leaky_relu_is_read():
    program = Program()
    x = program.add(Input(((4, 16),), index=0, name="x"))
    value = FUNCTIONS["leaky_relu"](Builder(program, [nn.Module()]),
                                    Call("leaky_relu", [x], {"negative_slope": 0.2, "inplace": False}))
    assert value.op == "leaky_relu"
    assert {k: s.value for k, s in value.attrs.items()} == {"negative_slope": 0.2}


# A forward over one [4, 16] input; `body` is the forward's code after its signature.
_ROW_MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):{body}


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
"""

ALIASED = _ROW_MODEL.format(body="""
        y = x * 1.0
        v = y.view(-1)
        z = F.leaky_relu(y, 0.2, inplace=True)
        return v * 2.0 + z.sum()""")


def test_inplace_op_on_a_tensor_whose_view_is_read_later_is_refused(tmp_path):
    """The view `v` taken before the mutation sees it in torch; the functional program cannot express that."""
    path = _write_problem(tmp_path, "aliased", ALIASED)
    with pytest.raises(UnsupportedSubproblem, match="shares its memory"):
        variant_count(path, TARGET)


INPUT_MUTATED = _ROW_MODEL.format(body="""
        F.leaky_relu_(x, 0.2)
        return x * 2.0""")


def test_inplace_statement_on_a_forward_input_is_still_refused(tmp_path):
    """The caller sees its input change; the generated program writes new tensors only."""
    path = _write_problem(tmp_path, "input_mutated", INPUT_MUTATED)
    with pytest.raises(UnsupportedSubproblem, match="whose result is not used"):
        variant_count(path, TARGET)


# --- 4. aten.slice and aten.expand_as, as a level 3 decomposition writes them (NetVLAD) ----------------------

ATEN_VIEWS = {
    "slice_view_sum": ("x",
                       "s = torch.ops.aten.slice.Tensor(x, 1, 0, 8)\n"
                       "        v = torch.ops.aten.view.default(s, [-1, 10, 8])\n"
                       "        return torch.ops.aten.sum.dim_IntList(v, [1], True)",
                       "torch.randn(40, 12)"),
    "slice_to_the_end_with_a_step": ("x", "return torch.ops.aten.slice.Tensor(x, 0, 1, 9223372036854775807, 2) * 3.0",
                                     "torch.randn(9, 16)"),
    "clamp_expand_as_div": ("x0, x1",
                            "r = torch.ops.aten.reshape.default(x0, [-1, 128])\n"
                            "        c = torch.ops.aten.clamp_min.default(x1, 1e-12)\n"
                            "        e = torch.ops.aten.expand_as.default(c, r)\n"
                            "        return torch.ops.aten.div.Tensor(r, e)",
                            "torch.randn(4, 16, 8), torch.rand(4, 1) + 0.5"),
}
ATEN_VIEW_PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, {args}):
        {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("case", sorted(ATEN_VIEWS))
def test_aten_slice_and_expand_as_get_a_kernel(case, tmp_path):
    args, body, inputs = ATEN_VIEWS[case]
    path = _write_problem(tmp_path, case, ATEN_VIEW_PROBLEM.format(args=args, body=body, inputs=inputs))
    _assert_all_variants_match(path, tmp_path)


# --- 5. module state written in forward: VanillaRNN's hidden state (level 3) ------------------------------------

# The subproblem a level 3 decomposition of 33_VanillaRNN writes: the hidden state is a plain tensor attribute
# (not a buffer), overwritten with copy_ (broadcast when x0 has fewer dims) and read back through `.to`.
HIDDEN_STATE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, batch_size, hidden_size, in_features, out_features):
        super().__init__()
        self.hidden = torch.randn((batch_size, hidden_size))
        self.linear = nn.Linear(in_features, out_features)
        self.tanh = nn.Tanh()

    def forward(self, x0, x1):
        copy = self.hidden.copy_(x0)
        getattr_out = x1.device
        to = self.hidden.to(getattr_out)
        cat = torch.cat((x1, to), dim=1)
        linear = self.linear(cat)
        tanh = self.tanh(linear)
        return tanh


def get_inputs():
    return [torch.rand({x0_shape}), torch.rand(2, 4)]


def get_init_inputs():
    return [2, 8, 12, 8]
"""


@pytest.mark.parametrize("x0_shape", ["2, 8", "8"], ids=["same_shape", "broadcast"])
def test_copy_into_a_tensor_attribute_writes_it_in_place(x0_shape, tmp_path):
    """The kernel writes x0 into the caller's own self.hidden tensor (the caller sees it change, as in
    PyTorch), and the cat after it reads the new values."""
    path = _write_problem(tmp_path, "hidden_state", HIDDEN_STATE.format(x0_shape=x0_shape))
    module = import_file(_save(generate_kernel(path, 0, TARGET).source, tmp_path, "hidden_state_kernel"),
                         prefix="generated")
    torch.manual_seed(0)
    reference = load_problem(path).model_cls(2, 8, 12, 8).to(DEVICE)
    torch.manual_seed(0)
    candidate = module.ModelNew(2, 8, 12, 8).to(DEVICE)
    hidden = candidate.hidden
    x0, x1 = torch.rand(*map(int, x0_shape.split(", ")), device=DEVICE), torch.rand(2, 4, device=DEVICE)
    torch.testing.assert_close(candidate(x0, x1), reference(x0, x1), atol=1e-4, rtol=1e-4)
    assert candidate.hidden is hidden and torch.equal(hidden, reference.hidden.to(DEVICE))


WRITTEN_THEN_STALE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 16))

    def forward(self, x):
        before = self.state * 2.0
        self.state.copy_(x)
        return before + self.state


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
"""


def test_a_read_of_the_old_state_after_it_is_overwritten_is_refused(tmp_path):
    """`before` would be fused into the kernel that runs after the copy, and read the new values."""
    path = _write_problem(tmp_path, "stale_state", WRITTEN_THEN_STALE)
    with pytest.raises(UnsupportedSubproblem, match="overwritten in place"):
        variant_count(path, TARGET)



# NetVLAD's (level 3) training-mode batch norm, as its decomposition writes it: the int64 step counter is bumped
# in place and never read. Nothing reads it in the forward, so it stays a dead state update, as the running
# statistics do, instead of a write-back the float32 kernels cannot express.
TRAINING_BATCH_NORM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.batchnorm1d = nn.BatchNorm1d(num_features)

    def forward(self, x):
        add = torch.ops.aten.add_.Tensor(self.batchnorm1d.num_batches_tracked, 1)
        batch_norm = torch.ops.aten.batch_norm.default(x, self.batchnorm1d.weight, self.batchnorm1d.bias,
            self.batchnorm1d.running_mean, self.batchnorm1d.running_var, True, 0.1, 1e-05, False)
        return torch.ops.aten.softmax.int(batch_norm, 1)


def get_inputs():
    return [torch.randn(64, 8)]


def get_init_inputs():
    return [8]
"""


def test_a_counter_buffer_bumped_and_never_read_does_not_stop_the_kernel(tmp_path):
    path = _write_problem(tmp_path, "training_batch_norm", TRAINING_BATCH_NORM)
    _assert_all_variants_match(path, tmp_path)


# Whole runs of the builtin agent on small problems whose subproblems once ended as PyTorch code: shrunk level 3
# models (VanillaRNN's hidden-state copy, minGPT's ReLU attention with its causal mask read from a buffer,
# MobileNetV2) and a loss.
VANILLA_RNN = """import torch
import torch.nn as nn

batch_size = 2


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.hidden = torch.randn((batch_size, hidden_size))
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)
        self.tanh = nn.Tanh()

    def forward(self, x, initial_hidden=None):
        if initial_hidden is not None:
            self.hidden.copy_(initial_hidden)
        self.hidden = self.hidden.to(x.device)
        combined = torch.cat((x, self.hidden), dim=1)
        self.hidden = self.tanh(self.i2h(combined))
        return self.h2o(self.hidden)


def get_inputs():
    return [torch.rand(batch_size, 4), torch.rand(batch_size, 8)]


def get_init_inputs():
    return [4, 8, 4]
"""

# minGPT's ReLU attention (level 3, problem 50), the causal mask read from a buffer.
RELU_SELF_ATTENTION = (Path(__file__).parent / "fixtures" / "attention_small" / "relu_self_attention.py").read_text()


# MobileNetV2 (level 3, problem 20) in miniature: its layers re-initialised in one loop after all are built,
# which the top-level runs over the kernels' modules.
MOBILENET_V2 = (Path(__file__).parent / "fixtures" / "level3_small" / "mobilenet_v2_tiny.py").read_text()


# A loss (KernelBench level 1's MSELoss): its output is a 0-d tensor, which the candidate process could not
# save (a 0-d tensor has no last dimension to view as bytes), so every kernel of it was rejected.
MSE_LOSS = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.randn(16, 32), torch.randn(16, 32)]


def get_init_inputs():
    return []
"""


WHOLE_RUNS = {"vanilla_rnn": VANILLA_RNN, "relu_self_attention": RELU_SELF_ATTENTION,
                   "mobilenet_v2": MOBILENET_V2, "mse_loss": MSE_LOSS}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WHOLE_RUNS))
def test_builtin_agent_writes_every_subkernel_of_a_whole_problem(name, tmp_path, capsys):
    path = _write_problem(tmp_path, name, WHOLE_RUNS[name])
    out = tmp_path / "runs"
    assert main(["run", str(path), "--out", str(out), "--iterations", "1", "--budget", "6", "--beam-width", "1",
                 "--trials", "1", "--workers", "2"]) == 0
    (run_dir,) = (out / name).iterdir()
    subkernels = Manifest.read(run_dir / BEST).subkernels
    assert {n: (e.origin, e.reason) for n, e in subkernels.items()} == {n: ("builtin", None) for n in subkernels}
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"all {len(subkernels)} subkernels in Triton"


# A reduction over a reshape of a normalisation's output (builders._reduce_by_rows): each case's forward, and
# whether the normalised tensor is still written whole. Regrouping the rows (groups of 2 images' worth) maps
# onto no run of the normalisation's dims, so that one keeps the tensor; every variant must match PyTorch.
REDUCED_NORMALISATIONS = {
    "layernorm_flatten_sum": ("F.layer_norm(x, (5,)).flatten(1).sum(1)", False),
    "softmax_reshape_max": ("torch.softmax(x, -1).reshape(x.shape[0], -1).amax(1)", False),
    "groupnorm_regrouped_mean": ("F.group_norm(x, 2).reshape(x.shape[0] * 2, -1).mean(1)", True),
}


@pytest.mark.parametrize("case", sorted(REDUCED_NORMALISATIONS))
def test_reductions_over_reshaped_normalisations(case, tmp_path):
    expression, writes_whole = REDUCED_NORMALISATIONS[case]
    path = _write_problem(tmp_path, case, textwrap.dedent(f"""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Model(nn.Module):
            def forward(self, x):
                return {expression}


        def get_inputs():
            return [torch.randn(3, 4, 5)]


        def get_init_inputs():
            return []
        """))
    assert ("(full rows)" in generate_kernel(path, 0, TARGET).description) is writes_whole
    _assert_all_variants_match(path, tmp_path)


CONSTANT_MASK = _ROW_MODEL.format(body="""
        keep = torch.ones(4, 16, dtype=torch.bool).tril()
        return x.masked_fill(~keep, float("-inf")).softmax(-1)""")


def test_a_tensor_forward_builds_from_constants_is_refused_with_what_to_do(tmp_path):
    """fx folds it into a CPU constant beside the meta inputs; the refusal said only that devices differed."""
    path = _write_problem(tmp_path, "constant_mask", CONSTANT_MASK)
    with pytest.raises(UnsupportedSubproblem, match=r"builds a \[4, 16\] tensor from constants alone.*buffer"):
        variant_count(path, TARGET)


VAR_MEAN = _ROW_MODEL.format(body="""
        var, mean = torch.var_mean(x, dim=1, keepdim=True)
        std, mean0 = torch.std_mean(x, dim=0, correction=0)
        return (x - mean) / torch.sqrt(var + 1e-5) + std * mean0""")


def test_var_mean_and_std_mean_give_both_outputs(tmp_path):
    """torch.var_mean and std_mean return (var or std, mean); before, no kernel."""
    assert_variant_matches(_write_problem(tmp_path, "var_mean", VAR_MEAN), 0, tmp_path)


LRN_MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lrn = nn.LocalResponseNorm({size}, alpha=0.01, beta=0.6, k=2.0)

    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn{shape}]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("size, body, shape", [
    (5, "self.lrn(x)", (2, 12, 5, 6)),                                   # even and odd halves of the window
    (4, "self.lrn(x) * 2.0", (2, 12, 7)),                                # 3-d input: a 2-d pool
    (3, "F.local_response_norm(x, 3, alpha=0.01, beta=0.6, k=2.0)", (2, 8, 4, 4))])
def test_local_response_norm_matches_pytorch(tmp_path, size, body, shape):
    """nn.LocalResponseNorm and F.local_response_norm; before, no kernel."""
    path = _write_problem(tmp_path, f"lrn_{size}", LRN_MODEL.format(size=size, body=body, shape=shape))
    assert_variant_matches(path, 0, tmp_path)


BILINEAR_MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bilinear = nn.Bilinear(12, 10, 6, bias={bias})

    def forward(self, x):
        left, right = x[..., :12], x[..., 12:] * 0.5
        return {body}


def get_inputs():
    return [torch.randn{shape}]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("bias, body, shape", [
    (True, "self.bilinear(left, right)", (5, 22)),
    (False, "torch.tanh(self.bilinear(left, right))", (2, 3, 22)),           # leading dims kept
    (True, "F.bilinear(left, right, self.bilinear.weight, self.bilinear.bias)", (4, 22))])
def test_bilinear_matches_pytorch(tmp_path, bias, body, shape):
    """nn.Bilinear and F.bilinear; before, no kernel."""
    path = _write_problem(tmp_path, f"bilinear_{len(shape)}_{bias}", BILINEAR_MODEL.format(bias=bias, body=body,
                                                                                          shape=shape))
    assert_variant_matches(path, 0, tmp_path)


def test_bilinear_serves_every_input_config(tmp_path):
    """The output's leading dims differ between configs: the products are split per output by a view that
    names no leading size."""
    model = BILINEAR_MODEL.format(bias=True, body="self.bilinear(left, right)", shape=(2, 3, 22))
    path = _write_problem(tmp_path, "bilinear_configs", _with_configs(model, [([], (2, 3, 22)), ([], (4, 5, 22))]))
    assert_variant_matches(path, 0, tmp_path)


SOFTMIN_AND_FRIENDS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmin = nn.Softmin(dim=1)
        self.softmax2d = nn.Softmax2d()

    def forward(self, x):
        channels = self.softmax2d(x) + self.softmin(x)                 # both over dim 1 of [2, 3, 4, 5]
        rows = F.softmin(x, dim=-1) + F.rrelu(x, 0.1, 0.3)            # functional rrelu: training=False
        mixed = torch.lerp(x, rows, 0.25) + torch.lerp(rows, x, rows)  # scalar weight, then tensor weight
        return channels + torch.addcmul(mixed, x, rows, value=0.5) + torch.addcdiv(x, rows, x.abs() + 1)


def get_inputs():
    return [torch.randn(2, 3, 4, 5)]


def get_init_inputs():
    return []
"""


def test_softmin_softmax2d_rrelu_lerp_addcmul_and_addcdiv_match_pytorch(tmp_path):
    """Before, no kernel for any of them."""
    assert_variant_matches(_write_problem(tmp_path, "softmin_and_friends", SOFTMIN_AND_FRIENDS), 0, tmp_path)


RRELU_MODULE = _ROW_MODEL.format(body="""
        return self.rrelu(x)

    def __init__(self):
        super().__init__()
        self.rrelu = nn.RReLU(0.1, 0.3)""")


def test_rrelu_module_gets_kernels_in_eval_mode_only(tmp_path):
    """In training mode nn.RReLU draws a slope per element; in eval mode it is leaky_relu with the mean slope."""
    path = _write_problem(tmp_path, "rrelu_module", RRELU_MODULE)
    with pytest.raises(UnsupportedSubproblem, match="RReLU in training mode"):
        generate_kernel(path, 0, TARGET, mode="train")
    module = import_file(_save(generate_kernel(path, 0, TARGET, mode="eval").source, tmp_path, "rrelu_eval"),
                         prefix="generated")
    x = torch.randn(4, 16, device=DEVICE)
    expected = nn.RReLU(0.1, 0.3).eval()(x)
    with torch.no_grad():
        actual = module.ModelNew().to(DEVICE).eval()(x)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


STATE_ASSIGNED = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.zeros(4, 16)

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)
        self.hidden = torch.tanh(x + self.hidden)
        return self.hidden * 2.0


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return []
"""


def test_a_forward_that_assigns_a_tensor_attribute_is_refused_by_name(tmp_path):
    """The graph does not record `self.hidden = ...`, so a kernel would drop the state; before, the second
    trace (eval mode) met the first trace's proxy and failed with 'multiple different tracers'."""
    path = _write_problem(tmp_path, "state_assigned", STATE_ASSIGNED)
    with pytest.raises(UnsupportedSubproblem, match=r"assigns module state \(self\.hidden = a tensor\)"):
        variant_count(path, TARGET)


ARG_REDUCE_SPECIAL_VALUES = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        top = x.argmax(dim=1, keepdim=True)
        return torch.argmin(x, dim=1), top, x.gather(1, top).isnan().float() + top.float() / 4.0


def get_inputs():
    x = torch.randn(5, 12)
    x[0, 7] = x[0, 9] = float("nan")        # the first NaN, for argmax and argmin alike
    x[1, 3] = x[1, 8] = float("inf")
    x[2] = float("-inf")                     # nothing beats -inf: position 0
    x[3, 2], x[3, 5] = float("nan"), float("-inf")
    x[4] = 1.0                               # all tied: position 0
    return [x]


def get_init_inputs():
    return []
"""


def test_argmax_and_argmin_give_pytorchs_positions_for_nan_infinities_and_ties(tmp_path):
    """Before, no kernel for argmax or argmin; their int64 positions are read as float and as gather indices."""
    expected, actual = _first_config_outputs(_write_problem(tmp_path, "arg_special", ARG_REDUCE_SPECIAL_VALUES),
                                             tmp_path)
    assert [a.dtype for a in actual] == [torch.int64, torch.int64, torch.float32]
    assert expected[0][[0, 2, 3, 4]].tolist() == [7, 0, 2, 0] and expected[1].flatten().tolist() == [7, 3, 0, 2, 0]
    for e, a in zip(expected, actual):
        assert torch.equal(a, e)


SORT_SPECIAL_VALUES = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        up, up_at = torch.sort(x, dim=1, stable=True)
        down, down_at = torch.sort(x, dim=1, descending=True, stable=True)
        return up, up_at, down, down_at, torch.topk(x, 3).values   # its indices on ties: PyTorch's own order


def get_inputs():
    x = torch.randn(4, 9)
    x[0, 2] = x[0, 6] = float("nan")         # NaNs above +inf: last ascending, first descending, in order
    x[0, 4] = float("inf")
    x[1, 1], x[1, 5] = -0.0, 0.0             # equal: kept in order, each keeping its sign
    x[2, 3] = x[2, 7] = float("-inf")
    x[3] = 2.0                               # all tied
    return [x]


def get_init_inputs():
    return []
"""


def test_sorts_put_nans_infinities_signed_zeros_and_ties_where_pytorch_does(tmp_path):
    """Before, no kernel for sort or topk. A stable sort's order, compared bit for bit (-0.0 and NaN too)."""
    expected, actual = _first_config_outputs(_write_problem(tmp_path, "sort_special", SORT_SPECIAL_VALUES), tmp_path)
    assert [a.dtype for a in actual] == [torch.float32, torch.int64, torch.float32, torch.int64, torch.float32]
    assert expected[1][0, -2:].tolist() == [2, 6] and expected[3][0, :3].tolist() == [2, 6, 4]
    assert expected[1][3].tolist() == list(range(9))
    for e, a in zip(expected, actual):
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           e.view(torch.int32) if e.is_floating_point() else e)


@pytest.mark.parametrize("call, message", [
    ("torch.topk(x, 2, sorted=False)", "sorted=False"),
    ("torch.sort(torch.cat([x] * 700, dim=1)).values", "6300 elements"),
    ("torch.argsort(torch.argmax(x, dim=1))", "integer tensor")])
def test_sorts_it_cannot_write_are_refused_by_name(call, message, tmp_path):
    source = SORT_SPECIAL_VALUES.replace(
        "return up, up_at, down, down_at, torch.topk(x, 3).values", f"return {call}")
    with pytest.raises(UnsupportedSubproblem, match=message):
        variant_count(_write_problem(tmp_path, "sort_refused", source), TARGET)


MEDIAN_SPECIAL_VALUES = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        m = torch.median(x, dim=1)
        n = torch.nanmedian(x, dim=1)
        k = torch.kthvalue(x, 3, dim=1)
        return m.values, m.indices, n.values, n.indices, k.values, k.indices


def get_inputs():
    nan, inf = float("nan"), float("inf")
    x = torch.randn(4, 9)
    x[0, 2] = x[0, 6] = nan                  # median: the first NaN; the others: as if the NaNs were not there
    x[1] = torch.tensor([-0.0, -5.0, -inf, -3.0, 7.0, -inf, 6.0, 8.0, 9.0])   # the median is -0.0, sign kept
    x[2] = torch.tensor([nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, nan])
    x[3, 4] = inf
    return [x]


def get_init_inputs():
    return []
"""


def test_medians_and_kthvalue_pick_pytorchs_value_and_position_around_nans(tmp_path):
    """Before, no kernel for kthvalue, median or nanmedian. A row's first NaN is its median; nanmedian and
    kthvalue look past NaNs (they sort above +inf); compared bit for bit. (Which of several equal values
    PyTorch's kthvalue and nanmedian name is its own choice: these rows have none at the answer.)"""
    expected, actual = _first_config_outputs(_write_problem(tmp_path, "median_special", MEDIAN_SPECIAL_VALUES),
                                             tmp_path)
    assert expected[1][:3].tolist() == [2, 0, 0] and expected[3][2].item() == 4
    assert str(expected[0][1].item()) == "-0.0"
    for e, a in zip(expected, actual):
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           e.view(torch.int32) if e.is_floating_point() else e)

MAX_POOL_INDICES_SPECIAL_VALUES = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x, y, values, at):
        top, top_at = F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)
        line, line_at = F.max_pool1d(y, 2, stride=1, padding=1, dilation=2, ceil_mode=True, return_indices=True)
        back = F.max_unpool2d(top, top_at, 3, stride=2, padding=1, output_size=x.shape[-2:])
        return top, top_at, line, line_at, back, F.max_unpool1d(values, at, 2)


def get_inputs():
    nan, inf = float("nan"), float("inf")
    x = torch.randn(1, 2, 7, 7).mul(2.0).round()  # whole numbers: ties, where the first position in window order wins
    x[0, 0, :3, :3] = -inf                # the corner window holds -inf alone (and padding): its first position inside
    x[0, 0, 3, 4] = x[0, 0, 4, 3] = nan   # two NaNs in the window around (4, 4): the later one wins
    x[0, 1] = torch.where(x[0, 1] > 0, 0.0, -0.0)   # signed zeros alone: the first of equal zeros, sign and all
    y = torch.tensor([[[3.0, -inf, 3.0, nan, 3.0, -0.0, 0.0, 0.0]]])
    values = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0]]])
    at = torch.tensor([[[4, 0, 4, 9, 0]]])   # positions named twice, with different values: the last one writes
    return [x, y, values, at]


def get_init_inputs():
    return []
"""


def test_max_pool_indices_and_unpooling_follow_pytorch_through_nans_ties_and_infinities(tmp_path):
    """Before, max pooling with return_indices=True and MaxUnpool were refused. PyTorch keeps a window's first
    position among equal values, its last NaN, and, in a window of -inf alone, its first position inside the input
    (padding never); MaxUnpool writes each value at its index, the last one in order where indices repeat (PyTorch's
    CPU kernel). Values compared bit for bit (-0.0 and NaN too), indices exactly."""
    path = _write_problem(tmp_path, "max_pool_indices_special", MAX_POOL_INDICES_SPECIAL_VALUES)
    # one thread: PyTorch's CPU unpooling of a channels-last-shaped input (one channel) writes positions in
    # parallel, so where indices repeat, which one writes last is a race unless it runs alone
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected, actual = _first_config_outputs(path, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert [a.dtype for a in actual] == [torch.float32, torch.int64] * 2 + [torch.float32] * 2
    # the inputs hold what they are meant to: a -inf corner, the later of two NaNs (4 * 7 + 3), ties, -0.0 first
    assert expected[1][0, 0, 0, 0] == 0 and expected[1][0, 0, 2, 2] == 31 and expected[1][0, 0, 1, 2] == 25
    assert expected[3][0, 0].tolist() == [1, 0, 3, 2, 3, 4, 5, 6] and str(expected[2][0, 0, 6].item()) == "-0.0"
    assert expected[5][0, 0].tolist() == [5.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 4.0]
    for e, a in zip(expected, actual):
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           e.view(torch.int32) if e.is_floating_point() else e)


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="records launches in the interpreter")
def test_max_pool_indices_and_unpooling_compile_for_sm_90(tmp_path, monkeypatch):
    """The positions kernels, the unpool's claim launch (an atomic max) and its scatter compile for an H200."""
    path = Path(__file__).resolve().parent / "subproblems" / "maxpool_unpool.py"
    specs = _launch_specs(path, generate_kernel(path, 0, TARGET).source, tmp_path, monkeypatch, "unpool")
    names = {name for _, name, *_ in specs}
    assert {"_pool_indices_kernel_0", "_unpool_kernel_2_claim", "_unpool_kernel_2"} <= names
    _assert_compiles(specs)


ADAPTIVE_MAX_POOL_INDICES = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(2, return_indices=True)

    def forward(self, x):
        return CALL


def get_inputs():
    return [torch.randn(1, 2, 7, 7)]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("call", ["self.pool(x)[1]", "F.adaptive_max_pool2d(x, 2, return_indices=True)[1]",
                                  "F.adaptive_max_pool1d_with_indices(x.flatten(2), 3)[1]"])
def test_adaptive_max_pool_indices_are_refused_by_name(call, tmp_path):
    source = ADAPTIVE_MAX_POOL_INDICES.replace("CALL", call)
    with pytest.raises(UnsupportedSubproblem, match="adaptive max pooling's indices are not written"):
        variant_count(_write_problem(tmp_path, "adaptive_max_pool_indices", source), TARGET)


def test_a_max_pool_s_pair_returned_as_it_is_is_its_values_and_indices(tmp_path):
    """`return self.pool(x)` of a MaxPool1d with return_indices=True: before, refused (the forward returned a
    (values, indices) pair, not tensors)."""
    source = ADAPTIVE_MAX_POOL_INDICES.replace("nn.AdaptiveMaxPool2d(2, return_indices=True)",
                                               "nn.MaxPool1d(3, stride=2, padding=1, return_indices=True)")
    source = source.replace("CALL", "self.pool(x.flatten(2))")
    expected, actual = _first_config_outputs(_write_problem(tmp_path, "max_pool_pair", source), tmp_path)
    assert [a.dtype for a in actual] == [torch.float32, torch.int64]
    for e, a in zip(expected, actual):
        assert torch.equal(a, e)


UNFOLD = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        return F.unfold(x, 2) * 2.0


def get_inputs():
    return [torch.randn(2, 3, 4, 5)]


def get_init_inputs():
    return []
"""


def test_tensor_unfold_is_refused_by_name_not_read_as_f_unfold(tmp_path):
    """Tensor.unfold (sliding windows along one dim) shares F.unfold's name, and its ints would pass for
    F.unfold's kernel size, dilation and padding."""
    assert variant_count(_write_problem(tmp_path, "unfold", UNFOLD), TARGET) >= 1
    source = UNFOLD.replace("F.unfold(x, 2)", "x.unfold(3, 2, 1)")
    with pytest.raises(UnsupportedSubproblem, match="Tensor.unfold"):
        variant_count(_write_problem(tmp_path, "unfold_method", source), TARGET)


EMBEDDING_BAG = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(20, 8, mode="sum")

    def forward(self, index, offsets):
        return self.bag(index.flatten(), offsets) * 2.0


def get_inputs():
    return [torch.randint(1, 20, (6, 5)), torch.tensor([0, 3, 4, 12])]


def get_init_inputs():
    return []
"""


EQUAL_BAGS = ("self.bag(index.flatten(), offsets)", "self.bag(index)")


@pytest.mark.parametrize("edits, message", [
    ([], "offsets"),
    ([EQUAL_BAGS], None),
    ([EQUAL_BAGS, ('mode="sum")', 'mode="sum", padding_idx=0)')], "padding_idx")])
def test_embedding_bags_of_varying_size_or_with_padding_are_refused_by_name(edits, message, tmp_path):
    """Equal bags (a 2-d input) get a kernel; offsets (bags of varying size) and padding_idx (its entries leave
    the mean's count) are refused with the reason."""
    source = EMBEDDING_BAG
    for old, new in edits:
        source = source.replace(old, new)
    path = _write_problem(tmp_path, "embedding_bag", source)
    if message is None:
        assert variant_count(path, TARGET) >= 1
        return
    with pytest.raises(UnsupportedSubproblem, match=message):
        variant_count(path, TARGET)


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="records launches in the interpreter")
@pytest.mark.parametrize("stem, kind", [("arg_reductions", "arg_reduce"), ("aranges", "arange"),
                                       ("sorts", "sort")])
def test_int64_writing_kernels_compile_for_sm_90(stem, kind, tmp_path, monkeypatch):
    """argmax/argmin's running (value, first position, first NaN) state, arange's int64 and fp32 numbers and
    a sort's int64 keys through tl.sort compile for an H200."""
    path = Path(__file__).resolve().parent / "subproblems" / f"{stem}.py"
    specs = _launch_specs(path, generate_kernel(path, 0, TARGET).source, tmp_path, monkeypatch, stem)
    assert any(f"_{kind}_kernel" in name for _, name, *_ in specs)
    _assert_compiles(specs)


ROUNDING_AND_SHUFFLE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.shuffle = nn.ChannelShuffle(3)

    def forward(self, x):
        halves = x * 2.0                                           # many exact halves: round goes to even
        y = torch.round(halves) + torch.trunc(halves) * 0.5 + torch.frac(halves) + halves.round() * 0.25
        return self.shuffle(y) + F.channel_shuffle(y, 2)


def get_inputs():
    x = torch.randn(2, 6, 4, 5).mul(4.0).round().div(4.0)          # quarters
    x[0, 0, 0, :3] = torch.tensor([-0.25, 0.25, -1.25])            # -0.5, 0.5, -2.5 after doubling
    return [x]


def get_init_inputs():
    return []
"""


def test_round_trunc_frac_and_channel_shuffle_match_pytorch(tmp_path):
    """round to even on exact halves, trunc and frac of negatives, nn.ChannelShuffle and F.channel_shuffle;
    before, no kernel."""
    assert_variant_matches(_write_problem(tmp_path, "round_shuffle", ROUNDING_AND_SHUFFLE), 0, tmp_path)


NAN_PROPAGATION = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x):
        return (torch.relu(x), F.relu6(x), F.hardtanh(x), x.clamp(-1.0, 1.0), x.clamp_min(0.0), x.clamp_max(0.0),
                F.hardsigmoid(x), F.hardswish(x), F.celu(x), F.threshold(x, 0.5, -2.0), F.softshrink(x),
                F.hardshrink(x), torch.maximum(x, x.flip(1)), torch.minimum(x, x.flip(1)), torch.fmax(x, x.flip(1)),
                x.amax(dim=1), x.amin(dim=0), x.max(dim=1).values, torch.sign(x), F.softplus(x), F.mish(x),
                F.max_pool1d(x.unsqueeze(0), 2), F.adaptive_max_pool1d(x.unsqueeze(0), 3),
                x.norm(p=float("inf"), dim=1))


def get_inputs():
    x = torch.randn(6, 8)
    x[0, 1] = x[2, 6] = x[5, 0] = float("nan")
    x[1, 3], x[3, 7] = float("inf"), float("-inf")
    return [x]


def get_init_inputs():
    return []
"""


def test_nan_propagates_through_max_min_clamps_and_relus_as_in_pytorch(tmp_path):
    """PyTorch's relu, clamps, maximum, amax and max pooling return NaN for a NaN; tl.maximum and tl.max skip
    it, so a problem whose forward makes NaNs (a log of negatives) failed the verifier's NaN-placement check."""
    path = _write_problem(tmp_path, "nan_propagation", NAN_PROPAGATION)
    expected, actual = _first_config_outputs(path, tmp_path)
    assert len(actual) == len(expected) == 24
    for i, (e, a) in enumerate(zip(expected, actual)):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, equal_nan=True, msg=f"output {i}")
    assert expected[0].isnan().sum() == 3 and expected[14].isnan().sum() == 0    # fmax: a NaN loses


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="records launches in the interpreter")
def test_nan_keeping_max_and_min_compile_for_sm_90(tmp_path, monkeypatch):
    """tl.reduce with a NaN-keeping combine (amax, amin) and tl.maximum(..., propagate_nan=ALL) compile."""
    path = _write_problem(tmp_path, "nan_propagation", NAN_PROPAGATION)
    specs = _launch_specs(path, generate_kernel(path, 0, TARGET).source, tmp_path, monkeypatch, "nan")
    assert len(specs) >= 3
    _assert_compiles(specs)


PRODUCT_OF_LONG_ROWS = _ROW_MODEL.replace("torch.randn(4, 16)", "torch.randn(4, 3000)").format(body="""
        return torch.prod(1.0 + 0.001 * x, dim=1)""")


def test_prod_is_right_in_every_variant_of_its_rows_kernel(tmp_path):
    """Single-block, looped and split rows: the split one multiplies per-program partial products."""
    _assert_all_variants_match(_write_problem(tmp_path, "prod_rows", PRODUCT_OF_LONG_ROWS), tmp_path)


SUMS_OF_LONG_ROWS = _ROW_MODEL.replace("torch.randn(4, 16)", "1.0 + 0.001 * torch.randn(8, 3000)").format(body="""
        return x.sum(dim=1), x.mean(dim=1)""")


def test_sums_and_means_of_long_rows_round_once_in_every_variant_of_their_rows_kernel(tmp_path):
    """Added in fp64 and rounded to fp32 at the end, a sum or a mean of values near 1 is the fp64 result
    rounded, bit for bit, in single-block, looped and split rows; added in fp32 (before), 3000 values put
    several ulps of error in some rows."""
    path = _write_problem(tmp_path, "sum_rows", SUMS_OF_LONG_ROWS)
    torch.manual_seed(1)
    x = 1.0 + 0.001 * torch.randn(8, 3000)
    rounded = (x.double().sum(dim=1).float(), x.double().mean(dim=1).float())
    count = variant_count(path, TARGET)
    assert count >= 3
    for variant in range(count):
        source = _save(generate_kernel(path, variant, TARGET).source, tmp_path, f"sums_v{variant}")
        actual = import_file(source, prefix="generated").ModelNew().to(DEVICE)(x.to(DEVICE))
        for expected, got in zip(rounded, actual):
            assert torch.equal(got.cpu(), expected), f"variant {variant}: off by {(got.cpu() - expected).abs().max()}"


TRIANGLES_OF_DATA = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        scores = x @ x.transpose(-1, -2)                                     # [2, 5, 5]
        y = y.masked_fill(y > 1.5, float("nan"))                             # a NaN cut off reads 0
        return torch.tril(scores).sum(0) + scores.triu(2)[0], y.tril(-1) - torch.triu(y, diagonal=3)


def get_inputs():
    return [torch.randn(2, 5, 7), torch.randn(3, 4, 6)]


def get_init_inputs():
    return []
"""


def test_tril_and_triu_of_computed_tensors_match_pytorch(tmp_path):
    """Before, only tril/triu of ones_like (an attention mask) had a kernel."""
    expected, actual = _first_config_outputs(_write_problem(tmp_path, "triangles", TRIANGLES_OF_DATA), tmp_path)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4, equal_nan=True)


ARANGE_OF_A_SIZE = _ROW_MODEL.format(body="""
        return x * torch.arange(x.shape[-1], device=x.device)""")


def test_an_arange_as_long_as_a_size_that_differs_between_configs_is_refused_by_name(tmp_path):
    """Its kernel writes a length fixed when it is generated; a config of another length would read past it."""
    path = _write_problem(tmp_path, "arange_sizes", _with_configs(ARANGE_OF_A_SIZE, [([], (4, 16)), ([], (4, 8))]))
    with pytest.raises(UnsupportedSubproblem, match="torch.arange read by a kernel, with bounds the forward"):
        generate_kernel(path, 0, TARGET)


HYPOT_AND_NAN_TO_NUM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        near_zero = y.clamp(-0.5, 0.5).round()                    # -0.0 where y < 0: x / -0.0 is -inf
        return (torch.hypot(x, y), torch.hypot(x * 1e20, y * 1e20), torch.hypot(x * 1e-25, y * 1e-25),
                torch.nan_to_num(x.log()), torch.nan_to_num(x / near_zero, nan=0.5, posinf=2.0),
                x.log().nan_to_num(neginf=-7.0))


def get_inputs():
    x, y = torch.randn(4, 16), torch.randn(4, 16)
    x[0, :4] = torch.tensor([float("inf"), float("nan"), 0.0, -float("inf")])
    y[0, :4] = torch.tensor([float("nan"), float("inf"), 0.0, 3.0])
    return [x, y]


def get_init_inputs():
    return []
"""


def test_hypot_nan_to_num_and_the_sign_of_a_rounded_zero_match_pytorch(tmp_path):
    """hypot without overflow or underflow, an infinity beating a NaN; nan_to_num's defaults (fp32's largest
    numbers); round(-0.3) is -0.0, whose reciprocal is -inf. Before, no kernel for hypot or nan_to_num."""
    path = _write_problem(tmp_path, "hypot_nan_to_num", HYPOT_AND_NAN_TO_NUM)
    expected, actual = _first_config_outputs(path, tmp_path)
    for i, (e, a) in enumerate(zip(expected, actual)):
        torch.testing.assert_close(a, e, atol=0.0, rtol=1e-6, equal_nan=True, msg=f"output {i}")
