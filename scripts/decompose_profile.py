"""Where the time before a run's first candidate goes: imports, the builtin decomposition, the decomposition check.

    python scripts/decompose_profile.py PROBLEM [--json FILE] [--top 25]

A lone run spends its first 14 to 20 s (H200, level2/63) before any kernel is written: the orchestrator's
imports, the builtin decomposition (a trace of the problem at full size) and the decomposition check (the
problem and the top-level built and compared). This script times each one in a fresh process, on an otherwise
idle GPU, with a sampling profiler, and lists the functions that take the most cumulative time, so that the slow part is
named rather than guessed. The check runs twice in one process: its first run pays what a fresh worker pays.
The JSON carries the date, GPU and versions.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # mkevolve, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the sibling scripts
from kernelbench import environment  # noqa: E402


def profiled(call, top: int, interval_s: float = 0.005) -> tuple[object, float, list[dict]]:
    """`call()`'s value, its wall time (s) and the `top` functions by cumulative time, from stacks sampled every
    `interval_s` by a thread (cProfile cannot be used: the builtin decomposer records construction with
    sys.setprofile)."""
    main_thread, samples, done = threading.get_ident(), Counter(), threading.Event()
    own = Counter()

    def sample() -> None:
        while not done.wait(interval_s):
            frame = sys._current_frames().get(main_thread)
            seen = set()
            leaf = True
            while frame is not None:
                code = frame.f_code
                key = f"{Path(code.co_filename).name}:{code.co_firstlineno}({code.co_name})"
                if key not in seen:
                    samples[key] += 1
                    seen.add(key)
                if leaf:
                    own[key] += 1
                    leaf = False
                frame = frame.f_back

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    sampler.start()
    try:
        value = call()
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - start
    rows = [{"function": key, "cumulative_s": round(count * interval_s, 3), "own_s": round(own[key] * interval_s, 3)}
            for key, count in samples.most_common(top)]
    return value, wall, rows


def import_times(module: str, top: int) -> dict:
    """`python -X importtime -c 'import module'` in a fresh process: its wall time and slowest imports."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1])
    wall = time.perf_counter() - start
    rows = []
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if match:
            rows.append({"module": match.group(4), "cumulative_s": int(match.group(2)) / 1e6,
                         "depth": len(match.group(3)) // 2})
    rows.sort(key=lambda r: -r["cumulative_s"])
    return {"module": module, "process_s": round(wall, 3), "slowest": rows[:top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    record: dict = {**environment(), "problem": str(args.problem), "imports": import_times("mkevolve.cli", args.top)}
    from mkevolve.builtin.decomposer import decomposition_files
    from mkevolve.verify.decomposition.worker import run_checks

    files, wall, rows = profiled(lambda: decomposition_files(args.problem), args.top)
    record["decomposition"] = {"wall_s": round(wall, 3), "slowest": rows}
    with tempfile.TemporaryDirectory(prefix="decompose-profile-") as folder:
        for name, text in files.items():
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_text(text, encoding="utf-8")
        record["checks"] = []
        for attempt in ("first in the process", "second"):
            report, wall, rows = profiled(lambda: run_checks(str(args.problem.resolve()), folder), args.top)
            record["checks"].append({"run": attempt, "wall_s": round(wall, 3), "passed": report.passed,
                                     "phases": report.phases, "slowest": rows})
    text = json.dumps(record, indent=1)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    summary = {k: record[k]["wall_s"] for k in ("decomposition",)}
    print(json.dumps({"imports_s": record["imports"]["process_s"], **summary,
                      "checks_s": [c["wall_s"] for c in record["checks"]],
                      "check_phases": [c["phases"] for c in record["checks"]]}))


if __name__ == "__main__":
    main()
