"""How a Winograd convolution's GEMMs should add up their depth: error against fp64 and time, per way.

The builtin Winograd variant's GEMMs chain their K steps through tensor-core accumulation
(`acc = tl.dot(a, b, acc)`): each step's products are added to the running sum inside the MMA. Where
that addition rounds toward zero rather than to nearest, its error grows with the number of steps and
in one direction, and the output transform's coefficients amplify it. This probe rewrites the generated
GEMM in three ways and measures each on one bench_builtin case (default: level2/11's 5x5
ConvTranspose2d):

    chain   the generated kernel as it is
    step    each K step's products summed on their own (tl.dot from zero), added to acc by an fp32 add
    tap     one leading tap's channels chained (tl.dot with a per-tap accumulator), the taps added by fp32 adds

The fp32 adds are written `tl.fma(x, 1.0, acc)`: Triton's combine pass rewrites `acc + tl.dot(a, b)` into
`tl.dot(a, b, acc)`, so written as an add the step mode compiles to the chain (the 2026-12-04 run's step
row, its error equal to the chain's to 1e-16, measured that).

beside the direct implicit-GEMM tf32x3 variant and eager fp32. On a GPU only:

    PYTHONPATH=. python3 scripts/winograd_accumulate_probe.py --json OUT.json [--case NAME] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from tempfile import mkdtemp

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_builtin  # noqa: E402
from kernelbench import environment  # noqa: E402

from mkevolve.builtin.kernels import generate_kernel, variant_count  # noqa: E402
from mkevolve.problem import fp32_strict, import_file  # noqa: E402
from mkevolve.verify.timing import time_forward  # noqa: E402

CHAINED = 'acc = tl.dot(a, b, acc, input_precision="tf32x3")'
LOOP = re.compile(r"^(?P<pad> *)for k0 in range\(0, K_TOTAL, BLOCK_K\):\n(?P<body>(?:(?P=pad)    .*\n)+)", re.M)


def fp32_add(products: str) -> str:
    """acc + products by an fp32 add that Triton cannot fold into a tl.dot's accumulator (the module doc)."""
    return f"tl.fma({products}, 1.0, acc)"


def rewrite(source: str, mode: str) -> str:
    """The generated Winograd source with its GEMM's K loop rewritten for `mode`."""
    if mode == "chain":
        return source
    if mode == "step":
        step = CHAINED.removeprefix("acc = ").replace(", acc,", ",")      # tl.dot(a, b, input_precision=...)
        return source.replace(CHAINED, f"acc = {fp32_add(step)}")
    match = LOOP.search(source)
    pad, body = match["pad"], match["body"].replace(CHAINED, CHAINED.replace("acc", "part"))
    nested = (f"{pad}for tap0 in range(0, K_TOTAL, C_in):\n"
              f"{pad}    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n"
              f"{pad}    for k0 in range(tap0, tap0 + C_in, BLOCK_K):\n"
              + "".join(f"    {line}\n" for line in body.splitlines())
              + f"{pad}    acc = {fp32_add('part')}\n")
    return source[:match.start()] + nested + source[match.end():]


def measure(path: Path, source: str, workdir: Path, name: str, rounds: int) -> dict:
    file = workdir / f"{name}.py"
    file.write_text(source)
    module = import_file(file, prefix=f"probe_{name}")
    _, init, reference, inputs = bench_builtin._instantiate(path)
    candidate = bench_builtin._build(module, init)
    with torch.no_grad():
        expected, actual = reference(*inputs), candidate(*inputs)
    torch.cuda.synchronize()
    ok, max_diff = bench_builtin._compare(expected, actual)
    eager_error, error = bench_builtin._errors_vs_fp64(reference, inputs, expected, actual)
    times = [time_forward(lambda: candidate(*inputs)).median_ms for _ in range(rounds)]
    row = {"mode": name, "correct": ok, "max_abs_vs_eager": max_diff, "error_vs_fp64": error,
           "eager_error_vs_fp64": eager_error, "median_ms": statistics.median(times), "round_ms": times}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="convT2d_64_128_k5__11")
    parser.add_argument("--modes", nargs="+", default=["chain", "step", "tap"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    fp32_strict()   # eager fp32 as the verifier runs it: cuDNN without TF32
    workdir = Path(mkdtemp(prefix="winograd-probe-"))
    case = next(c for c in bench_builtin._kernelbench_conv_cases() if c.name == args.case)
    path = workdir / f"{case.name}.py"
    path.write_text(case.source)
    generated = [generate_kernel(path, v, target="cuda") for v in range(variant_count(path, target="cuda"))]
    winograd = next(g for g in generated if g.description.startswith("Winograd"))
    rows = [measure(path, generated[0].source, workdir, "direct", args.rounds)]
    rows += [measure(path, rewrite(winograd.source, mode), workdir, mode, args.rounds) for mode in args.modes]
    record = {**environment(), "case": case.name, "direct": generated[0].description,
              "winograd": winograd.description, "rows": rows}
    args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
