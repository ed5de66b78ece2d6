"""MKEvolve's Algorithm 1 and 2: decompose, refine, evolve per subproblem, evaluate, keep the best, swap."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.markup import escape

from mkevolve.agents import decompose as decompose_agent
from mkevolve.agents import fuse as fuse_agent
from mkevolve.agents import split as split_agent
from mkevolve.agents.evolve import RefineContext, evolve_kernel
from mkevolve.budget import allocate_budget
from mkevolve.codebase import Decomposition, write_solution
from mkevolve.config import RunConfig, build_config, config_from_args
from mkevolve.display import RunDisplay, RunView, SubproblemRow, final_table
from mkevolve.events import EventLog
from mkevolve.fsutil import write_atomic
from mkevolve.problem import ProblemError, load_problem
from mkevolve.run_state import IterationRecord, RunState, StateError, Step, SubkernelRecord
from mkevolve.search.beam import Beam
from mkevolve.solution import (ORIGIN_PYTORCH, Coverage, Manifest, SubkernelEntry, copy_solution,
                               pytorch_alternative, recover_solution, sha256_of)
from mkevolve.verify.profile import SubkernelProfile
from mkevolve.verify.result import Status
from mkevolve.workers.pool import Job

BEST = "best"
STATUS_PYTORCH = "pytorch"  # a manifest entry's status where the subproblem's own PyTorch code stands in


@dataclass
class RunOutcome:
    run_dir: Path
    passed: bool                      # best/ holds a solution verified end to end
    speedup: float | None
    iterations: int
    coverage: Coverage | None = None  # how much of best/ runs in Triton; None without best/
    failure: str = ""                 # without best/: why the last iteration's composite did not pass


def new_run_dir(out: str | Path, problem_path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(out) / problem_path.stem
    run_dir, n = base / stamp, 1
    while run_dir.exists():
        n += 1
        run_dir = base / f"{stamp}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir


def iteration_dir(run_dir: Path, index: int) -> Path:
    return run_dir / "iterations" / f"iter_{index:02d}"


def beam_hash(source: str) -> str:
    return sha256_of(source)[:16]


class Orchestrator:
    """One run: owns its folder, checkpoint, LLM client and verifier; `run()` goes to the end."""

    def __init__(self, problem_path: Path, config: RunConfig, run_dir: Path, state: RunState,
                 client, verifier, display: RunDisplay):
        self.problem_path = Path(problem_path).resolve()
        self.config = config
        self.run_dir = Path(run_dir)
        self.state = state
        self.client = client
        self.verifier = verifier
        self.display = display
        self.events: EventLog = verifier.events
        self.client.clock = verifier.clock  # one clock: time in LLM calls or evaluation, counted once

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        recover_solution(self.run_dir / BEST)
        if self.state.step is Step.FINISHED and self.state.iteration < self.config.iterations:
            self.state.step = Step.EVALUATED  # resumed with more --iterations: carry on from the last one
        if self.state.step is Step.STARTED:
            self._initial_decomposition()
        while not self._loop_done():
            self._iteration()
        if self.state.step is not Step.FINISHED:
            if self.config.swap and self.state.step is not Step.SWAPPED:
                self._swap()
            self._checkpoint(Step.FINISHED)
        return self._outcome()

    def _loop_done(self) -> bool:
        at_end = self.state.iteration >= self.config.iterations and self.state.step is Step.EVALUATED
        return at_end or self.state.step in (Step.SWAPPED, Step.FINISHED)

    def _iteration(self) -> None:
        if self.state.step in (Step.DECOMPOSED, Step.EVALUATED):
            self.state.iteration += 1
            self.state.evolved = []
            self._refine()
        t = self.state.iteration
        started = time.monotonic()
        busy_before = self.verifier.clock.busy_s
        decomposition = Decomposition.read(iteration_dir(self.run_dir, t))
        if self.state.step is Step.REFINED:
            self._evolve_all(t, decomposition)
        record = self._evaluate(t, decomposition)
        record.seconds = time.monotonic() - started
        overhead = record.seconds - (self.verifier.clock.busy_s - busy_before)
        self.events.emit("iteration", index=t, seconds=round(record.seconds, 3),
                         overhead_s=round(overhead, 3), e2e=record.e2e_status, speedup=record.e2e_speedup)
        self._keep_if_best(record)
        self.state.history.append(record)
        self._checkpoint(Step.EVALUATED)

    def _checkpoint(self, step: Step) -> None:
        self.state.step = step
        self.state.save(self.run_dir)
        self.events.emit("checkpoint", iteration=self.state.iteration, step=step.value)

    # -- Decompose, Split, Fuse, TotalFuse -----------------------------------------------------

    def _agent_args(self) -> dict:
        return dict(config=self.config, client=self.client, pool=self.verifier.executor, events=self.events)

    def _initial_decomposition(self) -> None:
        self._phase(0, "decomposing")
        decomposition, report = decompose_agent.decompose(self.problem_path, **self._agent_args())
        decomposition.write(iteration_dir(self.run_dir, 0))
        how = "fallback (the original module as one subproblem)" if decomposition.fallback else "passed every check"
        self.display.log(f"decomposed into {len(decomposition.names)} subproblem(s), {how}: "
                         f"{', '.join(decomposition.names)}")
        self.events.emit("decomposition", iteration=0, refinement="initial", subproblems=decomposition.names,
                         fallback=decomposition.fallback, checks=report.to_dict())
        self._checkpoint(Step.DECOMPOSED)

    def _refine(self) -> None:
        """This iteration's decomposition: TotalFuse when the last end-to-end check failed while every
        subkernel passed locally; otherwise Split failing subproblems, or Fuse, every L iterations."""
        t = self.state.iteration
        before = Decomposition.read(iteration_dir(self.run_dir, t - 1))
        decomposition, refinement = self._refined(t, before)
        if decomposition is before:
            refinement = "none"  # no agent was asked, or the agent's output failed the checks
        self.state.needs_total_fuse = False
        decomposition.write(iteration_dir(self.run_dir, t))
        self._reconcile_beams(decomposition)
        how = "decomposition unchanged" if refinement == "none" else refinement.replace("_", " ")
        self.display.log(f"iteration {t}: {how}: {', '.join(decomposition.names)}")
        self.events.emit("decomposition", iteration=t, refinement=refinement, subproblems=decomposition.names,
                         fallback=decomposition.fallback)
        self.state.refinement = refinement
        self._checkpoint(Step.REFINED)

    def _refined(self, t: int, decomposition: Decomposition) -> tuple[Decomposition, str]:
        """TotalFuse supersedes the periodic step: a Split or Fuse it would replace is not paid for."""
        if self.state.needs_total_fuse and len(decomposition.names) > 1:
            self._phase(t, "total fuse: subkernels pass locally but not end to end")
            return fuse_agent.total_fuse(self.problem_path, decomposition, **self._agent_args()), "total_fuse"
        if t % self.config.refine_every != 0:
            return decomposition, "none"
        failing = [n for n in decomposition.names if self._failing(n)]
        if failing:
            self._phase(t, f"splitting {', '.join(failing)}")
            return split_agent.split(self.problem_path, decomposition, failing, **self._agent_args()), "split"
        if self.config.fuse:
            self._phase(t, "fusing")
            return fuse_agent.fuse(self.problem_path, decomposition, **self._agent_args()), "fuse"
        return decomposition, "none"

    def _reconcile_beams(self, decomposition: Decomposition) -> None:
        """A subproblem whose source is unchanged keeps its beam; new or changed ones start empty."""
        beams, sources = {}, {}
        for spec in decomposition.subproblems:
            digest = beam_hash(spec.source)
            if self.state.beam_sources.get(spec.name) == digest:
                beams[spec.name] = self.state.beams[spec.name]
            else:
                beams[spec.name] = Beam(width=self.config.beam_width).to_dict()
            sources[spec.name] = digest
        self.state.beams, self.state.beam_sources = beams, sources

    # -- EvolveKernel for every subproblem ------------------------------------------------------

    def _beam(self, name: str) -> Beam:
        return Beam.from_dict(self.state.beams[name])

    def _best_of(self, name: str):
        return self._beam(name).best if name in self.state.beams else None

    def _exhausted(self, name: str) -> str | None:
        """Why the agent has no (further) kernel for this subproblem; None while it may still be asked."""
        return self._beam(name).exhausted_for(self.config.model)

    def _failing(self, name: str) -> bool:
        """Tried (or declined by the agent) and still without an accepted kernel; a subproblem never evolved
        is new, not failing."""
        beam = self._beam(name)
        return (beam.next_seq > 0 or self._exhausted(name) is not None) and beam.best is None

    def _budget(self, decomposition: Decomposition) -> dict[str, int]:
        needs_work = {n for n in decomposition.names if self._best_of(n) is None}
        exhausted = {n for n in decomposition.names if self._exhausted(n) is not None}
        last = self.state.history[-1].runtime_ms if self.state.history else {}
        return allocate_budget(self.config.budget, decomposition.names, needs_work, last, exhausted)

    def _evolve_all(self, t: int, decomposition: Decomposition) -> None:
        folder = iteration_dir(self.run_dir, t)
        if not self.state.evolved:
            self.state.budget = self._budget(decomposition)
            self.events.emit("budget", iteration=t, calls=self.state.budget)
        budget = self.state.budget
        shares = self.state.history[-1].runtime_ms if self.state.history else {}
        total_ms = sum(shares.values()) or None
        for name in decomposition.names:
            if name in self.state.evolved:
                continue
            self._phase(t, f"evolving {name} ({budget[name]} calls)")
            self.display.view.rows[name] = SubproblemRow(status="evolving", calls=budget[name])
            context = RefineContext(share=(shares.get(name, 0.0) / total_ms) if total_ms else None,
                                    end_to_end_ms=total_ms)
            before = self._beam(name)
            beam = evolve_kernel(name, folder / "subkernel_problems" / f"{name}.py", before,
                                 budget[name], self.verifier, self.client, self.config,
                                 folder / "candidates", context)
            self.state.beams[name] = beam.to_dict()
            self.state.evolved.append(name)
            best = beam.best
            self.display.view.rows[name] = SubproblemRow(status="passing" if best else "failing",
                                                         calls=beam.next_seq - before.next_seq,
                                                         speedup=best.result.speedup if best else None)
            if beam.exhausted is not None and before.exhausted is None:
                self.display.log(f"iteration {t}: {name}: {beam.exhausted.reason}; no further call for it")
            self.display.view.tokens = self.client.tokens().total.total
            self.state.save(self.run_dir)
        self._checkpoint(Step.EVOLVED)

    # -- Evaluate ------------------------------------------------------------------------------

    def _evaluate(self, t: int, decomposition: Decomposition) -> IterationRecord:
        self._phase(t, "evaluating end to end")
        folder = iteration_dir(self.run_dir, t)
        subkernels = {n: self._subkernel_record(n) for n in decomposition.names}
        record = IterationRecord(index=t, refinement=self.state.refinement,
                                 subproblems=decomposition.names, budget=dict(self.state.budget),
                                 subkernels=subkernels)
        missing = [n for n, r in subkernels.items() if r.candidate is None]
        # Guarded completion: a subproblem without an accepted kernel keeps its own PyTorch code, declared to
        # the verifier (and in the manifest) as such, so the iteration still yields a verified solution.
        record.pytorch = missing
        for name in missing:
            record.subkernels[name].origin, record.subkernels[name].reason = ORIGIN_PYTORCH, self._no_kernel(name)
            self.display.log(f"iteration {t}: {name} runs its PyTorch code: {record.subkernels[name].reason}")
        kernels = {n: pytorch_alternative(decomposition.subproblem(n).source) if n in missing
                   else self._best_of(n).source for n in decomposition.names}
        write_solution(folder, decomposition, kernels)
        result = self.verifier.check_composite(self.problem_path, folder, pytorch=frozenset(missing))
        record.e2e_status, record.e2e_reason, record.e2e_speedup = result.status.value, result.reason, result.speedup
        if result.passed:
            record.runtime_ms = self._profile(folder)
            for name, ms in record.runtime_ms.items():
                record.subkernels[name].runtime_ms = ms
        else:
            self.state.needs_total_fuse = True  # every Triton subkernel passed locally, end to end did not
            which = "every Triton subkernel passes" if missing else "subkernels pass"
            self.display.log(f"iteration {t}: {which} locally but the composite fails end to end: "
                             f"{result.status.value}: {result.reason}")
        return record

    def _no_kernel(self, name: str) -> str:
        """Why a subproblem has no accepted kernel: what the agent said, or the best verdict its candidates got."""
        exhausted = self._exhausted(name)
        if exhausted is not None:
            return exhausted
        beam = self._beam(name)
        if beam.next_seq == 0:
            return "no kernel requested yet (its budget this iteration was 0 calls)"
        if not beam.members:
            return f"none of its {beam.next_seq} candidate(s) had code"
        closest = beam.members[0]
        return (f"no accepted kernel among {beam.next_seq} candidate(s); the closest, {closest.id}: "
                f"{closest.result.status.value}: {closest.result.reason[:200]}")

    def _subkernel_record(self, name: str) -> SubkernelRecord:
        best = self._best_of(name)
        if best is None:
            return SubkernelRecord(status="failing")
        return SubkernelRecord(status=best.result.status.value, speedup=best.result.speedup, candidate=best.id,
                               origin=self.config.model, precision=best.result.precision)

    def _profile(self, folder: Path) -> dict[str, float]:
        job = Job("mkevolve.verify.profile:profile_subkernels",
                  {"problem_path": str(self.problem_path), "solution_path": str(folder / "decomposed_solution.py"),
                   "seed": self.config.seed, "eval_mode": self.config.eval_mode,
                   "timeout_s": self.config.timeout}, timeout=2 * self.config.timeout + 60)
        outcome = self.verifier.run_jobs([job])[0]
        profile = outcome.value if outcome.ok else None
        return profile.runtime_ms if isinstance(profile, SubkernelProfile) else {}

    # -- keep the best -------------------------------------------------------------------------

    def _best_record(self) -> IterationRecord | None:
        return next((r for r in self.state.history if r.index == self.state.best_iteration), None)

    def _keep_if_best(self, record: IterationRecord) -> None:
        rank, best = solution_rank(record), self._best_record()
        if rank is None or (best is not None and rank < solution_rank(best)):
            return
        record.kept = True
        self.state.best_score, self.state.best_iteration = rank[1], record.index
        folder = iteration_dir(self.run_dir, record.index)
        manifest = self._manifest(record)
        manifest.write(folder)
        copy_solution(folder, self.run_dir / BEST)
        self.display.view.best = f"iteration {record.index}, speedup {_fmt(record.e2e_speedup)}"
        self.display.log(f"iteration {record.index}: end to end passes (speedup {_fmt(record.e2e_speedup)}), "
                         f"{manifest.coverage.line()}; kept as best/")

    def _manifest(self, record: IterationRecord, origins: dict[str, str] | None = None) -> Manifest:
        import torch
        import triton

        total = sum(record.runtime_ms.values())
        entries = {}
        folder = iteration_dir(self.run_dir, record.index)
        for name, sub in record.subkernels.items():
            source = (folder / "subkernel_implementations" / f"{name}.py").read_text(encoding="utf-8")
            pytorch = name in record.pytorch
            entries[name] = SubkernelEntry(
                origin=(origins or {}).get(name, sub.origin), candidate=sub.candidate,
                status=STATUS_PYTORCH if pytorch else sub.status,
                speedup=sub.speedup, runtime_ms=sub.runtime_ms, precision=sub.precision,
                runtime_share=(sub.runtime_ms / total) if total and sub.runtime_ms is not None else None,
                sha256=sha256_of(source), reason=sub.reason if pytorch else None)
        return Manifest(problem=str(self.problem_path), device=self.verifier.device_name,
                        status=record.e2e_status, speedup=record.e2e_speedup, iteration=record.index,
                        versions={"torch": str(torch.__version__), "triton": str(triton.__version__)},
                        subkernels=entries)

    # -- Swap ----------------------------------------------------------------------------------

    def _swap(self) -> None:
        """Subkernels below tau x their torch.compile run their PyTorch code instead, if that does not
        make the end-to-end result worse (guarded)."""
        best_dir = self.run_dir / BEST
        if self.state.best_iteration is None:
            self._swap_skipped("no end-to-end solution to swap in")
            return
        manifest = Manifest.read(best_dir)
        # Only Triton subkernels are candidates: those already running PyTorch code have nothing to swap.
        speedups = {n: e.speedup for n, e in manifest.subkernels.items() if n not in manifest.pytorch_subkernels}
        slow = sorted(n for n, s in speedups.items() if s is not None and s < self.config.tau)
        if len(speedups) < 2:
            reason = "fewer than two Triton subkernels"
        elif any(s is None for s in speedups.values()):
            reason = "subkernel speedups are unknown (no GPU)"
        elif not slow:
            reason = f"every subkernel is at least {self.config.tau} x torch.compile"
        elif len(slow) == len(speedups):
            reason = "every subkernel is slower than tau; swapping all would leave no kernel"
        else:
            reason = ""
        if reason:
            self._swap_skipped(reason)
            return
        self._try_swap(manifest, slow)

    def _try_swap(self, manifest: Manifest, slow: list[str]) -> None:
        t = self.state.best_iteration
        trial = self.run_dir / "swap"
        copy_solution(self.run_dir / BEST, trial)
        decomposition = Decomposition.read(iteration_dir(self.run_dir, t))
        for name in slow:
            write_atomic(trial / "subkernel_implementations" / f"{name}.py",
                         pytorch_alternative(decomposition.subproblem(name).source))
        pytorch = frozenset(slow) | manifest.pytorch_subkernels
        result = self.verifier.check_composite(self.problem_path, trial, pytorch=pytorch)
        better = result.passed and result.speedup is not None and result.speedup >= (manifest.speedup or 0.0)
        self.events.emit("swap", subkernels=slow, status=result.status.value, speedup=result.speedup,
                         previous=manifest.speedup, kept=better)
        if better:
            for name in slow:
                entry = manifest.subkernels[name]
                entry.origin, entry.candidate, entry.precision = ORIGIN_PYTORCH, None, None
                entry.reason = f"--swap: at {_fmt(entry.speedup)} its torch.compile, below tau {self.config.tau}"
                entry.sha256 = sha256_of((trial / "subkernel_implementations" / f"{name}.py").read_text())
            manifest.speedup = result.speedup
            manifest.write(trial)
            copy_solution(trial, self.run_dir / BEST)
            self.display.log(f"swap: {', '.join(slow)} now run PyTorch; end to end {_fmt(result.speedup)}")
        else:
            self.display.log(f"swap of {', '.join(slow)} undone: end to end {_fmt(result.speedup)} "
                             f"({result.status.value}) vs {_fmt(manifest.speedup)}")
        self._checkpoint(Step.SWAPPED)

    def _swap_skipped(self, reason: str) -> None:
        self.events.emit("swap", skipped=reason)
        self.display.log(f"swap skipped: {reason}")
        self._checkpoint(Step.SWAPPED)

    # -- helpers -------------------------------------------------------------------------------

    def _phase(self, t: int, phase: str) -> None:
        self.display.view.iteration, self.display.view.phase = t, phase
        self.display.update()

    def _outcome(self) -> RunOutcome:
        outcome = RunOutcome(run_dir=self.run_dir, passed=self.state.best_iteration is not None, speedup=None,
                             iterations=self.state.iteration)
        if outcome.passed:
            manifest = Manifest.read(self.run_dir / BEST)  # after --swap, best/ is what the manifest says
            outcome.speedup, outcome.coverage = manifest.speedup, manifest.coverage
        elif self.state.history:
            last = self.state.history[-1]
            outcome.failure = f"iteration {last.index}: {last.e2e_status}: {last.e2e_reason}"
        return outcome


def solution_rank(record: IterationRecord) -> tuple[bool, float] | None:
    """How an iteration's solution compares (higher is better; None: it did not pass end to end). One entirely
    in Triton beats a partial one whatever their speeds: the user asked for kernels, and trading a slow kernel
    for PyTorch is --swap's guarded decision. Then the faster; on a CPU, correct is all that is known."""
    if record.e2e_status != Status.OK.value:
        return None
    return not record.pytorch, record.e2e_speedup if record.e2e_speedup is not None else 1.0


def _fmt(value: float | None) -> str:
    return "unknown (no GPU)" if value is None else f"{value:.3f}x"


# -- the `run` command ------------------------------------------------------------------------------


def prepare_run(args) -> tuple[Path, RunConfig, Path, RunState]:
    """A new run directory with its config and first checkpoint, or the one --resume names."""
    if args.resume:
        run_dir = Path(args.resume)
        state = RunState.load(run_dir)
        # Flags given with --resume change the saved config (e.g. more --iterations); the rest stays.
        overrides = {k: v for k, v in vars(args).items() if k in RunConfig.field_names() and v is not None}
        config = build_config(run_dir / "config.yaml", overrides)
        write_atomic(run_dir / "config.yaml", config.to_yaml())
        return Path(state.problem), config, run_dir, state
    if not args.problem:
        raise ProblemError("<problem>", "give a problem file, or --resume RUN_DIR")
    config = config_from_args(args)
    problem_path = Path(args.problem)
    load_problem(problem_path)
    run_dir = new_run_dir(config.out, problem_path)
    write_atomic(run_dir / "config.yaml", config.to_yaml())
    state = RunState(problem=str(problem_path.resolve()), run_id=run_dir.name)
    state.save(run_dir)
    return problem_path, config, run_dir, state


def seed_run(problem_path: Path, config: RunConfig, decomposition: Decomposition,
             beams: dict[str, Beam]) -> tuple[Path, RunState]:
    """A new run that starts from a given decomposition and beams (what `port` reuses), not from Decompose."""
    problem_path = Path(problem_path)
    run_dir = new_run_dir(config.out, problem_path)
    write_atomic(run_dir / "config.yaml", config.to_yaml())
    decomposition.write(iteration_dir(run_dir, 0))
    state = RunState(problem=str(problem_path.resolve()), run_id=run_dir.name, step=Step.DECOMPOSED)
    for spec in decomposition.subproblems:
        beam = beams.get(spec.name) or Beam(width=config.beam_width)
        state.beams[spec.name], state.beam_sources[spec.name] = beam.to_dict(), beam_hash(spec.source)
    state.save(run_dir)
    return run_dir, state


def execute_run(problem_path: Path, config: RunConfig, run_dir: Path, state: RunState) -> tuple[RunOutcome, int]:
    """Run (or resume) to the end with a live display; returns the outcome and the LLM calls it paid for."""
    from mkevolve.llm.client import make_client
    from mkevolve.verify.verifier import Verifier

    events = EventLog(run_dir / "events.jsonl")
    client = make_client(config, events, cache_dir=run_dir / "llm_cache")
    display = RunDisplay(RunView(problem=Path(problem_path).name, iterations=config.iterations))
    display.console.print(f"run directory: {run_dir}")
    try:
        with Verifier(config, events) as verifier, display:
            outcome = Orchestrator(problem_path, config, run_dir, state, client, verifier, display).run()
    except KeyboardInterrupt:
        display.console.print(f"interrupted; best/ is consistent. Continue with: "
                              f"python -m mkevolve run --resume {run_dir}")
        raise
    client.emit_totals()
    _write_report(run_dir, display)
    _print_summary(outcome, display)
    return outcome, client.provider_calls


def run_command(args) -> int:
    """`mkevolve run`: 0 when best/ holds a verified end-to-end solution (all in Triton or partial), 1 when
    none passed, 2 bad input."""
    try:
        problem_path, config, run_dir, state = prepare_run(args)
    except StateError as err:
        raise ProblemError(Path(args.resume) / "state.json", str(err).split(": ", 1)[-1]) from None
    outcome, _ = execute_run(problem_path, config, run_dir, state)
    # A partial best/ (some subkernels run their PyTorch code) still exits 0: the status answers "is there a
    # verified solution to use?", as `eval` and `swap ... pytorch` answer it for the same folder, and 1
    # would make it look like no best/ at all. What the user got is said in the last line and the manifest,
    # and `pack` lists, and `check` rejects, a file with PyTorch subkernels, so nothing downstream takes a
    # partial solution for an all-Triton one.
    return 0 if outcome.passed else 1


def _write_report(run_dir: Path, display: RunDisplay) -> None:
    try:
        from mkevolve.report import write_report
    except ImportError:
        return
    display.console.print(f"report: {write_report(run_dir)}")


def _print_summary(outcome: RunOutcome, display: RunDisplay) -> None:
    if not outcome.passed:
        why = f" ({outcome.failure})" if outcome.failure else ""
        display.console.print(f"[red]no end-to-end solution passed[/red] after {outcome.iterations} iteration(s)"
                              f"{escape(why)}; candidates and verdicts are in {outcome.run_dir / 'iterations'}",
                              soft_wrap=True)
        return
    manifest = Manifest.read(outcome.run_dir / BEST)
    rows = [(name, e.status, "n/a (PyTorch)" if name in outcome.coverage.pytorch else _fmt(e.speedup),
             "unknown" if e.runtime_share is None else f"{100 * e.runtime_share:.1f}%", e.origin)
            for name, e in manifest.subkernels.items()]
    title = f"best/ (iteration {manifest.iteration}): end to end {manifest.status}, speedup {_fmt(manifest.speedup)}"
    display.console.print(final_table(rows, title))
    for name in outcome.coverage.pytorch:
        reason = manifest.subkernels[name].reason or "declared PyTorch code"
        display.console.print(f"  {name}: PyTorch code: {reason}", markup=False, highlight=False, soft_wrap=True)
    display.console.print(f"solution: {outcome.run_dir / BEST}")
    # The last line says what the user got; a partial solution says so loudly (its exit status is still 0).
    style = "green" if outcome.coverage.complete else "bold yellow"
    display.console.print(f"[{style}]{escape(outcome.coverage.line())}[/{style}]", soft_wrap=True)
