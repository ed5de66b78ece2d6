"""How a tf32x3 GEMM's operand splits, tensor-core rounding and accumulation set its error, emulated on a CPU.

tl.dot(a, b, acc, input_precision="tf32x3") splits each fp32 operand into a TF32 part and a remainder (10
explicit mantissa bits each) and adds three of the four products (remainder x remainder is dropped). Triton 3.6
builds each such dot from zero: the two small products, then the big one, chained through 8-deep MMA steps, the
result added to acc by an fp32 add. An MMA step's products are exact; its sum with the accumulator is rounded
once to fp32, and tensor cores are reported to round that sum toward zero, not to nearest. This script computes
one dim of a convolution (`depth` terms per output: level2/11's 64 channels x 5 taps of the other dim) that way
in exact arithmetic wherever the hardware is exact, under:

    split      nearest: both parts rounded to nearest; truncated: both parts cut toward zero (the low 13 bits
               of each dropped); hi-rounded: the TF32 part rounded to nearest, the remainder cut (Triton
               rounds the part by `cvt.rna`; a tensor core reading an fp32 operand as TF32 may cut the rest).
               An operand presplit to hi + tf32(x - hi) (scripts/tf32x3_probe.py) gives a tf32x3 dot that
               rounds its part to nearest the nearest split's parts
    mma        nearest or toward-zero: how an MMA step rounds its sum
    sum        step: each 32-deep K step a tf32x3 dot from zero, added to acc in fp32 (what Triton 3.6 compiles
               `acc = tl.dot(a, b, acc, input_precision="tf32x3")` to); tap: the steps of one leading tap
               (64 channels) added in fp32, the taps added in fp32; kahan: the steps added by Kahan's
               compensated summation; one-acc: all three products of every K step chained through one
               accumulator (3xTF32 written out as `acc = tl.dot(a_lo, b_hi, acc)` ...); two-acc: the small
               products chained through a second accumulator, added to the first at the end

for the direct sum and Winograd F(3, 5) and F(2, 5) (scripts/winograd_points.py's point sets). Each row's
error against fp64 is the median over draws of the largest one, divided by that of the direct fp32 sum (the
order eager fp32 adds in). No GPU needed:

    python scripts/tf32x3_emulation.py --json scripts/results/tf32x3_emulation_cpu_DATE.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from winograd_points import ACCURATE_F25, draw, exact_and_fp32, matrices  # noqa: E402

from mkevolve.builtin.kernels import winograd  # noqa: E402

MMA_DEPTH = 8        # products one tensor-core MMA step adds before its sum is rounded to fp32
BLOCK_K = 32         # depth of one K step of the generated kernels
TAP_DEPTH = 64       # input channels per leading tap (level2/11)
_LOW_BITS = 0x1FFF   # the 13 fp32 mantissa bits TF32 drops
TILES = {"direct": None, "F(3, 5)": (3, winograd._POINTS[:6]), "F(2, 5)": (2, ACCURATE_F25)}
SPLITS = {"nearest": (True, True), "truncated": (False, False), "hi-rounded": (True, False)}   # (part, remainder)
MMA_ROUNDINGS = ("nearest", "toward-zero")
SUMS = ("step", "tap", "kahan", "one-acc", "two-acc")


def to_tf32(x: torch.Tensor, nearest: bool) -> torch.Tensor:
    bits = x.float().contiguous().view(torch.int32)
    if nearest:
        bits = bits + 0x1000          # half of the dropped bits' range: round to nearest (ties away)
    return (bits & ~_LOW_BITS).view(torch.float32)


def split(x: torch.Tensor, split_mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    big_nearest, small_nearest = SPLITS[split_mode]
    big = to_tf32(x, big_nearest)
    return big, to_tf32(x - big, small_nearest)


def round_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """fp64 -> fp32 cutting toward zero: the nearest fp32, stepped back toward zero where it overshot."""
    nearest = x.float()
    overshot = nearest.double().abs() > x.abs()
    return torch.where(overshot, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest)


def mma(acc: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: slice, rounding: str) -> torch.Tensor:
    """acc + x[:, k] @ y[k] through 8-deep MMA steps: each step's products exact, its sum rounded once."""
    for start in range(k.start, k.stop, MMA_DEPTH):
        depth = slice(start, min(start + MMA_DEPTH, k.stop))
        exact = acc.double() + x[:, depth].double() @ y[depth].double()   # TF32 x TF32 is exact in fp64
        acc = exact.float() if rounding == "nearest" else round_toward_zero(exact)
    return acc


def small_products(a: tuple, b: tuple, acc: torch.Tensor, k: slice, rounding: str) -> torch.Tensor:
    return mma(mma(acc, a[1], b[0], k, rounding), a[0], b[1], k, rounding)


def tf32x3_dot(a: tuple, b: tuple, k: slice, rounding: str) -> torch.Tensor:
    """One K step's dot as Triton 3.6 builds it: from zero, the small products, then the big one."""
    zero = torch.zeros(a[0].shape[0], b[0].shape[1])
    return mma(small_products(a, b, zero, k, rounding), a[0], b[0], k, rounding)


def add_steps(steps: list[torch.Tensor], kahan: bool) -> torch.Tensor:
    acc, lost = torch.zeros_like(steps[0]), torch.zeros_like(steps[0])
    for step in steps:
        if not kahan:               # plain fp32 adds
            acc = acc + step
            continue
        step = step - lost          # Kahan: take back what the last addition lost
        total = acc + step
        lost = (total - acc) - step
        acc = total
    return acc - lost


def gemm(a: torch.Tensor, b: torch.Tensor, split_mode: str, rounding: str, sum_mode: str) -> torch.Tensor:
    """[M, K] @ [K, N] in fp32 by tf32x3 under the modes of the module docstring."""
    a2, b2, depth = split(a, split_mode), split(b, split_mode), a.shape[1]
    steps = [slice(k, min(k + BLOCK_K, depth)) for k in range(0, depth, BLOCK_K)]
    if sum_mode in ("one-acc", "two-acc"):
        acc = small = torch.zeros(a.shape[0], b.shape[1])
        for k in steps:
            if sum_mode == "one-acc":
                acc = small_products(a2, b2, acc, k, rounding)
            else:
                small = small_products(a2, b2, small, k, rounding)
            acc = mma(acc, a2[0], b2[0], k, rounding)
        return acc + small
    parts = [tf32x3_dot(a2, b2, k, rounding) for k in steps]
    if sum_mode == "tap":
        per_tap = TAP_DEPTH // BLOCK_K
        parts = [add_steps(parts[i:i + per_tap], kahan=False) for i in range(0, len(parts), per_tap)]
    return add_steps(parts, kahan=sum_mode == "kahan")


def convolve(signal: torch.Tensor, weight: torch.Tensor, tile, modes: tuple[str, str, str]) -> torch.Tensor:
    """[n] outputs of the correlation of signal [depth, n + taps - 1] with weight [depth, taps]."""
    depth, taps = weight.shape
    if tile is None:   # direct: depth x taps terms per output, the taps outermost as the kernels step
        windows = signal.float().unfold(1, taps, 1).permute(1, 2, 0).reshape(-1, taps * depth)
        return gemm(windows, weight.float().T.reshape(-1, 1), *modes)[:, 0]
    outputs, points = tile
    wt, at, g, bt = matrices(outputs, taps, points, dtype=torch.float64)
    tiles = signal.float().unfold(1, wt.alpha, outputs) @ bt.T.float()          # [depth, tiles, alpha] in fp32
    u = (weight @ g.T).float()                                                    # [depth, alpha], fp64 once
    x = torch.stack([gemm(tiles[:, :, p].T.contiguous(), u[:, p:p + 1].contiguous(), *modes)[:, 0]
                     for p in range(wt.alpha)], 1)
    return (x @ at.T.float()).reshape(-1)


def errors(depth: int, outputs: int, seeds: int) -> dict:
    rows: dict[str, list[float]] = {"direct fp32": []}
    for seed in range(seeds):
        signal, weight = draw(depth, 5, outputs, seed)
        exact, direct_error = exact_and_fp32(signal, weight)
        rows["direct fp32"].append(direct_error)
        for name, tile in TILES.items():
            for modes in itertools.product(SPLITS, MMA_ROUNDINGS, SUMS):
                got = convolve(signal, weight, tile, modes)
                key = "{}, {} split, mma {}, {}".format(name, *modes)
                rows.setdefault(key, []).append(float((got.double() - exact).abs().max()))
    reference = statistics.median(rows["direct fp32"])
    return {key: {"median_max_error": statistics.median(v), "vs_direct_fp32": statistics.median(v) / reference}
            for key, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=320, help="terms per output of one tap (channels x taps)")
    parser.add_argument("--outputs", type=int, default=6000, help="outputs per draw (a multiple of 6)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = errors(args.depth, args.outputs, args.seeds)
    for key, row in rows.items():
        print(f"{key:55s} {row['median_max_error']:.3e}  {row['vs_direct_fp32']:.2f}x direct fp32")
    if args.json:
        args.json.write_text(json.dumps({"date": date.today().isoformat(), "machine": "cpu",
                                         "torch": torch.__version__, "python": platform.python_version(),
                                         "depth": args.depth, "outputs": args.outputs, "seeds": args.seeds,
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
