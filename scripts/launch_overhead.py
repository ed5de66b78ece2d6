r"""Where a forward's time goes when its kernels are short: the CPU's work to issue it against the GPU's work.

For each problem and packed solution (`python -m mkevolve pack`), on one GPU, eager, torch.compile and the
solution are each measured four ways:

- wall_ms: the benchmark's own time (the verifier's `time_forward`: L2 flushed, synchronised, median);
- issue_ms: CPU time from calling the forward to its return, the GPU idle before the call (median of 20).
  The GPU runs the kernels while later ones are issued, so a forward whose issue_ms is above its kernel_ms
  leaves the GPU waiting on Python;
- kernel_ms and launches: the GPU time of one forward's kernels, summed, and their number (torch.profiler,
  mean of 5 forwards);
- for the solution, issue_ms per top-level subkernel module: which launchers cost the CPU most;
- the kernels that took the most GPU time, by name (ms per forward, summed over a forward's launches).

    PYTHONPATH=. python3 scripts/launch_overhead.py PROBLEM.py PACKED.py [PROBLEM.py PACKED.py ...] \
        --out scripts/results/launch_overhead_<gpu>_<date>.json

Without CUDA nothing is timed and the script says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # mkevolve, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the sibling scripts
from kernelbench import build_sides, environment  # noqa: E402

ISSUE_REPEATS = 20
PROFILED_FORWARDS = 5


@dataclass
class SideCost:
    side: str                             # eager, compile or solution
    wall_ms: float
    issue_ms: float
    kernel_ms: float | None               # None: the profiler saw no GPU kernels
    launches: float | None
    module_issue_ms: dict[str, float] = field(default_factory=dict)   # solution: per top-level subkernel
    top_kernels_ms: dict[str, float] = field(default_factory=dict)    # kernel name -> GPU ms per forward


@dataclass
class ProblemCost:
    problem: str
    solution: str
    sides: list[SideCost]


def issue_ms(forward, repeats: int = ISSUE_REPEATS) -> float:
    import torch

    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        forward()
        times.append((time.perf_counter() - started) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


TOP_KERNELS = 10


def kernel_time(forward, forwards: int = PROFILED_FORWARDS) -> tuple[float | None, float | None, dict[str, float]]:
    """(kernel ms, kernels, the TOP_KERNELS names' ms) per forward, from the profiler's GPU events."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            forward()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return None, None, {}
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / forwards
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP_KERNELS])
    return sum(by_name.values()), len(kernels) / forwards, {n: round(ms, 4) for n, ms in top.items()}


def module_issue_ms(model, forward, repeats: int = ISSUE_REPEATS) -> dict[str, float]:
    """Median CPU time per forward spent in each direct child module's call (a solution's subkernels)."""
    import torch

    spent: dict[str, list[float]] = {}
    started: dict[str, float] = {}
    handles = []
    for name, child in model.named_children():
        handles.append(child.register_forward_pre_hook(lambda *_, n=name: started.__setitem__(n, time.perf_counter())))
        handles.append(child.register_forward_hook(
            lambda *_, n=name: spent.setdefault(n, []).append((time.perf_counter() - started[n]) * 1e3)))
    try:
        for _ in range(repeats):
            torch.cuda.synchronize()
            forward()
    finally:
        for handle in handles:
            handle.remove()
    torch.cuda.synchronize()
    # a child called k times a forward has k entries per forward: the median of per-call times, times k
    return {n: round(statistics.median(t) * len(t) / repeats, 4) for n, t in spent.items()}


def measure_problem(problem: Path, solution: Path) -> ProblemCost:
    import torch

    from mkevolve.verify.timing import time_forward

    sides = build_sides(problem, solution)
    models = {"eager": sides.eager, "compile": torch.compile(sides.eager), "solution": sides.ours}
    costs = []
    with torch.no_grad():
        for name, model in models.items():
            forward = (lambda m=model: m(*sides.inputs))
            for _ in range(3):
                forward()                 # compile, autotune, warm the caches
            kernel_ms, launches, top = kernel_time(forward)
            cost = SideCost(side=name, wall_ms=round(time_forward(forward).median_ms, 4),
                            issue_ms=round(issue_ms(forward), 4),
                            kernel_ms=None if kernel_ms is None else round(kernel_ms, 4),
                            launches=launches, top_kernels_ms=top)
            if name == "solution":
                cost.module_issue_ms = module_issue_ms(model, forward)
            costs.append(cost)
    return ProblemCost(problem=str(problem), solution=str(solution), sides=costs)


def summary(cost: ProblemCost) -> str:
    lines = [f"{Path(cost.problem).stem}:"]
    for s in cost.sides:
        kernel = "unknown" if s.kernel_ms is None else f"{s.kernel_ms:.3f} ms in {s.launches:.0f} kernels"
        lines.append(f"  {s.side:8s} wall {s.wall_ms:.3f} ms  issue {s.issue_ms:.3f} ms  GPU {kernel}")
        for module, ms in sorted(s.module_issue_ms.items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"      {module}: issue {ms:.3f} ms")
        for kernel, ms in list(s.top_kernels_ms.items())[:5]:
            lines.append(f"      GPU {ms:.3f} ms: {kernel[:90]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", type=Path, help="PROBLEM.py PACKED.py, one or more pairs")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give problems and packed solutions in pairs")
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: issue and kernel times unknown")
        return 0
    record = {**environment(), "problems": []}
    for problem, solution in zip(args.pairs[::2], args.pairs[1::2]):
        cost = measure_problem(problem, solution)
        print(summary(cost), flush=True)
        record["problems"].append(asdict(cost))
        if args.out:
            args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
