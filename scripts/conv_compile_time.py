"""Seconds to compile a builtin outer-product convolution kernel for a GPU, with no GPU needed.

Triton compiles for a named target (sm_90 by default) on any machine: this times that compile for every
tile config the kernel is autotuned over, under each unroll limit asked for (by default: every (tap,
channel) step unrolled, and the generator's emit_conv._MAX_UNROLLED_STEPS), each in a fresh Triton cache.

    python scripts/conv_compile_time.py PROBLEM.py --const C_in_g=8 K0=3 K1=3 K2=3 [--limits 64 128] --json OUT.json

The problem is a small copy of the one of interest (compile time depends on the constexprs, not on the
sizes); --const gives the kernel's constexpr values other than the tile sizes (strides, paddings and
dilations default to 1, 0 and 1, groups to 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mkevolve.builtin.kernels import emit_conv  # noqa: E402
from mkevolve.builtin.kernels.generate import generate  # noqa: E402


def conv_kernel(source: str, folder: Path):
    """The first `_conv_kernel*` of a generated file, and its autotuner's configs."""
    path = folder / "kernel.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("generated_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tuned = next(v for k, v in vars(module).items() if k.startswith("_conv_kernel") and not k.endswith("launch"))
    jit = tuned
    while type(jit).__name__ != "JITFunction":
        jit = jit.fn
    return jit, getattr(tuned, "configs", [])


def compile_seconds(jit, constants: dict[str, int], config, target: GPUTarget) -> float:
    values = {**constants, **config.kwargs}
    signature = {n: "constexpr" if n in values else ("*fp32" if n.endswith("_ptr") else "i32") for n in jit.arg_names}
    source = ASTSource(fn=jit, signature=signature,
                       constexprs={(jit.arg_names.index(n),): v for n, v in values.items() if n in jit.arg_names})
    started = time.perf_counter()
    triton.compile(source, target=target, options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    return time.perf_counter() - started


def measure(problem: Path, constants: dict[str, int], limit: int, target: GPUTarget) -> dict:
    saved = emit_conv._MAX_UNROLLED_STEPS
    emit_conv._MAX_UNROLLED_STEPS = limit
    try:
        source = generate(problem, 0, "cuda").source
    finally:
        emit_conv._MAX_UNROLLED_STEPS = saved
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TRITON_CACHE_DIR"] = str(Path(folder) / "cache")   # nothing compiled before counts
        jit, configs = conv_kernel(source, Path(folder))
        seconds = [round(compile_seconds(jit, constants, c, target), 2) for c in configs]
    return {"unroll_limit": limit, "rolled_loops": source.count(" in range("), "seconds_per_config": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", type=Path)
    parser.add_argument("--const", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for")
    parser.add_argument("--limits", nargs="*", type=int, help="unroll limits to time (steps unrolled at most)",
                        default=[10**9, emit_conv._MAX_UNROLLED_STEPS])
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    constants = {f"{p}{d}": v for p, v in (("STRIDE", 1), ("PAD", 0), ("DIL", 1)) for d in range(3)}
    constants["GROUPS"] = 1
    constants.update({k: int(v) for k, v in (c.split("=") for c in args.const)})
    target = GPUTarget("cuda", args.arch, 32)
    rows = [measure(args.problem, constants, limit, target) for limit in args.limits]
    result = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
              "triton": triton.__version__, "target": f"sm_{args.arch}", "problem": str(args.problem),
              "constants": constants, "rows": rows}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
