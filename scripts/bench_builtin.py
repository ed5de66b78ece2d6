"""Benchmark the builtin Triton generator on a GPU: correctness, time against torch.compile, roofline fraction.

    PYTHONPATH=. python3 scripts/bench_builtin.py --out results.json
    PYTHONPATH=. python3 scripts/bench_builtin.py --out results.json --cases gemm_bias_gelu softmax
    PYTHONPATH=. python3 scripts/bench_builtin.py --out checks.json --check tests/subproblems/*.py

Each suite case is a KernelBench-form problem at a KernelBench-like size. For every generator variant the
script measures its error and eager's against the reference module run in fp64, checks the output
against the eager reference as the verifier does (fp32, TF32 off, atol=rtol=1e-4, atol grown by
EAGER_ERROR_SLACK times eager's error), and times it the way the verifier does (`verify.timing.time_forward`:
CUDA events, 10 warm-ups, 100 timed runs or at least 20 adding up to 1 s, L2 flushed before each, every
stream joined, median); the errors recorded are the first input config's. The fastest correct variant
and torch.compile(Model) are then timed again in alternating rounds (PAIRED_ROUNDS), and each side's time
is the median of its round medians: timings drift by several percent over a run, and alternating puts that
drift on both sides alike. The roofline floor of a case is the H200's in mkevolve/gpu_peaks.py, max(FLOPs / 67 TFLOP/s,
bytes / 4.3 TB/s), with FLOPs and the minimum bytes (every input and parameter read once, every output
written once) counted by hand per case.
`--check` instead verifies every variant of the given problem files, without timing.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import math
import statistics
import sys
import tempfile
import textwrap
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

import torch
import triton

from mkevolve.builtin.kernels import (
    GeneratedKernel,
    UnsupportedSubproblem,
    emit_conv,
    generate_kernel,
    variant_count,
)
from mkevolve.config import EAGER_ERROR_SLACK, TOLERANCE
from mkevolve.gpu_peaks import H200
from mkevolve.problem import fp32_strict, import_file, load_problem
from mkevolve.verify.reference import largest_error
from mkevolve.verify.result import Timing
from mkevolve.verify.timing import TIMED_RUNS, WARMUP_RUNS, time_forward

PAIRED_ROUNDS = 5


@dataclass(frozen=True)
class Case:
    name: str
    source: str            # KernelBench-form problem
    flops: float
    min_bytes: float


def _problem(body: str, inputs: str, init: str) -> str:
    return textwrap.dedent(f'''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        {textwrap.indent(textwrap.dedent(body), "        ").strip()}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return {init}
        ''').lstrip()


def _cases() -> list[Case]:
    f32 = 4
    cases = []
    m = n = k = 4096
    cases.append(Case("gemm_bias_gelu", _problem('''
        class Model(nn.Module):
            def __init__(self, in_features, out_features):
                super().__init__()
                self.fc = nn.Linear(in_features, out_features)

            def forward(self, x):
                return F.gelu(self.fc(x))
        ''', f"[torch.randn({m}, {k})]", f"[{k}, {n}]"), 2 * m * n * k, f32 * (m * k + k * n + n + m * n)))
    b, s = 32, 1024
    cases.append(Case("bmm", _problem('''
        class Model(nn.Module):
            def forward(self, a, b):
                return torch.bmm(a, b)
        ''', f"[torch.randn({b}, {s}, {s}), torch.randn({b}, {s}, {s})]", "[]"), 2 * b * s ** 3, f32 * 3 * b * s * s))
    shape = (128, 4096, 4096)
    numel = math.prod(shape)
    cases.append(Case("pointwise_chain", _problem('''
        class Model(nn.Module):
            def __init__(self, features):
                super().__init__()
                self.scale = nn.Parameter(torch.rand(features) + 0.5)
                self.shift = nn.Parameter(torch.randn(features))

            def forward(self, x):
                y = F.gelu(x * self.scale + self.shift, approximate="tanh")
                return torch.clamp(y, -1.0, 1.0) + torch.sigmoid(x)
        ''', f"[torch.randn{shape}]", f"[{shape[-1]}]"), 30 * numel, f32 * (2 * numel + 2 * shape[-1])))
    rows, cols = 128, 32768
    cases.append(Case("softmax", _problem('''
        class Model(nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=1)
        ''', f"[torch.randn({rows}, {cols})]", "[]"), 5 * rows * cols, f32 * 2 * rows * cols))
    rows, cols = 16384, 4096
    cases.append(Case("layernorm", _problem('''
        class Model(nn.Module):
            def __init__(self, features):
                super().__init__()
                self.ln = nn.LayerNorm(features)

            def forward(self, x):
                return self.ln(x)
        ''', f"[torch.randn({rows}, {cols})]", f"[{cols}]"), 8 * rows * cols, f32 * (2 * rows * cols + 2 * cols)))
    shape = (16, 64, 256, 256)
    numel = math.prod(shape)
    cases.append(Case("layernorm_kernelbench", _problem('''
        class Model(nn.Module):
            def __init__(self, normalized_shape):
                super().__init__()
                self.ln = nn.LayerNorm(normalized_shape)

            def forward(self, x):
                return self.ln(x)
        ''', f"[torch.randn{shape}]", f"[{shape[1:]}]"), 8 * numel, f32 * (2 * numel + 2 * numel // shape[0])))
    cases.append(Case("rmsnorm_channels", _problem('''
        class Model(nn.Module):
            def __init__(self, eps):
                super().__init__()
                self.eps = eps

            def forward(self, x):
                rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
                return x / rms
        ''', f"[torch.randn{shape}]", "[1e-5]"), 4 * numel, f32 * 2 * numel))
    n_, c, hw, co = 32, 64, 56, 64
    out = n_ * co * hw * hw
    cases.append(Case("conv2d_3x3_bias_relu", _problem('''
        class Model(nn.Module):
            def __init__(self, in_channels, out_channels):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

            def forward(self, x):
                return torch.relu(self.conv(x))
        ''', f"[torch.randn({n_}, {c}, {hw}, {hw})]", f"[{c}, {co}]"),
        2 * out * c * 9, f32 * (n_ * c * hw * hw + co * c * 9 + co + out)))
    # level2/23's tail: a mean over a GroupNorm's whole groups, reduced with each group in the normalizing kernel
    shape = (128, 24, 22, 30, 30)
    numel = math.prod(shape)
    cases.append(Case("groupnorm_mean__23", _problem('''
        class Model(nn.Module):
            def __init__(self, groups, channels):
                super().__init__()
                self.gn = nn.GroupNorm(groups, channels)

            def forward(self, x):
                return self.gn(x).mean(dim=[1, 2, 3, 4])
        ''', f"[torch.randn{shape}]", f"[8, {shape[1]}]"), 8 * numel, f32 * (numel + 2 * shape[1] + shape[0])))
    # causal self-attention at a GPT-2 small layer's size: (batch, heads, sequence, head dim)
    b, h, t, d = 16, 12, 1024, 64
    cases.append(Case("causal_attention", _problem('''
        class Model(nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ''', f"[torch.randn({b}, {h}, {t}, {d}) for _ in range(3)]", "[]"),
        2 * 2 * b * h * t * t * d / 2, 4 * 4 * b * h * t * d))
    cases += _kernelbench_conv_cases()
    return cases + _data_movement_cases() + _skinny_gemm_cases() + _recurrent_cases()


def _conv_case(name: str, layer: str, x_shape: tuple[int, ...], out_shape: tuple[int, ...],
               macs_per_output: int, weight_numel: int) -> Case:
    """A convolution layer alone at a KernelBench level 2 size and on KernelBench's inputs, uniform in
    [0, 1): FLOPs = 2 x outputs x MACs per output (for a transposed convolution, the MACs its gather form
    does on average: C_in x taps / stride^d)."""
    outputs, inputs = math.prod(out_shape), math.prod(x_shape)
    return Case(name, _problem(f'''
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = {layer}

            def forward(self, x):
                return self.conv(x)
        ''', f"[torch.rand{x_shape}]", "[]"),
        2 * outputs * macs_per_output, 4 * (inputs + weight_numel + out_shape[1] + outputs))


def _kernelbench_conv_cases() -> list[Case]:
    """The convolution of each convolution-family problem in the shared KernelBench level 2 sample, at
    its size (the problem numbers are in the names)."""
    return [
        _conv_case("conv2d_64_128_k3__31_35", "nn.Conv2d(64, 128, 3)", (128, 64, 128, 128),
                   (128, 128, 126, 126), 64 * 9, 128 * 64 * 9),
        _conv_case("conv2d_8_64_k3__67_87", "nn.Conv2d(8, 64, 3)", (128, 8, 256, 256),
                   (128, 64, 254, 254), 8 * 9, 64 * 8 * 9),
        _conv_case("conv3d_3_16_k3__83", "nn.Conv3d(3, 16, 3)", (128, 3, 16, 64, 64),
                   (128, 16, 14, 62, 62), 3 * 27, 16 * 3 * 27),
        _conv_case("conv3d_8_32_k3__7", "nn.Conv3d(8, 32, 3)", (64, 8, 32, 64, 64),
                   (64, 32, 30, 62, 62), 8 * 27, 32 * 8 * 27),
        _conv_case("conv3d_3_24_k3__23", "nn.Conv3d(3, 24, 3)", (128, 3, 24, 32, 32),
                   (128, 24, 22, 30, 30), 3 * 27, 24 * 3 * 27),
        _conv_case("conv3d_3_16_k4__27", "nn.Conv3d(3, 16, 4)", (1024, 3, 16, 32, 32),
                   (1024, 16, 13, 29, 29), 3 * 64, 16 * 3 * 64),
        _conv_case("conv3d_32_64_k3p1__43", "nn.Conv3d(32, 64, 3, padding=1)", (4, 32, 32, 128, 128),
                   (4, 64, 32, 128, 128), 32 * 27, 64 * 32 * 27),
        _conv_case("convT2d_64_128_k4s2__91", "nn.ConvTranspose2d(64, 128, 4, stride=2, padding=1, "
                   "output_padding=1)", (128, 64, 64, 64), (128, 128, 129, 129), 64 * 16 // 4, 64 * 128 * 16),
        _conv_case("convT3d_32_64_k3s2__3", "nn.ConvTranspose3d(32, 64, 3, stride=2, padding=1, "
                   "output_padding=1)", (32, 32, 16, 32, 32), (32, 64, 32, 64, 64), 32 * 27 // 8,
                   32 * 64 * 27),
        _conv_case("convT2d_64_128_k5__11", "nn.ConvTranspose2d(64, 128, 5, padding=1)", (512, 64, 32, 32),
                   (512, 128, 34, 34), 64 * 25, 64 * 128 * 25),
    ]


def _movement_case(name: str, forward: str, x_shape: tuple[int, ...], out_numel: int,
                   flops_per_output: int = 1) -> Case:
    """A copy that moves or combines elements (padding, resampling, reordering, scans): memory-bound, so
    its floor is one read of the input and one write of the output."""
    return Case(name, _problem(f'''
        class Model(nn.Module):
            def forward(self, x):
                return {forward}
        ''', f"[torch.randn{x_shape}]", "[]"),
        flops_per_output * out_numel, 4 * (math.prod(x_shape) + out_numel))


def _data_movement_cases() -> list[Case]:
    """The pad, resize, reindex and scan kernel kinds on 512 MB fp32 tensors."""
    image = (32, 64, 256, 256)
    numel = math.prod(image)
    return [
        _movement_case("pad_reflect2d", 'F.pad(x, (3, 3, 3, 3), mode="reflect")', image, 32 * 64 * 262 * 262),
        _movement_case("pad_constant_crop", "F.pad(x, (2, -2, 1, 1), value=-1.0)", image, 32 * 64 * 258 * 256),
        _movement_case("upsample_bilinear_x2", 'F.interpolate(x, scale_factor=2, mode="bilinear")',
                       (32, 64, 128, 128), numel, 8),
        _movement_case("upsample_nearest_x2", 'F.interpolate(x, scale_factor=2, mode="nearest")',
                       (32, 64, 128, 128), numel),
        _movement_case("flip_hw", "torch.flip(x, dims=(2, 3))", image, numel),
        _movement_case("roll_w", "torch.roll(x, shifts=5, dims=3)", image, numel),
        _movement_case("pixel_shuffle_2", "F.pixel_shuffle(x, 2)", (32, 256, 128, 128), numel),
        _movement_case("cumsum_last", "torch.cumsum(x, dim=1)", (32768, 4096), 32768 * 4096),
        _movement_case("cumsum_middle", "torch.cumsum(x, dim=1)", (64, 4096, 512), 64 * 4096 * 512),
    ]


def _skinny_gemm_cases() -> list[Case]:
    """Small batches through wide layers: few output tiles and a long K, where the split-K variant splits K.
    (rows M, K, columns N): a ConvolutionalVisionTransformer's projection (level3/32), a decode step's layer,
    a ResNet classifier head (level3/9), a batch of 32 through a wide layer."""
    cases = []
    for name, (m, k, n) in {"linear_10x8192x128": (10, 8192, 128), "linear_gelu_1x4096x4096": (1, 4096, 4096),
                            "linear_2x512x1000": (2, 512, 1000), "linear_32x16384x1024": (32, 16384, 1024)}.items():
        gelu = "gelu" in name
        cases.append(Case(name, _problem(f'''
            class Model(nn.Module):
                def __init__(self, in_features, out_features):
                    super().__init__()
                    self.fc = nn.Linear(in_features, out_features)

                def forward(self, x):
                    return {"F.gelu(self.fc(x))" if gelu else "self.fc(x)"}
            ''', f"[torch.randn({m}, {k})]", f"[{k}, {n}]"), 2 * m * n * k, 4 * (m * k + k * n + n + m * n)))
    return cases


def _recurrent_cases() -> list[Case]:
    """KernelBench level 3's recurrent layers at its sizes (35_LTSMs, 39_GRU, 41_GRUBidirectional): 6 layers of
    hidden size 256 over 512 steps of a batch of 10, input size 128. FLOPs: every layer's input GEMM and its
    steps' h W_hh^T; bytes: the input, the weights and the output once."""
    cases = []
    batch, steps, features, hidden, layers = 10, 512, 128, 256, 6
    # positional: bias, batch_first, dropout, bidirectional
    for name, layer, gates, directions in (("lstm_6x256", "nn.LSTM", 4, 1), ("gru_6x256", "nn.GRU", 3, 1),
                                           ("gru_bidirectional_6x256", "nn.GRU", 3, 2)):
        inputs = [features] + [hidden * directions] * (layers - 1)
        weights = sum(gates * hidden * (i + hidden + 2) for i in inputs) * directions
        flops = 2 * steps * batch * gates * hidden * directions * sum(i + hidden for i in inputs)
        cases.append(Case(name, _problem(f'''
            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = {layer}({features}, {hidden}, {layers}, True, True, 0.0, {directions == 2})

                def forward(self, x):
                    return self.rnn(x)[0]
            ''', f"[torch.randn({batch}, {steps}, {features})]", "[]"),
            flops, 4 * (batch * steps * (features + hidden * directions) + weights)))
    return cases


@dataclass
class VariantResult:
    variant: int
    precision: str
    description: str
    correct: bool
    max_abs_err: float | None = None
    time: Timing | None = None
    error: str | None = None
    error_vs_fp64: float | None = None         # max |output - the reference run in fp64|, first input config
    eager_error_vs_fp64: float | None = None   # the same for the eager fp32 reference: the error to stay within


@dataclass
class CaseResult:
    name: str
    flops: float
    min_bytes: float
    floor_ms: float
    variants: list[VariantResult] = field(default_factory=list)
    best_variant: int | None = None
    candidate_ms: float | None = None
    compile_ms: float | None = None
    speedup_vs_compile: float | None = None
    roofline_fraction: float | None = None
    compile_roofline_fraction: float | None = None
    rounds_ms: list[tuple[float, float]] = field(default_factory=list)   # (ours, compile) median per round
    error: str | None = None


def _instantiate(problem_path: Path, config_index: int = 0, eval_mode: bool = False):
    """Reference model and inputs with the verifier's seeds (0, 1), but drawn directly on the GPU rather than
    on the CPU and moved (problem.build_model, make_inputs), since some inputs here are gigabytes."""
    problem = load_problem(problem_path)
    config = problem.configs[config_index]
    init = config.get_init_inputs()
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = problem.model_cls(*init)
        torch.manual_seed(1)
        inputs = config.get_inputs()
    return problem, init, model.train(not eval_mode), inputs


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _compare(expected, actual, slack: float) -> tuple[bool, float]:
    """allclose at the verifier's tolerance, its atol grown by `slack` (EAGER_ERROR_SLACK x eager's error)."""
    expected, actual = _outputs(expected), _outputs(actual)
    if len(expected) != len(actual):
        return False, float("inf")
    worst, ok = 0.0, True
    for e, a in zip(expected, actual):
        if e.shape != a.shape or e.dtype != a.dtype:
            return False, float("inf")
        worst = max(worst, (e - a).abs().max().item() if e.numel() else 0.0)
        ok = ok and torch.allclose(a, e, atol=TOLERANCE + slack, rtol=TOLERANCE)
    return ok, worst


def _errors_vs_fp64(reference: torch.nn.Module, inputs: list, expected, actual) -> tuple[float, float]:
    """(eager's, the candidate's) largest absolute error against the reference module run in fp64."""
    reference64 = copy.deepcopy(reference).double()
    inputs64 = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    with torch.no_grad():
        exact = _outputs(reference64(*inputs64))
    del reference64, inputs64

    return largest_error(_outputs(expected), exact), largest_error(_outputs(actual), exact)


def _build(module, init: list, eval_mode: bool = False) -> torch.nn.Module:
    with torch.device("cuda"):
        torch.manual_seed(0)
        return module.ModelNew(*init).train(not eval_mode)


def _paired_medians(ours, theirs) -> list[tuple[float, float]]:
    """Median times of `ours` and `theirs` over alternating rounds, so drift over the run falls on both."""
    return [(time_forward(ours).median_ms, time_forward(theirs).median_ms) for _ in range(PAIRED_ROUNDS)]


@functools.cache
def _import_variant(problem_path: Path, variant: int, workdir: Path) -> tuple[GeneratedKernel, ModuleType]:
    """Each variant is imported once, so the config its autotuner picked while checked is the one timed later."""
    generated = generate_kernel(problem_path, variant, target="cuda")
    source_path = workdir / f"{problem_path.stem}_v{variant}.py"
    source_path.write_text(generated.source)
    return generated, import_file(source_path, prefix="bench_candidate")


def check_variant(problem_path: Path, variant: int, workdir: Path, with_timing: bool,
                  eval_mode: bool = False) -> VariantResult:
    generated, module = _import_variant(problem_path, variant, workdir)
    result = VariantResult(variant, generated.precision, generated.description, correct=False)
    problem = load_problem(problem_path)
    for config_index, config in enumerate(problem.configs):
        _, init, reference, inputs = _instantiate(problem_path, config_index, eval_mode)
        candidate = _build(module, init, eval_mode)
        with torch.no_grad():
            expected = reference(*inputs)
            actual = candidate(*inputs)
        torch.cuda.synchronize()
        eager_error, error = _errors_vs_fp64(reference, inputs, expected, actual)
        ok, err = _compare(expected, actual, EAGER_ERROR_SLACK * eager_error)
        result.max_abs_err = max(result.max_abs_err or 0.0, err)
        if config_index == 0:
            result.eager_error_vs_fp64, result.error_vs_fp64 = eager_error, error
        if not ok:
            return result
        if with_timing and config_index == 0:
            del expected, actual
            result.time = time_forward(lambda: candidate(*inputs))
    result.correct = True
    return result


def run_case(case: Case, workdir: Path, variants: str) -> CaseResult:
    floor_ms = 1e3 * H200.floor_s(case.flops, case.min_bytes)
    result = CaseResult(case.name, case.flops, case.min_bytes, floor_ms)
    path = workdir / f"{case.name}.py"
    path.write_text(case.source)
    try:
        count = variant_count(path, target="cuda")
    except UnsupportedSubproblem as err:
        result.error = f"unsupported: {err}"
        return result
    for variant in range(count) if variants == "all" else [int(variants)]:
        try:
            outcome = check_variant(path, variant, workdir, with_timing=True)
        except Exception:  # noqa: BLE001 - one failing variant is a result to record, not the end of the run
            outcome = VariantResult(variant, "", "", correct=False, error=traceback.format_exc(limit=4))
        result.variants.append(outcome)
        torch.cuda.empty_cache()
        print(f"  {case.name} variant {variant}: "
              + (f"{outcome.time.median_ms:.4f} ms, error vs fp64 {outcome.error_vs_fp64:.3g} (eager "
                 f"{outcome.eager_error_vs_fp64:.3g}) {outcome.description}" if outcome.correct
                 else f"FAILED {outcome.error or ''}"
                 f" max_abs_err={outcome.max_abs_err}"), flush=True)
    timed = [v for v in result.variants if v.correct and v.time is not None]
    if not timed:
        result.error = result.error or "no correct variant"
        return result
    best = min(timed, key=lambda v: v.time.median_ms)
    result.best_variant = best.variant
    _, init, reference, inputs = _instantiate(path)
    candidate = _build(_import_variant(path, best.variant, workdir)[1], init)
    compiled = torch.compile(reference)
    result.rounds_ms = _paired_medians(lambda: candidate(*inputs), lambda: compiled(*inputs))
    result.candidate_ms = statistics.median(ours for ours, _ in result.rounds_ms)
    result.compile_ms = statistics.median(theirs for _, theirs in result.rounds_ms)
    result.speedup_vs_compile = result.compile_ms / result.candidate_ms
    result.roofline_fraction = floor_ms / result.candidate_ms
    result.compile_roofline_fraction = floor_ms / result.compile_ms
    return result


def run_checks(paths: list[Path], workdir: Path, variants: str, eval_mode: bool) -> list[dict]:
    checks = []
    for path in paths:
        try:
            count = variant_count(path, target="cuda")
        except UnsupportedSubproblem as err:
            checks.append({"problem": str(path), "unsupported": str(err)})
            print(f"{path}: unsupported ({err})")
            continue
        for variant in range(count) if variants == "all" else [int(variants)]:
            try:
                outcome = check_variant(path, variant, workdir, with_timing=False, eval_mode=eval_mode)
            except Exception:  # noqa: BLE001 - recorded per variant
                outcome = VariantResult(variant, "", "", correct=False, error=traceback.format_exc(limit=4))
            checks.append({"problem": str(path), **asdict(outcome)})
            status = "ok" if outcome.correct else f"FAILED max_abs_err={outcome.max_abs_err} {outcome.error or ''}"
            print(f"{path} variant {variant}: {status}", flush=True)
            torch.cuda.empty_cache()
    return checks


def _print_table(results: list[CaseResult]) -> None:
    header = f"{'case':<24}{'var':>4}{'ours ms':>11}{'compile ms':>12}{'speedup':>9}{'roof ours':>11}{'roof comp':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        if r.candidate_ms is None:
            print(f"{r.name:<24}  {r.error}")
            continue
        print(f"{r.name:<24}{r.best_variant:>4}{r.candidate_ms:>11.4f}{r.compile_ms:>12.4f}"
              f"{r.speedup_vs_compile:>8.2f}x{r.roofline_fraction:>11.1%}{r.compile_roofline_fraction:>11.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    parser.add_argument("--cases", nargs="*", help="suite cases to run (default: all)")
    parser.add_argument("--variants", default="all", help="'all' or one variant index")
    parser.add_argument("--check", nargs="*", type=Path, help="verify these problem files instead of the suite")
    parser.add_argument("--unroll-limit", type=int, help="generate outer-product convolutions with this many "
                        "(tap, channel) steps unrolled at most (emit_conv._MAX_UNROLLED_STEPS) instead of the default")
    parser.add_argument("--eval", action="store_true", help="with --check: compare in eval mode (dropout off, "
                                                            "BatchNorm running statistics)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_builtin.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                 "on a CPU, run tests/test_builtin_kernels.py instead")
    fp32_strict()
    if args.unroll_limit is not None:
        emit_conv._MAX_UNROLLED_STEPS = args.unroll_limit
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "cuda": torch.version.cuda,
              "peaks": {"fp32_flops": H200.fp32_flops_per_s, "bytes_per_s": H200.bytes_per_s},
              "timing": {"warmup": WARMUP_RUNS, "runs": TIMED_RUNS, "how": "verify.timing.time_forward",
                         "paired_rounds": PAIRED_ROUNDS},
              "outer_product_unroll_limit": emit_conv._MAX_UNROLLED_STEPS}
    with tempfile.TemporaryDirectory(prefix="bench_builtin_") as tmp:
        workdir = Path(tmp)
        if args.check:
            report["checks"] = run_checks(args.check, workdir, args.variants, args.eval)
        else:
            cases = [c for c in _cases() if not args.cases or c.name in args.cases]
            results = []
            for case in cases:
                print(f"{case.name}:", flush=True)
                results.append(run_case(case, workdir, args.variants))
                report["cases"] = [asdict(r) for r in results]
                # written after every case, so a run stopped part-way keeps what it measured
                Path(args.out).write_text(json.dumps(report, indent=2))
            _print_table(results)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
