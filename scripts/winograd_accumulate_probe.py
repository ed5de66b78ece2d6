"""How a convolution's tf32x3 GEMMs should add up their depth: error against fp64 and time, per way.

The builtin convolutions add their K steps with `acc = tl.dot(a, b, acc, input_precision="tf32x3")`, which
Triton 3.6 builds as a dot from zero per step (the small products, then the big one, through 8-deep MMA
steps) added to acc in fp32; a Winograd convolution's output transform amplifies what those sums lose
(scripts/tf32x3_emulation.py models them). This probe rewrites the generated GEMM's K loop in several ways
and measures each, for the direct implicit GEMM and the Winograd variants of one bench_builtin case
(default: level2/11's 5x5 ConvTranspose2d):

    chain     the generated kernel with every K step chained through tl.dot's accumulator (`chained_gemms`)
    step      each K step's dot from zero, added to acc by an fp32 add written out
    kahan     the same steps added by compensated (Kahan) summation: acc and its running rounding error
    tap       (Winograd only) one leading tap's channels chained, the taps added by fp32 adds
    step_rn, kahan_rn
              step and kahan with each step's tf32x3 written out (`SPLIT_RN`): both parts of every operand
              rounded to nearest TF32 (ties away, as `cvt.rna`), so no tensor core cuts a remainder; the
              products from zero, the small ones first, as Triton builds its own
    chain_pre, kahan_pre
              chain and kahan with Triton's tf32x3 dot on operands first rounded to hi + tf32(x - hi)
              (`_presplit`): where Triton rounds its part as `cvt.rna` does, step_rn's products with no tf32
              dot in the kernel

The fp32 adds are written `tl.fma(x, 1.0, acc)`, which no pass folds into a tl.dot's accumulator. The chain
adds in fp32 once per step already, so step should err as it does (the 2026-12-04 run's step row, written as
`acc + tl.dot(a, b)`, did to 1e-16). `--outputs 3` builds the 5-tap Winograd variant as F(3, 5), the generator's tile
before F(2, 5) at (0, 1, -1, 1/2, -2). On a GPU only:

    PYTHONPATH=. python3 scripts/winograd_accumulate_probe.py --json OUT.json [--case NAME] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path
from tempfile import mkdtemp

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_builtin  # noqa: E402
from kernelbench import environment  # noqa: E402

from mkevolve.builtin.kernels import emit_winograd, generate_kernel, variant_count  # noqa: E402
from mkevolve.config import EAGER_ERROR_SLACK  # noqa: E402
from mkevolve.problem import fp32_strict, import_file  # noqa: E402
from mkevolve.verify.timing import time_forward  # noqa: E402

CHAINED = re.compile(r'acc = tl\.dot\(a, b, acc, input_precision="\w+"\)')   # the generated K step
ZEROS = "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
LOOP = re.compile(r"^(?P<pad> *)for k0 in range\(0, K_TOTAL, BLOCK_K\):\n(?P<body>(?:(?P=pad)    .*\n)+)", re.M)


SPLIT_RN = '''
@triton.jit
def _tf32_rn(x):   # to nearest TF32, ties away from zero (as `cvt.rna`): add half the 13 dropped bits, drop them
    return ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _presplit(x):   # hi + tf32(x - hi): its TF32 part and remainder both exact, however a dot splits it
    hi = _tf32_rn(x)
    return hi + _tf32_rn(x - hi)


@triton.jit
def _tf32x3_rn(a, b):
    a_hi = _tf32_rn(a)
    a_lo = _tf32_rn(a - a_hi)
    b_hi = _tf32_rn(b)
    b_lo = _tf32_rn(b - b_hi)
    part = tl.dot(a_lo, b_hi, input_precision="tf32")
    part = tl.dot(a_hi, b_lo, part, input_precision="tf32")
    return tl.dot(a_hi, b_hi, part, input_precision="tf32")

'''


def fp32_add(products: str) -> str:
    """acc + products by an fp32 add that Triton cannot fold into a tl.dot's accumulator (the module doc)."""
    return f"tl.fma({products}, 1.0, acc)"


@contextmanager
def chained_gemms():
    """The generator's K loops all chained through tl.dot's accumulator, as the modes below start from: it
    compensates the GEMMs of Winograd tiles whose output transform amplifies them itself (their kahan)."""
    amplifies = emit_winograd._amplifies
    emit_winograd._amplifies = lambda wt: False
    try:
        yield
    finally:
        emit_winograd._amplifies = amplifies


def use_tile(outputs: int) -> None:
    """Make the generator build its 5-tap Winograd variants with `outputs` per tile (at its own points)."""
    emit_winograd.OUTPUTS_PER_TILE[5] = outputs


def rewrite(source: str, mode: str) -> str:
    """The generated source with its GEMM's K loop rewritten for `mode`."""
    chained = CHAINED.search(source)[0]
    step = chained.removeprefix("acc = ").replace(", acc,", ",")      # tl.dot(a, b, input_precision=...)
    mode, _, operands = mode.partition("_")
    if operands:                 # the helpers go before the first kernel; each step calls them
        first = re.search(r"^@triton\.(jit|autotune)", source, re.M).start()
        source = source[:first] + SPLIT_RN + "\n" + source[first:]
        if operands == "rn":
            step = "_tf32x3_rn(a, b)"
        else:                    # "pre": the same tf32x3 dots, on presplit operands
            step, presplit = (text.replace("tl.dot(a, b,", "tl.dot(_presplit(a), _presplit(b),")
                              for text in (step, chained))
            source, chained = source.replace(chained, presplit), presplit
    if mode == "chain":
        return source
    if mode == "step":
        return source.replace(chained, f"acc = {fp32_add(step)}")
    if mode == "kahan":
        return kahan(source, chained, step)
    match = LOOP.search(source)
    pad, body = match["pad"], match["body"].replace(chained, chained.replace("acc", "part"))
    nested = (f"{pad}for tap0 in range(0, K_TOTAL, C_in):\n"
              f"{pad}    part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n"
              f"{pad}    for k0 in range(tap0, tap0 + C_in, BLOCK_K):\n"
              + "".join(f"    {line}\n" for line in body.splitlines())
              + f"{pad}    acc = {fp32_add('part')}\n")
    return source[:match.start()] + nested + source[match.end():]


def _indent_of(source: str, line: str) -> str:
    return re.search(rf"^( *){re.escape(line)}", source, re.M)[1]


def kahan(source: str, chained: str, step: str) -> str:
    """The K loop adding each step's products to acc by Kahan's compensated sum (k_comp: what acc lost)."""
    pad, zeros_pad = _indent_of(source, chained), _indent_of(source, ZEROS)
    lines = [f"k_part = {step}", "k_y = k_part - k_comp", "k_total = acc + k_y", "k_comp = (k_total - acc) - k_y",
             "acc = k_total"]
    source = source.replace(chained, f"\n{pad}".join(lines))
    return source.replace(ZEROS, f"{ZEROS}\n{zeros_pad}{ZEROS.replace('acc', 'k_comp')}")


def measure(path: Path, source: str, workdir: Path, name: str, rounds: int) -> dict:
    file = workdir / f"{re.sub(r'[^A-Za-z0-9]+', '_', name)}.py"
    file.write_text(source)
    module = import_file(file, prefix=f"probe_{file.stem}")
    _, init, reference, inputs = bench_builtin._instantiate(path)
    candidate = bench_builtin._build(module, init)
    with torch.no_grad():
        expected, actual = reference(*inputs), candidate(*inputs)
    torch.cuda.synchronize()
    eager_error, error = bench_builtin._errors_vs_fp64(reference, inputs, expected, actual)
    ok, max_diff = bench_builtin._compare(expected, actual, EAGER_ERROR_SLACK * eager_error)
    times = [time_forward(lambda: candidate(*inputs)).median_ms for _ in range(rounds)]
    row = {"mode": name, "correct": ok, "max_abs_vs_eager": max_diff, "error_vs_fp64": error,
           "eager_error_vs_fp64": eager_error, "median_ms": statistics.median(times), "round_ms": times}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="convT2d_64_128_k5__11")
    parser.add_argument("--modes", nargs="+", default=["chain", "step", "kahan", "tap"])
    parser.add_argument("--kinds", nargs="+", default=["direct", "winograd"], choices=["direct", "winograd"])
    parser.add_argument("--outputs", type=int, help="outputs per Winograd tile (default: the generator's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    fp32_strict()   # eager fp32 as the verifier runs it: cuDNN without TF32
    workdir = Path(mkdtemp(prefix="winograd-probe-"))
    case = next(c for c in bench_builtin._kernelbench_conv_cases() if c.name == args.case)
    path = workdir / f"{case.name}.py"
    path.write_text(case.source)
    if args.outputs:
        use_tile(args.outputs)
    with chained_gemms():
        generated = [generate_kernel(path, v, target="cuda") for v in range(variant_count(path, target="cuda"))]
    kernels = {"direct": generated[0]}
    kernels.update({"winograd": g for g in generated if g.description.startswith("Winograd")})
    rows = [measure(path, rewrite(kernel.source, mode), workdir, f"{kind} {mode}", args.rounds)
            for kind, kernel in kernels.items() if kind in args.kinds
            for mode in args.modes if kind == "winograd" or mode != "tap"]
    record = {**environment(), "case": case.name, "direct": generated[0].description,
              "winograd": kernels["winograd"].description if "winograd" in kernels else None, "rows": rows}
    args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
