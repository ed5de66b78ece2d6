"""Winograd's minimal filtering F(m, r) along one dim: m outputs of an r-tap correlation from m + r - 1 products.

For a tile of alpha = m + r - 1 inputs d and the r taps g, y_i = sum_k d[i + k] g[k] (i < m) equals

    y = AT @ ((G @ g) * (BT @ d))          AT [m, alpha], G [alpha, r], BT [alpha, alpha]

so a convolution whose last spatial dim has r taps does alpha products per m outputs instead of m * r: each
of the alpha points is a GEMM over the remaining taps and the input channels, on the transformed input
BT @ d and the transformed weight G @ g. The matrices come from interpolating at alpha - 1 finite points and
infinity (Toom-Cook); AT and G are written down from the points, BT solved for exactly so the identity above
holds (`transform`), all in exact fractions.

How many outputs per tile: larger tiles need fewer products but reach points whose powers grow, and fp32
rounding grows with them. Against an fp64 reference on a CPU (64 -> 128 channels, 4 images of 32x32, fp32
transforms and GEMMs, weights of level2/11's scale), the error relative to PyTorch's CPU fp32 convolution's was,
for r = 5: m = 2 1.17, m = 3 1.00, m = 4 1.12, m = 6 12.4; for r = 3: m = 2 0.81, m = 3 1.16, m = 4 2.07, and
`OUTPUTS_PER_TILE` keeps r = 3's most accurate tile, m = 2 (r = 5's: below). On the H200 the direct tf32x3
convolution is more accurate than that CPU one, and the comparison changes for 5 taps: level2/11's 5x5 layer had
2.0e-06 with F(3, 5) against 8.6e-07 direct and cuDNN's 6.5e-07, while the 3x3 layers had 8.4e-07 and 8.7e-07
with F(2, 3) against 9.6e-07 and 1.1e-06 direct (scripts/results/bench_builtin_winograd_h200_2026-12-04.json).
The tf32x3 GEMMs' rounding, amplified by AT's coefficients, makes most of F(3, 5)'s error: summing the GEMMs'
depth per leading tap barely changed it on the H200, nor did tf32x3 operands rounded to nearest TF32 parts
before the dot, which an emulation had put at half the error (9.7e-06 against 9.9e-06 for level2/11's whole
kernel on an H100). Emulated in fp32 on a CPU (one dim, 320 terms deep, median of 7 draws;
scripts/results/winograd_points_cpu_2026-12-06.json), F(3, 5) errs by 3.4 to 3.7 times the direct sum whatever
its points, and F(2, 5) by 3.0 to 3.1 times at symmetric points but 1.9 times at (0, 1, -1, 1/2, -2), the first
five of `_POINTS`. On an H100, level2/11's whole kernel erred, against fp64 and in times eager fp32's error:
F(3, 5) 1.87, the same with Kahan's sum of the GEMMs' K steps (emit_winograd) 1.38, F(2, 5) 1.23, F(2, 5) with
Kahan's sum 0.99, the direct tf32x3 convolution 0.81; in time 3.90, 4.50, 4.45 and 5.1 ms, the direct one 43 %
more than F(3, 5) (scripts/results/generator_trees_h100_2026-12-07.json, generator_trees_h100_2026-12-06_b.json).
F(2, 5) with Kahan's sum is the most accurate tile that stays faster than the direct convolution, so it is the
5-tap tile: level2/11 end to end 0.74 times torch.compile at 0.98 times eager's error, where F(3, 5) was 0.97
times at 2.2 (scripts/results/kernelbench_h100.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

# taps r -> outputs m per tile (see the module docstring): r = 5 does 6 products per 2 outputs instead of 10,
# r = 3 does 4 per 2 instead of 6
OUTPUTS_PER_TILE = {3: 2, 5: 2}
# the finite points, in the order tiles take them: F(2, 5) the first five, its most accurate set
_POINTS = (Fraction(0), Fraction(1), Fraction(-1), Fraction(1, 2), Fraction(-2), Fraction(2), Fraction(-1, 2))


@dataclass(frozen=True)
class WinogradTransform:
    outputs: int                               # m
    taps: int                                  # r
    at: tuple[tuple[Fraction, ...], ...]       # [m, alpha]: outputs from the products
    g: tuple[tuple[Fraction, ...], ...]        # [alpha, r]: transformed taps
    bt: tuple[tuple[Fraction, ...], ...]       # [alpha, alpha]: transformed inputs

    @property
    def alpha(self) -> int:
        """Inputs per tile, and products (GEMMs) per tile."""
        return self.outputs + self.taps - 1


def transform(outputs: int, taps: int, points: tuple[Fraction, ...] = _POINTS) -> WinogradTransform:
    """F(outputs, taps) from the first alpha - 1 of `points` and infinity (distinct points; the generator's
    are _POINTS, scripts/winograd_points.py compares others)."""
    alpha = outputs + taps - 1
    if not 2 <= alpha <= len(points) + 1:
        raise ValueError(f"F({outputs}, {taps}) needs {alpha - 1} finite points; {len(points)} are given")
    points = points[:alpha - 1]
    # the point at infinity: the leading coefficient, which reaches only the last output through the last tap
    at = [[p ** i for p in points] + [Fraction(int(i == outputs - 1))] for i in range(outputs)]
    g = [[p ** k / _product(p - q for q in points if q != p) for k in range(taps)] for p in points]
    g.append([Fraction(int(k == taps - 1)) for k in range(taps)])
    # y_i = sum_j at[i][j] (g @ taps)_j (bt @ d)_j for every d and taps: for each input l, the products
    # at[i][j] * g[j][k] weighted by bt[j][l] must pick out exactly the pairs with l = i + k
    pairs = [[at[i][j] * g[j][k] for j in range(alpha)] for i in range(outputs) for k in range(taps)]
    columns = [_solve(pairs, [Fraction(int(l == i + k)) for i in range(outputs) for k in range(taps)])
               for l in range(alpha)]
    bt = [[columns[l][j] for l in range(alpha)] for j in range(alpha)]
    return WinogradTransform(outputs, taps, _frozen(at), _frozen(g), _frozen(bt))


def _product(values) -> Fraction:
    result = Fraction(1)
    for v in values:
        result *= v
    return result


def _frozen(rows: list[list[Fraction]]) -> tuple[tuple[Fraction, ...], ...]:
    return tuple(tuple(row) for row in rows)


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    """x with rows @ x = rhs, by Gauss-Jordan elimination in exact fractions; rows has full column rank and
    the system is consistent (checked: the leftover equations must read 0 = 0)."""
    n = len(rows[0])
    system = [list(row) + [b] for row, b in zip(rows, rhs)]
    for col in range(n):
        pivot = next(i for i in range(col, len(system)) if system[i][col] != 0)
        system[col], system[pivot] = system[pivot], system[col]
        system[col] = [v / system[col][col] for v in system[col]]
        for i, row in enumerate(system):
            if i != col and row[col] != 0:
                system[i] = [a - row[col] * b for a, b in zip(row, system[col])]
    if any(v != 0 for row in system[n:] for v in row):
        raise ArithmeticError("the Winograd identity has no solution for these points")
    return [system[i][n] for i in range(n)]


def combination(coefficients: tuple[Fraction, ...], names: list[str], exact: bool = False) -> str:
    """Kernel code for sum(c * name), zero terms left out and +-1 written as a sign: "d1 - d3 + 0.5 * d5".
    `exact` writes c as integers, "w1 * 2 / 45", for fp64 values: a float literal would be rounded to fp32."""
    terms = []
    for c, name in zip(coefficients, names):
        if c == 0:
            continue
        if abs(c) == 1:
            term = name
        elif exact:
            term = f"{name} * {abs(c.numerator)}" + (f" / {c.denominator}" if c.denominator != 1 else "")
        elif Fraction(float(c)) == c:
            term = f"{float(abs(c))!r} * {name}"
        else:
            raise ValueError(f"{c} has no exact float literal: write it exact=True, in fp64")
        terms.append(("- " if c < 0 else "+ ") + term)
    if not terms:
        return "0.0"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]
