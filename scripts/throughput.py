"""Evaluation throughput of one benchmark part, against the targets it is held to.

    python scripts/throughput.py RUN_EVENTS... --util util.csv --gpus 1 --runs-per-gpu 4 --json out.json

RUN_EVENTS are the events.jsonl files of the part's runs (or folders holding them); util.csv holds GPU
utilisation samples, one integer percentage per line and GPU, as written by

    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > util.csv

while the part ran. Reported, each beside its target:

    median run wall      seconds from a run's process start (its run_started event less its startup_s; else its
                         first event) to its last event, median over the runs (the target
                         is for a level 2 problem alone on its GPU: compare only with --runs-per-gpu 1)
    candidates per GPU-minute
                         verdict events of all runs (composite checks included, checks that never ran
                         their candidate left out) over the span from the
                         earliest event to the latest, in minutes, times the GPUs
    GPU busy             share of utilisation samples above zero (a sample is the share of its period in
                         which any kernel ran), and their mean
    orchestrator overhead
                         the runs' `iteration` events: overhead_s (time in neither an LLM call nor an
                         evaluation) over seconds, summed over the iterations

A value that the inputs cannot give (no samples, no iteration finished) is null, never a guess.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mkevolve.events import EventFilesError, find_event_files, read_event_lines  # noqa: E402
from mkevolve.verify.result import not_started_cause  # noqa: E402

# The targets of the evaluation-throughput work (H200, builtin agent, 1 iteration, budget 8).
MEDIAN_RUN_TARGET_S = 30.0          # one level 2 problem alone on a GPU
CANDIDATES_PER_GPU_MINUTE_TARGET = 20.0
GPU_BUSY_TARGET = 0.70
OVERHEAD_TARGET = 0.05


@dataclass
class RunThroughput:
    events: str
    wall_s: float
    verdicts: int
    composite_verdicts: int
    iteration_s: float
    overhead_s: float


@dataclass
class Throughput:
    runs: list[RunThroughput]
    gpus: int
    runs_per_gpu: int
    span_s: float | None
    median_run_s: float | None
    candidates_per_gpu_minute: float | None
    gpu_samples: int
    gpu_busy_share: float | None
    gpu_mean_utilisation: float | None
    overhead_share: float | None

    def lines(self) -> list[str]:
        alone = "" if self.runs_per_gpu == 1 else f" ({self.runs_per_gpu} runs per GPU; the target is for one alone)"
        return [
            f"runs: {len(self.runs)} on {self.gpus} GPU(s), {self.runs_per_gpu} per GPU",
            f"median run wall: {_value(self.median_run_s, '.1f', ' s')} (target <= {MEDIAN_RUN_TARGET_S:g} s){alone}",
            f"candidates per GPU-minute: {_value(self.candidates_per_gpu_minute, '.2f')} "
            f"(target >= {CANDIDATES_PER_GPU_MINUTE_TARGET:g})",
            (f"GPU busy: {_value(self.gpu_busy_share, '.1%')} of {self.gpu_samples} samples, mean utilisation "
             f"{_value(self.gpu_mean_utilisation, '.1f', ' %')}" if self.gpu_samples
             else "GPU busy: unknown (no samples)") + f" (target >= {GPU_BUSY_TARGET:.0%} busy)",
            f"orchestrator overhead: {_value(self.overhead_share, '.1%')} (target < {OVERHEAD_TARGET:.0%})",
        ]


def _value(value: float | None, spec: str, unit: str = "") -> str:
    return "unknown" if value is None else f"{value:{spec}}{unit}"


def run_throughput(path: Path) -> tuple[RunThroughput, float, float] | None:
    """One run's counts, and its first and last event times; None for a file without events."""
    events = read_event_lines(path)
    times = [e["t"] for e in events if isinstance(e.get("t"), (int, float))]
    if not times:
        return None
    times += [e["t"] - e["startup_s"] for e in events if e.get("kind") == "run_started"
              and isinstance(e.get("t"), (int, float)) and isinstance(e.get("startup_s"), (int, float))]
    # a check that never ran its candidate (the time budget was spent first) evaluated nothing
    verdicts = [e for e in events if e.get("kind") == "verdict" and not_started_cause(e.get("reason") or "") is None]
    iterations = [e for e in events if e.get("kind") == "iteration"]
    run = RunThroughput(events=str(path), wall_s=round(max(times) - min(times), 3), verdicts=len(verdicts),
                        composite_verdicts=sum(1 for e in verdicts if e.get("composite")),
                        iteration_s=sum(e.get("seconds") or 0.0 for e in iterations),
                        overhead_s=sum(e.get("overhead_s") or 0.0 for e in iterations))
    return run, min(times), max(times)


def read_utilisation(path: Path | None) -> list[int]:
    """The samples of a utilisation file; lines that are not a percentage (a header, a cut line) are skipped."""
    if path is None or not path.is_file():
        return []
    return [int(line) for line in path.read_text().split() if line.isdigit()]


def busy_and_mean(samples: list[int]) -> tuple[float | None, float | None]:
    """(share of samples above zero, mean utilisation in %), None without samples."""
    if not samples:
        return None, None
    return sum(1 for s in samples if s > 0) / len(samples), statistics.fmean(samples)


def measure(paths: list[Path], util: Path | None, gpus: int, runs_per_gpu: int) -> Throughput:
    measured = [m for m in (run_throughput(p) for p in find_event_files(paths)) if m is not None]
    runs = [m[0] for m in measured]
    span = (max(m[2] for m in measured) - min(m[1] for m in measured)) if measured else None
    verdicts = sum(r.verdicts for r in runs)
    samples = read_utilisation(util)
    busy, mean = busy_and_mean(samples)
    iteration_s = sum(r.iteration_s for r in runs)
    return Throughput(
        runs=runs, gpus=gpus, runs_per_gpu=runs_per_gpu, span_s=span,
        median_run_s=statistics.median(r.wall_s for r in runs) if runs else None,
        candidates_per_gpu_minute=verdicts / (span / 60 * gpus) if span else None,
        gpu_samples=len(samples), gpu_busy_share=busy, gpu_mean_utilisation=mean,
        overhead_share=sum(r.overhead_s for r in runs) / iteration_s if iteration_s else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", nargs="+", type=Path, help="events.jsonl files of the runs, or folders of them")
    parser.add_argument("--util", type=Path, help="GPU utilisation samples (nvidia-smi, one per line and GPU)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the runs shared")
    parser.add_argument("--runs-per-gpu", type=int, default=1, help="runs that shared one GPU at a time (lanes)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the numbers as JSON to FILE")
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.runs_per_gpu < 1:
        parser.error("--gpus and --runs-per-gpu must be at least 1")
    if args.util is not None and not args.util.is_file():
        parser.error(f"{args.util}: no such file")
    try:
        throughput = measure(args.events, args.util, args.gpus, args.runs_per_gpu)
    except EventFilesError as err:
        parser.error(str(err))
    print("\n".join(throughput.lines()))
    if args.json:
        args.json.write_text(json.dumps(asdict(throughput), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
