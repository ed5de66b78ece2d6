"""Decompose: a module into subproblems and a top-level, checked; the wrap-original fallback otherwise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mkevolve.agents.attempts import AttemptLoop, Feedback, emit_result, prompt_variables
from mkevolve.codebase import Decomposition, wrap_original
from mkevolve.config import RunConfig, config_from_args
from mkevolve.events import EventLog
from mkevolve.llm.builtin.decomposer import UnsupportedModule, decomposition_files, format_reply
from mkevolve.llm.client import LLMClient, make_client
from mkevolve.llm.types import LLMRequest
from mkevolve.problem import ProblemError, load_problem, read_source
from mkevolve.prompts import render
from mkevolve.verify.decomposition import CheckReport, check_decomposition
from mkevolve.workers.executor import Executor, make_executor

EXIT_OK, EXIT_FALLBACK = 0, 1


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
              events: EventLog | None = None) -> tuple[Decomposition, CheckReport]:
    """The first of `decompose_attempts` parallel replies per round that passes every check, with up to
    `retries` further rounds; else the original module as the only subproblem (fallback=True)."""
    problem_path = Path(problem_path)
    loop = AttemptLoop("decompose", problem_path, config, client, pool, events)

    def requests(feedback: list[Feedback]) -> list[LLMRequest]:
        prompt = render("decompose.j2", **prompt_variables(problem_path, feedback))
        task = DecomposeTask(str(problem_path), config.eval_mode)
        return [LLMRequest(agent="decompose", prompt=prompt, task=task, sample=i)
                for i in range(config.decompose_attempts)]

    winner = loop.run(requests, Decomposition.from_files, lambda decomposition, report: [])
    if winner is not None:
        result = winner.decomposition.with_configs(winner.report.instances)
        emit_result(events, "decompose", "passed", result)
        return result, winner.report
    fallback = wrap_original(problem_path.stem, read_source(problem_path))
    report = check_decomposition(problem_path, fallback, pool, config)
    fallback = fallback.with_configs(report.instances)
    emit_result(events, "decompose", "fallback" if report.passed else "failed", fallback)
    return fallback, report


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
    return EXIT_FALLBACK if decomposition.fallback else EXIT_OK


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
