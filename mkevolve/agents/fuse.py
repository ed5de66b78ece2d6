"""Fuse (merge subproblems, as many as the agent decides) and TotalFuse (back to one monolithic subproblem)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mkevolve.agents.attempts import AttemptLoop, Feedback, emit_result, prompt_variables
from mkevolve.builtin.decomposer import UnsupportedModule, format_reply, fuse_files, total_fuse_files
from mkevolve.codebase import Decomposition, wrap_original
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import LLMClient
from mkevolve.llm.types import LLMRequest
from mkevolve.problem import read_source
from mkevolve.prompts import render
from mkevolve.verify.decomposition.orchestration import check_decomposition
from mkevolve.verify.decomposition.results import CheckReport
from mkevolve.workers.executor import Executor


@dataclass(frozen=True)
class FuseTask:
    problem_path: str
    top_level: str
    eval_mode: bool = False

    def builtin_reply(self) -> str:
        try:
            files = fuse_files(self.problem_path, self.top_level, self.eval_mode)
        except UnsupportedModule as err:
            return format_reply({}, f"The builtin decomposer fuses nothing: {err}")
        return format_reply(files, "Builtin fusion of the two neighbouring subproblems whose boundary costs most.")


@dataclass(frozen=True)
class TotalFuseTask:
    problem_path: str

    def builtin_reply(self) -> str:
        return format_reply(total_fuse_files(self.problem_path), "The original module as the only subproblem.")


def fuse(problem_path: str | Path, decomposition: Decomposition, config: RunConfig, client: LLMClient,
         pool: Executor, events: EventLog | None = None) -> Decomposition:
    """A decomposition with fewer subproblem instances, merged where the agent chose; `decomposition` itself
    when no attempt passes the checks."""
    problem_path = Path(problem_path)

    def requests(feedback: list[Feedback]) -> list[LLMRequest]:
        prompt = render("fuse.j2", **prompt_variables(problem_path, feedback, decomposition))
        return [LLMRequest(agent="fuse", prompt=prompt,
                           task=FuseTask(str(problem_path), decomposition.top_level, config.eval_mode))]

    def validate(candidate: Decomposition, report: CheckReport) -> list[str]:
        before, after = decomposition.total_instances, sum(len(v) for v in report.instances.values())
        if after >= before:
            return [f"a fusion must leave fewer subproblem instances: {before} before, {after} now"]
        return []

    return _refine("fuse", problem_path, decomposition, requests, validate, config, client, pool, events)


def total_fuse(problem_path: str | Path, decomposition: Decomposition, config: RunConfig, client: LLMClient,
               pool: Executor, events: EventLog | None = None) -> Decomposition:
    """One monolithic subproblem. When the agent's attempts fail, the original module as that subproblem
    (fallback=True); `decomposition` itself only when even that fails the checks."""
    problem_path = Path(problem_path)

    def requests(feedback: list[Feedback]) -> list[LLMRequest]:
        prompt = render("total_fuse.j2", **prompt_variables(problem_path, feedback, decomposition))
        return [LLMRequest(agent="total_fuse", prompt=prompt, task=TotalFuseTask(str(problem_path)))]

    def validate(candidate: Decomposition, report: CheckReport) -> list[str]:
        count = sum(len(v) for v in report.instances.values())
        if len(candidate.subproblems) != 1 or count != 1:
            got = f"{len(candidate.subproblems)} subproblem(s), {count} instance(s)"
            return [f"expected one subproblem built once; got {got}"]
        return []

    result = _refine("total_fuse", problem_path, decomposition, requests, validate, config, client, pool, events)
    if result is not decomposition:
        return result
    fallback = wrap_original(problem_path.stem, read_source(problem_path))
    report = check_decomposition(problem_path, fallback, pool, config)
    if not report.passed:
        return decomposition
    fallback = fallback.with_configs(report.instances, report.inputs)
    emit_result(events, "total_fuse", "fallback", fallback)
    return fallback


def _refine(agent, problem_path, decomposition, requests, validate, config, client, pool, events) -> Decomposition:
    loop = AttemptLoop(agent, problem_path, config, client, pool, events)
    winner = loop.run(requests, lambda files: Decomposition.from_files(files, previous=decomposition), validate)
    if winner is None:
        emit_result(events, agent, "unchanged", decomposition)
        return decomposition
    result = winner.decomposition.with_configs(winner.report.instances, winner.report.inputs)
    emit_result(events, agent, "passed", result)
    return result
