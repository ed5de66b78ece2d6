"""The names inside a run directory, OUT/<problem>/<run-id>/: one place for the run that writes them and the
commands that read them (report, port, swap)."""

from __future__ import annotations

from pathlib import Path

BEST = "best"              # the best solution verified end to end so far: a solution folder
ITERATIONS = "iterations"  # one folder per iteration: its decomposition and every candidate's verdict
AHEAD = "ahead"            # in an iteration's folder: ahead/<K>/, the composition its K-th end-to-end check ahead ran


def ahead_dir(iteration: Path, number: int) -> Path:
    """Where an iteration's end-to-end check number `number` (1 and up) run ahead of its searches' end writes."""
    return iteration / AHEAD / str(number)


def iteration_dir(run_dir: Path, index: int) -> Path:
    return run_dir / ITERATIONS / f"iter_{index:02d}"
