"""The attempt loop the decomposition agents share: ask, parse, check in workers, retry with the reasons."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from mkevolve.codebase import CodebaseError, Decomposition
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import LLMClient
from mkevolve.llm.parse import ReplyFormatError, extract_files
from mkevolve.llm.types import LLMRequest, LLMResponse
from mkevolve.text import first_line
from mkevolve.verify.decomposition.orchestration import check_decomposition
from mkevolve.verify.decomposition.results import CheckReport
from mkevolve.verify.decomposition.static import structure_problems
from mkevolve.workers.executor import Executor

REASON_CHARS = 600        # one reason, as the next prompt shows it
FEEDBACK_ATTEMPTS = 4     # failed attempts the next prompt shows, newest first


@dataclass
class Attempt:
    """One reply: what it became, and why it was rejected (empty when it passed)."""

    round: int
    sample: int
    decomposition: Decomposition | None = None
    report: CheckReport | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.report is not None and self.report.passed and not self.reasons


@dataclass(frozen=True)
class Feedback:
    """A failed attempt as a prompt shows it."""

    round: int
    sample: int
    reasons: tuple[str, ...]


@dataclass
class AttemptLoop:
    """Rounds of parallel requests; each round's prompt carries the reasons earlier attempts failed."""

    agent: str
    problem_path: Path
    config: RunConfig
    client: LLMClient
    pool: Executor
    events: EventLog | None
    history: list[Attempt] = field(default_factory=list)
    # A reply identical to an earlier one gets the earlier verdict instead of a second check.
    reports: dict[tuple, CheckReport] = field(default_factory=dict)
    # Given each round's first new reply that passes the structure check, just before the checks start: what
    # the run would do with it once it passes can start while it is checked (None: nothing).
    speculate: Callable[[Decomposition], None] | None = None

    def run(self, requests_for: Callable[[list[Feedback]], list[LLMRequest]],
            build: Callable[[dict[str, str]], Decomposition],
            validate: Callable[[Decomposition, CheckReport], list[str]]) -> Attempt | None:
        """The first attempt that passes every check and `validate`, or None after all rounds."""
        for round_index in range(self.config.retries + 1):
            requests = requests_for(self.feedback())
            responses = self.client.complete_many(requests)
            attempts = [self._parse(round_index, request.sample, response, build)
                        for request, response in zip(requests, responses)]
            self._speculate(attempts)
            winner = self._check(attempts, validate)
            self.history += attempts
            for attempt in attempts:
                self._emit(attempt)
            if winner is not None:
                return winner
        return None

    def feedback(self) -> list[Feedback]:
        failed = [a for a in reversed(self.history) if not a.passed]
        seen, shown = set(), []
        for attempt in failed:
            reasons = tuple(_clip(r) for r in attempt.reasons)
            if reasons and reasons not in seen:
                seen.add(reasons)
                shown.append(Feedback(attempt.round, attempt.sample, reasons))
        return shown[:FEEDBACK_ATTEMPTS]

    def _parse(self, round_index: int, sample: int, response: LLMResponse,
               build: Callable[[dict[str, str]], Decomposition]) -> Attempt:
        attempt = Attempt(round_index, sample)
        if response.error is not None:
            attempt.reasons = [f"the model call failed: {response.error}"]
            return attempt
        try:
            attempt.decomposition = build(extract_files(response.text))
        except (ReplyFormatError, CodebaseError) as err:
            note = first_line(response.text, limit=200)
            attempt.reasons = [f"reply format: {err}" + (f" (the reply says: {note})" if note else "")]
        return attempt

    def _speculate(self, attempts: list[Attempt]) -> None:
        if self.speculate is None:
            return
        for attempt in attempts:
            decomposition = attempt.decomposition
            if decomposition is not None and _reply_key(decomposition) not in self.reports \
                    and not structure_problems(decomposition.files()):
                self.speculate(decomposition)
                return

    def _check(self, attempts: list[Attempt],
               validate: Callable[[Decomposition, CheckReport], list[str]]) -> Attempt | None:
        """Check the parsed attempts in parallel (identical ones once); return as soon as one passes."""
        unique: dict[tuple, list[Attempt]] = {}
        for attempt in attempts:
            if attempt.decomposition is not None:
                unique.setdefault(_reply_key(attempt.decomposition), []).append(attempt)
        winner = None
        for key in [k for k in unique if k in self.reports]:
            winner = winner or self._judge(unique.pop(key), self.reports[key], validate)
        if winner is not None or not unique:
            return winner
        executor = ThreadPoolExecutor(max_workers=max(1, min(len(unique), getattr(self.pool, "size", 1))))
        pending = {executor.submit(check_decomposition, self.problem_path, group[0].decomposition, self.pool,
                                   self.config): (key, group) for key, group in unique.items()}
        try:
            while pending and winner is None:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    key, group = pending.pop(future)
                    self.reports[key] = future.result()
                    winner = winner or self._judge(group, self.reports[key], validate)
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
        for _, group in pending.values():
            for attempt in group:
                attempt.reasons = ["not checked: another attempt passed first"]
        return winner

    @staticmethod
    def _judge(group: list[Attempt], report: CheckReport,
               validate: Callable[[Decomposition, CheckReport], list[str]]) -> Attempt | None:
        """Give every attempt of one reply its verdict; the first that passes, if any."""
        for attempt in group:
            attempt.report = report
            attempt.reasons = report.reasons() or (validate(attempt.decomposition, report)
                                                   if report.passed else ["the checks failed"])
        return next((a for a in group if a.passed), None)

    def _emit(self, attempt: Attempt) -> None:
        if self.events is None:
            return
        self.events.emit("decomposition_attempt", agent=self.agent, round=attempt.round, sample=attempt.sample,
                         passed=attempt.passed, reasons=attempt.reasons,
                         subproblems=attempt.decomposition.names if attempt.decomposition else [],
                         check_s=round(attempt.report.wall_s, 3) if attempt.report else None)


def emit_result(events: EventLog | None, agent: str, outcome: str, decomposition: Decomposition) -> None:
    """One event per agent call: what came out (passed, fallback, unchanged) and its subproblems."""
    if events is not None:
        events.emit("decomposition_result", agent=agent, outcome=outcome, fallback=decomposition.fallback,
                    subproblems={s.name: s.instances for s in decomposition.subproblems})


def _reply_key(decomposition: Decomposition) -> tuple:
    return tuple(sorted(decomposition.files().items()))


def _clip(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def prompt_variables(problem_path: Path, feedback: list[Feedback],
                     current: Decomposition | None = None) -> dict:
    """What every decomposition prompt shows: the problem, the loader, the reasons of failed attempts."""
    from mkevolve.codebase import problem_loader_source
    from mkevolve.problem import read_source

    variables = {"problem_name": problem_path.stem, "problem_source": read_source(problem_path),
                 "loader": problem_loader_source(), "feedback": feedback}
    if current is not None:
        variables["files"] = current.files()
    return variables
