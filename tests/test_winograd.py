"""Winograd convolutions: the transform matrices are exact, only stride-1 convolutions of its form get the
variant, and the generated kernels match PyTorch (the cases of test_builtin_conv run every variant too)."""

from __future__ import annotations

import ast
import random
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from mkevolve.builtin.kernels import generate_kernel, variant_count
from mkevolve.builtin.kernels.emit_winograd import winograd_fits
from mkevolve.builtin.kernels.ir import Conv, Param
from mkevolve.builtin.kernels.winograd import OUTPUTS_PER_TILE, combination, transform

sys.path.insert(0, str(Path(__file__).parent))
from test_builtin_conv import CASES, TARGET, _check, _problem  # noqa: E402

WINOGRAD_CASES = [name for name in CASES if name.endswith("_winograd")]


HALF = Fraction(1, 2)


@pytest.mark.parametrize("outputs, taps, points", [
    (2, 3, None), (3, 5, None), (4, 3, None), (2, 5, None), (4, 5, None), (2, 7, None),
    (2, 5, (0, 1, -1, HALF, -2)), (3, 5, (0, 1, -1, HALF, -HALF, 2))])   # scripts/winograd_points.py's others
def test_transform_computes_the_correlation_exactly(outputs, taps, points):
    wt = transform(outputs, taps) if points is None else transform(outputs, taps, tuple(map(Fraction, points)))
    rng = random.Random(outputs * 10 + taps)
    for _ in range(3):
        d = [Fraction(rng.randint(-9, 9), rng.randint(1, 4)) for _ in range(wt.alpha)]
        g = [Fraction(rng.randint(-9, 9), rng.randint(1, 4)) for _ in range(taps)]
        products = [sum(row[k] * g[k] for k in range(taps)) * sum(b * x for b, x in zip(bt_row, d))
                    for row, bt_row in zip(wt.g, wt.bt)]
        y = [sum(a * p for a, p in zip(row, products)) for row in wt.at]
        assert y == [sum(d[i + k] * g[k] for k in range(taps)) for i in range(outputs)]


def test_the_kept_tiles_have_exact_float_transforms():
    """The input and output transforms are written as float literals: every coefficient must be dyadic."""
    for taps, outputs in OUTPUTS_PER_TILE.items():
        wt = transform(outputs, taps)
        for row in wt.bt + wt.at:
            assert all(Fraction(float(c)) == c for c in row)


def test_combination_writes_fractions_exactly_or_refuses():
    assert combination((Fraction(1), Fraction(0), Fraction(-5, 2)), ["a", "b", "c"]) == "a - 2.5 * c"
    assert combination((Fraction(-1, 3), Fraction(2, 45)), ["w0", "w1"], exact=True) == "-w0 * 1 / 3 + w1 * 2 / 45"
    with pytest.raises(ValueError, match="no exact float literal"):
        combination((Fraction(1, 3),), ["w0"])


def _conv(c_in=16, c_out=16, kernel=3, stride=1, dilation=1, groups=1, transposed=False, padding=1,
          configs=1) -> Conv:
    shape = (c_in, c_out // groups, kernel, kernel) if transposed else (c_out, c_in // groups, kernel, kernel)
    return Conv(shapes=((1, c_out, 8, 8),) * configs, w=Param(shapes=(shape,) * configs), transposed=transposed,
                stride=(stride, stride), padding=(padding, padding), dilation=(dilation, dilation),
                groups=(groups,) * configs, output_padding=(0, 0))


@pytest.mark.parametrize("conv, fits", [
    (_conv(), True),
    (_conv(kernel=5, transposed=True), True),
    (_conv(stride=2), False),                      # a strided tile would skip inputs
    (_conv(dilation=2), False),
    (_conv(groups=2, c_in=32, c_out=32), False),
    (_conv(c_in=8), False),                        # fewer channels than one tl.dot step
    (_conv(kernel=4), False),                      # no tile kept for 4 taps
    (_conv(configs=2), False),                     # one instance shape only
    (_conv(kernel=3, padding=3, transposed=True), False),   # the forward form would need negative padding
])
def test_only_stride_one_convolutions_of_its_form_take_winograd(conv, fits):
    assert winograd_fits(conv) is fits


def test_the_winograd_variant_is_offered_only_where_it_differs(tmp_path):
    eligible = _problem(tmp_path, "conv2d_16ch_k3_winograd")
    strided = _problem(tmp_path, "conv2d_16ch_strided")
    assert variant_count(eligible, TARGET) == variant_count(strided, TARGET) + 1
    descriptions = [generate_kernel(eligible, v, TARGET).description for v in range(variant_count(eligible, TARGET))]
    assert sum("Winograd F(2, 3)" in d for d in descriptions) == 1


def _assigned(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AugAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _loop_carried(function: ast.FunctionDef) -> set[str]:
    """Names assigned both before a loop and inside it."""
    before: set[str] = set()
    carried: set[str] = set()
    for statement in function.body:
        if isinstance(statement, ast.For):
            carried |= _assigned(statement) & before
        before |= _assigned(statement)
    return carried


@pytest.mark.parametrize("name", ["conv3d_16ch_k3_winograd", "convT2d_16ch_k5_winograd"])
def test_only_the_accumulator_is_carried_through_the_gemm_loop(name, tmp_path):
    """Triton keeps one type per name across a loop: a name that is a row vector before the K loop and a
    scalar inside it fails to compile on a GPU (the interpreter runs it), as `rest` once did."""
    path = _problem(tmp_path, name)
    source = _winograd_variant(path, "cuda").source
    gemm = next(node for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.FunctionDef) and node.name.endswith("_gemm"))
    # 5 taps: F(2, 5)'s output transform multiplies by up to 2, so the sum carries its rounding (`lost`) too
    assert _loop_carried(gemm) == ({"acc", "lost"} if "k5" in name else {"acc"})


@pytest.mark.parametrize("name", WINOGRAD_CASES)
def test_winograd_convolution_matches_pytorch(name, tmp_path):
    path = _problem(tmp_path, name)
    generated = _winograd_variant(path, TARGET)
    _check(path, generated.source, tmp_path, generated.variant)


def _winograd_variant(path: Path, target: str):
    generated = [generate_kernel(path, v, target) for v in range(variant_count(path, target))]
    return next(g for g in generated if g.description.startswith("Winograd"))


def test_the_point_comparison_emulates_each_tile_within_fp32_rounding():
    """scripts/winograd_points.py's fp32 emulation computes the correlation (its errors are fp32 rounding, not a
    wrong transform) and names every point set it compares."""
    from script_loader import load_script

    points = load_script("winograd_points")
    rows = points.errors(depth=16, taps=5, outputs=60, seeds=1)
    assert len(rows) == 1 + sum(len(sets) for sets in points.POINT_SETS.values())
    assert all(0 < row["median_max_error"] < 1e-5 for row in rows.values())
    assert rows["direct fp32"]["vs_direct"] == 1.0
