"""The kernel evaluation job, run in a trusted worker: references, one candidate process, the verdict.

The worker never imports the candidate's file. It computes (or reads from the cache) the reference
inputs and outputs, runs the candidate in a fresh confined process (candidate_run.py), compares the
outputs that process saved as raw bytes, and writes the verdict. On a GPU it also reads what actually
ran there (kernel_audit.py); on a CPU the static and dispatcher rules are all there is, and the
result says so (`authority`).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mkevolve.config import (EAGER_ERROR_SLACK, PRECISION_TOLERANCE_SHARE, PRECISION_ULPS, PRECISION_VS_EAGER,
                             TOLERANCE)
from mkevolve.problem import Problem, ProblemError, check_reference, fp32_strict, load_problem
from mkevolve.verify.candidate_run import (GPU_MEMORY_TRIES, TIMING_SETS, CallPlan, CandidateReport, OutputCheck,
                                           gpu_accounting, gpu_memory_try, pause_after_gpu_memory_try, plan_calls,
                                           remember_autotune_choices, run_candidate_process, scratch_folder)
from mkevolve.verify import module_state
from mkevolve.verify.cheating import Rule, Violation, dot_precision, headline
from mkevolve.verify.reference import (ReferenceSet, ReferenceSpaceError, cache_root, determinism_mark,
                                      forget_kept, largest_error, reference_set)
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, EvalResult, Rejected, Status, Timing, timed_phase
from mkevolve.verify.timing import (baseline_key, cached_baseline, combine, default_cache_dir, summarize,
                                    time_forward)
from mkevolve.workers import wire
from mkevolve.workers.gpu_share import gpu_lent

_checked_references: set[tuple[str, bool]] = set()
# A subproblem instantiated at many shapes (a MobileNetV2's 35 dense convolutions) is checked at every shape
# but timed at this many: those with the largest inputs, which dominate its runtime. Timing all of them would
# compile a torch.compile baseline per shape for the first candidate, for a speedup that ranks candidates
# no better.
MAX_TIMED_CONFIGS = 4


@dataclass(frozen=True)
class KernelEvalRequest:
    problem_path: str
    solution_path: str
    trials: int = 5
    seed: int = 0
    eval_mode: bool = False
    timed: bool = True
    baseline_cache_dir: str | None = None
    cache_dir: str | None = None          # root of the reference cache (default: beside the baselines)
    trusted_files: tuple[str, ...] = ()   # PyTorch alternatives a composite declares; torch may run there
    code_files: tuple[str, ...] = ()      # files whose @triton.jit kernels may run (default: the solution)
    timeout_s: float = 300.0
    memory_limit_gb: float = 16.0
    atol: float = TOLERANCE
    rtol: float = TOLERANCE
    precision_vs_eager: float = PRECISION_VS_EAGER   # the precision rule's limit, times eager fp32's error


@dataclass
class _Errors:
    atol: float = TOLERANCE
    rtol: float = TOLERANCE
    precision_vs_eager: float = PRECISION_VS_EAGER
    slack: float = 0.0            # added to atol for the config being compared: EAGER_ERROR_SLACK x eager's error
    widest_slack: float = 0.0     # the largest of those, reported with atol
    max_abs: float = 0.0
    max_rel: float = 0.0
    tolerance_used: float = 0.0
    failed_trial: int | None = None
    failure: str = ""
    # The last trial of the config nearest the precision rule's limit: its largest error against the reference
    # run in fp64, and eager fp32's on the same inputs
    error_vs_fp64: float | None = None
    eager_error_vs_fp64: float | None = None
    precision_share: float = -1.0               # that call's error as a share of the rule's limit
    precision_failure: str = ""                 # the precision rule's reason, raised once every output matched
    phases: dict[str, float] = field(default_factory=dict)


def _phase(errors: _Errors, name: str):
    return timed_phase(errors.phases, name)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def evaluate_kernel(request: KernelEvalRequest) -> EvalResult:
    """The whole check of one ModelNew against one problem; never raises for a bad candidate.

    Where the check's own GPU work (references, reading back and comparing outputs) runs out of memory, other
    processes on the GPU held it, or what this one keeps: what it keeps is let go (`reference.forget_kept`) and
    the check runs again after a pause, GPU_MEMORY_TRIES times in all, the last with the GPU alone, as a
    candidate's process is; then it has no verdict. Before, the error ended the job and the candidate was judged
    crashed (level2/7 on an H100 shared by three runs); with three shared tries, one of level2/87's checks in
    such a part went without a verdict after 246 s."""
    fp32_strict()
    for attempt in range(1, GPU_MEMORY_TRIES + 1):
        errors = _Errors(request.atol, request.rtol, request.precision_vs_eager)
        try:
            with gpu_memory_try(attempt):
                return _evaluate_once(request, errors)
        except torch.cuda.OutOfMemoryError as err:
            reason = str(err).strip().splitlines()[0][:300]
        forget_kept()
        torch.cuda.empty_cache()
        pause_after_gpu_memory_try(attempt)
    return Rejected(Status.NOT_RUN, f"{CANDIDATE_NOT_STARTED}: in each of its {GPU_MEMORY_TRIES} tries the check "
                                    f"ran out of GPU memory ({reason})").to_result()


def _evaluate_once(request: KernelEvalRequest, errors: _Errors) -> EvalResult:
    try:
        with _phase(errors, "load"):
            problem = _load_checked_problem(request)
        result = _judge(problem, request, errors)
    except Rejected as stop:
        result = stop.to_result()
    except ReferenceSpaceError as err:  # the check could not run: no verdict on the candidate
        result = Rejected(Status.NOT_RUN, f"{CANDIDATE_NOT_STARTED}: {err}").to_result()
    if errors.failed_trial is not None or errors.max_abs:
        result.max_abs_err, result.max_rel_err = errors.max_abs, errors.max_rel
        result.tolerance_used = errors.tolerance_used
        result.atol, result.rtol = request.atol + errors.widest_slack, request.rtol
        result.failed_trial = errors.failed_trial
    result.error_vs_fp64, result.eager_error_vs_fp64 = errors.error_vs_fp64, errors.eager_error_vs_fp64
    result.phases = errors.phases
    result.authority = "gpu" if device().type == "cuda" else "cpu"
    return result


def _load_checked_problem(request: KernelEvalRequest) -> Problem:
    """The problem, its reference checked for determinism once per worker process and, through a mark in the
    reference cache, once per machine: the check builds the model and runs it twice, 10 s at full size (a
    32768 x 32768 Linear on the H200's host), which every worker's first job of the problem paid."""
    try:
        problem = load_problem(request.problem_path)
        key = (problem.source_hash, request.eval_mode)
        if key not in _checked_references:
            mark = determinism_mark(cache_root(request.cache_dir), problem, request.seed, request.eval_mode,
                                    device())
            if not mark.exists():
                check_reference(problem, device(), request.eval_mode, request.seed)
                mark.parent.mkdir(parents=True, exist_ok=True)
                mark.touch()
            _checked_references.add(key)
    except ProblemError as err:
        raise Rejected(Status.BAD_PROBLEM, str(err)) from None
    return problem


def _judge(problem: Problem, request: KernelEvalRequest, errors: _Errors) -> EvalResult:
    """References first (trusted, cached), then the candidate in its own process, then the verdict here."""
    timed = request.timed and device().type == "cuda"
    with _held_references(problem, request) as references:
        plans, timed_configs, baselines = _references_and_baselines(problem, request, references, errors)
        with scratch_folder("mkevolve-candidate-") as scratch:
            with _phase(errors, "candidate"):
                report = run_candidate_process(request, references, plans, Path(scratch), device())
            errors.phases.update({f"candidate.{name}": seconds for name, seconds in report.phases.items()})
            with _phase(errors, "judge"):
                result = _verdict(problem, request, references, plans, report, Path(scratch), errors)
            if result.passed:
                remember_autotune_choices(report)
        if result.passed and timed:
            _add_timing(references, report, result, timed_configs, baselines)
    return result


@contextmanager
def _held_references(problem: Problem, request: KernelEvalRequest) -> Iterator[list[ReferenceSet]]:
    """Each config's reference set, which no eviction takes until the block ends (the verdict and timing)."""
    root = cache_root(request.cache_dir)
    references = [reference_set(root, problem, i, request.seed, request.eval_mode, device())
                  for i in range(len(problem.configs))]
    with ExitStack() as held:
        for reference in references:
            held.enter_context(reference.in_use())
        yield references


def _references_and_baselines(problem: Problem, request: KernelEvalRequest, references: list[ReferenceSet],
                              errors: _Errors) -> tuple[list[CallPlan], list[int], list[Timing]]:
    """Each config's plan of calls, with every input set it reads and the reference's outputs on it; which
    configs are timed, and torch.compile's time on each: computed here or read from the caches."""
    timed = request.timed and device().type == "cuda"
    with _phase(errors, "reference"):
        timed_configs = _configs_to_time(references, request.trials) if timed else []
        plans = [plan_calls(request.trials, index in timed_configs, device().type == "cuda",
                            random.Random(secrets.randbits(64)), prefix=f"config{index}_")
                 for index in range(len(problem.configs))]
        for reference, plan in zip(references, plans):
            reference.ensure(plan.set_names(), inputs_only=TIMING_SETS)
            plan.keep_state(reference.mutated_buffers())
            plan.keep_written(reference.written_inputs())
    with _phase(errors, "baseline"):
        # Before the candidate starts, never beside it: a candidate can let go of its GPU share (or launch
        # from a thread of its own while its harness times), and a baseline timed beside it would be
        # slowed, its own speedup raised. Every job of a subproblem gets the baseline here first, the
        # first measuring it under the key's lock, so none of its candidates runs while it is timed.
        baselines = [_baseline(problem, references[index], request) for index in timed_configs]
    return plans, timed_configs, baselines


@dataclass
class Preparation:
    """What a prepare job did: seconds per phase, and why it stopped early ("" when it did not)."""

    phases: dict[str, float]
    error: str = ""


def prepare_problem(request: KernelEvalRequest) -> Preparation:
    """Worker job, before the checks of a problem come: its reference sets and torch.compile baselines
    computed into their caches, where each check reads them instead of computing them on its own path.
    Nothing here decides a verdict: a problem that fails to load or a reference that does not fit on disk is
    met again, and reported, by the first check."""
    fp32_strict()
    errors = _Errors()
    try:
        with _phase(errors, "load"):
            problem = _load_checked_problem(request)
        with _held_references(problem, request) as references:
            _references_and_baselines(problem, request, references, errors)
    except Rejected as stop:
        return Preparation(errors.phases, stop.reason)
    except ReferenceSpaceError as err:
        return Preparation(errors.phases, str(err))
    return Preparation(errors.phases)


def _configs_to_time(references: list[ReferenceSet], trials: int) -> list[int]:
    """Every config, or the MAX_TIMED_CONFIGS with the most input bytes (the first trial set's; ties: earlier).
    Choosing computes every config's untimed sets, each config's reference Model built once; the chosen
    configs then add only their timing sets."""
    if len(references) <= MAX_TIMED_CONFIGS:
        return list(range(len(references)))
    untimed = plan_calls(trials, False, True, random.Random(0)).set_names()   # the same for any order drawn
    sizes = []
    for index, reference in enumerate(references):
        reference.ensure(untimed, inputs_only=TIMING_SETS)
        header = wire.read_values(reference.inputs_file("trial0"), "meta")     # shapes only, no data
        sizes.append((-sum(v.numel() * v.element_size() for v in header if isinstance(v, torch.Tensor)), index))
    return sorted(index for _, index in sorted(sizes)[:MAX_TIMED_CONFIGS])


def _verdict(problem: Problem, request: KernelEvalRequest, references: list[ReferenceSet],
             plans: list[CallPlan], report: CandidateReport, scratch: Path, errors: _Errors) -> EvalResult:
    """The rules in order: confinement, errors, early rules, GPU accounting, outputs."""
    if report.denials:
        more = f" (+{len(report.denials) - 1} more)" if len(report.denials) > 1 else ""
        denied = [Violation(Rule.SANDBOX, denial).to_dict() for denial in report.denials]
        raise Rejected(Status.CHEATING, f"[{Rule.SANDBOX.value}] {report.denials[0]}{more}", rule=Rule.SANDBOX.value,
                       violations=denied)
    if report.error is not None:
        raise report.error
    gpu_violations = []
    if device().type == "cuda":
        with _phase(errors, "judge.accounting"):
            gpu_violations = gpu_accounting(report.activities, request.code_files or (request.solution_path,),
                                            scratch, pytorch_allowed=bool(request.trusted_files))
    violations = report.violations + gpu_violations
    if _all_declared_pytorch(request):
        # Every subkernel of this composite is declared PyTorch (guarded completion found no kernel for
        # any): no Triton launch is expected, and the run says the solution is 0 of n in Triton.
        violations = [v for v in violations if v.rule is not Rule.NO_LAUNCH]
    _raise_violations(violations)
    with _phase(errors, "judge.read"), gpu_lent():    # disk and hashing: no GPU work to hold it for
        report.read_outputs(scratch)
    with _phase(errors, "judge.compare"):
        for index, (reference, plan) in enumerate(zip(references, plans)):
            _check_outputs(problem, index, reference, plan, report, scratch, errors)
    if errors.precision_failure:    # after the outputs: a wrong one is reported as wrong, not as imprecise
        raise Rejected(Status.CHEATING, errors.precision_failure, rule=Rule.PRECISION.value)
    with _phase(errors, "judge.state"):
        for index, (reference, plan) in enumerate(zip(references, plans)):
            if plan.state_buffers:
                _check_state(problem, index, reference, plan, report, scratch, errors)
    _check_inputs_left(problem, report)
    return EvalResult(status=Status.OK, trials=request.trials, launches=report.launches,
                      precision=dot_precision(Path(request.solution_path).read_text()),
                      peak_rss_mb=round(report.peak_rss_mb, 1))


def _check_outputs(problem: Problem, index: int, reference: ReferenceSet, plan: CallPlan,
                   report: CandidateReport, scratch: Path, errors: _Errors) -> None:
    """Every kept output against the reference's (on the inputs as the call got them); then the precision rule
    on the same tensors: the last trial against the reference run in fp64, the timed or late calls against the
    limit that trial sets."""
    last_trial, where = _last_trial(plan), _config_label(problem, index)
    with _phase(errors, "judge.precision"):
        exact = reference.fp64(last_trial.input_set)
    errors.slack = EAGER_ERROR_SLACK * exact.eager_error if exact else 0.0
    errors.widest_slack = max(errors.widest_slack, errors.slack)
    for check in plan.checks:
        actual = report.output(check.save, scratch, reference.device)
        expected = reference.expected(check.input_set, check.shift)
        mismatch = _compare(expected, actual, errors, plan.written_inputs)
        if not mismatch:
            with _phase(errors, "judge.precision"):
                if check == last_trial:
                    _measure_precision(reference, check, actual, errors, where)
                elif check.trial is None:
                    _check_later_precision(reference, last_trial, check, actual, expected, errors, where)
            continue
        if check.trial is not None:
            errors.failed_trial = check.trial
            errors.failure = f"trial {check.trial}{where}: {mismatch}"
            raise Rejected(Status.INCORRECT, errors.failure)
        raise Rejected(Status.CHEATING, f"[{Rule.TIMED_OUTPUT.value}] call {check.call} of {plan.length}{where}, "
                       f"a timed or late call rather than a correctness trial, returned a wrong result "
                       f"({mismatch}); every call must do the work", rule=Rule.TIMED_OUTPUT.value)


def _last_trial(plan: CallPlan) -> OutputCheck:
    """The check the precision rule measures against fp64: the last trial, hidden among the timed calls, so a
    kernel cannot be exact on it alone by counting its calls (trial 0 is always the first call)."""
    return max((c for c in plan.checks if c.trial is not None), key=lambda c: c.trial)


def _measure_precision(reference: ReferenceSet, check: OutputCheck, actual: list, errors: _Errors,
                       where: str) -> None:
    """The measured side of the precision rule, on every input config's last trial: its error against the
    reference Model run in fp64, next to eager fp32's own on the same inputs. A kernel that rounds its operands to
    bf16, fp16 or tf32 by hand (a masked mantissa the TTIR audit cannot tell from fp32 math) can still pass the
    tolerance where outputs are small; it cannot stay near fp32's error. Unmeasured where the reference has no
    fp64 form (`ReferenceSet.fp64`)."""
    exact = reference.fp64(check.input_set)
    if exact is None:
        return
    error = exact.error(actual)
    limit = precision_limit(exact.eager_error, exact.largest, errors.atol, errors.precision_vs_eager)
    share = error / limit if limit else (float("inf") if error else 0.0)
    if share > errors.precision_share:     # the config nearest its limit is the one reported
        errors.error_vs_fp64, errors.eager_error_vs_fp64, errors.precision_share = error, exact.eager_error, share
    if error <= limit or errors.precision_failure:
        return
    errors.precision_failure = (
        f"[{Rule.PRECISION.value}] trial {check.trial}{where}: its outputs miss the reference run in fp64 by up to "
        f"{error:.3g}, where eager fp32's miss it by {exact.eager_error:.3g} (the rule allows {limit:.3g}: "
        f"{errors.precision_vs_eager:g} times eager's, or a floor for tiny errors): some step computes with less than "
        f"fp32's precision (fp16, bf16 or tf32 operands, a truncated mantissa, an approximate function)")


def _check_later_precision(reference: ReferenceSet, last_trial: OutputCheck, check: OutputCheck, actual: list,
                           expected: list, errors: _Errors, where: str) -> None:
    """A checked timed or late call against the fp32 reference on its own inputs, within the limit the last
    trial's measurement sets. Trials get new inputs and timed calls take a few sets again (shifted), so a kernel
    could keep fp32's precision on values it has not seen and drop it on those it has; an fp64 reference per
    call would cost a forward in fp64 per candidate, and the fp32 one errs by eager's own error alone, a
    sixteenth of the limit."""
    exact = reference.fp64(last_trial.input_set)
    if exact is None:
        return
    error = largest_error(actual, expected)
    limit = precision_limit(exact.eager_error, exact.largest, errors.atol, errors.precision_vs_eager)
    if error <= limit or errors.precision_failure:
        return
    errors.precision_failure = (
        f"[{Rule.PRECISION.value}] call {check.call} (a timed or late call){where}: its outputs stray from the fp32 "
        f"reference by up to {error:.3g}, where the rule allows {limit:.3g} ({errors.precision_vs_eager:g} times eager "
        f"fp32's own error against fp64 on trial {last_trial.trial}'s inputs, or a floor for tiny errors): it "
        f"computes with less precision on some calls than on the trials")


def precision_limit(eager_error: float, largest: float, atol: float,
                    vs_eager: float = PRECISION_VS_EAGER) -> float:
    """The largest error against fp64 the precision rule allows: `vs_eager` times eager fp32's (the run's
    precision_vs_eager, config.PRECISION_VS_EAGER by default) and its floors."""
    return max(vs_eager * eager_error, PRECISION_ULPS * torch.finfo(torch.float32).eps * largest,
               PRECISION_TOLERANCE_SHARE * atol)


def _check_state(problem: Problem, index: int, reference: ReferenceSet, plan: CallPlan, report: CandidateReport,
                 scratch: Path, errors: _Errors) -> None:
    """The buffers the reference's forward changes, after the first call and after the last, against the same
    calls replayed on the reference (verify/module_state.py)."""
    skipped = set(report.skipped[index]) if index < len(report.skipped) else set()
    first, last = module_state.replay(reference, plan, skipped, plan.state_buffers)
    for when, expected in (("first", first), ("last", last)):
        actual = report.output(plan.state_name(when), scratch, reference.device)
        missing = module_state.mismatches(expected, actual, errors.atol, errors.rtol)
        if not missing:
            continue
        after = "the first call (trial 0)" if when == "first" else f"the last of {plan.length} calls"
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise Rejected(Status.INCORRECT, f"[{Rule.MODULE_STATE.value}] after {after}{_config_label(problem, index)}, "
                       f"no buffer of ModelNew holds what the reference's forward left in "
                       f"{missing[0].describe()}{more}; update the module's state as Model does "
                       f"({tolerance_text(errors.atol, errors.rtol)})", rule=Rule.MODULE_STATE.value)


def _check_inputs_left(problem: Problem, report: CandidateReport) -> None:
    """An argument the reference's forward leaves as it was must be left so: in a model, the caller may read
    it again after the call."""
    if not report.changed_inputs:
        return
    index, position = report.changed_inputs[0]
    more = f" (+{len(report.changed_inputs) - 1} more)" if len(report.changed_inputs) > 1 else ""
    raise Rejected(Status.INCORRECT, f"[{Rule.INPUT_STATE.value}] forward wrote into its argument {position}"
                   f"{_config_label(problem, index)}{more}, which Model's forward leaves as it was; write "
                   f"results and scratch values to tensors of your own", rule=Rule.INPUT_STATE.value)


def _all_declared_pytorch(request: KernelEvalRequest) -> bool:
    """A composite whose every file but the top-level one is a declared PyTorch alternative."""
    kernels = {str(Path(f).resolve()) for f in request.code_files} - {str(Path(request.solution_path).resolve())}
    return bool(kernels) and kernels <= {str(Path(f).resolve()) for f in request.trusted_files}


def _config_label(problem: Problem, index: int) -> str:
    return f" (input config {index})" if len(problem.configs) > 1 else ""


def _raise_violations(violations: list[Violation]) -> None:
    """Reject with the headline violation as the reason; every one of them goes into the result."""
    if violations:
        first, reason = headline(violations)
        raise Rejected(Status.CHEATING, reason, first.line, first.rule.value,
                       violations=[v.to_dict() for v in violations])


def _add_timing(references: list[ReferenceSet], report: CandidateReport, result: EvalResult,
                timed_configs: list[int], baselines: list[Timing]) -> None:
    """Candidate and torch.compile over the same timed configs; their times add up (timing.combine)."""
    timings = [summarize(report.times_ms[index]) for index in timed_configs]
    result.runtime, result.baseline = combine(timings), combine(baselines)
    result.speedup = result.baseline.median_ms / result.runtime.median_ms
    if len(timed_configs) < len(references):
        result.timed_configs = timed_configs


def _compare(expected: list, actual: list, errors: _Errors, written: list[int] = ()) -> str:
    """Empty when every output matches; else what differs. Updates the error maxima. Both lists end with the
    arguments at the positions `written` (the reference writes into them), as the call left them."""
    outputs = len(expected) - len(written)
    if len(expected) != len(actual):
        return f"forward returned {len(actual) - len(written)} outputs, the reference {outputs}"
    for i, (ref, out) in enumerate(zip(expected, actual)):
        label = f"output {i}" if outputs > 1 else "output"
        if i >= outputs:
            label = f"argument {written[i - outputs]} after the call (Model's forward writes into it)"
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
        first = _position(int((out64.isnan() != ref64.isnan()).flatten().int().argmax()), ref.shape)
        return (f"{label} has NaN/inf where the reference does not (first at index {first}); often a load "
                "past the end of a tensor without a mask, or part of a torch.empty output the grid never wrote")
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    rel = diff / ref64.abs().clamp_min(1e-12)
    errors.max_abs = max(errors.max_abs, float(diff.max()) if diff.numel() else 0.0)
    errors.max_rel = max(errors.max_rel, float(rel.max()) if rel.numel() else 0.0)
    atol = errors.atol + errors.slack
    errors.tolerance_used = max(errors.tolerance_used, tolerance_used(ref64, diff, atol, errors.rtol))
    if torch.allclose(out, ref, atol=atol, rtol=errors.rtol, equal_nan=True):
        return ""
    worst = _position(int(diff.argmax()), ref.shape)
    slack = f", atol + {errors.slack:.3g} for eager fp32's own error" if errors.slack else ""
    return (f"{label} mismatch: max abs error {float(diff.max()):.3g}, max rel error "
            f"{float(rel.max()):.3g} ({tolerance_text(errors.atol, errors.rtol)}{slack}); worst at index {worst} "
            f"(expected {float(ref64.flatten()[diff.argmax()]):.6g}, got {float(out64.flatten()[diff.argmax()]):.6g})")


def _position(flat: int, shape: torch.Size) -> str:
    """A flat index as a tensor position, "(0, 3, 17)": what a kernel author can map to program ids."""
    if not shape:
        return "()"
    return "(" + ", ".join(str(int(i)) for i in torch.unravel_index(torch.tensor(flat), shape)) + ")"


def tolerance_text(atol: float, rtol: float) -> str:
    return f"atol=rtol={atol:g}" if atol == rtol else f"atol={atol:g}, rtol={rtol:g}"


def tolerance_used(ref: torch.Tensor, diff: torch.Tensor, atol: float, rtol: float) -> float:
    """The worst |out - ref| / (atol + rtol*|ref|): the share of allclose's tolerance the outputs use
    (above 1 fails). `diff` is |out - ref| with non-finite entries already zeroed."""
    if not diff.numel():
        return 0.0
    # NaN only where the reference is NaN, and those entries matched (equal_nan) or were refused before.
    return float(torch.nan_to_num(diff / (atol + rtol * ref.abs()), nan=0.0).max())


def _baseline(problem: Problem, reference: ReferenceSet, request: KernelEvalRequest) -> Timing:
    """torch.compile's time on the first timing set; the model is built only when it is not cached yet."""
    inputs_file = reference.inputs_file(TIMING_SETS[0])
    shapes = [list(v.shape) if isinstance(v, torch.Tensor) else repr(v)
              for v in wire.read_values(inputs_file, "meta")]  # the header only
    key = baseline_key(problem.source, shapes, request.eval_mode)
    cache = Path(request.baseline_cache_dir) if request.baseline_cache_dir else default_cache_dir()

    def measure() -> Timing:
        model = reference.build_model()
        inputs = wire.read_values(inputs_file, device())
        compiled = torch.compile(model, backend=inductor_with_the_gpu_lent)
        return time_forward(lambda: compiled(*inputs))

    return cached_baseline(cache, key, measure)


def inductor_with_the_gpu_lent(graph: torch.fx.GraphModule, example_inputs: list):
    """torch.compile's default backend, Inductor with its default settings, with this worker's hold on the GPU
    lent while it compiles: seconds to a minute of CPU work for a full-size model. Held, it kept every other
    job's timed section waiting for it, and every job behind that one waiting at the lock's gate (candidates'
    setups of 50 s with 4 runs on one H200). Dynamo's tracing before it and the first call after it, which
    runs the compiled kernels and autotunes them, keep the hold."""
    from torch._inductor.compile_fx import compile_fx

    with gpu_lent():
        return compile_fx(graph, example_inputs)


def device_name() -> str:
    """Runs in a worker, so the orchestrator never opens a CUDA context of its own."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
