"""report.html for a run directory: the result and what to run next, each subproblem's outcome and why, the
per-subkernel table with links to the kernel files, plots and the subproblem graph (inline SVG), tokens per agent."""

from __future__ import annotations

import html
import io
import math
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import jinja2
import networkx as nx
import yaml

from mkevolve.codebase import KERNELS_DIR, PROBLEM_FILE, PROBLEMS_DIR, SOLUTION_FILE, CodebaseError, Decomposition
from mkevolve.event_records import (CandidateEvent, EndToEndAheadEvent, EventFieldError, EventRecord, LLMCallEvent,
                                    LLMTokensEvent, PortEvent, SwapEvent, SwapSkippedEvent, VerdictEvent, of_type,
                                    parse_events)
from mkevolve.events import read_event_lines
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.matching import GRAPH_INPUT, GRAPH_OUTPUT, subproblem_graph
from mkevolve.verify.result import JudgeVerdict, not_started_cause
from mkevolve.problem import ProblemError
from mkevolve.run_layout import AHEAD, BEST, iteration_dir
from mkevolve.run_state import IterationRecord, RunState, StateError, Step, SubkernelRecord, SubkernelStatus
from mkevolve.search.beam import CandidateRecord
from mkevolve.solution import MANIFEST, Manifest, SolutionError, amdahl_contribution, sha256_of

if TYPE_CHECKING:  # matplotlib loads when a page is drawn, not when a run starts (1.5 s of imports)
    from matplotlib.figure import Figure

REPORT_FILE = "report.html"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
UNKNOWN = "unknown (no GPU)"
NOT_RUN = "not run"
LAST_VERDICTS = 3            # failing candidates quoted per subproblem; the rest are in their JSON files
REASON_CHARS = 400           # of one quoted reason (a traceback can run to pages)
EXAMPLE_MODEL = "anthropic/claude-opus-4-5"
_OK, _FAIL, _ABSENT, _PYTORCH, _NEUTRAL = "#2e7d32", "#c62828", "#bdbdbd", "#f9a825", "#90a4ae"


class Outcome(str, Enum):
    """What became of a subproblem by the end of the run."""

    ACCEPTED = "accepted kernel"
    PYTORCH = "kept as PyTorch"     # no kernel, but its own PyTorch code stands in inside a verified solution
    FAILING = "failing"             # no kernel, and no verified solution holds it
    REPLACED = "replaced"           # a split or fuse took it out of the decomposition

    @property
    def css(self) -> str:
        return {"accepted kernel": "pass", "kept as PyTorch": "warn", "failing": "fail"}.get(self.value, "muted")

    @property
    def colour(self) -> str:
        return {"accepted kernel": _OK, "kept as PyTorch": _PYTORCH, "failing": _FAIL}.get(self.value, _NEUTRAL)


@dataclass(frozen=True)
class Link:
    text: str
    href: str                # relative to report.html, URL-quoted


@dataclass(frozen=True)
class CandidateVerdict:
    """One saved candidate of a subproblem and what the verifier said of it."""

    id: str
    iteration: int
    status: str
    reason: str
    passed: bool
    href: str | None         # its source file; None when the reply had no code
    judge: str = ""          # the LLM judge's verdict and reason (--judge), when it was judged

    @property
    def unchecked(self) -> str | None:
        """Why its check never ran it (the run's time budget was spent first, say); None when it was checked."""
        return not_started_cause(self.reason)


@dataclass
class SubproblemOutcome:
    name: str
    outcome: Outcome
    why: str
    iteration: int                       # the last iteration it was part of
    links: list[Link] = field(default_factory=list)
    verdicts: list[CandidateVerdict] = field(default_factory=list)   # the last failing ones, when it has no kernel


@dataclass(frozen=True)
class EndToEnd:
    """An iteration's end-to-end check: whether the composed solution was run at all, and the verdict or why not."""

    ran: bool
    status: str              # the verdict's status, or NOT_RUN
    reason: str

    @property
    def css(self) -> str:
        return "pass" if self.status == "ok" else ("warn" if not self.ran else "fail")


@dataclass(frozen=True)
class NextStep:
    what: str
    command: str


@dataclass
class SubkernelRow:
    name: str
    status: str
    speedup: str
    share: str
    amdahl: str
    origin: str
    candidate: str
    precision: str
    accuracy: str = "-"            # its error against fp64, then eager fp32's: "3.1e-07 (eager 2.9e-07)"
    href: str | None = None


@dataclass
class IterationRow:
    index: int
    refinement: str
    subproblems: str
    calls: int
    e2e: EndToEnd
    speedup: str
    kept: bool
    seconds: str


@dataclass
class TokenRow:
    agent: str
    calls: int
    prompt: int
    completion: int
    reasoning: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass(frozen=True)
class TokenTable:
    """Tokens per agent with only the columns (and rows) that hold a non-zero value: the builtin offline agent
    spends no tokens, and a table of zeros says nothing."""

    columns: list[str]
    rows: list[tuple[str, list[int]]]
    hidden: list[str]

    @property
    def hidden_line(self) -> str:
        if not self.hidden:
            return ""
        names = ", ".join(self.hidden)
        plural = "columns are" if len(self.hidden) > 1 else "column is"
        return f"The {names} {plural} zero for every agent and left out (the builtin offline agent spends no tokens)."


@dataclass(frozen=True)
class SavedConfig:
    model: str
    iterations: int | None


@dataclass
class ReportPage:
    """Everything the template shows, already formatted."""

    title: str
    run_dir: str
    problem_path: str
    problem_source: str
    model: str
    device: str
    verdict: str
    passed: bool
    final_speedup: str
    measured: bool          # whether any speedup was measured (only on a GPU)
    best_iteration: int | None
    best_href: str | None
    next_steps: list[NextStep]
    outcomes: list[SubproblemOutcome]
    subkernels: list[SubkernelRow]
    iterations: list[IterationRow]
    tokens: TokenTable
    speedup_svg: str
    graph_svg: str
    graph_caption: str
    notes: list[str] = field(default_factory=list)
    generated: str = ""


def _fmt_speedup(value: float | None, unknown: str = UNKNOWN) -> str:
    return unknown if value is None else f"{value:.3f}x"


def fmt_accuracy(error: float | None, eager_error: float | None) -> str:
    """An error against fp64 beside eager fp32's, "3.1e-07 (eager 2.9e-07)"; "-" where not measured."""
    return "-" if error is None or eager_error is None else f"{error:.2g} (eager {eager_error:.2g})"


def _fmt_share(value: float | None, unknown: str = UNKNOWN) -> str:
    return unknown if value is None else f"{100 * value:.1f}%"


def _clip(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _href(run_dir: Path, path: Path) -> str | None:
    """`path` (inside run_dir) relative to report.html, URL-quoted; None when it is not there to link to."""
    if not path.exists():
        return None
    return quote(path.relative_to(run_dir).as_posix()) + ("/" if path.is_dir() else "")


# ---- reading the run -----------------------------------------------------------------------------------


def read_events(run_dir: Path) -> list[EventRecord]:
    """The events of events.jsonl that the report reads, as records; a line cut short by a crash is skipped.
    Raises EventFieldError when an event has a field of the wrong type."""
    path = run_dir / "events.jsonl"
    return parse_events(read_event_lines(path)) if path.is_file() else []


def token_rows(events: list[EventRecord]) -> list[TokenRow]:
    """Tokens per agent, summed over every client's totals (a resumed or ported run has several); calls
    are the ones that reached the model, cache hits left out."""
    rows: dict[str, TokenRow] = {}
    for totals in of_type(events, LLMTokensEvent):
        for agent, usage in totals.by_agent.items():
            row = rows.setdefault(agent, TokenRow(agent, 0, 0, 0, 0))
            row.prompt += usage.prompt
            row.completion += usage.completion
            row.reasoning += usage.reasoning
    for call in of_type(events, LLMCallEvent):
        if not call.cached:
            agent = call.agent or "unknown"
            rows.setdefault(agent, TokenRow(agent, 0, 0, 0, 0)).calls += 1
    return sorted(rows.values(), key=lambda r: (-r.total, r.agent))


_TOKEN_COLUMNS = ("calls", "prompt", "completion", "reasoning", "total")


def token_table(rows: list[TokenRow]) -> TokenTable:
    shown = [c for c in _TOKEN_COLUMNS if any(getattr(r, c) for r in rows)]
    body = [(r.agent, [getattr(r, c) for c in shown]) for r in rows if any(getattr(r, c) for c in shown)]
    return TokenTable(columns=shown, rows=body, hidden=[c for c in _TOKEN_COLUMNS if c not in shown])


def _saved_config(run_dir: Path) -> SavedConfig:
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        return SavedConfig(f"unknown (config.yaml: {type(err).__name__})", None)
    if not isinstance(config, dict):
        return SavedConfig("unknown", None)
    iterations = config.get("iterations")
    return SavedConfig(str(config.get("model", "unknown")), iterations if isinstance(iterations, int) else None)


def _read_manifest(run_dir: Path) -> tuple[Manifest | None, str | None]:
    """best/'s manifest, or None and, when it exists but cannot be read, why (shown on the page)."""
    if not (run_dir / BEST / MANIFEST).is_file():
        return None, None
    try:
        return Manifest.read(run_dir / BEST), None
    except SolutionError as err:
        return None, f"best/{MANIFEST} cannot be read: {err}"


def _best_decomposition(run_dir: Path, state: RunState) -> tuple[Decomposition | None, str]:
    """The decomposition of best/, else of the last iteration that has one, with a caption saying which."""
    candidates = [(run_dir / BEST, "the decomposition of best/")]
    for index in range(state.iteration, -1, -1):
        candidates.append((iteration_dir(run_dir, index), f"the decomposition of iteration {index}"))
    for folder, caption in candidates:
        if (folder / PROBLEM_FILE).is_file():
            try:
                return Decomposition.read(folder), caption
            except CodebaseError:
                continue
    return None, "no decomposition written yet"


def _measured(events: list[EventRecord], history: list[IterationRecord]) -> bool:
    """Whether any speedup was measured at all (only a GPU measures them)."""
    verdicts = of_type(events, CandidateEvent) + of_type(events, VerdictEvent)
    return any(r.e2e_speedup is not None for r in history) or any(v.speedup is not None for v in verdicts)


# ---- end to end: did the check run? --------------------------------------------------------------------

_COMPOSITE = re.compile(r"iter_(\d+)[/\\]" + re.escape(SOLUTION_FILE) + r"$")
# A check run ahead, while the searches went on: iter_NN/ahead/K/decomposed_solution.py (end_to_end_ahead.py)
_AHEAD = re.compile(r"iter_(\d+)[/\\]" + re.escape(AHEAD) + r"[/\\](\d+)[/\\]" + re.escape(SOLUTION_FILE)
                    + r"$")
_NOT_COMPOSED = "no accepted kernel yet for"        # what runs before guarded completion recorded instead of a check
_STATIC = re.compile(rf"^(subkernel \w+|{re.escape(SOLUTION_FILE)}): ")


def composite_checked(events: list[EventRecord]) -> set[int] | None:
    """The iterations whose composed solution the verifier ran (it logs a composite verdict only then; a static
    rejection returns before): its own check, or a check run ahead of the same files whose verdict the
    iteration used. None when the log holds no verdict at all, so it cannot tell."""
    verdicts = of_type(events, VerdictEvent)
    if not verdicts:
        return None
    used = {(e.iteration, e.check) for e in of_type(events, EndToEndAheadEvent) if e.state == EndToEndAheadEvent.USED}
    checked = set()
    for verdict in filter(lambda v: v.composite, verdicts):
        own, ahead = _COMPOSITE.search(verdict.solution), _AHEAD.search(verdict.solution)
        if own:
            checked.add(int(own.group(1)))
        elif ahead and (int(ahead.group(1)), int(ahead.group(2))) in used:
            checked.add(int(ahead.group(1)))
    return checked


def end_to_end(record: IterationRecord, checked: set[int] | None) -> EndToEnd:
    """The iteration's end-to-end verdict, or NOT_RUN and why: a status such as "incorrect" or "crashed" is
    only shown when the composed solution actually ran, since otherwise it says nothing about the kernels."""
    status, reason = record.e2e_status, _clip(record.e2e_reason)
    if status == "ok":
        return EndToEnd(True, status, "")
    if not status:
        return EndToEnd(False, NOT_RUN, "the run stopped before this iteration's end-to-end check")
    cause = not_started_cause(reason)
    if cause is not None:
        return EndToEnd(False, NOT_RUN, f"the verifier could not start the candidate process ({cause}), "
                                        "so the composed solution got no verdict")
    if reason.startswith(_NOT_COMPOSED):
        return EndToEnd(False, NOT_RUN, f"{reason}, so no solution was composed to check")
    static = _STATIC.match(reason) is not None
    if (record.index in checked) if checked is not None else not static:
        return EndToEnd(True, status, reason)
    if static:
        return EndToEnd(False, NOT_RUN, f"the static checks rejected the composed solution before it ran "
                                        f"({status}): {reason}")
    return EndToEnd(False, NOT_RUN, f"the log records no end-to-end run of it ({status}: {reason})")


# ---- subproblems: outcome and why ----------------------------------------------------------------------

_REFINEMENTS = {"split": "a split", "fuse": "a fuse", "total_fuse": "a total fuse", "initial": "the decomposition",
                "none": "an unchanged decomposition"}


def _read_candidate(run_dir: Path, path: Path, iteration: int, digest: str | None) -> CandidateVerdict | None:
    try:
        record = CandidateRecord.read(path)
    except (OSError, KeyError, TypeError, ValueError):  # the report shows what it can read, and goes on
        return None
    # A subproblem of the same name from an earlier decomposition had other code to match: not this one's.
    if digest and record.problem_sha256 not in (None, digest):
        return None
    candidate = record.candidate
    return CandidateVerdict(id=candidate.id, iteration=iteration, status=candidate.result.status.value,
                            reason=_clip(candidate.result.reason or ""),
                            passed=candidate.passed and candidate.accepted is not False,
                            href=_href(run_dir, path.with_suffix(".py")), judge=_judge_line(candidate.judge))


def _judge_line(verdict: JudgeVerdict | None) -> str:
    """The judge's verdict as the report quotes it; "" when there was no judge."""
    return _clip(verdict.summary()) if verdict is not None else ""


def candidate_verdicts(run_dir: Path, name: str, last: int) -> list[CandidateVerdict]:
    """Every saved candidate of subproblem `name` up to iteration `last`, oldest first."""
    problem = iteration_dir(run_dir, last) / PROBLEMS_DIR / f"{name}.py"
    digest = sha256_of(problem.read_text(encoding="utf-8")) if problem.is_file() else None
    found = []
    for index in range(last + 1):
        for path in sorted((iteration_dir(run_dir, index) / "candidates" / name).glob("*.json")):
            verdict = _read_candidate(run_dir, path, index, digest)
            if verdict is not None:
                found.append(verdict)
    return found


def _kernel_links(run_dir: Path, manifest: Manifest | None, name: str, sub: SubkernelRecord | None,
                  verdicts: list[CandidateVerdict]) -> list[Link]:
    links = []
    if manifest is not None and name in manifest.subkernels:
        pytorch = name in manifest.pytorch_subkernels
        href = _href(run_dir, run_dir / BEST / KERNELS_DIR / f"{name}.py")
        if href:
            links.append(Link("PyTorch stand-in in best/" if pytorch else "kernel in best/", href))
    if sub is not None and sub.candidate:
        # The last saved copy: a resumed run may have written the same candidate again in a later iteration.
        href = next((v.href for v in reversed(verdicts) if v.id == sub.candidate and v.href), None)
        if href:
            links.append(Link(f"candidate {sub.candidate}", href))
    return links


def _no_kernel_reason(state: RunState, name: str, sub: SubkernelRecord | None,
                      verdicts: list[CandidateVerdict]) -> str:
    if sub is not None and sub.reason:
        return sub.reason
    beam = state.beams.get(name)
    if beam is not None and beam.exhausted is not None and beam.exhausted.reason:
        return beam.exhausted.reason
    if not verdicts:
        return "no candidate was written for it"
    unchecked = [v for v in verdicts if v.unchecked is not None]
    if not unchecked:
        return f"none of its {len(verdicts)} candidate(s) passed"
    why = f"never checked: {unchecked[-1].unchecked}"
    if len(unchecked) == len(verdicts):
        return f"its {len(verdicts)} candidate(s) were {why}"
    return f"none of its {len(verdicts) - len(unchecked)} checked candidate(s) passed; {len(unchecked)} more {why}"


def _accepted_line(sub: SubkernelRecord, verdicts: list[CandidateVerdict]) -> str:
    precision = f", {sub.precision} precision" if sub.precision else ""
    # What the LLM judge said of it, from its last saved record (a resumed run may have saved it again).
    judged = next((v.judge for v in reversed(verdicts) if v.id == sub.candidate and v.judge), "")
    return (f"accepted kernel {sub.candidate} ({sub.origin or 'unknown origin'}{precision}): it passed its "
            "subproblem's correctness and cheating checks" + (f"; {judged}" if judged else ""))


def _classify(state: RunState, manifest: Manifest | None, name: str, record: IterationRecord,
              verdicts: list[CandidateVerdict]) -> tuple[Outcome, str]:
    sub = record.subkernels.get(name)
    accepted = sub is not None and sub.candidate is not None and name not in record.pytorch
    state_then = (_accepted_line(sub, verdicts) if accepted
                  else f"no accepted kernel: {_no_kernel_reason(state, name, sub, verdicts)}")
    later = next((r for r in state.history if r.index > record.index), None)
    if later is not None:
        how = _REFINEMENTS.get(later.refinement, later.refinement)
        return Outcome.REPLACED, (f"taken out of the decomposition in iteration {later.index} by {how} (now "
                                  f"{', '.join(later.subproblems)}); until then: {state_then}")
    if accepted:
        return Outcome.ACCEPTED, state_then
    in_best = manifest is not None and name in manifest.pytorch_subkernels
    if in_best or (name in record.pytorch and record.e2e_status == "ok"):
        return Outcome.PYTORCH, f"its own PyTorch code stands in inside the verified solution; {state_then}"
    return Outcome.FAILING, f"{state_then}; no verified solution holds it"


def subproblem_outcomes(run_dir: Path, state: RunState, manifest: Manifest | None) -> list[SubproblemOutcome]:
    """Every subproblem the run had: those of its last iteration first, then those a refinement replaced."""
    last_seen: dict[str, IterationRecord] = {}
    for record in state.history:
        for name in record.subproblems:
            last_seen[name] = record
    final = state.history[-1].subproblems if state.history else []
    outcomes = []
    for name in list(final) + [n for n in last_seen if n not in final]:
        record = last_seen[name]
        verdicts = candidate_verdicts(run_dir, name, record.index)
        outcome, why = _classify(state, manifest, name, record, verdicts)
        failed = [v for v in verdicts if not v.passed][-LAST_VERDICTS:]
        outcomes.append(SubproblemOutcome(
            name=name, outcome=outcome, why=_clip(why, 2 * REASON_CHARS), iteration=record.index,
            links=_kernel_links(run_dir, manifest, name, record.subkernels.get(name), verdicts),
            verdicts=failed if outcome is not Outcome.ACCEPTED else []))
    return outcomes


# ---- tables --------------------------------------------------------------------------------------------


def _subkernel_rows(run_dir: Path, manifest: Manifest | None, history: list[IterationRecord],
                    unknown: str) -> list[SubkernelRow]:
    if manifest is not None:
        return [SubkernelRow(name, e.status.value, _fmt_speedup(e.speedup, unknown),
                             _fmt_share(e.runtime_share, unknown),
                             _fmt_speedup(amdahl_contribution(e.runtime_share, e.speedup), unknown), e.origin,
                             e.candidate or "-", e.precision or "-",
                             fmt_accuracy(e.error_vs_fp64, e.eager_error_vs_fp64),
                             _href(run_dir, run_dir / BEST / KERNELS_DIR / f"{name}.py"))
                for name, e in manifest.subkernels.items()]
    if not history:
        return []
    return [SubkernelRow(name, r.status.value, _fmt_speedup(r.speedup, unknown), unknown, unknown, r.origin or "-",
                         r.candidate or "-", r.precision or "-", fmt_accuracy(r.error_vs_fp64, r.eager_error_vs_fp64))
            for name, r in history[-1].subkernels.items()]


def _iteration_rows(history: list[IterationRecord], checks: dict[int, EndToEnd], unknown: str) -> list[IterationRow]:
    return [IterationRow(index=r.index, refinement=r.refinement, subproblems=", ".join(r.subproblems),
                         calls=sum(r.budget.values()), e2e=checks[r.index],
                         speedup=_fmt_speedup(r.e2e_speedup, unknown), kept=r.kept, seconds=f"{r.seconds:.1f}")
            for r in history]


def _verdict_line(state: RunState, manifest: Manifest | None, checks: dict[int, EndToEnd]) -> str:
    if state.best_iteration is not None and manifest is not None:
        return f"end to end passes (best: iteration {state.best_iteration}); {manifest.coverage.line()}"
    if not state.history:
        return "no end-to-end solution passed: no iteration has finished yet"
    last = checks[state.history[-1].index]
    return (f"no end-to-end solution passed (iteration {state.history[-1].index}: end to end {last.status}: "
            f"{last.reason})")


def _pytorch_notes(manifest: Manifest | None) -> list[str]:
    """Each subkernel of best/ that runs its subproblem's PyTorch code, and why it has no Triton kernel."""
    if manifest is None:
        return []
    return [f"{name} runs its subproblem's PyTorch code, not a Triton kernel: "
            f"{manifest.subkernels[name].reason or 'declared so in the manifest'}."
            for name in manifest.coverage.pytorch]


def _notes(events: list[EventRecord], device: str, measured: bool) -> list[str]:
    notes = []
    if device == "cpu":
        notes.append("There is no GPU on the machine that ran this: kernels ran under the Triton interpreter for "
                     "correctness only, so every speedup, runtime share and Amdahl contribution is unknown.")
    elif not measured:
        notes.append("No speedup was measured in this run (no GPU, or nothing passed), so speedups, runtime "
                     "shares and Amdahl contributions are unknown.")
    for event in events:
        if isinstance(event, PortEvent):
            reused = ", ".join(f"{r.variant} (from {r.solution})" for r in event.reused) or "none"
            evolved = ", ".join(event.evolved) or "none"
            notes.append(f"Ported from {event.solution}: reused {reused}; evolved {evolved}.")
        elif isinstance(event, SwapSkippedEvent):
            notes.append(f"Swap skipped: {event.skipped}.")
        elif isinstance(event, SwapEvent):
            kept = "kept" if event.kept else "undone (end to end got worse)"
            notes.append(f"Swap of {', '.join(event.subkernels)} for their PyTorch code: {kept}.")
    return notes


# ---- next steps ----------------------------------------------------------------------------------------


def _solution_steps(best: str, problem: str, manifest: Manifest) -> list[NextStep]:
    pytorch = manifest.coverage.pytorch
    # check judges a KernelBench solution, which must be all Triton: say so before the user runs it on a partial one.
    verdict = (f" it rejects this one as a PyTorch fallback while {', '.join(pytorch)} "
               f"{'runs' if len(pytorch) == 1 else 'run'} PyTorch code" if pytorch else "")
    steps = [NextStep("Pack best/ into one KernelBench-style file (a ModelNew with every kernel inline):",
                      f"mkevolve pack {best} -o solution.py"),
             NextStep(f"Verify that file against the problem, as any KernelBench solution is judged"
                      f"{';' + verdict if verdict else ''}:", f"mkevolve check {problem} solution.py"),
             NextStep("Re-verify and profile best/ itself, subkernel by subkernel:", f"mkevolve eval {best}")]
    for name in pytorch:
        steps.append(NextStep(f"{name} runs PyTorch code: write a Triton kernel for it by hand (a ModelNew for "
                              f"best/{PROBLEMS_DIR}/{name}.py, in one file) and swap it in; swap verifies it:",
                              f"mkevolve swap {best} {shlex.quote(name)} {shlex.quote(name + '_kernel.py')}"))
    return steps


def next_steps(run_dir: Path, state: RunState, manifest: Manifest | None, outcomes: list[SubproblemOutcome],
               config: SavedConfig) -> list[NextStep]:
    """The commands to run next, with this run's real paths: use the solution, or give the search more."""
    run = Path(run_dir).resolve()
    steps = _solution_steps(shlex.quote(str(run / BEST)), shlex.quote(state.problem), manifest) if manifest else []
    if state.step is not Step.FINISHED:
        # Stopped part way (Ctrl-C, a crash): the checkpoint resumes it with the settings it had.
        steps.append(NextStep(f"The run stopped in iteration {state.iteration} ({state.step.value}); continue it "
                              "from its last checkpoint:", f"mkevolve run --resume {shlex.quote(str(run))}"))
        return steps
    without = [o.name for o in outcomes if o.outcome in (Outcome.PYTORCH, Outcome.FAILING)]
    if manifest is not None and not without:
        return steps
    iterations = max(config.iterations or 0, len(state.history)) + 2
    command = f"mkevolve run --resume {shlex.quote(str(run))} --iterations {iterations}"
    what = f"Give {', '.join(without) if without else 'the search'} more iterations"
    exhausted = without and all(n in state.beams and state.beams[n].exhausted for n in without)
    if exhausted:
        # The agent said it has nothing more to write for them: more iterations of it alone would change nothing.
        command += f" --model {EXAMPLE_MODEL}"
        them = "them" if len(without) > 1 else "it"
        what += (f" with an LLM (the {config.model} agent has no further kernel for {them}; any litellm model "
                 "string works, with its API key in the environment)")
    steps.append(NextStep(what + ":", command))
    return steps


# ---- plots ---------------------------------------------------------------------------------------------


def _svg(figure: Figure) -> str:
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mkevolve"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _tick_labels(history: list[IterationRecord]) -> list[str]:
    return [f"{r.index}\n{r.refinement}\n{len(r.subproblems)} subpr." for r in history]


def _grid_cell(record: IterationRecord, row: str, check: EndToEnd) -> tuple[str, str]:
    """Face and edge colour of one verdict-grid cell."""
    if row == "end to end":
        colour = _OK if check.status == "ok" else (_FAIL if check.ran else "white")
        return colour, (_NEUTRAL if colour == "white" else colour)
    if row not in record.subkernels:
        return _ABSENT, _ABSENT
    if row in record.pytorch:
        return _PYTORCH, _PYTORCH
    colour = _OK if record.subkernels[row].status is SubkernelStatus.OK else _FAIL
    return colour, colour


def _verdict_grid(axes, history: list[IterationRecord], checks: dict[int, EndToEnd]) -> None:
    """One row per subproblem (and end to end), one column per iteration: passing, failing, PyTorch code, or
    not in that iteration's decomposition, so the plot also shows which decomposition each iteration used."""
    names = list(dict.fromkeys(n for r in history for n in r.subproblems))
    rows = ["end to end"] + names
    for x, record in enumerate(history):
        for y, row in enumerate(rows):
            face, edge = _grid_cell(record, row, checks[record.index])
            axes.scatter([x], [y], s=120, color=face, edgecolors=edge, linewidths=1.2,
                         marker="s" if row == "end to end" else "o")
    axes.set_yticks(range(len(rows)), rows)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xticks(range(len(history)), _tick_labels(history))
    axes.set_xlim(-0.5, len(history) - 0.5)
    axes.set_title("verdicts (green: passes, red: fails, amber: its PyTorch code stands in,\nhollow: end to end "
                   "not run, grey: not in that iteration's decomposition)", fontsize=8)


def _speedup_lines(axes, history: list[IterationRecord]) -> None:
    xs = range(len(history))
    names = list(dict.fromkeys(n for r in history for n in r.subproblems))
    for name in names:
        values = [r.subkernels[name].speedup if name in r.subkernels else None for r in history]
        axes.plot(xs, [float("nan") if v is None else v for v in values], marker="o", linewidth=1, label=name)
    e2e = [float("nan") if r.e2e_speedup is None else r.e2e_speedup for r in history]
    axes.plot(xs, e2e, marker="s", linewidth=2.5, color="black", label="end to end")
    kept = [x for x, r in zip(xs, history) if r.kept]
    axes.scatter(kept, [e2e[x] for x in kept], s=160, facecolors="none", edgecolors="black", label="kept as best")
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_ylabel("speedup vs torch.compile")
    axes.set_xticks(list(xs), _tick_labels(history))
    axes.set_xlim(-0.5, len(history) - 0.5)
    axes.legend(fontsize=7, loc="best")
    axes.set_title("speedup per iteration (gaps: unknown or failing)", fontsize=9)


def speedup_plot(history: list[IterationRecord], checks: dict[int, EndToEnd] | None = None) -> str:
    """End-to-end and per-subkernel speedup over the iterations (when any was measured) above a verdict grid;
    the x labels name each iteration's refinement and subproblem count."""
    if not history:
        return ""
    checks = checks or {r.index: end_to_end(r, None) for r in history}
    measured = any(r.e2e_speedup is not None or any(s.speedup is not None for s in r.subkernels.values())
                   for r in history)
    names = {n for r in history for n in r.subproblems}
    height = 1.2 + 0.35 * (len(names) + 1)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(6.0, 1.3 * len(history) + 3), height + (3.5 if measured else 0)))
    if measured:
        top, bottom = figure.subplots(2, 1, gridspec_kw={"height_ratios": [3.5, height]})
        _speedup_lines(top, history)
    else:
        bottom = figure.subplots(1, 1)
        figure.suptitle(f"speedup {UNKNOWN}: correctness only", fontsize=10)
    _verdict_grid(bottom, history, checks)
    figure.tight_layout()
    return _svg(figure)


# ---- the subproblem graph ------------------------------------------------------------------------------
# Laid out in inches: one data unit is one inch of the figure, so the label sizes the renderer measures and
# the edges the labels are kept off are in one unit, and what the tests check is what the page draws.

GRAPH_FONT = 8               # points
NODE_RADIUS = 0.07           # inches
LABEL_PAD = 0.04             # inches of box around a label's text
CLEARANCE = 0.04             # inches kept free between a label box and any edge, node or other label
_WIDTH_SLACK = 1.12          # the browser's font may run a little wider than the one measured here
_BENDS = (0.0, 0.3, -0.3, 0.6, -0.6, 0.9, -0.9, 1.3, -1.3)   # inches an edge's middle is pushed sideways


Point = tuple[float, float]


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float

    @classmethod
    def around(cls, centre: Point, size: tuple[float, float]) -> "Box":
        (x, y), (w, h) = centre, size
        return cls(x - w / 2, y - h / 2, x + w / 2, y + h / 2)

    @property
    def centre(self) -> Point:
        return (self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2

    def grown(self, margin: float) -> "Box":
        return Box(self.x0 - margin, self.y0 - margin, self.x1 + margin, self.y1 + margin)

    def union(self, other: "Box") -> "Box":
        return Box(min(self.x0, other.x0), min(self.y0, other.y0), max(self.x1, other.x1), max(self.y1, other.y1))

    def overlaps(self, other: "Box") -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1

    def distance_to(self, point: Point) -> float:
        dx = max(self.x0 - point[0], 0.0, point[0] - self.x1)
        dy = max(self.y0 - point[1], 0.0, point[1] - self.y1)
        return math.hypot(dx, dy)

    def hits_segment(self, a: Point, b: Point) -> bool:
        """Whether the segment a-b passes through the box (Liang-Barsky clipping)."""
        (ax, ay), (bx, by) = a, b
        dx, dy = bx - ax, by - ay
        low, high = 0.0, 1.0
        for p, q in ((-dx, ax - self.x0), (dx, self.x1 - ax), (-dy, ay - self.y0), (dy, self.y1 - ay)):
            if p == 0:
                if q < 0:
                    return False
                continue
            t = q / p
            if p < 0:
                low = max(low, t)
            else:
                high = min(high, t)
            if low > high:
                return False
        return True


@dataclass(frozen=True)
class GraphEdge:
    source: str
    target: str
    points: tuple[Point, ...]          # the drawn polyline, from the source node's rim to the target's

    def segments(self) -> Iterator[tuple[Point, Point]]:
        return zip(self.points, self.points[1:])


@dataclass(frozen=True)
class GraphLabel:
    node: str
    text: str
    box: Box                           # with its padding


@dataclass
class GraphLayout:
    positions: dict[str, Point]
    edges: list[GraphEdge]
    labels: dict[str, GraphLabel]

    def extent(self) -> Box:
        dots = [Box.around(p, (2 * NODE_RADIUS, 2 * NODE_RADIUS)) for p in self.positions.values()]
        box = dots[0]
        for dot in dots[1:]:
            box = box.union(dot)
        for edge in self.edges:
            for x, y in edge.points:
                box = box.union(Box(x, y, x, y))
        for label in self.labels.values():
            box = box.union(label.box)
        return box


def _label_text(graph: nx.DiGraph, node: str) -> str:
    if node in (GRAPH_INPUT, GRAPH_OUTPUT):
        return node.strip("<>")
    instances = graph.nodes[node].get("instances", 1)
    loops = " ↻" if graph.has_edge(node, node) else ""
    return node + loops + (f"\n×{instances}" if instances > 1 else "")


def _text_sizes(texts: list[str]) -> dict[str, tuple[float, float]]:
    """Each label's box (text and padding) in inches, as matplotlib's renderer measures the text."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure()
    renderer = FigureCanvasAgg(figure).get_renderer()
    sizes = {}
    for text in texts:
        extent = figure.text(0, 0, text, fontsize=GRAPH_FONT, parse_math=False).get_window_extent(renderer)
        sizes[text] = (extent.width / figure.dpi * _WIDTH_SLACK + 2 * LABEL_PAD,
                       extent.height / figure.dpi + 2 * LABEL_PAD)
    return sizes


def _forward(graph: nx.DiGraph) -> tuple[nx.DiGraph, dict[str, int]]:
    """The graph without the edges that go back to a node met earlier on a walk from the input (loops, a shared
    subproblem fed by its own successor), plus each node's place on that walk."""
    order = list(nx.dfs_preorder_nodes(graph, GRAPH_INPUT)) if GRAPH_INPUT in graph else []
    order += [n for n in graph.nodes if n not in order]
    rank = {node: i for i, node in enumerate(order)}
    forward = nx.DiGraph()
    forward.add_nodes_from(order)
    forward.add_edges_from((u, v) for u, v in graph.edges if rank[u] < rank[v])
    return forward, rank


def _layers(graph: nx.DiGraph) -> dict[int, list[str]]:
    """Columns left to right by data flow (longest path from the input), the input first and the output last;
    within a column, nodes sit near the mean row of their predecessors so fewer edges cross."""
    forward, rank = _forward(graph)
    anchored = forward.copy()
    inner = [n for n in graph if n not in (GRAPH_INPUT, GRAPH_OUTPUT)]
    anchored.add_edges_from((GRAPH_INPUT, n) for n in inner if anchored.in_degree(n) == 0)
    anchored.add_edges_from((n, GRAPH_OUTPUT) for n in inner if anchored.out_degree(n) == 0)
    layers: dict[int, list[str]] = {}
    for index, generation in enumerate(nx.topological_generations(anchored)):
        layers[index] = sorted(generation, key=rank.get)
    row: dict[str, float] = {}
    for index in sorted(layers):
        def place(node: str) -> tuple[float, int]:
            rows = [row[p] for p in forward.predecessors(node) if p in row]
            return (sum(rows) / len(rows) if rows else 0.0, rank[node])
        layers[index].sort(key=place)
        for i, node in enumerate(layers[index]):
            row[node] = i - (len(layers[index]) - 1) / 2
    return layers


def _grid(graph: nx.DiGraph, sizes: dict[str, tuple[float, float]]) -> dict[str, Point]:
    """networkx's multipartite layout (one column per layer), stretched so that two neighbouring columns' widest
    labels fit side by side and two labels fit between two rows."""
    layers = _layers(graph)
    unit_positions = nx.multipartite_layout(graph, subset_key=layers)
    xs = sorted({float(p[0]) for p in unit_positions.values()})
    unit = (xs[-1] - xs[0]) / (len(layers) - 1) if len(layers) > 1 else 1.0
    widths = [max(sizes[n][0] for n in layers[i]) for i in sorted(layers)]
    offsets = [0.0]
    for left, right in zip(widths, widths[1:]):
        offsets.append(offsets[-1] + (left + right) / 2 + 4 * CLEARANCE + 0.3)
    height = max(h for _, h in sizes.values())
    row = 2 * (height + NODE_RADIUS + 2 * CLEARANCE) + 0.35
    return {node: (offsets[round((float(x) - xs[0]) / unit)], float(y) / unit * row)
            for node, (x, y) in unit_positions.items()}


def _bezier(start: Point, end: Point, bend: float, steps: int = 24) -> list[Point]:
    """A quadratic curve from start to end whose middle is pushed `bend` inches to the left of the way."""
    (x0, y0), (x1, y1) = start, end
    length = math.hypot(x1 - x0, y1 - y0) or 1.0
    cx = (x0 + x1) / 2 - 2 * bend * (y1 - y0) / length
    cy = (y0 + y1) / 2 + 2 * bend * (x1 - x0) / length
    return [((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t ** 2 * x1,
             (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y1)
            for t in (i / steps for i in range(steps + 1))]


def _trim(points: list[Point], radius: float) -> tuple[Point, ...]:
    """The polyline without the parts inside the two end nodes' dots, so the arrowhead meets the rim."""
    def cut(line: list[Point]) -> list[Point]:
        centre = line[0]
        for i in range(1, len(line)):
            if math.dist(centre, line[i]) >= radius:
                (ax, ay), (bx, by) = line[i - 1], line[i]
                da, db = math.dist(centre, line[i - 1]), math.dist(centre, line[i])
                t = (radius - da) / (db - da) if db > da else 0.0
                return [(ax + t * (bx - ax), ay + t * (by - ay))] + line[i:]
        return line[-1:]
    trimmed = cut(cut(points)[::-1])[::-1]
    return tuple(trimmed) if len(trimmed) > 1 else (points[0], points[-1])


def _route(positions: dict[str, Point], source: str, target: str, back: bool,
           drawn: list[GraphEdge]) -> GraphEdge:
    """The first bend whose curve keeps clear of every other node and of the edge the other way between the
    same two nodes; an edge going back never runs straight, so it cannot retrace a forward one."""
    start, end = positions[source], positions[target]
    others = [p for n, p in positions.items() if n not in (source, target)]
    reverse = [e for e in drawn if (e.source, e.target) == (target, source)]
    points = _bezier(start, end, _BENDS[1])
    for bend in (b for b in _BENDS if not (back and b == 0.0)):
        curve = _bezier(start, end, bend)
        clear = all(min(math.dist(p, q) for q in curve) > 3 * NODE_RADIUS for p in others)
        distinct = all(math.dist(curve[len(curve) // 2], e.points[len(e.points) // 2]) > 0.15 for e in reverse)
        if clear and distinct:
            points = curve
            break
    return GraphEdge(source, target, _trim(points, NODE_RADIUS))


def _label_boxes(centre: Point, size: tuple[float, float]) -> Iterator[Box]:
    """Places for a node's label, nearest first: above, below, right, left, then the diagonals, each further
    out in turn."""
    (x, y), (w, h) = centre, size
    for step in range(10):
        d = NODE_RADIUS + CLEARANCE + 0.12 * step
        yield Box.around((x, y + d + h / 2), size)
        yield Box.around((x, y - d - h / 2), size)
        yield Box.around((x + d + w / 2, y), size)
        yield Box.around((x - d - w / 2, y), size)
        for sx, sy in ((1, 1), (-1, 1), (1, -1), (-1, -1)):
            yield Box.around((x + sx * (0.7 * d + w / 2), y + sy * (0.7 * d + h / 2)), size)


def _conflicts(box: Box, layout: GraphLayout) -> int:
    """How many edges, nodes and placed labels the box (with the clearance around it) touches."""
    room = box.grown(CLEARANCE)
    edges = sum(1 for e in layout.edges if any(room.hits_segment(a, b) for a, b in e.segments()))
    nodes = sum(1 for p in layout.positions.values() if room.distance_to(p) < NODE_RADIUS)
    labels = sum(1 for label in layout.labels.values() if room.overlaps(label.box))
    return edges + nodes + labels


def _place_labels(graph: nx.DiGraph, layout: GraphLayout, texts: dict[str, str],
                  sizes: dict[str, tuple[float, float]]) -> None:
    # The busiest nodes first: they have the fewest free places left around them.
    for node in sorted(graph.nodes, key=lambda n: -graph.degree(n)):
        best, fewest = None, None
        for box in _label_boxes(layout.positions[node], sizes[node]):
            count = _conflicts(box, layout)
            if fewest is None or count < fewest:
                best, fewest = box, count
            if count == 0:
                break
        layout.labels[node] = GraphLabel(node, texts[node], best)


def graph_layout(graph: nx.DiGraph) -> GraphLayout:
    """Node positions, edge curves and label boxes, in inches; no label box meets an edge where there is room."""
    texts = {node: _label_text(graph, node) for node in graph.nodes}
    measured = _text_sizes(list(set(texts.values())))
    sizes = {node: measured[text] for node, text in texts.items()}
    positions = _grid(graph, sizes)
    forward, _ = _forward(graph)
    layout = GraphLayout(positions=positions, edges=[], labels={})
    # Forward edges first, so that an edge going back bends around the straight one the other way.
    ordered = sorted((e for e in graph.edges if e[0] != e[1]), key=lambda e: not forward.has_edge(*e))
    for source, target in ordered:
        back = not forward.has_edge(source, target)
        layout.edges.append(_route(positions, source, target, back, layout.edges))
    _place_labels(graph, layout, texts, sizes)
    return layout


def _draw_graph(layout: GraphLayout, colours: dict[str, str]) -> Figure:
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle, FancyArrowPatch
    from matplotlib.path import Path as PlotPath

    extent = layout.extent().grown(0.1)
    figure = Figure(figsize=(extent.x1 - extent.x0, extent.y1 - extent.y0))
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(extent.x0, extent.x1)
    axes.set_ylim(extent.y0, extent.y1)
    axes.axis("off")
    for edge in layout.edges:
        axes.add_patch(FancyArrowPatch(path=PlotPath(edge.points), arrowstyle="-|>", mutation_scale=8,
                                       color="#607d8b", linewidth=0.9, zorder=1))
    for node, (x, y) in layout.positions.items():
        axes.add_patch(Circle((x, y), NODE_RADIUS, facecolor=colours.get(node, _NEUTRAL), edgecolor="#37474f",
                              linewidth=0.6, zorder=2))
    for label in layout.labels.values():
        x, y = label.box.centre
        sentinel = label.node in (GRAPH_INPUT, GRAPH_OUTPUT)
        axes.text(x, y, label.text, ha="center", va="center", fontsize=GRAPH_FONT, parse_math=False, zorder=3,
                  bbox={"boxstyle": f"round,pad={LABEL_PAD * 72 / GRAPH_FONT:.3f}", "linewidth": 0.6,
                        "facecolor": "#eeeeee" if sentinel else "#ffffff", "edgecolor": "#b0bec5"})
    return figure


def graph_plot(decomposition: Decomposition, colours: dict[str, str] | None = None) -> str:
    """The subproblem graph: a dot per subproblem (coloured by outcome), an arrow per data flow, and each
    label beside its dot where no arrow crosses it."""
    return _svg(_draw_graph(graph_layout(subproblem_graph(decomposition)), colours or {}))


def _node_colours(decomposition: Decomposition, outcomes: list[SubproblemOutcome], manifest: Manifest | None,
                  of_best: bool) -> dict[str, str]:
    colours = {o.name: o.outcome.colour for o in outcomes}
    if of_best and manifest is not None:  # the graph of best/: what best/ runs, not the last iteration's state
        colours.update({n: _PYTORCH if n in manifest.pytorch_subkernels else _OK for n in manifest.subkernels})
    return {n: colours.get(n, _NEUTRAL) for n in decomposition.names}


# ---- the page ------------------------------------------------------------------------------------------


def _problem_source(problem_path: Path) -> str:
    try:
        return problem_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return f"({problem_path} is gone)"


def build_page(run_dir: Path) -> ReportPage:
    run_dir = Path(run_dir)
    state = RunState.load(run_dir)
    manifest, manifest_problem = _read_manifest(run_dir)
    events = read_events(run_dir)
    config = _saved_config(run_dir)
    problem_path = Path(state.problem)
    device = manifest.device if manifest else "unknown"
    measured = _measured(events, state.history)
    unknown = UNKNOWN if device == "cpu" or not measured else "unknown"
    checked = composite_checked(events)
    checks = {r.index: end_to_end(r, checked) for r in state.history}
    outcomes = subproblem_outcomes(run_dir, state, manifest)
    decomposition, caption = _best_decomposition(run_dir, state)
    colours = (_node_colours(decomposition, outcomes, manifest, caption.endswith("best/"))
               if decomposition else {})
    return ReportPage(
        title=f"mkevolve: {problem_path.stem} ({state.run_id})", run_dir=str(run_dir.resolve()),
        problem_path=str(problem_path), problem_source=_problem_source(problem_path), model=config.model,
        device=device, verdict=_verdict_line(state, manifest, checks),
        passed=state.best_iteration is not None and manifest is not None,
        final_speedup=_fmt_speedup(manifest.speedup, unknown) if manifest else "-", measured=measured,
        best_iteration=state.best_iteration, best_href=_href(run_dir, run_dir / BEST) if manifest else None,
        next_steps=next_steps(run_dir, state, manifest, outcomes, config), outcomes=outcomes,
        subkernels=_subkernel_rows(run_dir, manifest, state.history, unknown),
        iterations=_iteration_rows(state.history, checks, unknown), tokens=token_table(token_rows(events)),
        speedup_svg=speedup_plot(state.history, checks),
        graph_svg=graph_plot(decomposition, colours) if decomposition else "", graph_caption=caption,
        notes=[n for n in [manifest_problem] if n] + _pytorch_notes(manifest) + _notes(events, device, measured),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))


def render_page(page: ReportPage) -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return environment.get_template("report.html.j2").render(page=page, svg=_trusted_svg)


def _trusted_svg(text: str):
    """Our own matplotlib output goes into the page as markup; anything else is escaped."""
    from markupsafe import Markup

    return Markup(text) if text.lstrip().startswith("<svg") else html.escape(text)


def write_report(run_dir: Path) -> Path:
    """Write (or rewrite) run_dir/report.html from the run's files; returns its path."""
    run_dir = Path(run_dir)
    return write_atomic(run_dir / REPORT_FILE, render_page(build_page(run_dir)))


def report_command(args) -> int:
    """`mkevolve report RUN_DIR`: 0 when report.html is written, 2 when RUN_DIR is not a run directory or its
    events.jsonl holds an event with a field of the wrong type."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ProblemError(run_dir, "no such folder (expected a run directory)")
    try:
        path = write_report(run_dir)
    except StateError as err:
        raise ProblemError(run_dir, str(err).split(": ", 1)[-1]) from None
    except EventFieldError as err:
        raise ProblemError(run_dir / "events.jsonl", str(err)) from err
    print(f"wrote {path}")
    return ExitCode.OK
