"""End-to-end checks ahead of time: the composition the searches would deliver now, checked while they go on.

An iteration ends with an end-to-end check of the best kernel of every subproblem, and that check is as long
as a candidate's: a fresh process builds the full-size model, compiles and autotunes the same kernels again,
runs the trials and times the forward. On an H100, level2/7 alone (one subproblem, three candidates) got its
winner's verdict at 47 s, its last candidate's at 69 s, and the end-to-end check took 20 s after that.

So once every subproblem has a passing candidate and the searches have at most `NEAR_END` candidates left
without a verdict, the composition of the best ones so far goes to a worker that is free, behind every
candidate check. When the searches end with exactly those kernels, the iteration takes that check's verdict
instead of running the same check again; when a later candidate ranks higher, the composition changes and is
checked ahead again, at most `MAX_CHECKS` times an iteration, and an earlier check still waiting for a worker
is withdrawn. A check whose composition did not win is never used: it only cost a worker and its share of
the GPU. Waiting for the searches' last candidates matters: on the H200, level2/63 alone (four workers; its
GEMM variants pass one after another, the best changing as they do) took no less time with checks started at
the first passing kernels than without checks ahead, and made one or two more end-to-end checks.

The check itself is the same `Verifier.check_composite` on the same files: this module only decides when it
starts and whether its verdict is the one the iteration asked for.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from mkevolve.agents.evolve import COVERED_PRIORITY
from mkevolve.search.beam import Candidate
from mkevolve.verify.result import EvalResult

MAX_CHECKS = 2     # checks started ahead per iteration: a composition and one better one
NEAR_END = 1       # candidates still without a verdict, over every search, when a check ahead may start
# A check ahead waits for a worker behind every candidate check, those of covered subproblems included: it
# takes a worker the search leaves idle, and never delays a candidate.
PRIORITY = 2 * COVERED_PRIORITY


@dataclass(frozen=True)
class Composition:
    """One kernel source per subproblem, in the decomposition's order, and the candidates they came from."""

    kernels: tuple[tuple[str, str], ...]       # (subproblem, kernel source)
    candidates: tuple[tuple[str, str], ...]    # (subproblem, candidate id), for the event log

    @property
    def key(self) -> str:
        digest = hashlib.sha256()
        for name, source in self.kernels:
            digest.update(f"{name}\0{len(source)}\0{source}\0".encode())
        return digest.hexdigest()

    def as_dict(self) -> dict[str, str]:
        return dict(self.kernels)


def composition_key(kernels: dict[str, str], names: list[str]) -> str:
    """The key of the composition `kernels` (subproblem -> source) in the order of `names`."""
    return Composition(tuple((n, kernels[n]) for n in names), ()).key


@dataclass
class _Ahead:
    number: int                       # 1 for the iteration's first check ahead
    check: Future[EvalResult]
    withdrawn: threading.Event        # set when a later composition replaced this one: if still waiting, not run
    asked: bool = False               # verdict_for asked for this composition's verdict


# Checks one composition (its kernels by subproblem; its number in this iteration, 1 and up; an event that,
# once set, withdraws the check if it still waits for a worker) and returns its verdict. It runs in a thread
# of its own.
CheckFn = Callable[[Composition, int, threading.Event], EvalResult]


class EndToEndAhead:
    """The best passing candidate of each subproblem so far, and the checks of their compositions.

    `child` is called from the searches' threads as they start and as each candidate gets its verdict;
    `verdict_for` from the orchestrator once the searches have ended."""

    def __init__(self, iteration: int, names: list[str], check: CheckFn, best: dict[str, Candidate],
                 unfinished: dict[str, int], on_start: Callable[[Composition, int], None] | None = None):
        """`best`: each subproblem's passing kernel before this iteration's search, where it has one;
        `unfinished`: the candidates each search may still make (its budget), until the search says."""
        self.iteration = iteration
        self.names = list(names)
        self._check = check
        self._on_start = on_start
        self._best: dict[str, Candidate] = {n: c for n, c in best.items() if n in self.names}
        self._unfinished = {n: unfinished.get(n, 0) for n in self.names}
        self._checks: dict[str, _Ahead] = {}     # composition key -> its check
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=MAX_CHECKS, thread_name_prefix="end-to-end-ahead")

    def child(self, name: str, candidate: Candidate | None, unfinished: int) -> None:
        """The search of `name` has `unfinished` candidates left without a verdict, and `candidate` (if any)
        just got its verdict (agents.evolve.ChildHook). A passing one that ranks above the subproblem's best
        so far becomes its best. Once every subproblem has a best and at most NEAR_END candidates are left in
        all, the composition is checked (while fewer than MAX_CHECKS have started), and the checks of earlier
        compositions that still wait for a worker are withdrawn."""
        with self._lock:
            self._unfinished[name] = unfinished
            current = self._best.get(name)
            if candidate is not None and candidate.passed and (
                    current is None or candidate.rank_key() < current.rank_key()):
                self._best[name] = candidate
            composition = self._composition()
            if (composition is None or sum(self._unfinished.values()) > NEAR_END
                    or composition.key in self._checks or len(self._checks) >= MAX_CHECKS):
                return
            number = len(self._checks) + 1
            for earlier in self._checks.values():   # one still waiting for a worker gives its place up
                earlier.withdrawn.set()
            if self._on_start is not None:      # before the check's own events
                self._on_start(composition, number)
            withdrawn = threading.Event()
            check = self._pool.submit(self._check, composition, number, withdrawn)
            self._checks[composition.key] = _Ahead(number, check, withdrawn)

    def _composition(self) -> Composition | None:
        if any(n not in self._best for n in self.names):
            return None
        return Composition(kernels=tuple((n, self._best[n].source) for n in self.names),
                           candidates=tuple((n, self._best[n].id) for n in self.names))

    def verdict_for(self, kernels: dict[str, str]) -> tuple[int, EvalResult] | None:
        """The number and verdict of the check ahead of exactly these kernels (waiting for it if it still runs),
        or None when none was started. An error in that check is raised here, as the same check run now would."""
        with self._lock:
            ahead = self._checks.get(composition_key(kernels, self.names))
        if ahead is None:
            return None
        ahead.asked = True
        return ahead.number, ahead.check.result()

    def close(self) -> list[tuple[int, BaseException]]:
        """Waits for the checks still running (their workers are the verifier's, which closes after this).
        Returns the errors of checks whose verdict was never asked for, by check number: nothing else saw them."""
        self._pool.shutdown(wait=True)
        return [(a.number, a.check.exception()) for a in self._checks.values()
                if not a.asked and a.check.exception() is not None]
