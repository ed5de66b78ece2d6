"""The verifier's front door: static checks here, everything that executes code in workers."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tempfile
import threading
import tokenize
import time
from pathlib import Path

from mkevolve.busy import BusyClock
from mkevolve.config import RunConfig, config_from_args
from mkevolve.event_records import VerdictEvent
from mkevolve.events import EventLog
from mkevolve.exit_codes import ExitCode
from mkevolve.problem import ProblemError, read_source
from mkevolve.codebase import KERNELS_DIR, LOADER, SOLUTION_FILE, SOLUTION_LOADER, packed_sections
from mkevolve.verify.cheating import Rule, headline, static_violations
from mkevolve.verify.decomposition.static import top_level_violations
from mkevolve.verify.correctness import KernelEvalRequest, Preparation, tolerance_text
from mkevolve.workers.executor import make_executor
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, EvalResult, Status
from mkevolve.workers.pool import Job, JobFailure, JobOutcome, Priority

# A prepare job's place among jobs waiting for a worker: behind every check (their priorities are counts of
# candidates, far below this), so it only ever takes a worker that nothing else is waiting for.
PREPARE_PRIORITY = 1 << 30
# Seconds a candidate check (or preparation) that started before the run's time budget was spent may still run
# after it; then it is stopped, without a verdict, so the run goes on to its end-to-end check and `best/` in a
# bounded time: a full-size check can take minutes (on an H200, KernelBench level2/19 with its 2.2 GB input
# sets did not end its iteration within a 511 s part; level 3 checks beside two other runs took 60 to 270 s).
RUNNING_CHECK_GRACE_S = 60.0


class Verifier:
    """Checks kernels against problems; owns the executor (worker pool) for a run's lifetime."""

    def __init__(self, config: RunConfig, events: EventLog | None = None,
                 baseline_cache_dir: Path | None = None):
        self.config = config
        self.events = events or EventLog()
        self.baseline_cache_dir = baseline_cache_dir
        self.executor = make_executor(config.executor, config.workers)
        self._device_name: str | None = None
        self._device_lock = threading.Lock()      # the background threads ask for the device at the same time
        self.clock = BusyClock()  # shared with the LLM client by a run, to measure its own overhead
        # time.time() after which a candidate check still waiting for a worker is not started (a run's
        # --time-budget); end-to-end checks of composed solutions always run
        self.candidates_start_by: float | None = None   # the run's time budget: see candidates_end_by
        self._preparing: list[threading.Thread] = []      # prepare(), one thread per call
        self._prepared: set[str] = set()                  # contents (sha256) of the problems prepare() was given
        self._prepared_lock = threading.Lock()
        self._ahead_dir: Path | None = None                # prepare_sources' files, removed by close()
        self._closing = threading.Event()                  # close() was called

    @property
    def device_name(self) -> str:
        """The device evaluations run on: "cpu" or the GPU's name, asked of a worker (no CUDA context here)."""
        with self._device_lock:
            if self._device_name is None:
                outcome = self.run_jobs([Job("mkevolve.verify.correctness:device_name",
                                             timeout=self.config.timeout)])[0]
                self._device_name = outcome.value if outcome.ok else "unknown"
        return self._device_name

    @property
    def on_gpu(self) -> bool:
        return self.device_name not in ("cpu", "unknown")

    def prepare(self, problem_paths: list[Path], grace_s: float = 0.0) -> None:
        """In the background, on a GPU: each problem's reference sets and torch.compile baselines computed into
        their caches by a worker that no check is waiting for, so that the first checks of the problem find them
        there. The end-to-end check's baseline (an Inductor compile of the whole problem, 5 to 60 s) is made
        while the subproblems evolve, and a subproblem's while its first kernels are written.

        A job that has started keeps its worker to the end, so the jobs ask for workers only after `grace_s`
        seconds: checks sent at the same moment (by an agent that answers at once) are served first, and those
        checks compute what they need themselves."""
        if not self.executor.shares_caches:    # what a job left in one node's caches spares no other job
            return
        fresh = [path for path in problem_paths if self._first_preparation(Path(path))]
        if not fresh:
            return
        thread = threading.Thread(target=self._prepare, args=(fresh, grace_s), name="prepare", daemon=True)
        self._preparing.append(thread)
        thread.start()

    def prepare_sources(self, files: dict[str, str], grace_s: float = 0.0) -> None:
        """prepare() for problem files that exist only as text (relative path -> source): written to a scratch
        folder first. The caches are keyed by a problem's source, not its path, so a later check of the same
        source at another path finds what this prepared."""
        if not self.executor.shares_caches or not files:
            return
        with self._prepared_lock:
            if self._ahead_dir is None:
                self._ahead_dir = Path(tempfile.mkdtemp(prefix="mkevolve-ahead-"))
        digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]
        paths = []
        for relative, source in files.items():
            path = self._ahead_dir / digest / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source, encoding="utf-8")
            paths.append(path)
        self.prepare(paths, grace_s)

    def _first_preparation(self, path: Path) -> bool:
        """Whether no earlier prepare() was given this problem's source (or this path, for a file not there):
        a second job would only wait for the first one's caches."""
        try:
            key = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            key = str(path.resolve())
        with self._prepared_lock:
            first = key not in self._prepared
            self._prepared.add(key)
        return first

    def _prepare(self, problem_paths: list[Path], grace_s: float) -> None:
        if self._closing.wait(grace_s) or not self.on_gpu:  # on a CPU the first check computes the references
            return                                             # at the same cost
        jobs = [Job("mkevolve.verify.correctness:prepare_problem", {"request": self._request(path, path, True)},
                    timeout=self._worker_timeout, start_by=self.candidates_start_by,
                    end_by=self.candidates_end_by, priority=PREPARE_PRIORITY)
                for path in problem_paths]
        for path, outcome in zip(problem_paths, self.executor.run_many(jobs)):
            if outcome.failure in (JobFailure.NOT_STARTED, JobFailure.INTERRUPTED):
                continue
            prepared = outcome.value if outcome.ok else Preparation({}, outcome.reason)
            self.events.emit("prepared", problem=str(path), wall_s=round(outcome.wall_s, 3),
                             phases={name: round(seconds, 3) for name, seconds in prepared.phases.items()},
                             error=prepared.error)

    def static_check(self, source: str, filename: str) -> EvalResult | None:
        """A CHEATING result from the AST rules, or None when the source breaks none of them."""
        try:
            violations = static_violations(source, filename)
        except SyntaxError as err:
            return EvalResult(status=Status.COMPILE_ERROR, line=err.lineno,
                              reason=f"syntax error at line {err.lineno}: {err.msg}")
        if not violations:
            return declared_pytorch_fallback(source)
        first, reason = headline(violations)
        more = f" (+{len(violations) - 1} more)" if len(violations) > 1 else ""
        note = packed_sections_note(source, [v.line for v in violations])
        return EvalResult(status=Status.CHEATING, reason=reason + more + note, rule=first.rule.value,
                          line=first.line, violations=[v.to_dict() for v in violations])

    def check_kernel(self, problem_path: Path, solution_path: Path, *, timed: bool = True) -> EvalResult:
        return self.check_kernels([(problem_path, solution_path)], timed=timed)[0]

    def check_kernels(self, pairs: list[tuple[Path, Path]], *, timed: bool = True,
                      priority: Priority = 0) -> list[EvalResult]:
        """Static checks first (no execution), then the survivors in parallel across workers; `priority` orders
        them among jobs waiting for a worker (smaller first, `Job.priority`)."""
        results: list[EvalResult | None] = []
        jobs, slots = [], []
        for problem_path, solution_path in pairs:
            early = self.static_check(Path(solution_path).read_text(encoding="utf-8"), str(solution_path))
            results.append(early)
            if early is None:
                slots.append(len(results) - 1)
                jobs.append(self._kernel_job(problem_path, solution_path, timed,
                                             start_by=self.candidates_start_by,
                                             end_by=self.candidates_end_by, priority=priority))
        for slot, outcome in zip(slots, self.run_jobs(jobs)):
            results[slot] = _to_result(outcome)
        for (problem_path, solution_path), result in zip(pairs, results):
            self._emit_verdict(problem_path, solution_path, result)
        return results

    def check_composite(self, problem_path: Path, folder: Path, pytorch: frozenset[str] = frozenset(),
                        *, timed: bool = True, priority: Priority = 0,
                        withdrawn: threading.Event | None = None) -> EvalResult:
        """End to end: a solution folder's ModelNew against the original problem. `priority` orders it among
        jobs waiting for a worker (smaller first, `Job.priority`); once `withdrawn` is set, it is not started
        (`Job.withdrawn`).

        Every Triton subkernel passes the static rules, the top-level only builds and calls subkernel
        modules, and at run time PyTorch compute is allowed only inside the subkernels in `pytorch`
        (swapped for their reference code, and declared so in the manifest).
        """
        folder = Path(folder)
        trusted = []
        for path in sorted((folder / KERNELS_DIR).glob("*.py")):
            if path.stem in pytorch:
                trusted.append(str(path.resolve()))
                continue
            early = self.static_check(path.read_text(encoding="utf-8"), str(path))
            if early is not None:
                early.reason = f"subkernel {path.stem}: {early.reason}"
                return early
        top = folder / SOLUTION_FILE
        impurities = composite_top_level_violations(top.read_text(encoding="utf-8"))
        if impurities:
            return EvalResult(status=Status.CHEATING, rule=Rule.TORCH_COMPUTE.value,
                              reason=f"{SOLUTION_FILE}: {impurities[0]}")
        code = [str(top.resolve())] + [str(p.resolve()) for p in sorted((folder / KERNELS_DIR).glob("*.py"))]
        job = self._kernel_job(problem_path, top, timed, trusted, code, priority=priority, withdrawn=withdrawn)
        result = _to_result(self.run_jobs([job])[0])
        self._emit_verdict(problem_path, top, result, composite=True)
        return result

    def _emit_verdict(self, problem_path: Path, solution_path: Path, result: EvalResult,
                      composite: bool = False) -> None:
        """One event per verdict, with the evaluation's profile: seconds per phase (worker start, load,
        reference, candidate.*, judge, baseline) and the wall time the job took, queueing included."""
        self.events.record(VerdictEvent(
            problem=str(problem_path), solution=str(solution_path), status=result.status.value,
            reason=result.reason, speedup=result.speedup, wall_s=round(result.wall_s, 3),
            phases={name: round(seconds, 3) for name, seconds in result.phases.items()}, composite=composite))

    def run_jobs(self, jobs: list[Job]) -> list[JobOutcome]:
        if not jobs:
            return []
        with self.clock.busy():
            return self.executor.run_many(jobs)

    def _kernel_job(self, problem_path: Path, solution_path: Path, timed: bool,
                    trusted_files: list[str] | None = None, code_files: list[str] | None = None,
                    start_by: float | None = None, end_by: float | None = None, priority: Priority = 0,
                    withdrawn: threading.Event | None = None) -> Job:
        request = self._request(problem_path, solution_path, timed, trusted_files, code_files)
        return Job("mkevolve.verify.correctness:evaluate_kernel", {"request": request},
                   timeout=self._worker_timeout, start_by=start_by, end_by=end_by, priority=priority,
                   withdrawn=withdrawn)

    @property
    def candidates_end_by(self) -> float | None:
        """When candidate checks and preparations still running are stopped: RUNNING_CHECK_GRACE_S after the
        run's time budget (`candidates_start_by`). End-to-end checks are never stopped: they make `best/`."""
        return None if self.candidates_start_by is None else self.candidates_start_by + RUNNING_CHECK_GRACE_S

    @property
    def _worker_timeout(self) -> float:
        """A check's or prepare's limit in its trusted worker: the candidate process gets the configured limit,
        the worker around it room for the references and the baseline on top."""
        return 2 * self.config.timeout + 60

    def _request(self, problem_path: Path, solution_path: Path, timed: bool,
                 trusted_files: list[str] | None = None, code_files: list[str] | None = None) -> KernelEvalRequest:
        return KernelEvalRequest(
            problem_path=str(Path(problem_path).resolve()),
            solution_path=str(Path(solution_path).resolve()),
            trials=self.config.trials, seed=self.config.seed, eval_mode=self.config.eval_mode,
            timed=timed, trusted_files=tuple(trusted_files or ()), code_files=tuple(code_files or ()),
            baseline_cache_dir=str(self.baseline_cache_dir) if self.baseline_cache_dir else None,
            timeout_s=self.config.timeout, memory_limit_gb=self.config.memory_limit_gb,
            atol=self.config.atol, rtol=self.config.rtol, precision_vs_eager=self.config.precision_vs_eager,
        )

    def abort(self) -> None:
        """The run is interrupted: its jobs stop now (their candidates get no verdict: NOT_RUN) and none
        starts; close() follows as the run unwinds."""
        self._closing.set()
        self.executor.abort()

    def close(self) -> None:
        # No worker may start after the pool has stopped them all: jobs still waiting end at once, and the
        # threads that sent them finish before the workers are stopped (a running job first completes).
        self._closing.set()
        self.executor.refuse_new_jobs()
        for thread in self._preparing:
            thread.join()
        self.executor.close()
        if self._ahead_dir is not None:
            shutil.rmtree(self._ahead_dir, ignore_errors=True)

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def composite_top_level_violations(solution_source: str) -> list[str]:
    """The top-level purity rules of a decomposition, applied to decomposed_solution.py.

    The solution top-level is the problem top-level with ModelNew for Model and load_subkernel for
    load_subproblem; renamed back, the decomposition's own AST check applies unchanged.
    """
    renames = {"ModelNew": "Model", SOLUTION_LOADER: LOADER}
    tokens = [(tok.type, renames.get(tok.string, tok.string) if tok.type == tokenize.NAME else tok.string)
              for tok in tokenize.generate_tokens(io.StringIO(solution_source).readline)]
    return top_level_violations(tokenize.untokenize(tokens))


# ---- files written by `mkevolve pack`: which packed subkernel a static violation falls in ------------------


def packed_sections_note(source: str, lines: list[int | None]) -> str:
    """For a packed file, the sections the violations at `lines` fall in, PyTorch ones named as such;
    "" for any other file."""
    starts = packed_sections(source)
    sections = []
    for line in lines:
        section = next((s for s in reversed(starts) if line is not None and s[0] <= line), None)
        if section is not None and section not in sections:
            sections.append(section)
    if not sections:
        return ""
    pytorch = [name for _, name, kind in sections if kind == "pytorch"]
    where = ", ".join(name for _, name, _ in sections)
    if pytorch:
        verb = "runs" if len(pytorch) == 1 else "run"
        return (f" (packed file, a PyTorch fallback: {', '.join(pytorch)} {verb} PyTorch code, not a Triton "
                f"kernel; violations in {where})")
    return f" (packed file: violations in {where})"


def declared_pytorch_fallback(source: str) -> EvalResult | None:
    """A packed file whose sections declare PyTorch subkernels is a PyTorch fallback even where the AST rules
    see no PyTorch compute (an elementwise `x + y` in a reference forward); None for any other file."""
    pytorch = [name for _, name, kind in packed_sections(source) if kind == "pytorch"]
    if not pytorch:
        return None
    verb = "runs" if len(pytorch) == 1 else "run"
    return EvalResult(status=Status.CHEATING, rule=Rule.TORCH_COMPUTE.value,
                      reason=f"packed file, a PyTorch fallback: {', '.join(pytorch)} {verb} PyTorch code, not a "
                             "Triton kernel (see the file's header)")


def _to_result(outcome: JobOutcome) -> EvalResult:
    if outcome.failure is JobFailure.INTERRUPTED:  # no verdict: a resumed run checks it again
        return EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: the run was interrupted",
                          wall_s=outcome.wall_s)
    if outcome.failure is JobFailure.NOT_STARTED:  # no verdict on the candidate: a resumed run checks it again
        return EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: the run's time budget was "
                                                        f"spent before a worker was free")
    if outcome.failure is JobFailure.WITHDRAWN:    # an end-to-end check ahead that a better composition replaced
        return EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: {outcome.reason}")
    if outcome.failure is JobFailure.STOPPED:      # no verdict either
        return EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: its check was "
                          f"still running {RUNNING_CHECK_GRACE_S:g} s after the run's time budget was spent, and "
                          f"was stopped", wall_s=outcome.wall_s)
    if not outcome.ok:
        return EvalResult(status=Status(outcome.failure.value), reason=outcome.reason, wall_s=outcome.wall_s,
                          phases={"worker_start": outcome.worker_start_s})
    result: EvalResult = outcome.value
    result.wall_s = outcome.wall_s + outcome.worker_start_s
    result.phases = {"worker_start": outcome.worker_start_s, **result.phases}
    return result


def _require_file(path: str, what: str) -> Path:
    candidate = Path(path)
    if not candidate.exists():
        raise ProblemError(candidate, f"no such {what} file")
    if candidate.is_dir():
        raise ProblemError(candidate, f"is a folder, expected a {what} file")
    return candidate


def check_command(args) -> int:
    """`mkevolve check PROBLEM SOLUTION`: 0 accepted, 1 rejected, 2 bad input."""
    config = config_from_args(args)
    read_source(args.problem)
    solution = _require_file(args.solution, "solution")
    started = time.monotonic()
    with Verifier(config) as verifier:
        result = verifier.check_kernel(Path(args.problem), solution)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        _print_result(result, time.monotonic() - started)
    if result.status is Status.BAD_PROBLEM:
        print(f"mkevolve check: error: {result.reason}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    return ExitCode.OK if result.passed else ExitCode.FAILED


AUTHORITY = {
    "gpu": "what ran on the GPU (profiler: kernels, copies; compiled IR: precision)",
    "cpu": "static and dispatcher rules only; on a GPU, what actually ran is checked and decides",
}


def error_line(result: EvalResult) -> str:
    """The error as the verdict judged it: the share of the tolerance the worst element used. The
    elementwise relative error is left to --json: near a zero reference it is large for a correct output."""
    if result.tolerance_used is None:  # a result recorded before the share was computed
        return f"abs {result.max_abs_err:.3g}"
    percent = 100 * result.tolerance_used
    shown = f"{percent:.2g}%" if percent < 10 else f"{percent:.0f}%"  # two digits even for a tiny share
    tolerance = tolerance_text(result.atol, result.rtol) if result.atol is not None else "tolerance"
    return f"{shown} of the tolerance ({tolerance}; max abs error {result.max_abs_err:.3g})"


def _print_result(result: EvalResult, seconds: float) -> None:
    from mkevolve.display import make_console
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_header=False, box=None)
    colour = "green" if result.passed else "red"
    table.add_row("verdict", f"[{colour}]{result.status.value}[/{colour}]")
    if result.reason:
        table.add_row("reason", escape(result.reason))
    if result.max_abs_err is not None:
        table.add_row("max error", error_line(result))
    if result.launches is not None:
        table.add_row("launches", f"{result.launches} Triton launch(es) per forward")
    if result.precision:
        table.add_row("precision", result.precision)
    if result.runtime is not None:
        t, b = result.runtime, result.baseline
        table.add_row("runtime", f"{t.median_ms:.4f} ms (p10 {t.p10_ms:.4f}, p90 {t.p90_ms:.4f})")
        table.add_row("torch.compile", f"{b.median_ms:.4f} ms (p10 {b.p10_ms:.4f}, p90 {b.p90_ms:.4f})")
    speed = "unknown (no GPU: correctness only)" if result.speedup is None else f"{result.speedup:.3f}x"
    table.add_row("speedup", speed)
    if result.authority in AUTHORITY:
        table.add_row("checked by", AUTHORITY[result.authority])
    table.add_row("checked in", f"{seconds:.1f} s")
    make_console().print(table)
