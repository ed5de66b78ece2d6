"""How long a value file takes to write, against its two parts: writing the bytes and hashing them.

    python scripts/bench_wire.py [--mb 32 256 2048] [--repeats 3] [--json FILE]

Every candidate output and every reference input set goes through `wire.write_values`, which writes the bytes
and computes their sha256 (the digest the trusted side checks). At KernelBench's full sizes these files are
gigabytes (level2/19: 2.2 GB per input set and per output), so a check writes tens of gigabytes. Since the
hash runs on a thread of its own while the file is written, a write should cost about the longer of the two
parts, not their sum; this script measures the three on one tensor of each size, in the memory filesystem
where candidates write (or the temporary folder without one), and reports the median of the repeats.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # mkevolve, from a checkout
from mkevolve.workers import wire  # noqa: E402

MEMORY_FS = Path("/dev/shm")


def seconds(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 4)


def measure(megabytes: int, folder: Path, repeats: int) -> dict:
    tensor = torch.rand(megabytes << 18)             # float32: 2**18 elements per MB
    data = tensor.numpy().data
    path = folder / "bench_wire.mkv"

    def raw_write():
        with open(path, "wb") as out:
            out.write(data)

    try:
        row = {"mb": megabytes,
               "raw_write_s": seconds(raw_write, repeats),
               "sha256_s": seconds(lambda: hashlib.sha256(data).digest(), repeats),
               "write_values_s": seconds(lambda: wire.write_values(path, [tensor]), repeats)}
    finally:
        path.unlink(missing_ok=True)
    row["write_values_over_sum"] = round(row["write_values_s"] / (row["raw_write_s"] + row["sha256_s"]), 3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[32, 256, 2048], help="tensor sizes (MB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    folder = MEMORY_FS if MEMORY_FS.is_dir() and os.access(MEMORY_FS, os.W_OK) else Path(tempfile.gettempdir())
    rows = [measure(mb, folder, args.repeats) for mb in args.mb]
    result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
              "folder": str(folder), "repeats": args.repeats, "rows": rows}
    for row in rows:
        print(f"{row['mb']:>6} MB  write {row['raw_write_s']:.3f} s  sha256 {row['sha256_s']:.3f} s  "
              f"write_values {row['write_values_s']:.3f} s  ({row['write_values_over_sum']:.2f} of their sum)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
