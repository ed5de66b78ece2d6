"""MKEvolve's Algorithm 1 and 2: decompose, refine, evolve per subproblem, evaluate, keep the best, swap."""

from __future__ import annotations

import contextlib
import errno
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from datetime import datetime, timezone
from pathlib import Path

from rich.markup import escape

from mkevolve.agents import decompose as decompose_agent
from mkevolve.agents import fuse as fuse_agent
from mkevolve.agents import split as split_agent
from mkevolve.agents.evolve import UNTIMED_NOTE, RefineContext, SearchProgress, evolve_kernel, times_kernels
from mkevolve.agents.judge import Judge, check_judge, make_judge
from mkevolve.budget import allocate_budget
from mkevolve.codebase import Decomposition, write_solution
from mkevolve.config import RunConfig, build_config, config_from_args, load_yaml, require_installed
from mkevolve.display import RowStatus, RunDisplay, RunView, SubproblemRow, final_table
from mkevolve.end_to_end_ahead import PRIORITY as AHEAD_PRIORITY
from mkevolve.end_to_end_ahead import Composition, EndToEndAhead
from mkevolve.event_records import EndToEndAheadEvent, SwapEvent, SwapSkippedEvent
from mkevolve.events import EventLog, process_age_s
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.llm.providers import ProviderError, make_provider
from mkevolve.problem import ProblemError, load_problem
from mkevolve.report import write_report
from mkevolve.run_layout import BEST, ITERATIONS, ahead_dir, iteration_dir
from mkevolve.run_state import IterationRecord, RunState, StateError, Step, SubkernelRecord, SubkernelStatus
from mkevolve.search.beam import Beam, Candidate
from mkevolve.solution import (ORIGIN_PYTORCH, Coverage, EntryStatus, Manifest, SubkernelEntry, copy_solution,
                               mode_name, pytorch_alternative, recover_solution, sha256_of)
from mkevolve.verify.profile import SubkernelProfile
from mkevolve.verify.result import EvalResult, Status, not_started_cause
from mkevolve.workers.pool import Job

SPLIT_REASONS = 3  # failed candidates whose verdicts the Split prompt quotes, per subproblem
# Seconds a subproblem's prepare job waits before it asks for a worker: the builtin agent's first kernels come
# within 0.1 s of the decomposition, and their checks should have the workers; a model's take seconds or more.
# Likewise a reply's subproblems prepared while it is checked wait for its check to take a worker first.
PREPARE_GRACE_S = 2.0


@dataclass
class RunOutcome:
    run_dir: Path
    passed: bool                      # best/ holds a solution verified end to end
    speedup: float | None
    iterations: int
    coverage: Coverage | None = None  # how much of best/ runs in Triton; None without best/
    failure: str = ""                 # without best/: why the last iteration's composite did not pass
    last: IterationRecord | None = None   # the last iteration: every subproblem's outcome and reason
    stop: str = ""                    # why the search ended before its last iteration


@dataclass(frozen=True)
class Refinement:
    """A refinement agent to ask, and for what. Asked again of the same decomposition it gives the same answer:
    the builtin agent is deterministic, and a model's reply to the same prompt comes from the response cache."""

    agent: str                        # split | fuse | total_fuse
    failing: tuple[str, ...] = ()     # what a split is asked to split

    def __str__(self) -> str:
        return f"{self.agent} {', '.join(self.failing)}" if self.failing else self.agent


def new_run_dir(out: str | Path, problem_path: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = Path(out) / problem_path.stem
    run_dir, n = base / stamp, 1
    while run_dir.exists():
        n += 1
        run_dir = base / f"{stamp}-{n}"
    run_dir.mkdir(parents=True)
    return run_dir


def beam_hash(source: str) -> str:
    return sha256_of(source)[:16]


def _failure_reason(candidate: Candidate) -> str:
    """Why a candidate of a failing subproblem did not count: its verdict, or the final cheating check."""
    if candidate.passed and candidate.accepted is False:
        return "passed its checks, but the final cheating check rejected it"
    return candidate.result.reason


class Orchestrator:
    """One run: owns its folder, checkpoint, LLM client and verifier; `run()` goes to the end."""

    def __init__(self, problem_path: Path, config: RunConfig, run_dir: Path, state: RunState,
                 client, verifier, display: RunDisplay, judge: Judge | None = None):
        self.problem_path = Path(problem_path).resolve()
        self.config = config
        self.run_dir = Path(run_dir)
        self.state = state
        self.client = client
        self.judge = judge  # the optional LLM judge (--judge); None: off
        self.verifier = verifier
        self.display = display
        self.events: EventLog = verifier.events
        self.client.clock = verifier.clock  # one clock: time in LLM calls or evaluation, counted once
        if judge is not None:
            judge.client.clock = verifier.clock
        self._state_lock = threading.Lock()  # subproblems evolve at once (_search_lanes)
        self._end_to_end_prepared = False
        self._ahead: EndToEndAhead | None = None          # this iteration's end-to-end checks ahead, if any
        self._aheads: list[EndToEndAhead] = []            # every iteration's, waited for at the end
        # --time-budget: past this moment (time.monotonic()) no kernel is asked for and no iteration starts
        self.deadline = time.monotonic() + config.time_budget if config.time_budget > 0 else None
        if self.deadline is not None:  # and checks still queued for a worker then are not started
            verifier.candidates_start_by = time.time() + config.time_budget
        self.interrupted = threading.Event()  # set by interrupted_by_signals: searches ask for no further batch

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        recover_solution(self.run_dir / BEST)
        if self.state.step is Step.FINISHED and self.state.iteration < self.config.iterations:
            self.state.step = Step.EVALUATED  # resumed with more --iterations: carry on from the last one
            self.state.stop = ""              # another model or budget may change what stopped it early
        if not self._loop_done():
            self._prepare_end_to_end(at_start=True)
        if self.state.step is Step.STARTED:
            self._initial_decomposition()
        while not self._loop_done():
            self._iteration()
        self._close_checks_ahead()
        if self.state.step is not Step.FINISHED:
            if self.config.swap and self.state.step is not Step.SWAPPED:
                self._swap()
            self._checkpoint(Step.FINISHED)
        return self._outcome()

    def _loop_done(self) -> bool:
        at_end = self.state.iteration >= self.config.iterations and self.state.step is Step.EVALUATED
        stopped = bool(self.state.stop) and self.state.step is Step.EVALUATED
        return at_end or stopped or self.state.step in (Step.SWAPPED, Step.FINISHED)

    def _iteration(self) -> None:
        if self.state.step in (Step.DECOMPOSED, Step.EVALUATED):
            self.state.iteration += 1
            self.state.evolved, self.state.made = [], {}
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
        self._emit_iteration(record, overhead)
        self._keep_if_best(record)
        self.state.history.append(record)
        self.state.stop = self._time_spent() or self._nothing_can_change(record, decomposition) or ""
        self._checkpoint(Step.EVALUATED)
        if self.state.stop:
            self.events.emit("stopped", iteration=t, iterations=self.config.iterations, reason=self.state.stop)
            self.display.log(f"stopped after iteration {t} of {self.config.iterations}: {self.state.stop}")

    def _emit_iteration(self, record: IterationRecord, overhead: float) -> None:
        """The iteration's end-to-end verdict, and each subproblem's outcome with its reason, in the log."""
        for name, sub in record.subkernels.items():
            self.events.emit("subproblem_outcome", iteration=record.index, subproblem=name,
                             outcome=ORIGIN_PYTORCH if sub.candidate is None else "triton", candidate=sub.candidate,
                             status=sub.status.value, speedup=sub.speedup, candidates=sub.candidates,
                             reason=sub.reason, summary=sub.outcome())
        self.events.emit("iteration", index=record.index, seconds=round(record.seconds, 3),
                         overhead_s=round(overhead, 3), e2e=record.e2e_status, e2e_reason=record.e2e_reason,
                         e2e_ran=record.e2e_ran, e2e_not_run=record.e2e_not_run, speedup=record.e2e_speedup,
                         candidates=sum(sub.candidates for sub in record.subkernels.values()),
                         refinement=record.refinement, asked=record.asked)

    def _nothing_can_change(self, record: IterationRecord, decomposition: Decomposition) -> str | None:
        """Why no later iteration can differ from this one, or None. Nothing changes when no subproblem got a
        new candidate, the decomposition stayed, and the next refinement any later iteration would ask for is
        none, or the one this iteration asked for and got no change from (the same question, the same answer)."""
        t = record.index
        if t >= self.config.iterations or record.refinement != "none":
            return None
        if any(sub.candidates for sub in record.subkernels.values()):
            return None
        plans = (self._plan(u, decomposition) for u in range(t + 1, self.config.iterations + 1))
        pending = next((plan for plan in plans if plan is not None), None)
        quiet = "no subproblem got a new candidate and the decomposition is unchanged"
        if pending is None:
            return f"nothing can change: {quiet}, and no later iteration would split or fuse"
        if str(pending) == record.asked:
            return f"nothing can change: {quiet}, and {pending} was asked this iteration and left it as it was"
        return None

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _time_spent(self) -> str | None:
        """Why no further iteration starts: the time budget is spent (and iterations were left)."""
        if self._out_of_time() and self.state.iteration < self.config.iterations:
            return f"the time budget of {self.config.time_budget:g} s is spent"
        return None

    def _checkpoint(self, step: Step) -> None:
        self.state.step = step
        self.state.save(self.run_dir)
        self.events.emit("checkpoint", iteration=self.state.iteration, step=step.value)

    # -- Decompose, Split, Fuse, TotalFuse -----------------------------------------------------

    def _agent_args(self) -> dict:
        return dict(config=self.config, client=self.client, pool=self.verifier.executor, events=self.events)

    def _initial_decomposition(self) -> None:
        self._phase(0, "decomposing")
        decomposition, report = decompose_agent.decompose(self.problem_path, **self._agent_args(),
                                                          speculate=self._prepare_subproblems_ahead)
        decomposition.write(iteration_dir(self.run_dir, 0))
        self._reconcile_beams(decomposition)  # the beams keep what the check saw (input shapes) past a resume
        how = "fallback (the original module as one subproblem)" if decomposition.fallback else "passed every check"
        self.display.log(f"decomposed into {len(decomposition.names)} subproblem(s), {how}: "
                         f"{', '.join(decomposition.names)}")
        self.events.emit("decomposition", iteration=0, refinement="initial", subproblems=decomposition.names,
                         fallback=decomposition.fallback, checks=report.to_dict())
        self._checkpoint(Step.DECOMPOSED)

    def _prepare_subproblems_ahead(self, decomposition: Decomposition) -> None:
        """Speculation: a reply's subproblems prepared (references, baselines) while its decomposition is being
        checked, when a worker is to spare beside the check. The caches are keyed by source, so once it passes
        its subproblems' first checks find them made; if it fails, only idle workers' time was spent."""
        if self.verifier.executor.size > 1:
            self.verifier.prepare_sources({s.path: s.source for s in decomposition.subproblems},
                                          grace_s=PREPARE_GRACE_S)

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
        how = refinement.replace("_", " ")
        if refinement == "none":
            asked = f" ({self.state.asked}: no answer passed the checks)" if self.state.asked else ""
            how = f"decomposition unchanged{asked}"
        self.display.log(f"iteration {t}: {how}: {', '.join(decomposition.names)}")
        self.events.emit("decomposition", iteration=t, refinement=refinement, subproblems=decomposition.names,
                         fallback=decomposition.fallback, asked=self.state.asked)
        self.state.refinement = refinement
        self._checkpoint(Step.REFINED)

    def _plan(self, t: int, decomposition: Decomposition) -> Refinement | None:
        """The refinement iteration t asks for, if any. TotalFuse supersedes the periodic step: a Split or Fuse
        it would replace is not paid for."""
        if self.state.needs_total_fuse and len(decomposition.names) > 1:
            return Refinement("total_fuse")
        if t % self.config.refine_every != 0:
            return None
        failing = tuple(n for n in decomposition.names if self._failing(n) and self._debugged(n))
        if failing:
            return Refinement("split", failing)
        return Refinement("fuse") if self.config.fuse else None

    def _refined(self, t: int, decomposition: Decomposition) -> tuple[Decomposition, str]:
        plan = self._plan(t, decomposition)
        self.state.asked = str(plan) if plan is not None else ""
        if plan is None:
            return decomposition, "none"
        if plan.agent == "total_fuse":
            self._phase(t, "total fuse: subkernels pass locally but not end to end")
            return fuse_agent.total_fuse(self.problem_path, decomposition, **self._agent_args()), "total_fuse"
        if plan.agent == "split":
            self._phase(t, f"splitting {', '.join(plan.failing)}")
            split = split_agent.split(self.problem_path, decomposition, list(plan.failing),
                                      why={n: self._why_failing(n) for n in plan.failing}, **self._agent_args())
            return split, "split"
        self._phase(t, "fusing")
        return fuse_agent.fuse(self.problem_path, decomposition, **self._agent_args()), "fuse"

    def _reconcile_beams(self, decomposition: Decomposition) -> None:
        """A subproblem whose source is unchanged keeps its beam; new or changed ones start empty."""
        beams, sources = {}, {}
        for spec in decomposition.subproblems:
            digest = beam_hash(spec.source)
            if self.state.beam_sources.get(spec.name) == digest:
                beams[spec.name] = self.state.beams[spec.name]
            else:
                beams[spec.name] = Beam(width=self.config.beam_width)
            if beams[spec.name].input_shapes is None and spec.input_shapes:
                # as the decomposition check saw the file called: the first prompt needs no job for them (a job
                # would wait for a worker behind checks and preparations, 20 to 35 s at KernelBench size)
                beams[spec.name].input_shapes = list(spec.input_shapes)
            sources[spec.name] = digest
        self.state.beams, self.state.beam_sources = beams, sources

    # -- EvolveKernel for every subproblem ------------------------------------------------------

    def _beam(self, name: str) -> Beam:
        # Read only: a search works on a copy (evolve_kernel) and the result replaces the state's beam.
        return self.state.beams[name]

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

    def _debugged(self, name: str) -> bool:
        return self._beam(name).split_allowed(agent_exhausted=self._exhausted(name) is not None)

    def _why_failing(self, name: str) -> list[str]:
        """What the verifier said of a failing subproblem's best-ranked candidates (and why the agent has no
        more), for the Split prompt: the model cuts better knowing what went wrong."""
        beam = self._beam(name)
        lines = [f"{c.id}: {c.result.status.value}: {_failure_reason(c)}".rstrip(": ")
                 for c in beam.members[:SPLIT_REASONS]]
        exhausted = self._exhausted(name)
        return lines + ([f"the agent has no further kernel: {exhausted}"] if exhausted else [])

    def _settled(self, decomposition: Decomposition) -> list[str]:
        """Subproblems with an accepted kernel where kernels are not timed: a refined kernel could only tie with
        theirs, so they get no call (refine needs timings to rank)."""
        if times_kernels(self.verifier.device_name):
            return []
        return [n for n in decomposition.names if self._best_of(n) is not None]

    def _budget(self, t: int, decomposition: Decomposition) -> dict[str, int]:
        needs_work = {n for n in decomposition.names if self._best_of(n) is None}
        exhausted = {n for n in decomposition.names if self._exhausted(n) is not None}
        settled = self._settled(decomposition)
        if settled:
            self.events.emit("refine_skipped", iteration=t, subproblems=settled, reason=UNTIMED_NOTE)
            self.display.log(f"iteration {t}: refine skipped for {', '.join(settled)}: {UNTIMED_NOTE}")
        last = self.state.history[-1].runtime_ms if self.state.history else {}
        return allocate_budget(self.config.budget, decomposition.names, needs_work, last, exhausted | set(settled))

    def _evolve_all(self, t: int, decomposition: Decomposition) -> None:
        if not self.state.evolved:
            self.state.budget = self._budget(t, decomposition)
            self.events.emit("budget", iteration=t, calls=self.state.budget)
        self._show_rows(decomposition)
        pending = [name for name in decomposition.names if name not in self.state.evolved]
        folder = iteration_dir(self.run_dir, t)
        self.verifier.prepare([folder / decomposition.subproblem(name).path for name in pending
                               if self.state.budget.get(name, 0) > 0], grace_s=PREPARE_GRACE_S)
        self._prepare_end_to_end(at_start=False)
        self._ahead = self._checks_ahead(t, decomposition)
        with ThreadPoolExecutor(max_workers=self._search_lanes(len(pending))) as lanes:
            list(lanes.map(partial(self._evolve_one, t), pending))  # list(): a search's error is raised here
        if self._out_of_time():
            self.events.emit("time_budget_spent", iteration=t, seconds=self.config.time_budget)
            self.display.log(f"iteration {t}: the time budget of {self.config.time_budget:g} s is spent: "
                             "searches asked for no further batch")
        self._checkpoint(Step.EVOLVED)

    def _prepare_end_to_end(self, at_start: bool) -> None:
        """The end-to-end check's references and baseline, made ahead once per run: at the start when a worker
        is to spare beside the decomposition's check, else behind the first subproblems' checks."""
        if self._end_to_end_prepared or at_start != (self.verifier.executor.size > 1):
            return
        self._end_to_end_prepared = True
        self.verifier.prepare([self.problem_path], grace_s=0.0 if at_start else PREPARE_GRACE_S)

    def _checks_ahead(self, t: int, decomposition: Decomposition) -> EndToEndAhead | None:
        """End-to-end checks of the best composition so far, run while the searches go on (end_to_end_ahead.py),
        where kernels are timed (a search ends at its first passing kernel otherwise) and a second worker can
        take them."""
        if not times_kernels(self.verifier.device_name) or self.verifier.executor.size < 2:
            return None
        best = {n: self._best_of(n) for n in decomposition.names if self._best_of(n) is not None}
        pending = {n: self.state.budget.get(n, 0) for n in decomposition.names if n not in self.state.evolved}
        ahead = EndToEndAhead(t, decomposition.names, partial(self._check_ahead, t, decomposition), best, pending,
                              on_start=partial(self._ahead_started, t))
        self._aheads.append(ahead)
        return ahead

    def _check_ahead(self, t: int, decomposition: Decomposition, composition: Composition, number: int,
                     withdrawn: threading.Event) -> EvalResult:
        folder = ahead_dir(iteration_dir(self.run_dir, t), number)
        write_solution(folder, decomposition, composition.as_dict())
        return self.verifier.check_composite(self.problem_path, folder, priority=AHEAD_PRIORITY, withdrawn=withdrawn)

    def _ahead_started(self, t: int, composition: Composition, number: int) -> None:
        self.events.record(EndToEndAheadEvent(iteration=t, check=number, state=EndToEndAheadEvent.STARTED,
                                              candidates=dict(composition.candidates)))

    def _close_checks_ahead(self) -> None:
        """Waits for checks ahead still running; an error in one whose verdict was never used goes to the log."""
        for ahead in self._aheads:
            for number, error in ahead.close():
                self.events.record(EndToEndAheadEvent(iteration=ahead.iteration, check=number,
                                                      state=EndToEndAheadEvent.ERROR,
                                                      reason=f"{type(error).__name__}: {error}"[:300]))
        self._aheads, self._ahead = [], None

    def _search_lanes(self, pending: int) -> int:
        """How many subproblems evolve at once. Their searches are independent (each spends its own budget),
        so one waits for its model or its checks while another's run; a replay file answers in call order,
        so a replayed run evolves them one after another."""
        if self.client.in_call_order:
            return 1
        return max(1, min(pending, self.config.llm_parallel))

    def _evolve_one(self, t: int, name: str) -> None:
        folder = iteration_dir(self.run_dir, t)
        calls = self.state.budget[name]
        shares = self.state.history[-1].runtime_ms if self.state.history else {}
        total_ms = sum(shares.values()) or None
        if calls > 0:  # a subproblem without calls makes no candidate: nothing to watch
            # Shown by the search's first progress report, which knows how many of the calls it will make.
            self._phase(t, f"evolving {name} ({calls} calls)", show=False)
            self.display.set_row(name, SubproblemRow(status=RowStatus.EVOLVING, calls=calls, pending=calls))
        context = RefineContext(share=(shares.get(name, 0.0) / total_ms) if total_ms else None,
                                end_to_end_ms=total_ms)
        before = self._beam(name)
        beam = evolve_kernel(name, folder / "subkernel_problems" / f"{name}.py", before, calls, self.verifier,
                             self.client, self.config, folder / "candidates", context, progress=self._progress,
                             judge=self.judge, deadline=self.deadline, interrupted=self.interrupted,
                             on_child=self._ahead.child if self._ahead is not None else None)
        if self.interrupted.is_set():
            return  # stopped mid-search, its last checks unfinished: a resumed run searches this subproblem again
        with self._state_lock:  # other subproblems' searches end at the same time
            self.state.beams[name] = beam
            self.state.evolved.append(name)
            self.state.made[name] = beam.next_seq - before.next_seq
            self.display.set_row(name, self._row(name, done=self.state.made[name]))
            self.display.view.tokens = self.client.tokens().total.total
            self._log_evolved(t, name, before)
            self.state.save(self.run_dir)

    def _progress(self, progress: SearchProgress) -> None:
        self.display.set_row(progress.subproblem, SubproblemRow(
            status=RowStatus.EVOLVING, calls=progress.planned, done=progress.done, pending=progress.pending,
            passing=progress.passing))
        self.display.update()

    def _row(self, name: str, done: int = 0) -> SubproblemRow:
        """A subproblem's row between searches: whether it has a kernel, or why not in a word."""
        best = self._best_of(name)
        if best is not None:
            status = RowStatus.PASSING
        elif self._exhausted(name) is not None:
            status = RowStatus.DECLINED
        else:
            status = RowStatus.FAILING if self._failing(name) else RowStatus.NEW
        return SubproblemRow(status=status, calls=self.state.budget.get(name, 0), done=done,
                             speedup=best.result.speedup if best else None, passing=best is not None)

    def _show_rows(self, decomposition: Decomposition) -> None:
        """Every subproblem of this iteration in the live view, those still to evolve as waiting."""
        rows = {}
        for name in decomposition.names:
            row = self._row(name, done=self.state.made.get(name, 0))
            if name not in self.state.evolved and self.state.budget.get(name, 0) > 0:
                row.status, row.pending = RowStatus.WAITING, self.state.budget[name]
            rows[name] = row
        self.display.set_rows(rows)

    def _log_evolved(self, t: int, name: str, before: Beam) -> None:
        """One line per search: what it made, and the subproblem's kernel or why it has none."""
        beam, made = self._beam(name), self.state.made[name]
        newly_exhausted = beam.exhausted is not None and before.exhausted is None
        if made == 0 and not newly_exhausted:
            return
        best, unspent = beam.best, self.state.budget.get(name, 0) - made
        if best is not None:
            speed = "speedup unknown" if best.result.speedup is None else f"speedup {best.result.speedup:.2f}x"
            line = f"kernel {best.id} passes ({speed})"
            if newly_exhausted:
                line += f"; {beam.exhausted.reason}"
            elif unspent > 0 and not times_kernels(self.verifier.device_name):
                line += f"; {unspent} call(s) not made: no GPU to time a faster kernel"
        else:
            line = self._no_kernel(name)
        stop = "; no further call for it" if newly_exhausted else ""
        self.display.log(f"iteration {t}: {name}: {made} new candidate(s); {line}{stop}")

    # -- Evaluate ------------------------------------------------------------------------------

    def _evaluate(self, t: int, decomposition: Decomposition) -> IterationRecord:
        self._phase(t, "evaluating end to end")
        folder = iteration_dir(self.run_dir, t)
        subkernels = {n: self._subkernel_record(n) for n in decomposition.names}
        for name, sub in subkernels.items():
            sub.candidates = self.state.made.get(name, 0)
        record = IterationRecord(index=t, refinement=self.state.refinement, asked=self.state.asked,
                                 subproblems=decomposition.names, budget=dict(self.state.budget),
                                 subkernels=subkernels)
        missing = [n for n, r in subkernels.items() if r.candidate is None]
        # Guarded completion: a subproblem without an accepted kernel keeps its own PyTorch code, declared to
        # the verifier (and in the manifest) as such, so the iteration still yields a verified solution.
        record.pytorch = missing
        for name in missing:
            record.subkernels[name].origin, record.subkernels[name].reason = ORIGIN_PYTORCH, self._no_kernel(name)
            self.display.log(f"iteration {t}: {name} runs its PyTorch code: {record.subkernels[name].reason}")
        result = self._compose(folder, decomposition, missing)
        if not result.passed and not composite_not_run(result):
            self.state.needs_total_fuse = True  # every Triton subkernel passed locally, end to end did not
            which = "every Triton subkernel passes" if missing else "subkernels pass"
            self.display.log(f"iteration {t}: {which} locally but the composite fails end to end: "
                             f"{result.status.value}: {result.reason}")
            result = self._fall_back(t, folder, decomposition, record, result)
        record.e2e_status, record.e2e_reason, record.e2e_speedup = result.status.value, result.reason, result.speedup
        record.e2e_error_vs_fp64, record.e2e_eager_error_vs_fp64 = result.error_vs_fp64, result.eager_error_vs_fp64
        record.e2e_not_run = composite_not_run(result)
        record.e2e_ran = not record.e2e_not_run
        if result.passed:
            record.runtime_ms = self._profile(folder, decomposition, result)
            for name, ms in record.runtime_ms.items():
                record.subkernels[name].runtime_ms = ms
        elif not record.e2e_ran:
            self.display.log(f"iteration {t}: the end-to-end check did not run: {record.e2e_not_run}")
        self._ahead = None      # its checks may still run: _close_checks_ahead waits for them at the end
        return record

    def _compose(self, folder: Path, decomposition: Decomposition, pytorch: list[str]) -> EvalResult:
        """Write the composed solution (the `pytorch` subproblems as their own PyTorch code) and check it."""
        kernels = {n: pytorch_alternative(decomposition.subproblem(n).source) if n in pytorch
                   else self._best_of(n).source for n in decomposition.names}
        write_solution(folder, decomposition, kernels)
        ahead = self._ahead.verdict_for(kernels) if self._ahead is not None and not pytorch else None
        if ahead is not None:
            # The same check, of the same files, already run while the searches went on.
            number, result = ahead
            self.events.record(EndToEndAheadEvent(iteration=self._ahead.iteration, check=number,
                                                  state=EndToEndAheadEvent.USED))
            return result
        return self.verifier.check_composite(self.problem_path, folder, pytorch=frozenset(pytorch))

    def _fall_back(self, t: int, folder: Path, decomposition: Decomposition, record: IterationRecord,
                   failed: EvalResult) -> EvalResult:
        """Guarded integration: the composite failed, so keep the most valuable half of its Triton subkernels
        (by speedup) and run the rest as PyTorch code, halving until a composite passes; at worst every
        subproblem runs its PyTorch code. At most log2(n) + 1 more end-to-end checks for n subkernels."""
        triton = sorted((n for n in decomposition.names if n not in record.pytorch),
                        key=lambda n: -(record.subkernels[n].speedup or 0.0))
        result = failed
        while triton and not result.passed:
            triton = triton[:len(triton) // 2]
            pytorch = [n for n in decomposition.names if n not in triton]
            result = self._compose(folder, decomposition, pytorch)
            kept = ", ".join(triton) or "none"
            self.display.log(f"iteration {t}: guarded fallback with Triton for {kept}: {result.status.value}")
            if composite_not_run(result):
                return result
        if not result.passed:
            return result
        reason = f"reverted to its PyTorch code: the composite with it failed end to end ({failed.reason[:200]})"
        for name in decomposition.names:
            if name not in triton and name not in record.pytorch:
                sub = record.subkernels[name]
                sub.origin, sub.candidate, sub.precision, sub.reason = ORIGIN_PYTORCH, None, None, reason
        record.pytorch = [n for n in decomposition.names if n not in triton]
        return result

    def _no_kernel(self, name: str) -> str:
        """Why a subproblem has no accepted kernel: what the agent said, or the best verdict its candidates got."""
        exhausted = self._exhausted(name)
        if exhausted is not None:
            return exhausted
        beam = self._beam(name)
        if beam.next_seq == 0:
            return "no kernel requested yet (its budget this iteration was 0 calls)"
        if not beam.members:
            last = f"; the last: {beam.codeless[:300]}" if beam.codeless else ""
            return f"none of its {beam.next_seq} candidate(s) had code{last}"
        closest = beam.members[0]
        return (f"no accepted kernel among {beam.next_seq} candidate(s); the closest, {closest.id}: "
                f"{closest.result.status.value}: {closest.result.reason[:200]}")

    def _subkernel_record(self, name: str) -> SubkernelRecord:
        best = self._best_of(name)
        if best is None:
            return SubkernelRecord(status=SubkernelStatus.FAILING)
        # The best member passed every check, so its verdict is the verifier's OK.
        return SubkernelRecord(status=SubkernelStatus.OK, speedup=best.result.speedup, candidate=best.id,
                               origin=self.config.model, precision=best.result.precision,
                               error_vs_fp64=best.result.error_vs_fp64,
                               eager_error_vs_fp64=best.result.eager_error_vs_fp64)

    def _profile(self, folder: Path, decomposition: Decomposition, passed: EvalResult) -> dict[str, float]:
        """Each subkernel's milliseconds inside one end-to-end forward ({} where nothing is timed). A single
        subkernel is the whole forward: its time is the end-to-end check's, with no second candidate process
        compiling and timing the same kernels again (5 to 6 s of a full-size GEMM's run on an H200)."""
        if len(decomposition.names) == 1:
            return {decomposition.names[0]: passed.runtime.median_ms} if passed.runtime is not None else {}
        if self._out_of_time():
            # The shares steer the next iteration's budget and fill the report's share column; past the time
            # budget no iteration follows, and a full-size model's profile is one more process to compile.
            self.events.emit("profile_skipped", reason="the time budget is spent")
            return {}
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
                status=EntryStatus.PYTORCH if pytorch else EntryStatus.OK,  # not PyTorch: an accepted kernel
                speedup=sub.speedup, runtime_ms=sub.runtime_ms, precision=sub.precision,
                error_vs_fp64=None if pytorch else sub.error_vs_fp64,
                eager_error_vs_fp64=None if pytorch else sub.eager_error_vs_fp64,
                runtime_share=(sub.runtime_ms / total) if total and sub.runtime_ms is not None else None,
                sha256=sha256_of(source), reason=sub.reason if pytorch else None)
        return Manifest(problem=str(self.problem_path), device=self.verifier.device_name,
                        status=record.e2e_status, speedup=record.e2e_speedup, iteration=record.index,
                        error_vs_fp64=record.e2e_error_vs_fp64, eager_error_vs_fp64=record.e2e_eager_error_vs_fp64,
                        versions={"torch": str(torch.__version__), "triton": str(triton.__version__)},
                        subkernels=entries, mode=mode_name(self.config.eval_mode))

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
        self.events.record(SwapEvent(subkernels=tuple(slow), status=result.status.value, speedup=result.speedup,
                                     previous=manifest.speedup, kept=better))
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
        self.events.record(SwapSkippedEvent(skipped=reason))
        self.display.log(f"swap skipped: {reason}")
        self._checkpoint(Step.SWAPPED)

    # -- helpers -------------------------------------------------------------------------------

    def _phase(self, t: int, phase: str, show: bool = True) -> None:
        self.display.view.iteration, self.display.view.phase = t, phase
        if show:
            self.display.update()

    def _outcome(self) -> RunOutcome:
        outcome = RunOutcome(run_dir=self.run_dir, passed=self.state.best_iteration is not None, speedup=None,
                             iterations=self.state.iteration, stop=self.state.stop,
                             last=self.state.history[-1] if self.state.history else None)
        if outcome.passed:
            manifest = Manifest.read(self.run_dir / BEST)  # after --swap, best/ is what the manifest says
            outcome.speedup, outcome.coverage = manifest.speedup, manifest.coverage
        elif outcome.last is not None:
            last = outcome.last
            verdict = f"not run: {last.e2e_not_run}" if last.e2e_not_run else f"{last.e2e_status}: {last.e2e_reason}"
            outcome.failure = f"iteration {last.index}: {verdict}"
        return outcome


def composite_not_run(result: EvalResult) -> str:
    """Why the verifier did not run the composed solution, or "" when it did (whatever the verdict). A static
    rejection returns before any job, so it has no phases; a candidate process that never started says so."""
    if result.passed:
        return ""
    if not result.phases:
        return f"the static checks rejected the composed solution before it ran ({result.status.value}): " \
               f"{result.reason}"
    cause = not_started_cause(result.reason)
    return "" if cause is None else f"the verifier could not start the candidate process ({cause})"


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
    """A new run directory with its config and first checkpoint, or the one --resume names. Everything is
    checked before a directory is made, so a bad flag leaves nothing behind."""
    if args.resume:
        return _resume(args)
    if not args.problem:
        raise ProblemError("<problem>", "give a problem file, or --resume RUN_DIR")
    config = config_from_args(args)
    problem_path = Path(args.problem)
    load_problem(problem_path)
    make_provider(config.model, config.api_base).check()  # a missing API key or replay file: nothing made yet
    check_judge(config)
    run_dir = new_run_dir(config.out, problem_path)
    write_atomic(run_dir / "config.yaml", config.to_yaml())
    state = RunState(problem=str(problem_path.resolve()), run_id=run_dir.name)
    state.save(run_dir)
    return problem_path, config, run_dir, state


def _resume(args) -> tuple[Path, RunConfig, Path, RunState]:
    run_dir = Path(args.resume)
    state = RunState.load(run_dir)
    if args.problem:
        _require_same_problem(Path(args.problem), Path(state.problem), run_dir)
    # The saved config, then --config, then flags: flags given with --resume change the saved config (e.g.
    # more --iterations); the rest stays.
    overrides = load_yaml(args.config) if args.config else {}
    overrides.update({k: v for k, v in vars(args).items() if k in RunConfig.field_names() and v is not None})
    config = build_config(run_dir / "config.yaml", overrides)
    require_installed(config)
    write_atomic(run_dir / "config.yaml", config.to_yaml())
    return Path(state.problem), config, run_dir, state


def _require_same_problem(given: Path, recorded: Path, run_dir: Path) -> None:
    """`run PROBLEM --resume DIR` resumes DIR's own problem; another PROBLEM would silently be ignored."""
    if given.resolve() == recorded.resolve():
        return
    # The same file at another path (the tree was moved or copied) is still the same problem.
    if given.is_file() and recorded.is_file() and sha256_of(given.read_text(encoding="utf-8")) == \
            sha256_of(recorded.read_text(encoding="utf-8")):
        return
    raise ProblemError(given, f"not the problem of run {run_dir}, which is {recorded}; "
                              "give that file, or no problem, with --resume")


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
        state.beams[spec.name], state.beam_sources[spec.name] = beam, beam_hash(spec.source)
    state.save(run_dir)
    return run_dir, state


@contextlib.contextmanager
def interrupted_by_signals(verifier, interrupted: threading.Event):
    """Inside the block, Ctrl-C (SIGINT) and SIGTERM set `interrupted`, so that searches ask for nothing more,
    abort the verifier's checks (their candidates get no verdict), and then raise KeyboardInterrupt: the command
    unwinds in seconds to its last checkpoint. Raised alone, KeyboardInterrupt waited for every running
    evaluation (minutes at full size) while the searches went on: their thread pools join their threads on the
    way out, and those threads wait on the workers. Signals reach the main thread only; elsewhere nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        interrupted.set()
        verifier.abort()
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def execute_run(problem_path: Path, config: RunConfig, run_dir: Path, state: RunState) -> tuple[RunOutcome, int]:
    """Run (or resume) to the end with a live display; returns the outcome and the LLM calls it paid for."""
    from mkevolve.llm.client import make_client
    from mkevolve.verify.verifier import Verifier

    events = EventLog(run_dir / "events.jsonl")
    # Imports, the configuration and the run directory, before anything else this run does.
    events.emit("run_started", startup_s=process_age_s())
    client = make_client(config, events, cache_dir=run_dir / "llm_cache")
    judge = make_judge(config, events, cache_dir=run_dir / "llm_cache")  # its cache keys name its model
    display = RunDisplay(RunView(problem=Path(problem_path).name, iterations=config.iterations))
    display.console.print(f"run directory: {run_dir}")
    try:
        with Verifier(config, events) as verifier, display:
            orchestrator = Orchestrator(problem_path, config, run_dir, state, client, verifier, display, judge)
            with interrupted_by_signals(verifier, orchestrator.interrupted):
                outcome = orchestrator.run()
            ended = time.time()
    except KeyboardInterrupt:
        display.console.print(f"interrupted; best/ is consistent. Continue with: "
                              f"python -m mkevolve run --resume {run_dir}")
        raise
    except OSError as err:
        if err.errno == errno.ENOSPC:  # checkpoints are written atomically: the last one stands
            display.console.print(f"the disk is full; best/ is consistent. Free space, then continue with: "
                                  f"python -m mkevolve run --resume {run_dir}")
        raise
    except ProviderError as err:
        # Every further call would fail the same way: stop here, at the last checkpoint, resumable.
        client.emit_totals()
        if judge is not None:
            judge.emit_totals()
        raise err.with_note(f"the run stopped; once the provider answers, continue it with: "
                            f"python -m mkevolve run --resume {run_dir}") from err
    client.emit_totals()
    if judge is not None:
        judge.emit_totals()
    _write_report(run_dir, display)
    # The workers stopped and the report written: what a run costs after its last check.
    events.emit("run_finished", closing_s=round(time.time() - ended, 3))
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
    return ExitCode.OK if outcome.passed else ExitCode.FAILED


def _write_report(run_dir: Path, display: RunDisplay) -> None:
    display.console.print(f"report: {write_report(run_dir)}")


def _print_summary(outcome: RunOutcome, display: RunDisplay) -> None:
    if not outcome.passed:
        _print_failure(outcome, display)
        return
    manifest = Manifest.read(outcome.run_dir / BEST)
    rows = [(name, e.status.value, "n/a (PyTorch)" if name in outcome.coverage.pytorch else _fmt(e.speedup),
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


def _print_failure(outcome: RunOutcome, display: RunDisplay) -> None:
    """Why no end-to-end solution passed: the last composite's verdict (or why it did not run), then every
    subproblem's outcome with its reason, in the agent's own words where it declined."""
    why = f" ({outcome.failure})" if outcome.failure else ""
    display.console.print(f"[red]no end-to-end solution passed[/red] after {outcome.iterations} iteration(s)"
                          f"{escape(why)}", soft_wrap=True)
    if outcome.last is not None:
        for name, sub in outcome.last.subkernels.items():
            display.console.print(f"  {name}: {sub.outcome()}", markup=False, highlight=False, soft_wrap=True)
    display.console.print(f"candidates and verdicts are in {outcome.run_dir / ITERATIONS}", markup=False,
                          highlight=False, soft_wrap=True)
