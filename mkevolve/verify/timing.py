"""GPU timing with CUDA events and the cached torch.compile baseline; on CPU nothing is timed."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path
from typing import Callable

import torch

from mkevolve.fsutil import write_atomic
from mkevolve.workers.gpu_share import gpu_alone, lock_file
from mkevolve.workers.harden import own_builtins
from mkevolve.verify.result import Timing

WARMUP_RUNS = 10
TIMED_RUNS = 100           # at most this many timed runs,
MIN_TIMED_RUNS = 20        # at least this many,
TIMED_BUDGET_MS = 1000.0   # and no more once they add up to this much GPU time: the median is settled by then
_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (60 MB on an H200)


def _percentile(sorted_ms: list[float], q: float) -> float:
    index = min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))
    return sorted_ms[index]


def summarize(times_ms: list[float]) -> Timing:
    ordered = sorted(times_ms)
    return Timing(median_ms=statistics.median(ordered), p10_ms=_percentile(ordered, 0.1),
                  p20_ms=_percentile(ordered, 0.2), p80_ms=_percentile(ordered, 0.8),
                  p90_ms=_percentile(ordered, 0.9), runs=len(ordered))


def timing_done(times_ms: list[float], runs: int = TIMED_RUNS) -> bool:
    """Whether enough timed runs are in: `runs` of them, or MIN_TIMED_RUNS that add up to TIMED_BUDGET_MS.

    A 2 ms forward is still timed 100 times (0.2 s); a 100 ms one 20 times (2 s) rather than 100 (10 s),
    which is also 8 s less that every other job waiting for the GPU lock spends waiting."""
    return len(times_ms) >= runs or (len(times_ms) >= min(MIN_TIMED_RUNS, runs)
                                     and sum(times_ms) >= TIMED_BUDGET_MS)


def time_forward(forward: Callable[[], object], warmup: int = WARMUP_RUNS,
                 runs: int = TIMED_RUNS) -> Timing:
    """Time `forward()` on the current GPU: L2 flushed before each run, every stream joined.

    The end event is recorded after a device-wide synchronize, so work a forward leaves on a
    side stream is inside the measured interval rather than silently outside it. Warm-up runs (where
    Triton and torch.compile compile) share the GPU with other workers; the timed runs have it alone.
    """
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    with torch.no_grad():
        for _ in range(warmup):
            forward()
        torch.cuda.synchronize()
        times = []
        with gpu_alone():
            while not timing_done(times, runs):
                flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                forward()
                torch.cuda.synchronize()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
    return summarize(times)


def combine(timings: list[Timing]) -> Timing:
    """Several instantiations of one subproblem run in sequence: their times add up."""
    fields = ("median_ms", "p10_ms", "p20_ms", "p80_ms", "p90_ms")
    sums = {f: sum(getattr(t, f) for t in timings) for f in fields}
    return Timing(**sums, runs=min(t.runs for t in timings))


def default_cache_dir() -> Path:
    base = os.environ.get("MKEVOLVE_CACHE") or Path.home() / ".cache" / "mkevolve"
    return Path(base) / "baselines"


def baseline_key(problem_source: str, shapes: list, eval_mode: bool) -> str:
    import triton

    identity = {
        "problem": hashlib.sha256(problem_source.encode()).hexdigest(),
        "shapes": shapes,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "eval_mode": eval_mode,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def cached_baseline(cache_dir: Path, key: str, measure: Callable[[], Timing]) -> Timing:
    """torch.compile's time for this (problem, shapes, GPU, versions), measured once.

    Once even when several workers or runs ask at the same moment: the first takes the key's lock file
    and measures, the others wait for it and read its result (a torch.compile of a KernelBench model
    takes 10 to 30 s of CPU and GPU that every duplicate would spend again)."""
    path = Path(cache_dir) / f"{key}.json"
    if path.exists():
        return Timing(**json.loads(path.read_text()))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        lock_file(lock)  # released when the file closes, or when this process dies
        if path.exists():
            return Timing(**json.loads(path.read_text()))
        timing = measure()
        write_atomic(path, json.dumps(timing.__dict__))
    return timing


# timing_done also runs inside candidate processes (the harness asks it between calls): it reads this
# module's own copies of len, sum and min, not builtins that candidate code may have replaced.
own_builtins(globals())
