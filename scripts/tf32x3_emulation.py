"""How a tf32x3 GEMM's operand splits and accumulation set its error, emulated on a CPU.

tl.dot(a, b, acc, input_precision="tf32x3") splits each fp32 operand into a TF32 part and a TF32 remainder
(10 explicit mantissa bits each), adds three of the four products (remainder x remainder is dropped) and
accumulates on tensor cores, which round the running sum after every 8-deep MMA step. This script computes
one dim of a convolution (`depth` terms per output: level2/11's 64 channels x 5 taps of the other dim) that
way in exact arithmetic wherever the hardware is exact, under:

    split      nearest: both parts rounded to nearest; truncated: both parts cut toward zero (the low 13 bits
               of each dropped)
    sum        chain: one fp32 rounding per 8-deep step, as `acc = tl.dot(a, b, acc)` in a K loop;
               tap: each leading tap's 64 channels chained, the taps added in fp32;
               kahan: each 32-deep K step chained from zero and added to acc by Kahan's summation

for the direct sum and Winograd F(3, 5) and F(2, 5) (scripts/winograd_points.py's point sets). Each row's
error against fp64 is the median over draws of the largest one, divided by that of the direct fp32 sum (the
order eager fp32 adds in). No GPU needed:

    python scripts/tf32x3_emulation.py --json scripts/results/tf32x3_emulation_cpu_DATE.json
"""

from __future__ import annotations

import argparse
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


def to_tf32(x: torch.Tensor, nearest: bool) -> torch.Tensor:
    bits = x.float().contiguous().view(torch.int32)
    if nearest:
        bits = bits + 0x1000          # half of the dropped bits' range: round to nearest (ties away)
    return (bits & ~_LOW_BITS).view(torch.float32)


def split(x: torch.Tensor, nearest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    big = to_tf32(x, nearest)
    return big, to_tf32(x - big, nearest)


def products(a: tuple, b: tuple, k: slice) -> torch.Tensor:
    """The three tf32x3 products of one depth slice, summed exactly (TF32 x TF32 is exact in fp64), in fp32."""
    (a_big, a_small), (b_big, b_small) = a, b
    exact = sum(x[:, k].double() @ y[k].double() for x, y in ((a_big, b_big), (a_big, b_small), (a_small, b_big)))
    return exact.float()


def chain(a: tuple, b: tuple, start: int, stop: int) -> torch.Tensor:
    acc = torch.zeros(a[0].shape[0], b[0].shape[1])
    for k in range(start, stop, MMA_DEPTH):
        acc = acc + products(a, b, slice(k, min(k + MMA_DEPTH, stop)))
    return acc


def gemm(a: torch.Tensor, b: torch.Tensor, nearest: bool, sum_mode: str) -> torch.Tensor:
    """[M, K] @ [K, N] in fp32 by tf32x3 under the split and sum modes of the module docstring."""
    a2, b2, depth = split(a, nearest), split(b, nearest), a.shape[1]
    if sum_mode == "chain":
        return chain(a2, b2, 0, depth)
    step = TAP_DEPTH if sum_mode == "tap" else BLOCK_K
    parts = [chain(a2, b2, k, min(k + step, depth)) for k in range(0, depth, step)]
    acc, lost = torch.zeros_like(parts[0]), torch.zeros_like(parts[0])
    for part in parts:
        if sum_mode == "tap":       # plain fp32 adds
            acc = acc + part
            continue
        part = part - lost          # Kahan: take back what the last addition lost
        total = acc + part
        lost = (total - acc) - part
        acc = total
    return acc - lost


def convolve(signal: torch.Tensor, weight: torch.Tensor, tile, nearest: bool, sum_mode: str) -> torch.Tensor:
    """[n] outputs of the correlation of signal [depth, n + taps - 1] with weight [depth, taps]."""
    depth, taps = weight.shape
    if tile is None:   # direct: depth x taps terms per output, the taps outermost as the kernels step
        windows = signal.float().unfold(1, taps, 1).permute(1, 2, 0).reshape(-1, taps * depth)
        return gemm(windows, weight.float().T.reshape(-1, 1), nearest, sum_mode)[:, 0]
    outputs, points = tile
    wt, at, g, bt = matrices(outputs, taps, points, dtype=torch.float64)
    tiles = signal.float().unfold(1, wt.alpha, outputs) @ bt.T.float()          # [depth, tiles, alpha] in fp32
    u = (weight @ g.T).float()                                                    # [depth, alpha], fp64 once
    x = torch.stack([gemm(tiles[:, :, p].T.contiguous(), u[:, p:p + 1].contiguous(), nearest, sum_mode)[:, 0]
                     for p in range(wt.alpha)], 1)
    return (x @ at.T.float()).reshape(-1)


def errors(depth: int, outputs: int, seeds: int) -> dict:
    rows: dict[str, list[float]] = {"direct fp32": []}
    for seed in range(seeds):
        signal, weight = draw(depth, 5, outputs, seed)
        exact, direct_error = exact_and_fp32(signal, weight)
        rows["direct fp32"].append(direct_error)
        for name, tile in TILES.items():
            for nearest in (True, False):
                for sum_mode in ("chain", "tap", "kahan"):
                    got = convolve(signal, weight, tile, nearest, sum_mode)
                    key = f"{name}, {'nearest' if nearest else 'truncated'} split, {sum_mode}"
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
        print(f"{key:45s} {row['median_max_error']:.3e}  {row['vs_direct_fp32']:.2f}x direct fp32")
    if args.json:
        args.json.write_text(json.dumps({"date": date.today().isoformat(), "machine": "cpu",
                                         "torch": torch.__version__, "python": platform.python_version(),
                                         "depth": args.depth, "outputs": args.outputs, "seeds": args.seeds,
                                         "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
