"""Runs `mkevolve run` with the builtin agent over a problem suite and records, per problem, whether
best/ holds a correct end-to-end solution, its speedup vs torch.compile, and the orchestrator's own
overhead (iteration time not spent in LLM calls or evaluation jobs).

    PYTHONPATH=. python3 scripts/run_suite.py --out scripts/results/run_suite_<gpu>_<date>.json \
        [--batch-size 128] [--iterations 1] [--budget 2] [problems ...]

--batch-size rewrites each problem's `batch_size = N` line into a copy, for KernelBench-like sizes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]


def scaled_copy(problem: Path, batch_size: int | None, folder: Path) -> Path:
    if batch_size is None:
        return problem
    text = re.sub(r"^batch_size\s*=\s*\d+", f"batch_size = {batch_size}", problem.read_text(), flags=re.M)
    target = folder / problem.name
    target.write_text(text)
    return target


def run_one(problem: Path, args, out: Path) -> dict:
    command = [sys.executable, "-m", "mkevolve", "run", str(problem), "--out", str(out),
               "--iterations", str(args.iterations), "--budget", str(args.budget), "--timeout", "600"]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.problem_timeout)
    wall = time.perf_counter() - started
    runs = sorted((out / problem.stem).glob("*/state.json"))
    record = {"problem": problem.name, "exit": proc.returncode, "wall_s": round(wall, 1)}
    if not runs:
        record["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        return record
    run_dir = runs[-1].parent
    state = json.loads((run_dir / "state.json").read_text())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    iterations = [e for e in events if e["kind"] == "iteration"]
    best = state.get("best_iteration")
    record.update({
        "correct": best is not None,
        "speedup": next((h["e2e_speedup"] for h in state["history"] if h["index"] == best), None),
        "subproblems": state["history"][-1]["subproblems"] if state["history"] else [],
        "e2e_per_iteration": [(h["e2e_status"], h["e2e_speedup"]) for h in state["history"]],
        "iteration_s": [e["seconds"] for e in iterations],
        "overhead_s": [e["overhead_s"] for e in iterations],
        "failure": None if best is not None else (state["history"][-1]["e2e_reason"] if state["history"] else "no iteration"),
    })
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", type=Path)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--budget", type=int, default=2)
    parser.add_argument("--problem-timeout", type=float, default=900)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "run_suite")
    args = parser.parse_args()
    problems = args.problems or sorted((ROOT / "problems" / "level2").glob("*.py"))
    (args.work / "problems").mkdir(parents=True, exist_ok=True)
    results = []
    for problem in problems:
        copy = scaled_copy(problem, args.batch_size, args.work / "problems")
        results.append(run_one(copy, args, args.work / "runs"))
        r = results[-1]
        speed = "unknown" if r.get("speedup") is None else f"{r['speedup']:.3f}x"
        print(f"{r['problem']:58} correct={r.get('correct')} speedup={speed} wall={r['wall_s']}s "
              f"overhead={r.get('overhead_s')} {r.get('failure') or ''}", flush=True)
        write(args, results)
    correct = sum(1 for r in results if r.get("correct"))
    print(f"correct end to end: {correct}/{len(results)}")


def write(args, results: list[dict]) -> None:
    record = {"date": date.today().isoformat(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": str(torch.__version__), "triton": triton.__version__,
              "settings": {"batch_size": args.batch_size, "iterations": args.iterations, "budget": args.budget,
                           "model": "builtin"},
              "correct": sum(1 for r in results if r.get("correct")), "total": len(results), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
