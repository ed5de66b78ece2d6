"""`mkevolve solve`: the monolithic baselines, one kernel search over the whole problem, no decomposition."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mkevolve.agents.evolve import KernelVerifier, evolve_kernel
from mkevolve.config import RunConfig, config_from_args
from mkevolve.events import EventLog
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.llm.client import LLMClient, make_client
from mkevolve.llm.tokens import TokenReport
from mkevolve.orchestrator import interrupted_by_signals
from mkevolve.problem import ProblemError, read_source
from mkevolve.search.beam import Beam, Candidate
from mkevolve.verify.result import Status
from mkevolve.verify.verifier import Verifier


@dataclass
class SolveOutcome:
    out_dir: Path
    beam: Beam
    best: Candidate | None
    tokens: TokenReport

    @property
    def solution_path(self) -> Path:
        return self.out_dir / "solution.py"


def default_out_dir(config: RunConfig, problem_path: Path) -> Path:
    """OUT/<problem>/solve-<search>-<time>, with -2, -3... when two solves start in the same second."""
    base = Path(config.out) / problem_path.stem / f"solve-{config.search}-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir, n = base, 1
    while out_dir.exists():
        n += 1
        out_dir = base.with_name(f"{base.name}-{n}")
    return out_dir


def solve(problem_path: Path, config: RunConfig, out_dir: Path, verifier: KernelVerifier | None = None,
          client: LLMClient | None = None) -> SolveOutcome:
    """Spend `config.budget` LLM calls on one kernel for the whole problem; write what came of it to out_dir.

    The client (with its response cache under out_dir) and the verifier are made here unless given.
    """
    problem_path = Path(problem_path)
    read_source(problem_path)
    events = EventLog(out_dir / "events.jsonl")
    if client is None:  # made before the folder, so a model that cannot work leaves nothing behind
        client = make_client(config, events, cache_dir=out_dir / "llm_cache")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "config.yaml", config.to_yaml())
    if verifier is not None:
        beam = _search(problem_path, config, out_dir, verifier, client)
    else:
        with Verifier(config, events) as own_verifier:
            interrupted = threading.Event()
            with interrupted_by_signals(own_verifier, interrupted):
                beam = _search(problem_path, config, out_dir, own_verifier, client, interrupted)
    _reject_bad_problem(problem_path, beam)
    outcome = SolveOutcome(out_dir=out_dir, beam=beam, best=beam.best, tokens=client.emit_totals())
    _write_outputs(outcome)
    return outcome


def _search(problem_path: Path, config: RunConfig, out_dir: Path, verifier: KernelVerifier,
            client: LLMClient, interrupted: threading.Event | None = None) -> Beam:
    return evolve_kernel(problem_path.stem, problem_path, Beam(width=config.beam_width), config.budget,
                         verifier, client, config, out_dir / "candidates", interrupted=interrupted)


def _reject_bad_problem(problem_path: Path, beam: Beam) -> None:
    """When the verifier could not use the problem itself, that is the user's error, not a failed search."""
    bad = next((c for c in beam.members if c.result.status is Status.BAD_PROBLEM), None)
    if bad is not None:
        raise ProblemError(problem_path, bad.result.reason)


def _write_outputs(outcome: SolveOutcome) -> None:
    write_atomic(outcome.out_dir / "beam.json", json.dumps(outcome.beam.to_dict(), indent=1))
    write_atomic(outcome.out_dir / "tokens.json", json.dumps(outcome.tokens.to_dict(), indent=1))
    if outcome.best is not None:
        write_atomic(outcome.solution_path, outcome.best.source)
    else:
        # A solution.py left by an earlier run in the same folder would pass for this run's result.
        outcome.solution_path.unlink(missing_ok=True)


def _report(outcome: SolveOutcome) -> str:
    tokens = outcome.tokens
    spent = (f"{tokens.calls} LLM call(s), {tokens.cached_calls} from the cache; tokens: "
             f"{tokens.total.prompt} prompt, {tokens.total.completion} completion, "
             f"{tokens.total.reasoning} reasoning")
    if outcome.best is not None:
        best = outcome.best
        return f"solved: {best.id} {best.result.summary()} -> {outcome.solution_path}\n{spent}"
    nearest = outcome.beam.members[0] if outcome.beam.members else None
    detail = f"; best attempt {nearest.id}: {nearest.result.summary()}" if nearest else ""
    return f"no kernel passed every check{detail}; candidates are in {outcome.out_dir / 'candidates'}\n{spent}"


def solve_command(args) -> int:
    """`mkevolve solve PROBLEM`: 0 when a kernel passed every check, 1 when none did."""
    config = config_from_args(args)
    problem_path = Path(args.problem)
    outcome = solve(problem_path, config, default_out_dir(config, problem_path))
    print(_report(outcome))
    return ExitCode.OK if outcome.best is not None else ExitCode.FAILED
