"""Decompose a suite of problems with one agent; print the pass rate and the time per problem, write JSON.

A problem passes when the decomposition has two or more subproblems, is not the fallback, and passes every
check. Usage: python scripts/decompose_suite.py [PROBLEM_OR_FOLDER ...] [--model builtin] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not: the imports below need the path first

from mkevolve.agents.decompose import decompose
from mkevolve.config import build_config
from mkevolve.events import EventLog
from mkevolve.llm.client import make_client
from mkevolve.workers.executor import make_executor


@dataclass
class SuiteRow:
    problem: str
    passed: bool
    fallback: bool
    checks_passed: bool
    subproblems: int
    instances: int
    seconds: float
    failed_checks: list[str]


def problem_files(arguments: list[str]) -> list[Path]:
    paths = [Path(a) for a in arguments] or [ROOT / "problems" / "level2"]
    files = []
    for path in paths:
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return files


def run(files: list[Path], model: str, workers: int, trials: int) -> list[SuiteRow]:
    config = build_config(overrides={"model": model, "workers": workers, "trials": trials,
                                     "decompose_attempts": 1 if model == "builtin" else None})
    events = EventLog()
    client = make_client(config, events)
    executor = make_executor(config.executor, config.workers)
    rows = []
    try:
        for path in files:
            start = time.monotonic()
            decomposition, report = decompose(path, config, client, executor, events)
            seconds = time.monotonic() - start
            rows.append(SuiteRow(
                problem=path.stem, fallback=decomposition.fallback, checks_passed=report.passed,
                passed=report.passed and not decomposition.fallback and len(decomposition.subproblems) >= 2,
                subproblems=len(decomposition.subproblems), instances=decomposition.total_instances,
                seconds=round(seconds, 2), failed_checks=[c.name for c in report.failures()]))
            print(_line(rows[-1]), flush=True)
    finally:
        executor.close()
    return rows


def _line(row: SuiteRow) -> str:
    verdict = "pass" if row.passed else ("fallback" if row.fallback else "FAIL")
    return (f"{row.problem:<70} {verdict:<8} {row.subproblems:>3} subproblems {row.instances:>3} instances "
            f"{row.seconds:>7.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="problem files or folders (default: problems/level2)")
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", dest="json_path", default=str(ROOT / "outputs" / "decompose_suite.json"))
    args = parser.parse_args()
    files = problem_files(args.paths)
    start = time.monotonic()
    rows = run(files, args.model, args.workers, args.trials)
    total = time.monotonic() - start
    passed = sum(r.passed for r in rows)
    rate = passed / len(rows) if rows else 0.0
    times = sorted(r.seconds for r in rows)
    median = times[len(times) // 2] if times else 0.0
    print(f"\n{passed}/{len(rows)} decomposed into 2+ subproblems passing every check ({rate:.0%}); "
          f"median {median:.2f} s, total {total:.1f} s")
    out = Path(args.json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "pass_rate": rate, "passed": passed, "problems": len(rows),
                               "median_s": median, "total_s": round(total, 2),
                               "rows": [asdict(r) for r in rows]}, indent=2))
    print(f"written to {out}")
    return 0 if rows else 2


if __name__ == "__main__":
    sys.exit(main())
