"""Split: each failing subproblem into exactly two, top-level rewritten; the previous decomposition on failure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mkevolve.agents.attempts import AttemptLoop, Feedback, emit_result, prompt_variables
from mkevolve.builtin.decomposer import UnsupportedModule, format_reply, split_files
from mkevolve.codebase import Decomposition
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import LLMClient
from mkevolve.llm.types import LLMRequest
from mkevolve.prompts import render
from mkevolve.verify.decomposition.results import CheckReport
from mkevolve.workers.executor import Executor


@dataclass(frozen=True)
class SplitTask:
    problem_path: str
    top_level: str
    failing: tuple[str, ...]
    eval_mode: bool = False

    def builtin_reply(self) -> str:
        try:
            files = split_files(self.problem_path, self.top_level, list(self.failing), self.eval_mode)
        except UnsupportedModule as err:
            return format_reply({}, f"The builtin decomposer cannot split {', '.join(self.failing)}: {err}")
        return format_reply(files, f"Builtin split of {', '.join(self.failing)}.")


def split(problem_path: str | Path, decomposition: Decomposition, failing: list[str], config: RunConfig,
          client: LLMClient, pool: Executor, events: EventLog | None = None,
          why: dict[str, list[str]] | None = None) -> Decomposition:
    """A decomposition in which every failing subproblem is replaced by two; `decomposition` itself when no
    attempt passes the checks. `why`: per failing subproblem, what the verifier said of its candidates."""
    unknown = [name for name in failing if name not in decomposition.names]
    if unknown or not failing:
        raise ValueError(f"split needs names of current subproblems; got {failing} (have {decomposition.names})")
    problem_path = Path(problem_path)
    loop = AttemptLoop("split", problem_path, config, client, pool, events)

    def requests(feedback: list[Feedback]) -> list[LLMRequest]:
        prompt = render("split.j2", failing=list(failing), why=why or {},
                        **prompt_variables(problem_path, feedback, decomposition))
        task = SplitTask(str(problem_path), decomposition.top_level, tuple(failing), config.eval_mode)
        return [LLMRequest(agent="split", prompt=prompt, task=task,
                           subproblem=failing[0] if len(failing) == 1 else None)]

    def validate(candidate: Decomposition, report: CheckReport) -> list[str]:
        return split_problems(decomposition, candidate, failing)

    winner = loop.run(requests, lambda files: Decomposition.from_files(files, previous=decomposition), validate)
    if winner is None:
        emit_result(events, "split", "unchanged", decomposition)
        return decomposition
    result = winner.decomposition.with_configs(winner.report.instances, winner.report.inputs)
    emit_result(events, "split", "passed", result)
    return result


def split_problems(before: Decomposition, after: Decomposition, failing: list[str]) -> list[str]:
    """Why `after` is not `before` with each failing subproblem split in two."""
    problems = [f"{name} is still there; it must be replaced by two new subproblems" for name in failing
                if name in after.names]
    new = [name for name in after.names if name not in before.names]
    expected = before.total_instances + sum(before.subproblem(n).instances for n in failing if n in before.names)
    if not new:
        problems.append("the reply adds no new subproblem")
    elif after.total_instances != expected:
        # Each instance of a failing subproblem becomes two module calls; a half may reuse an existing
        # subproblem file (one more instance of it), so instances are counted, not file names.
        problems.append(f"the top-level makes {after.total_instances} subproblem instance(s), expected {expected}: "
                        "split each failing subproblem into exactly two")
    return problems
