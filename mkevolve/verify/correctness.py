"""The kernel evaluation job, run inside a worker: correctness trials, runtime cheating checks, timing."""

from __future__ import annotations

import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mkevolve.problem import (Problem, ProblemError, build_model, call_inputs, check_reference,
                              clone_values, flatten_outputs, import_file, load_problem, make_inputs)
from mkevolve.verify.cheating import RuntimeGuard, Rule, Violation, dot_precision, output_violations
from mkevolve.verify.result import EvalResult, Status, Timing
from mkevolve.verify.timing import baseline_key, cached_baseline, combine, default_cache_dir, time_forward

ATOL = RTOL = 1e-4

_checked_references: set[tuple[str, bool]] = set()


@dataclass(frozen=True)
class KernelEvalRequest:
    problem_path: str
    solution_path: str
    trials: int = 5
    seed: int = 0
    eval_mode: bool = False
    timed: bool = True
    baseline_cache_dir: str | None = None
    trusted_files: tuple[str, ...] = ()   # PyTorch alternatives a composite declares; torch may run there


class Rejected(Exception):
    """Stops an evaluation with a verdict; raised inside the job, turned into an EvalResult."""

    def __init__(self, status: Status, reason: str, line: int | None = None, rule: str | None = None):
        super().__init__(reason)
        self.status, self.reason, self.line, self.rule = status, reason, line, rule


@dataclass
class _Errors:
    max_abs: float = 0.0
    max_rel: float = 0.0
    failed_trial: int | None = None
    failure: str = ""
    phases: dict[str, float] = field(default_factory=dict)


@contextmanager
def _phase(errors: _Errors, name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        errors.phases[name] = errors.phases.get(name, 0.0) + time.perf_counter() - start


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def fp32_strict() -> None:
    """The reference is fp32 with TF32 off, for both matmul and cuDNN."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def evaluate_kernel(request: KernelEvalRequest) -> EvalResult:
    """The whole check of one ModelNew against one problem; never raises for a bad candidate."""
    fp32_strict()
    errors = _Errors()
    try:
        with _phase(errors, "load"):
            problem = _load_checked_problem(request)
            solution_cls = _load_solution(request.solution_path)
        result = _run_checks(problem, solution_cls, request, errors)
    except Rejected as stop:
        result = EvalResult(status=stop.status, reason=stop.reason, line=stop.line, rule=stop.rule)
    if errors.failed_trial is not None or errors.max_abs:
        result.max_abs_err, result.max_rel_err = errors.max_abs, errors.max_rel
        result.failed_trial = errors.failed_trial
    result.phases = errors.phases
    return result


def _load_checked_problem(request: KernelEvalRequest) -> Problem:
    try:
        problem = load_problem(request.problem_path)
        key = (problem.source_hash, request.eval_mode)
        if key not in _checked_references:
            check_reference(problem, device(), request.eval_mode, request.seed)
            _checked_references.add(key)
    except ProblemError as err:
        raise Rejected(Status.BAD_PROBLEM, str(err)) from None
    return problem


def _load_solution(path: str) -> type:
    try:
        module = import_file(path, prefix="mkevolve_solution")
    except ProblemError as err:
        raise Rejected(Status.COMPILE_ERROR, err.reason) from None
    cls = getattr(module, "ModelNew", None)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise Rejected(Status.COMPILE_ERROR, "the solution defines no ModelNew(nn.Module) class")
    return cls


def _run_checks(problem: Problem, solution_cls: type, request: KernelEvalRequest,
                errors: _Errors) -> EvalResult:
    launches, timings, baselines = 0, [], []
    for index, config in enumerate(problem.configs):
        init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
        reference = build_model(problem.path, problem.model_cls, init, request.seed, device(),
                                request.eval_mode)
        candidate = _build_candidate(request, solution_cls, init)
        with _phase(errors, "correctness"):
            launches = max(launches, _trials(problem, index, reference, candidate, request, errors))
        if errors.failed_trial is not None:
            return EvalResult(status=Status.INCORRECT, reason=errors.failure,
                              trials=request.trials, launches=launches)
        if request.timed and device().type == "cuda":
            inputs = make_inputs(problem.path, config, request.seed + 1, device())
            with _phase(errors, "timing"):
                timings.append(time_forward(lambda: candidate(*inputs)))
            with _phase(errors, "baseline"):
                baselines.append(_baseline(problem, reference, inputs, request))
    return _accepted(request, launches, timings, baselines)


def _accepted(request, launches, timings: list[Timing], baselines: list[Timing]) -> EvalResult:
    result = EvalResult(status=Status.OK, trials=request.trials, launches=launches,
                        precision=dot_precision(Path(request.solution_path).read_text()))
    if timings:
        result.runtime, result.baseline = combine(timings), combine(baselines)
        result.speedup = result.baseline.median_ms / result.runtime.median_ms
    return result


def _build_candidate(request: KernelEvalRequest, solution_cls: type, init: list) -> torch.nn.Module:
    try:
        return build_model(Path(request.solution_path), solution_cls, init, request.seed, device(),
                           request.eval_mode, what="ModelNew")
    except ProblemError as err:
        raise Rejected(Status.RUNTIME_ERROR, err.reason, _solution_line(request.solution_path)) from None


def _trials(problem: Problem, config_index: int, reference, candidate, request: KernelEvalRequest,
            errors: _Errors) -> int:
    """Run every trial on the same two models; returns the Triton launches of one forward."""
    launches = 0
    for trial in range(request.trials):
        seed = request.seed + 1 + 1000 * config_index + trial
        inputs = make_inputs(problem.path, problem.configs[config_index], seed, device())
        with torch.no_grad():
            expected = flatten_outputs(reference(*clone_values(inputs)))
            candidate_inputs = clone_values(inputs)
            guard = RuntimeGuard(solution_file=request.solution_path, trusted_files=request.trusted_files)
            actual = _guarded_forward(candidate, candidate_inputs, guard, request.solution_path)
        launches = max(launches, guard.launches)
        _raise_violations(guard.violations + _launch_violations(guard)
                          + output_violations(actual, candidate_inputs))
        mismatch = _compare(expected, actual, errors)
        if mismatch:
            errors.failed_trial = trial
            errors.failure = f"trial {trial}{_config_label(problem, config_index)}: {mismatch}"
            break
    return launches


def _config_label(problem: Problem, index: int) -> str:
    return f" (input config {index})" if len(problem.configs) > 1 else ""


def _guarded_forward(candidate, inputs: list, guard: RuntimeGuard, solution_path: str) -> list:
    try:
        with guard:
            out = candidate(*inputs)
            if device().type == "cuda":
                torch.cuda.synchronize()
    except Exception as err:
        status = Status.COMPILE_ERROR if _is_compile_error(err) else Status.RUNTIME_ERROR
        raise Rejected(status, f"{type(err).__name__}: {_first_line(err)}",
                       _solution_line(solution_path, err)) from None
    return flatten_outputs(out)


def _launch_violations(guard: RuntimeGuard) -> list[Violation]:
    if guard.launches or any(v.rule is Rule.NO_LAUNCH for v in guard.violations):
        return []
    return [Violation(Rule.NO_LAUNCH, "forward launched no Triton kernel; the work must run in "
                                      "@triton.jit kernels launched from forward")]


def _raise_violations(violations: list[Violation]) -> None:
    if violations:
        first = violations[0]
        raise Rejected(Status.CHEATING, first.describe(), first.line, first.rule.value)


_COMPILE_TIME_ERRORS = ("NameError", "SyntaxError", "AttributeError", "TypeError", "CompilationError",
                        "UnsupportedLanguageConstruct")


def _is_compile_error(err: Exception) -> bool:
    """Triton's compiler errors, and their interpreter equivalents (which wrap the same mistakes)."""
    name, module = type(err).__name__, type(err).__module__
    if module.startswith("triton.compiler") or name in {"CompilationError", "CompileTimeAssertionFailure"}:
        return True
    return name == "InterpreterError" and any(kind in str(err) for kind in _COMPILE_TIME_ERRORS)


def _first_line(err: Exception, limit: int = 400) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return (lines[0] if lines else type(err).__name__)[:limit]


def _solution_line(solution_path: str, err: Exception | None = None) -> int | None:
    """The deepest line of the solution file in the traceback of the exception being handled."""
    tb = err.__traceback__ if err is not None else None
    if tb is None:
        return None
    target = str(Path(solution_path).resolve())
    lines = [f.lineno for f in traceback.extract_tb(tb) if str(Path(f.filename).resolve()) == target]
    return lines[-1] if lines else None


def _compare(expected: list, actual: list, errors: _Errors) -> str:
    """Empty when every output matches; else what differs. Updates the error maxima."""
    if len(expected) != len(actual):
        return f"forward returned {len(actual)} outputs, the reference {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, actual)):
        label = f"output {i}" if len(expected) > 1 else "output"
        if not isinstance(out, torch.Tensor):
            return f"{label} is {type(out).__name__}, expected a tensor"
        if out.shape != ref.shape:
            return f"{label} shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
        if out.dtype != ref.dtype:
            return f"{label} dtype {out.dtype}, expected {ref.dtype}"
        message = _compare_values(label, ref, out, errors)
        if message:
            return message
    return ""


def _compare_values(label: str, ref: torch.Tensor, out: torch.Tensor, errors: _Errors) -> str:
    ref64, out64 = ref.detach().double(), out.detach().double()
    diff = (ref64 - out64).abs()
    finite = torch.isfinite(diff)
    if not finite.all() and not torch.equal(ref64.isnan(), out64.isnan()):
        return f"{label} has NaN/inf where the reference does not"
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    rel = diff / ref64.abs().clamp_min(1e-12)
    errors.max_abs = max(errors.max_abs, float(diff.max()) if diff.numel() else 0.0)
    errors.max_rel = max(errors.max_rel, float(rel.max()) if rel.numel() else 0.0)
    if torch.allclose(out, ref, atol=ATOL, rtol=RTOL, equal_nan=True):
        return ""
    worst = int(diff.argmax())
    return (f"{label} mismatch: max abs error {float(diff.max()):.3g}, max rel error "
            f"{float(rel.max()):.3g} (atol=rtol={ATOL:g}); worst at flat index {worst}")


def _baseline(problem: Problem, reference, inputs: list, request: KernelEvalRequest) -> Timing:
    shapes = [list(v.shape) if isinstance(v, torch.Tensor) else repr(v) for v in inputs]
    key = baseline_key(problem.source, shapes, request.eval_mode)
    cache = Path(request.baseline_cache_dir) if request.baseline_cache_dir else default_cache_dir()

    def measure() -> Timing:
        compiled = torch.compile(reference)
        return time_forward(lambda: compiled(*inputs))

    return cached_baseline(cache, key, measure)


def device_name() -> str:
    """Runs in a worker, so the orchestrator never opens a CUDA context of its own."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
