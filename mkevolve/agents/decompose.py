"""Decompose: a module into subproblems and a top-level, checked; the wrap-original fallback otherwise."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from mkevolve.agents.attempts import Attempt, AttemptLoop, Feedback, emit_result, prompt_variables
from mkevolve.builtin.decomposer import UnsupportedModule, decomposition_files, format_reply
from mkevolve.codebase import Decomposition, wrap_original
from mkevolve.config import RunConfig, config_from_args
from mkevolve.events import EventLog
from mkevolve.exit_codes import ExitCode
from mkevolve.llm.client import LLMClient, make_client
from mkevolve.llm.types import LLMRequest
from mkevolve.problem import ProblemError, load_problem, read_source
from mkevolve.prompts import render
from mkevolve.verify.decomposition.orchestration import check_decomposition
from mkevolve.verify.decomposition.results import CheckReport
from mkevolve.workers.executor import Executor, make_executor

# A retry prompt shows the rejected attempts' files, so that a reason's "line 33" can be found; these bound
# what that adds: lines of one file, and lines of all rejected files together (older attempts' files past
# that are named, not shown).
REJECTED_FILE_LINES = 300
REJECTED_TOTAL_LINES = 1200


@dataclass(frozen=True)
class DecomposeTask:
    """A decomposition request in typed form, so the builtin agent answers it without reading the prompt."""

    problem_path: str
    eval_mode: bool = False

    def builtin_reply(self) -> str:
        try:
            files = decomposition_files(self.problem_path, self.eval_mode)
        except UnsupportedModule as err:
            return format_reply({}, f"The builtin decomposer cannot decompose this module: {err}")
        count = len(files) - 1
        return format_reply(files, f"Builtin decomposition: {count} subproblem file{'s' * (count != 1)}.")


def decompose(problem_path: str | Path, config: RunConfig, client: LLMClient, pool: Executor,
              events: EventLog | None = None,
              speculate: Callable[[Decomposition], None] | None = None) -> tuple[Decomposition, CheckReport]:
    """The first of `decompose_attempts` parallel replies per round that passes every check, with up to
    `retries` further rounds; else the original module as the only subproblem (fallback=True). `speculate` is
    given each round's first new reply that passes the structure check, before its checks run."""
    problem_path = Path(problem_path)
    loop = AttemptLoop("decompose", problem_path, config, client, pool, events, speculate=speculate)

    def requests(feedback: list[Feedback]) -> list[LLMRequest]:
        variables = prompt_variables(problem_path, feedback)
        variables["feedback"] = rejected_attempts(feedback, loop.history)
        prompt = render("decompose.j2", rejected_file_lines=REJECTED_FILE_LINES, **variables)
        task = DecomposeTask(str(problem_path), config.eval_mode)
        return [LLMRequest(agent="decompose", prompt=prompt, task=task, sample=i)
                for i in range(config.decompose_attempts)]

    winner = loop.run(requests, Decomposition.from_files, lambda decomposition, report: [])
    if winner is not None:
        result = winner.decomposition.with_configs(winner.report.instances, winner.report.inputs)
        emit_result(events, "decompose", "passed", result)
        return result, winner.report
    fallback = wrap_original(problem_path.stem, read_source(problem_path))
    report = check_decomposition(problem_path, fallback, pool, config)
    fallback = fallback.with_configs(report.instances, report.inputs)
    emit_result(events, "decompose", "fallback" if report.passed else "failed", fallback)
    return fallback, report


@dataclass(frozen=True)
class RejectedFile:
    """One file of a rejected attempt as a retry prompt lists it."""

    path: str
    # As the checker read it, so its line numbers are the reasons' (the model's file with its load_subproblem
    # replaced by the canonical one, which keeps the lines of a loader copied as asked).
    source: str
    same_as: str = ""      # the attempt ("1.2") already listed with this identical file
    omitted: bool = False  # not shown: the prompt's room for rejected files is used up

    @property
    def line_count(self) -> int:
        return len(self.source.rstrip().splitlines())


@dataclass(frozen=True)
class RejectedAttempt:
    """A failed attempt as a retry prompt shows it: why it failed, and the files the reasons point into."""

    round: int
    sample: int
    reasons: tuple[str, ...]
    files: tuple[RejectedFile, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.round + 1}.{self.sample + 1}"


def rejected_attempts(feedback: list[Feedback], history: list[Attempt]) -> list[RejectedAttempt]:
    """The feedback (newest first) with each attempt's files; an unparsed reply has none to show."""
    parsed = {(a.round, a.sample): a.decomposition for a in history if a.decomposition is not None}
    listing = _Listing(REJECTED_TOTAL_LINES)
    shown = []
    for item in feedback:
        attempt = RejectedAttempt(item.round, item.sample, item.reasons)
        decomposition = parsed.get((item.round, item.sample))
        if decomposition is not None:
            attempt = replace(attempt, files=listing.add(attempt.label, decomposition.files()))
        shown.append(attempt)
    return shown


@dataclass
class _Listing:
    """Lists files across attempts: an identical file once, and no more lines than the budget."""

    lines_left: int
    first_seen: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, label: str, files: dict[str, str]) -> tuple[RejectedFile, ...]:
        return tuple(self._one(label, path, source) for path, source in files.items())

    def _one(self, label: str, path: str, source: str) -> RejectedFile:
        earlier = self.first_seen.get((path, source))
        if earlier is not None:
            return RejectedFile(path, source, same_as=earlier)
        file = RejectedFile(path, source)
        cost = min(file.line_count, REJECTED_FILE_LINES)
        if cost > self.lines_left:
            return RejectedFile(path, source, omitted=True)
        self.lines_left -= cost
        self.first_seen[(path, source)] = label
        return file


def decompose_command(args) -> int:
    """`mkevolve decompose`: write the decomposition, print its subproblems and every check's verdict."""
    config = config_from_args(args)
    problem = load_problem(args.problem)
    events = EventLog()
    client = make_client(config, events)
    executor = make_executor(config.executor, config.workers)
    try:
        decomposition, report = decompose(problem.path, config, client, executor, events)
    finally:
        executor.close()
    if not report.passed:
        raise ProblemError(problem.path, "the original module fails the checks even as its own only subproblem: "
                           + "; ".join(report.reasons()))
    folder = Path(config.out) / problem.name / "decomposition"
    decomposition.write(folder)
    if args.json:
        print(json.dumps(_summary(decomposition, report, folder), indent=2))
    else:
        _print_table(problem.name, decomposition, report, folder)
    return ExitCode.FAILED if decomposition.fallback else ExitCode.OK


def _summary(decomposition: Decomposition, report: CheckReport, folder: Path) -> dict:
    return {
        "subproblems": [{"name": s.name, "instances": s.instances,
                         "configs": [{"attribute": c.attribute, "init_args": c.init_args, "inputs": list(c.inputs)}
                                     for c in s.configs]} for s in decomposition.subproblems],
        "fallback": decomposition.fallback,
        "checks": [{"name": c.name, "passed": c.passed, "reason": c.reason} for c in report.checks],
        "dir": str(folder),
    }


def _print_table(problem_name: str, decomposition: Decomposition, report: CheckReport, folder: Path) -> None:
    from mkevolve.display import make_console
    from rich.markup import escape
    from rich.table import Table

    console = make_console()
    title = f"{problem_name}: {len(decomposition.subproblems)} subproblem(s)"
    table = Table(title=title + (" (fallback: the original module whole)" if decomposition.fallback else ""))
    for column in ("subproblem", "instances", "inputs"):
        table.add_column(column)
    for spec in decomposition.subproblems:
        inputs = sorted({call for config in spec.configs for call in config.inputs})
        table.add_row(spec.name, str(spec.instances), escape("\n".join(inputs)))
    console.print(table)
    checks = Table(title="checks")
    for column in ("check", "verdict", "reason"):
        checks.add_column(column)
    for check in report.checks:
        checks.add_row(check.name, "pass" if check.passed else "FAIL", escape(check.reason))
    console.print(checks)
    console.print(f"written to {folder}")
