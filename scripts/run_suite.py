"""Runs `mkevolve run` with the builtin agent over a problem suite and records, per problem, whether
best/ holds a correct end-to-end solution, its speedup vs torch.compile, and the orchestrator's own
overhead (iteration time not spent in LLM calls or evaluation jobs).

    PYTHONPATH=. python3 scripts/run_suite.py --out scripts/results/run_suite_<gpu>_<date>.json \
        [--set batch_size=128 --set ...] [--iterations 1] [--budget 2] [--jobs 1] [--workers 0] [problems ...]

--set NAME=N rewrites a problem's top-level `NAME = ...` line, where it has one, into a copy: the suite's
files are small enough for a CPU, and this brings them to KernelBench-like sizes.
--jobs runs that many problems at once and --workers sets each run's evaluation workers; on a GPU
they share it, and every timed run still has the GPU alone (mkevolve/verify/gpu_share.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import date
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]


def scaled_copy(problem: Path, sizes: dict[str, int], folder: Path) -> Path:
    if not sizes:
        return problem
    text = problem.read_text()
    for name, value in sizes.items():
        text = re.sub(rf"^{name}\s*=\s*\d+\s*$", f"{name} = {value}", text, flags=re.M)
    target = folder / problem.name
    target.write_text(text)
    return target


def run_env(args) -> dict[str, str]:
    """Concurrent runs split the cores: torch.compile would otherwise start a compile pool of all of them
    in every worker of every run."""
    workers = args.jobs * (args.workers or max(1, torch.cuda.device_count()))
    return {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def run_one(problem: Path, args, out: Path) -> dict:
    command = [sys.executable, "-m", "mkevolve", "run", str(problem), "--out", str(out),
               "--iterations", str(args.iterations), "--budget", str(args.budget), "--timeout", "600",
               "--workers", str(args.workers)] + (["--eval"] if args.eval else [])
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.problem_timeout,
                              env=run_env(args))
    except subprocess.TimeoutExpired:
        return {"problem": problem.name, "exit": None, "wall_s": round(time.perf_counter() - started, 1),
                "correct": False, "error": f"stopped after --problem-timeout {args.problem_timeout} s"}
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
        # Subproblems that ran their PyTorch code in the kept solution (guarded completion): [] is all Triton.
        "pytorch": next((h.get("pytorch", []) for h in state["history"] if h["index"] == best), None),
        "speedup": next((h["e2e_speedup"] for h in state["history"] if h["index"] == best), None),
        "subproblems": state["history"][-1]["subproblems"] if state["history"] else [],
        "e2e_per_iteration": [(h["e2e_status"], h["e2e_speedup"]) for h in state["history"]],
        "iteration_s": [e["seconds"] for e in iterations],
        "overhead_s": [e["overhead_s"] for e in iterations],
        "failure": None if best is not None else
        (state["history"][-1]["e2e_reason"] if state["history"] else "no iteration"),
    })
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*", type=Path)
    parser.add_argument("--out", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=N",
                        help="a size to rewrite; repeat for several")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--budget", type=int, default=2)
    parser.add_argument("--problem-timeout", type=float, default=900)
    parser.add_argument("--jobs", type=int, default=1, help="problems run at once")
    parser.add_argument("--workers", type=int, default=0, help="evaluation workers per run (0: default)")
    parser.add_argument("--eval", action="store_true", help="compare modules in eval mode (mkevolve run --eval)")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="combine earlier result files (parts of one suite) into --out, and run nothing")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "run_suite")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, Path(args.out))
        return
    problems = args.problems or sorted((ROOT / "problems" / "level2").glob("*.py"))
    (args.work / "problems").mkdir(parents=True, exist_ok=True)
    sizes = {name: int(value) for name, value in (item.split("=", 1) for item in args.set)}
    copies = [scaled_copy(p, sizes, args.work / "problems") for p in problems]
    results: list[dict] = []
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, copy, args, args.work / "runs") for copy in copies]
        for future in as_completed(futures):
            r = future.result()
            results.append(r)
            results.sort(key=lambda record: record["problem"])
            speed = "unknown" if r.get("speedup") is None else f"{r['speedup']:.3f}x"
            print(f"{r['problem']:58} correct={r.get('correct')} pytorch={r.get('pytorch')} speedup={speed} "
                  f"wall={r['wall_s']}s "
                  f"overhead={r.get('overhead_s')} {r.get('failure') or ''}", flush=True)
            write(args, results, time.perf_counter() - started)
    summary = summarize(results)
    print(f"correct end to end: {summary['correct']}/{summary['total']}; {json.dumps(summary)}")


def summarize(results: list[dict]) -> dict:
    """Fraction correct, speedups of the correct ones, and the orchestrator's share of iteration time."""
    speedups = [r["speedup"] for r in results if r.get("correct") and r.get("speedup")]
    iteration_s = sum(sum(r.get("iteration_s", [])) for r in results)
    overhead_s = sum(sum(r.get("overhead_s", [])) for r in results)
    return {"correct": sum(1 for r in results if r.get("correct")), "total": len(results),
            "all_triton": sum(1 for r in results if r.get("correct") and r.get("pytorch") == []),
            "speedup_geomean": statistics.geometric_mean(speedups) if speedups else None,
            "speedup_median": statistics.median(speedups) if speedups else None,
            "at_least_1x": sum(1 for s in speedups if s >= 1.0),
            "overhead_fraction": overhead_s / iteration_s if iteration_s else None}


def write(args, results: list[dict], wall_s: float) -> None:
    record = {"date": date.today().isoformat(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "gpus": torch.cuda.device_count(), "cpus": os.cpu_count(),
              "torch": str(torch.__version__), "triton": triton.__version__,
              "settings": {"sizes": args.set, "iterations": args.iterations, "budget": args.budget,
                           "jobs": args.jobs, "workers": args.workers, "eval": args.eval,
                           "model": "builtin"},
              "suite_wall_s": round(wall_s, 1), **summarize(results), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))


def merge(parts: list[Path], out: Path) -> None:
    """One record for a suite run in parts (say, on two machines): each part keeps its settings and wall time."""
    records = [json.loads(p.read_text()) for p in parts]
    results = sorted((r for record in records for r in record["results"]), key=lambda r: r["problem"])
    kept = ("date", "device", "gpus", "cpus", "torch", "triton", "settings", "suite_wall_s")
    merged = {"parts": [{k: record.get(k) for k in kept} | {"problems": [r["problem"] for r in record["results"]]}
                        for record in records],
              **summarize(results), "results": results}
    out.write_text(json.dumps(merged, indent=1))
    print(f"merged {len(results)} problems from {len(parts)} parts into {out}: "
          f"{merged['correct']}/{merged['total']} correct")


if __name__ == "__main__":
    main()
