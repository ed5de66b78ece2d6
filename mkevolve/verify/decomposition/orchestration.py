"""Orchestrator side of the decomposition checks: run them on a decomposition in a worker, read the report."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mkevolve.codebase import Decomposition
from mkevolve.config import RunConfig
from mkevolve.verify.decomposition.results import EQUIVALENCE, CheckReport, CheckResult
from mkevolve.workers.executor import Executor
from mkevolve.workers.pool import Job, JobOutcome


def checks_job(problem_path: str | Path, folder: str | Path, config: RunConfig) -> Job:
    kwargs = {"problem_path": str(Path(problem_path).resolve()), "folder": str(Path(folder).resolve()),
              "seed": config.seed, "trials": config.trials, "eval_mode": config.eval_mode}
    return Job("mkevolve.verify.decomposition.worker:run_checks", kwargs, config.timeout)


def report_from_outcome(outcome: JobOutcome) -> CheckReport:
    """The worker's report, or one failed check saying why the worker gave none."""
    if isinstance(outcome.value, CheckReport):
        outcome.value.wall_s = outcome.wall_s
        return outcome.value
    if outcome.ok:
        reason = f"the checker failed: {outcome.value}"
    else:
        reason = f"the checks did not finish: {outcome.reason}"
    return CheckReport.from_checks([CheckResult(EQUIVALENCE, False, reason)], wall_s=outcome.wall_s)


def check_decomposition(problem_path: str | Path, decomposition: Decomposition, pool: Executor,
                        config: RunConfig) -> CheckReport:
    """Write the decomposition to a scratch folder and run every check on it in a worker."""
    folder = Path(tempfile.mkdtemp(prefix="mkevolve-decomposition-"))
    try:
        decomposition.write(folder)
        return report_from_outcome(pool.run_many([checks_job(problem_path, folder, config)])[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
