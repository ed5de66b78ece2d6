"""`mkevolve port`: adapt a solution to an architecture variant, reusing every subkernel that still fits."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from mkevolve.budget import allocate_budget
from mkevolve.codebase import PROBLEM_FILE, PROBLEMS_DIR, Decomposition
from mkevolve.config import RunConfig, config_from_args
from mkevolve.evaluate import SolutionFolder, SubkernelKind, open_solution
from mkevolve.event_records import PortEvent, PortMatch, PortReuse
from mkevolve.events import EventLog
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.matching import Match, match_subproblems
from mkevolve.orchestrator import execute_run, seed_run
from mkevolve.problem import ProblemError, load_problem
from mkevolve.report import write_report
from mkevolve.run_layout import BEST, iteration_dir
from mkevolve.run_state import RunState, Step
from mkevolve.search.beam import Beam, Candidate, CandidateRecord, PromptKind, candidate_id
from mkevolve.solution import MANIFEST, Manifest, sha256_of

PORT_REFINEMENT = "port"


class PortStatus(str, Enum):
    REUSED = "reused"                    # matched, and passes on the variant's subproblem
    REVERIFY_FAILED = "reverify_failed"  # matched, but fails on the variant's shapes: evolved, starting from it
    NO_KERNEL = "no_kernel"              # matched, but the solution runs PyTorch there (or has no file): evolved
    NEW = "new"                          # no match: evolved


@dataclass
class PortedSubproblem:
    name: str
    status: PortStatus
    source: str | None       # the solution subproblem it matched
    reason: str


@dataclass
class PortOutcome:
    run_dir: Path
    subproblems: list[PortedSubproblem]
    decompose_calls: int
    evolve_calls: int
    passed: bool
    speedup: float | None

    @property
    def llm_calls(self) -> int:
        return self.decompose_calls + self.evolve_calls

    @property
    def reused(self) -> list[str]:
        return [p.name for p in self.subproblems if p.status is PortStatus.REUSED]

    @property
    def evolved(self) -> list[str]:
        return [p.name for p in self.subproblems if p.status is not PortStatus.REUSED]


# ---- re-verifying matched kernels ---------------------------------------------------------------------


def _save_candidate(folder: Path, candidate: Candidate, subproblem_source: str, solution: SolutionFolder,
                    source_name: str) -> None:
    """The reused kernel as the run's first candidate of its subproblem, in the same form evolve saves."""
    write_atomic(folder / f"{candidate.id}.py", candidate.source)
    CandidateRecord(candidate, problem_sha256=sha256_of(subproblem_source),
                    ported_from={"solution": str(solution.path.resolve()), "subkernel": source_name}).write(folder)


def _not_checkable(match: Match, solution: SolutionFolder) -> PortedSubproblem | None:
    """The outcome of a variant subproblem whose match has no Triton kernel to re-verify; None if it has one."""
    if match.solution is None:
        return PortedSubproblem(match.variant, PortStatus.NEW, None, match.reason)
    kind = solution.kind(match.solution)
    if kind is SubkernelKind.TRITON:
        return None
    why = "runs PyTorch code" if kind is SubkernelKind.PYTORCH else "has no kernel file"
    return PortedSubproblem(match.variant, PortStatus.NO_KERNEL, match.solution,
                            f"matches {match.solution}, which {why} in the solution")


def reverify_matches(run_dir: Path, decomposition: Decomposition, matches: list[Match], solution: SolutionFolder,
                     verifier, beam_width: int) -> tuple[list[PortedSubproblem], dict[str, Beam]]:
    """Check each matched kernel against the variant's subproblem (its shapes, its configs), in parallel.
    A kernel that passes seeds its subproblem's beam as an accepted candidate; one that fails seeds it as a
    failing one, so the search starts by debugging it."""
    folder = iteration_dir(run_dir, 0)
    first = candidate_id(0)
    ported = {m.variant: outcome for m in matches if (outcome := _not_checkable(m, solution)) is not None}
    trials = [(m, write_atomic(folder / "candidates" / m.variant / f"{first}.py",
                               solution.kernel_file(m.solution).read_text(encoding="utf-8")))
              for m in matches if m.variant not in ported]
    pairs = [(folder / PROBLEMS_DIR / f"{m.variant}.py", path) for m, path in trials]
    beams = {}
    for (match, path), result in zip(trials, verifier.check_kernels(pairs, timed=True), strict=True):
        candidate = Candidate(id=first, subproblem=match.variant, parent=None, kind=PromptKind.GENERATE,
                              source=path.read_text(encoding="utf-8"), result=result,
                              accepted=True if result.passed else None)
        _save_candidate(path.parent, candidate, decomposition.subproblem(match.variant).source, solution,
                        match.solution)
        beams[match.variant] = Beam(width=beam_width, members=[candidate], next_seq=1)
        if result.passed:
            ported[match.variant] = PortedSubproblem(match.variant, PortStatus.REUSED, match.solution, match.reason)
        else:
            ported[match.variant] = PortedSubproblem(match.variant, PortStatus.REVERIFY_FAILED, match.solution,
                                                     f"matches {match.solution}, but on this subproblem: "
                                                     f"{result.summary()}")
    return [ported[m.variant] for m in matches], beams


# ---- the run ------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """A seeded run directory: the variant's decomposition, what was reused, and the beams to start from."""

    run_dir: Path
    state: RunState
    decomposition: Decomposition
    ported: list[PortedSubproblem]
    beams: dict[str, Beam]


def _seed_first_iteration(prepared: _Prepared, config: RunConfig, events: EventLog) -> None:
    """Iteration 1 starts with its decomposition fixed, the reused subkernels counted as evolved and the whole
    budget on the rest, so no call is spent on a kernel that was reused."""
    run_dir, state, decomposition, ported = prepared.run_dir, prepared.state, prepared.decomposition, prepared.ported
    needs_work = {p.name for p in ported if p.status is not PortStatus.REUSED}
    budget = (allocate_budget(config.budget, decomposition.names, needs_work, {}) if needs_work
              else {name: 0 for name in decomposition.names})
    state.beams.update(prepared.beams)
    decomposition.write(iteration_dir(run_dir, 1))
    state.iteration, state.step, state.refinement = 1, Step.REFINED, PORT_REFINEMENT
    state.evolved = [p.name for p in ported if p.status is PortStatus.REUSED]
    state.budget = budget
    state.save(run_dir)
    events.emit("decomposition", iteration=1, refinement=PORT_REFINEMENT, subproblems=decomposition.names,
                fallback=decomposition.fallback)
    events.emit("budget", iteration=1, calls=budget)


def _append_events(events: EventLog, run_dir: Path) -> None:
    """What happened before the run directory existed (decomposition, re-verification) goes first in its log."""
    lines = "".join(json.dumps(event, default=str) + "\n" for event in events.events)
    with (run_dir / "events.jsonl").open("a", encoding="utf-8") as log:
        log.write(lines)


def _record_reuse(run_dir: Path, ported: list[PortedSubproblem], solution: SolutionFolder) -> None:
    """best/manifest.yaml names, for each reused subkernel, the solution it came from and who wrote it."""
    best = run_dir / BEST
    if not (best / MANIFEST).is_file():
        return
    manifest = Manifest.read(best)
    for item in ported:
        entry = manifest.subkernels.get(item.name)
        if item.status is not PortStatus.REUSED or entry is None or entry.candidate != candidate_id(0):
            continue
        author = solution.manifest.subkernels.get(item.source) if solution.manifest else None
        entry.origin = author.origin if author else "unknown"
        entry.reused_from = f"{solution.path.resolve()} ({item.source})"
    manifest.write(best)


def _prepare(solution: SolutionFolder, variant_path: Path, config: RunConfig, client, events: EventLog) -> _Prepared:
    """Decompose the variant, match, seed a run directory and re-verify the matched kernels in it."""
    from mkevolve.agents.decompose import decompose
    from mkevolve.verify.verifier import Verifier

    with Verifier(config, events) as verifier:
        decomposition, report = decompose(variant_path, config, client, verifier.executor, events)
        if not report.passed:
            raise ProblemError(variant_path, "the variant fails the decomposition checks even as its own only "
                                             "subproblem: " + "; ".join(report.reasons()))
        matches = match_subproblems(Decomposition.read(solution.path), decomposition)
        run_dir, state = seed_run(variant_path, config, decomposition, {})
        ported, beams = reverify_matches(run_dir, decomposition, matches, solution, verifier, config.beam_width)
    return _Prepared(run_dir, state, decomposition, ported, beams)


def _emit_port(events: EventLog, solution: SolutionFolder, variant_path: Path, ported: list[PortedSubproblem],
               decompose_calls: int) -> None:
    events.record(PortEvent(
        solution=str(solution.path.resolve()), variant=str(variant_path.resolve()),
        subproblems=tuple(PortMatch(variant=p.name, status=p.status.value, solution=p.source, reason=p.reason)
                          for p in ported),
        reused=tuple(PortReuse(variant=p.name, solution=p.source) for p in ported if p.status is PortStatus.REUSED),
        evolved=tuple(p.name for p in ported if p.status is not PortStatus.REUSED),
        decompose_calls=decompose_calls))


def port_solution(solution_dir: str | Path, variant_path: str | Path, config: RunConfig) -> PortOutcome:
    """Decompose the variant, match its subproblems to the solution's, reuse every matched kernel that passes
    on the variant's shapes, and run one iteration that evolves only the rest; a normal run directory results."""
    from mkevolve.llm.client import make_client

    solution = open_solution(solution_dir)
    if not (solution.path / PROBLEM_FILE).is_file():
        raise ProblemError(solution.path, f"no {PROBLEM_FILE}: port needs the solution's decomposition")
    variant = load_problem(variant_path)
    config = replace(config, iterations=1)
    events = EventLog()
    client = make_client(config, events)
    prepared = _prepare(solution, variant.path, config, client, events)
    client.emit_totals()
    _emit_port(events, solution, variant.path, prepared.ported, client.provider_calls)
    _seed_first_iteration(prepared, config, events)
    _append_events(events, prepared.run_dir)
    print_matches(prepared.ported, solution.path)
    outcome, evolve_calls = execute_run(variant.path, config, prepared.run_dir, prepared.state)
    _record_reuse(prepared.run_dir, prepared.ported, solution)
    write_report(prepared.run_dir)
    return PortOutcome(run_dir=prepared.run_dir, subproblems=prepared.ported, decompose_calls=client.provider_calls,
                       evolve_calls=evolve_calls, passed=outcome.passed, speedup=outcome.speedup)


# ---- the command ---------------------------------------------------------------------------------------


def print_matches(ported: list[PortedSubproblem], solution_path: Path) -> None:
    from mkevolve.display import make_console
    from rich.table import Table

    console = make_console()
    table = Table(title=f"the variant's subproblems against {solution_path}")
    for column in ("subproblem", "from the solution", "outcome"):
        table.add_column(column, no_wrap=column == "subproblem")
    for item in ported:
        colour = "green" if item.status is PortStatus.REUSED else "yellow"
        outcome = "reused" if item.status is PortStatus.REUSED else f"evolve ({item.status.value})"
        table.add_row(item.name, item.source or "-", f"[{colour}]{outcome}[/{colour}]")
    console.print(table)
    for item in ported:
        console.print(f"  {item.name}: {item.reason}", markup=False, highlight=False, soft_wrap=True)


def port_command(args) -> int:
    """`mkevolve port SOLUTION_DIR VARIANT_PROBLEM`: 0 when the ported solution passes end to end, 1 when it
    does not, 2 for bad input."""
    outcome = port_solution(args.solution_dir, args.variant_problem, config_from_args(args))
    total = len(outcome.subproblems)
    print(f"port: reused {len(outcome.reused)} of {total} subkernel(s)"
          + (f" ({', '.join(outcome.reused)})" if outcome.reused else "")
          + f"; evolved {len(outcome.evolved)}" + (f" ({', '.join(outcome.evolved)})" if outcome.evolved else ""))
    print(f"LLM calls: {outcome.llm_calls} ({outcome.decompose_calls} to decompose the variant, "
          f"{outcome.evolve_calls} to evolve kernels)")
    print(f"run directory: {outcome.run_dir}")
    return ExitCode.OK if outcome.passed else ExitCode.FAILED
