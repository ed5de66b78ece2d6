"""One problem alone on its GPU: how long `mkevolve run` takes, by worker count, with cold and warm caches.

    python scripts/run_alone.py PROBLEM [--workers 1 2 4] [--run-args='--budget 8'] [--json FILE]

The target (a level 2 problem alone on an H200 in at most 30 s) is about this case. For each worker count there
are two runs: the first with mkevolve's, Triton's and Inductor's caches in fresh folders (a user's first run of
the problem), the second reusing what the first left there (the same problem run again). Each run's record: the
process's wall time and exit status, the run's startup and closing (its first and last events), its verdicts
and their median wall time, the GPU's utilisation sampled every 0.5 s (none without nvidia-smi), and the
profile of its evaluations, phase by phase (eval_profile.py). The JSON carries the date, GPU and versions.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # mkevolve, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the sibling scripts
from kernelbench import (UtilisationSampler, child_env, environment, last_line, load_sibling,  # noqa: E402
                         run_step)

from mkevolve.events import read_event_lines  # noqa: E402

eval_profile = load_sibling("eval_profile")
throughput = load_sibling("throughput")

DEFAULT_RUN_ARGS = "--model builtin --iterations 1 --budget 8"


@dataclass
class AloneRun:
    workers: int
    caches: str                       # "cold": fresh folders; "warm": those the cold run of this count left
    exit_code: int | None             # None: stopped at --limit
    process_s: float                  # the `mkevolve run` process, start to exit
    startup_s: float | None = None    # before the run's first event (imports, configuration)
    closing_s: float | None = None    # after its last check (workers stopped, report written)
    verdicts: int = 0
    median_evaluation_s: float | None = None
    gpu_busy_share: float | None = None
    gpu_mean_utilisation: float | None = None
    last_line: str = ""
    phases: dict[str, float] = field(default_factory=dict)   # median seconds per phase of its evaluations
    milestones: dict[str, float] = field(default_factory=dict)    # seconds after run_started (MILESTONES)
    check_phases: dict[str, float] = field(default_factory=dict)  # the first decomposition check's phases


# When a run reaches each step, by the first event that marks it: its decomposition checked (the budget of the
# search is set), its first kernel reply, its first verdict, its searches done, its end.
MILESTONES = {
    "decomposed": lambda e: e.get("kind") == "budget",
    "first_reply": lambda e: e.get("kind") == "llm_call" and e.get("agent") == "generate",
    "first_verdict": lambda e: e.get("kind") == "verdict",
    "searched": lambda e: e.get("kind") == "checkpoint" and e.get("step") == "evolved",
    "finished": lambda e: e.get("kind") == "run_finished",
}


def cache_env(root: Path) -> dict[str, str]:
    """Every cache a run reads or fills, under `root`: mkevolve's references and baselines, the warm Triton
    cache of candidate processes (in the temporary folder), Triton's own and Inductor's."""
    folders = {"MKEVOLVE_CACHE": root / "mkevolve", "TMPDIR": root / "tmp", "TRITON_CACHE_DIR": root / "triton",
               "TORCHINDUCTOR_CACHE_DIR": root / "inductor"}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {name: str(folder) for name, folder in folders.items()}


def run_once(problem: Path, workers: int, caches: str, cache_root: Path, out: Path, run_args: list[str],
             limit_s: float) -> AloneRun:
    """One `mkevolve run`, stopped (its process group) at `limit_s`, as a benchmark part stops a run."""
    command = [sys.executable, "-m", "mkevolve", "run", str(problem), "--workers", str(workers), "--out", str(out),
               *run_args]
    sampler = UtilisationSampler(out / f"util_w{workers}_{caches}.csv")
    step = run_step(command, out / f"run_w{workers}_{caches}.log", limit_s, {**child_env(), **cache_env(cache_root)})
    run = AloneRun(workers, caches, step.exit_code, round(step.seconds, 1), last_line=last_line(step.log))
    sampled = sampler.stop()
    run.gpu_busy_share, run.gpu_mean_utilisation = sampled["gpu_busy_share"], sampled["gpu_mean_utilisation"]
    events_files = sorted((out / problem.stem).glob("*/events.jsonl"), key=lambda p: p.stat().st_mtime)
    if events_files:
        read_events(run, events_files[-1])
    return run


def read_events(run: AloneRun, path: Path) -> None:
    """The run's own record of its startup, closing and evaluations."""
    events = read_event_lines(path)
    run.startup_s = next((e.get("startup_s") for e in events if e.get("kind") == "run_started"), None)
    run.closing_s = next((e.get("closing_s") for e in events if e.get("kind") == "run_finished"), None)
    verdicts = [e for e in events if e.get("kind") == "verdict"]
    profile = eval_profile.summarize(verdicts)
    run.verdicts = len(verdicts)
    run.phases = {row.phase: round(row.median_s, 3) for row in profile.rows}
    run.median_evaluation_s = round(profile.wall_median_s, 3) if profile.evaluations else None
    started = next((e["t"] for e in events if e.get("kind") == "run_started"), None)
    if started is not None:
        for name, marks in MILESTONES.items():
            at = next((e["t"] for e in events if marks(e) and "t" in e), None)
            if at is not None:
                run.milestones[name] = round(at - started, 1)
    check = next((e["checks"] for e in events if e.get("kind") == "decomposition" and "checks" in e), {})
    run.check_phases = dict(check.get("phases", {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", type=Path, help="a KernelBench-style problem file")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts, one pair of runs each")
    parser.add_argument("--run-args", default=DEFAULT_RUN_ARGS, metavar="ARGS",
                        help=f"flags for mkevolve run, one string after '=' (default: '{DEFAULT_RUN_ARGS}')")
    parser.add_argument("--limit", type=float, default=300.0, metavar="SECONDS", help="a run is stopped after this")
    parser.add_argument("--out", type=Path, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the records here")
    args = parser.parse_args(argv)
    out = (args.out or Path(tempfile.mkdtemp(prefix="mkevolve-alone-"))).resolve()   # the runs start in the repo
    runs = []
    for workers in args.workers:
        cache_root = out / f"caches_w{workers}"          # fresh for the cold run, reused by the warm one
        for caches in ("cold", "warm"):
            run = run_once(args.problem.resolve(), workers, caches, cache_root, out, shlex.split(args.run_args),
                           args.limit)
            runs.append(run)
            print(f"workers {workers}, {caches} caches: {run.process_s:.1f} s (exit {run.exit_code}), startup "
                  f"{run.startup_s} s, closing {run.closing_s} s, {run.verdicts} verdicts at "
                  f"{run.median_evaluation_s} s median, GPU busy {run.gpu_busy_share}; {run.last_line}")
            print("    after the start (s): " + ", ".join(f"{k} {v}" for k, v in run.milestones.items()))
    record = {**environment(), "problem": str(args.problem), "run_args": args.run_args,
              "target_s": throughput.MEDIAN_RUN_TARGET_S, "runs": [asdict(r) for r in runs]}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
