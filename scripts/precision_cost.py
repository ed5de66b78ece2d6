"""What the measured precision rule costs on full-size problems: the reference Model run in fp64 once per input
set, as the judge runs it (`ReferenceSet.fp64`), next to the fp32 reference the cache computes anyway.

    python scripts/precision_cost.py --out results.json /path/to/kernelbench/level2/*.py
    python scripts/precision_cost.py --out results.json --time-limit 300 problems/*.py

Per problem, config 0, the first input set: seconds for the fp32 reference (computed and written by
`ReferenceSet.ensure`), seconds for the fp64 one (fresh Model, upcast inputs, its outputs compared with fp32's),
an fp32 forward alone (median of 3) for scale, the fp64 outputs' size, whether the rule measures the set at
all (None from `fp64`: no fp64 form) and whether it keeps the fp64 outputs at sampled positions alone (outputs
past FP64_REFERENCE_BYTES). Results are saved after every problem, so a run cut short by --time-limit keeps
what it measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not

from mkevolve.problem import build_model, call_inputs, fp32_strict, load_problem, make_inputs  # noqa: E402
from mkevolve.verify import reference  # noqa: E402


@dataclass
class Cost:
    problem: str
    fp32_reference_s: float      # ReferenceSet.ensure of the first set: inputs made, Model built and run, written
    fp64_reference_s: float      # ReferenceSet.fp64 of it: fresh Model in fp64, run, compared with fp32's outputs
    fp32_forward_ms: float       # one fp32 forward of a built Model, median of 3, for scale
    fp64_output_mib: float       # the floating-point outputs' size in fp64
    measured: bool               # False where fp64() gives None: the rule leaves the set unmeasured
    sampled: bool                # kept at FP64_SAMPLED_POSITIONS positions per output, not whole
    eager_error_vs_fp64: float | None
    peak_gpu_mib: float | None   # the most GPU memory allocated while the fp64 reference ran
    note: str = ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _fp32_forward_ms(problem, device: torch.device) -> float:
    config = problem.configs[0]
    init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
    model = build_model(problem.path, problem.model_cls, init, 0, device, False)
    inputs = make_inputs(problem.path, config, 1, device)
    times = []
    with torch.no_grad():
        for _ in range(4):
            _sync(device)
            start = time.perf_counter()
            model(*inputs)
            _sync(device)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])          # the first call pays cuDNN's and the allocator's setup


def measure(path: Path, device: torch.device, cache: Path) -> Cost:
    problem = load_problem(path)
    references = reference.reference_set(cache, problem, 0, 0, False, device)
    start = time.perf_counter()
    references.ensure([reference.FIRST_SET])
    _sync(device)
    fp32_s = time.perf_counter() - start
    expected = references.expected(reference.FIRST_SET)
    floating = [v for v in expected if isinstance(v, torch.Tensor) and v.is_floating_point()]
    fp64_mib = sum(v.numel() for v in floating) * 8 / 2**20
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    exact = references.fp64(reference.FIRST_SET)
    _sync(device)
    fp64_s = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    reference._fp64_references.clear()           # free it before the next problem
    return Cost(problem=path.stem, fp32_reference_s=round(fp32_s, 3), fp64_reference_s=round(fp64_s, 3),
                fp32_forward_ms=round(_fp32_forward_ms(problem, device), 3), fp64_output_mib=round(fp64_mib, 3),
                measured=exact is not None, sampled=exact is not None and exact.positions is not None,
                eager_error_vs_fp64=exact.eager_error if exact else None,
                peak_gpu_mib=round(peak, 1) if peak is not None else None)


def environment(device: torch.device) -> dict:
    import triton

    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    return {"date": date.today().isoformat(), "gpu": gpu, "torch": str(torch.__version__),
            "triton": triton.__version__, "python": platform.python_version(),
            "fp64_reference_bytes": reference.FP64_REFERENCE_BYTES,
            "fp64_sampled_positions": reference.FP64_SAMPLED_POSITIONS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--time-limit", type=float, default=None, help="seconds; no new problem starts after")
    args = parser.parse_args()
    fp32_strict()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    results = {"environment": environment(device), "costs": []}
    for path in args.problems:
        if deadline is not None and time.monotonic() > deadline:
            print(f"time limit reached: {path.stem} and later not measured")
            break
        cache = Path(tempfile.mkdtemp(prefix="mkv-precision-"))
        try:
            cost = measure(path, device, cache)
        except (RuntimeError, OSError) as err:      # out of memory, disk: record it, go on with the next
            cost = Cost(path.stem, 0.0, 0.0, 0.0, 0.0, False, False, None, None, note=f"{type(err).__name__}: {err}")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results["costs"].append(asdict(cost))
        args.out.write_text(json.dumps(results, indent=1))
        print(f"{cost.problem}: fp32 ref {cost.fp32_reference_s:.2f} s, fp64 ref {cost.fp64_reference_s:.2f} s, "
              f"forward {cost.fp32_forward_ms:.1f} ms, {cost.fp64_output_mib:.0f} MiB, measured {cost.measured}"
              f"{' (sampled)' if cost.sampled else ''}"
              f"{' ' + cost.note if cost.note else ''}", flush=True)


if __name__ == "__main__":
    main()
