"""Runs `check` on honest kernels and on a side-stream kernel; records verdicts, speedups and the
verifier's own overhead (cold worker, warm worker, timed section). Works on a GPU or, smaller, on CPU.

    PYTHONPATH=. python3 scripts/gpu_verifier.py --out scripts/results/verifier_<gpu>_<date>.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch
import triton

from mkevolve.config import RunConfig
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
KERNELS = ROOT / "scripts" / "kernels"

SMALL_CASES = [(CORPUS / "problems" / f"{n}.py", CORPUS / "honest" / f"{n}.py")
               for n in ("elementwise", "gemm_epilogue", "row_reduction")]
GPU_CASES = [(KERNELS / "silu_large.py", KERNELS / "silu_large_honest.py"),
             (KERNELS / "silu_large.py", KERNELS / "silu_large_side_stream.py")]


def evaluate(problem: Path, solution: Path, config: RunConfig) -> dict:
    """Two checks with one fresh worker: the first pays for the worker start, the second does not."""
    with Verifier(config) as verifier:
        runs = []
        for attempt in ("cold", "warm"):
            started = time.perf_counter()
            result = verifier.check_kernel(problem, solution)
            runs.append({"attempt": attempt, "wall_s": round(time.perf_counter() - started, 3),
                         "phases_s": {k: round(v, 3) for k, v in result.phases.items()},
                         "status": result.status.value, "reason": result.reason,
                         "speedup": result.speedup,
                         "runtime_ms": result.runtime.median_ms if result.runtime else None,
                         "runtime_p10_p90_ms": [result.runtime.p10_ms, result.runtime.p90_ms] if result.runtime else None,
                         "baseline_ms": result.baseline.median_ms if result.baseline else None,
                         "max_abs_err": result.max_abs_err})
    return {"problem": problem.name, "solution": solution.name, "runs": runs}


def naive_default_stream_ms(solution: Path, problem: Path) -> float:
    """What a timer that records events on the default stream only would report (no device-wide join)."""
    from mkevolve.problem import import_file

    model = import_file(solution).ModelNew().cuda()
    x = import_file(problem).get_inputs()[0].cuda()
    for _ in range(5):
        model(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    config = RunConfig(workers=1, trials=5, timeout=600.0)
    cases = SMALL_CASES + (GPU_CASES if on_gpu else [])
    results = [evaluate(problem, solution, config) for problem, solution in cases]
    record = {"date": date.today().isoformat(), "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu",
              "torch": str(torch.__version__), "triton": triton.__version__, "results": results}
    if on_gpu:
        record["side_stream_naive_default_stream_ms"] = naive_default_stream_ms(GPU_CASES[1][1], GPU_CASES[1][0])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(f"{'solution':32} {'run':5} {'verdict':9} {'wall s':>7} {'speedup':>8} {'ms':>8}  phases")
    for case in results:
        for run in case["runs"]:
            speed = "unknown" if run["speedup"] is None else f"{run['speedup']:.3f}"
            ms = "-" if run["runtime_ms"] is None else f"{run['runtime_ms']:.4f}"
            print(f"{case['solution']:32} {run['attempt']:5} {run['status']:9} {run['wall_s']:7.2f} {speed:>8} "
                  f"{ms:>8}  {run['phases_s']}")
    if on_gpu:
        print(f"side stream, naive default-stream timer: {record['side_stream_naive_default_stream_ms']:.4f} ms")


if __name__ == "__main__":
    main()
