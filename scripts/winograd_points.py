"""Which interpolation points and tile sizes keep a Winograd convolution nearest fp64, emulated on a CPU.

One dim of a convolution with `taps` taps, summed over `depth` terms (input channels times the other dims'
taps: 64 x 5 for level2/11's 5x5 ConvTranspose2d), as the builtin Winograd variant computes it: input and weight
transforms, the alpha products summed over the depth, and the output transform, all in fp32
(`mkevolve.builtin.kernels.winograd.transform` gives the matrices). Each point set's largest error against the
same sums in fp64 is the median over several draws, beside the direct fp32 sum's (a matmul). Inputs are uniform
in [-1, 1), weights uniform within 1/sqrt(depth x taps), as nn.Conv2d draws them. No GPU needed.

    python scripts/winograd_points.py --json scripts/results/winograd_points_cpu_DATE.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import date
from fractions import Fraction
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mkevolve.builtin.kernels import winograd  # noqa: E402

HALF = Fraction(1, 2)
ACCURATE_F25 = (0, 1, -1, HALF, -2)      # the F(2, 5) points with the least error here: the generator's now
# per outputs-per-tile m, point sets of m + taps - 2 finite points (taps = 5); the generator's first
POINT_SETS = {
    3: [winograd._POINTS[:6], (0, 1, -1, HALF, -HALF, 2), (0, 1, -1, HALF, -HALF, -2), (0, 1, -1, 2, -2, -HALF)],
    2: [winograd._POINTS[:5], (0, 1, -1, HALF, -HALF), (0, 1, -1, 2, -2), (0, 1, -1, -HALF, 2)],
}


def matrices(outputs: int, taps: int, points, dtype=torch.float32) -> tuple[winograd.WinogradTransform, torch.Tensor,
                                                                            torch.Tensor, torch.Tensor]:
    """F(outputs, taps) at `points`, and its AT, G and BT as tensors of `dtype`."""
    wt = winograd.transform(outputs, taps, tuple(Fraction(p) for p in points))
    at, g, bt = (torch.tensor([[float(v) for v in row] for row in m], dtype=dtype) for m in (wt.at, wt.g, wt.bt))
    return wt, at, g, bt


def exact_and_fp32(signal: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The correlation of signal [depth, n + taps - 1] with weight [depth, taps] in fp64, and the largest error
    of the direct fp32 sum (a matmul over depth x taps, as eager adds) against it."""
    outputs, taps = signal.shape[1] - weight.shape[1] + 1, weight.shape[1]
    windows = signal.unfold(1, taps, 1)                          # [depth, n, taps]
    exact = torch.einsum("dnk,dk->n", windows, weight)
    direct = windows.float().permute(1, 0, 2).reshape(outputs, -1) @ weight.float().reshape(-1)
    return exact, float((direct.double() - exact).abs().max())


def winograd_fp32(signal: torch.Tensor, weight: torch.Tensor, outputs: int, points) -> torch.Tensor:
    """[n] outputs of the correlation of `signal` [depth, n + taps - 1] with `weight` [depth, taps], in fp32."""
    wt, at, g, bt = matrices(outputs, weight.shape[1], points)
    tiles = signal.unfold(1, wt.alpha, outputs)                     # [depth, tiles, alpha]
    products = torch.einsum("dta,da->ta", tiles @ bt.T, weight @ g.T)   # alpha sums over the depth, per tile
    return (products @ at.T).reshape(-1)


def draw(depth: int, taps: int, outputs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    signal = torch.rand(depth, outputs + taps - 1, generator=generator, dtype=torch.float64) * 2 - 1
    bound = (depth * taps) ** -0.5
    weight = (torch.rand(depth, taps, generator=generator, dtype=torch.float64) * 2 - 1) * bound
    return signal, weight


def errors(depth: int, taps: int, outputs: int, seeds: int) -> dict:
    rows = {"direct fp32": []}
    for seed in range(seeds):
        signal, weight = draw(depth, taps, outputs, seed)
        exact, direct_error = exact_and_fp32(signal, weight)
        rows["direct fp32"].append(direct_error)
        for m, sets in POINT_SETS.items():
            for points in sets:
                name = f"F({m}, {taps}) at " + ", ".join(str(Fraction(p)) for p in points)
                got = winograd_fp32(signal.float(), weight.float(), m, points)
                rows.setdefault(name, []).append(float((got.double() - exact).abs().max()))
    direct = statistics.median(rows["direct fp32"])
    return {name: {"median_max_error": statistics.median(v), "vs_direct": statistics.median(v) / direct}
            for name, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=320, help="terms each product sums (channels x other taps)")
    parser.add_argument("--outputs", type=int, default=60000, help="outputs per draw (a multiple of 6)")
    parser.add_argument("--seeds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = errors(args.depth, 5, args.outputs, args.seeds)
    for name, row in rows.items():
        print(f"{name:40s} {row['median_max_error']:.3e}  {row['vs_direct']:.2f}x direct")
    if args.json:
        args.json.write_text(json.dumps({"date": date.today().isoformat(), "machine": "cpu",
                                         "torch": torch.__version__, "python": platform.python_version(),
                                         "depth": args.depth, "taps": 5, "outputs": args.outputs,
                                         "seeds": args.seeds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
