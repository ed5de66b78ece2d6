"""The elementwise ops the generator fuses, each as a Triton expression over fp32 operands."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class PointwiseOp:
    """`render(args, attrs)` gives a Triton expression. The @triton.jit functions it may call are in
    HELPER_SOURCES: module_source.assemble puts those a file's code calls into the file."""

    arity: int
    render: Callable[[list[str], dict[str, str]], str]
    boolean: bool = False                 # the result is a mask (comparisons), not fp32


def divide(a: str, b: str, normal_divisor: bool = False) -> str:
    """a / b in fp32, rounded as IEEE division is, as PyTorch divides. Triton's `/` on fp32 compiles to an
    approximation within 2 ulp (div.full.f32, seen in the PTX of Triton 3.9 for sm_90), and tl.sigmoid
    divides that way too: a mean's or a variance's count divided so is one error on every element it scales.
    The price, in the SASS of an elementwise x / s compiled for sm_90: 40 instructions per element against 22,
    where by an H200's peak rates a kernel moving 12 bytes per element has room for about 80 before memory
    stops being what it waits for. `b` must be fp32 (an integer kernel argument: `as_float`).

    Where the caller knows the divisor finite and normal (at least 2^-126 in magnitude) and the quotient finite
    (`normal_divisor`), `_div` divides: IEEE division keeps a slow path for subnormal operands as a subroutine
    call, and a call in a kernel that holds a convolution's accumulator makes ptxas spill around it (level2/87's
    128x64 outer-product convolution tile with Mish: 216 bytes of stack a thread, none with `_div`; Triton 3.6, sm_90).

    tl.rsqrt stays (rsqrt.approx.ftz.f32): an approximation as PyTorch's own group and layer norms use
    (rsqrtf), which a normalization's kernel computes for every element it scales, where a rounded square
    root and a rounded division would cost two slow instruction sequences each time. Even where 1 / sqrt runs
    once per row, rounding it twice (a relative error of 8.9e-08 at most against rsqrt's 1.24e-07, H100,
    scripts/probe_sigmoid_gpu.py) left level2/27's error where it was and its kernel 2.7 % slower."""
    return f"_div({a}, {b})" if normal_divisor else f"tl.div_rn({a}, {b})"


def maximum(a: str, b: str) -> str:
    """max(a, b) as PyTorch's max, relu and clamp take it: a NaN wins (tl.maximum alone returns the other)."""
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def minimum(a: str, b: str) -> str:
    """min(a, b), a NaN winning, as `maximum`."""
    return f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def as_float(name: str) -> str:
    """An integer kernel argument (or a Python int Triton made a constant) as fp32, for `divide`."""
    return f"({name} * 1.0)"


# tanh's odd Taylor series, x + c3 x^3 + ... + c15 x^15 (2^2n (2^2n - 1) B_2n / (2n)!); past 0.55 its truncation
# would exceed 1e-8 of tanh
_TANH_SERIES = (Fraction(-1, 3), Fraction(2, 15), Fraction(-17, 315), Fraction(62, 2835), Fraction(-1382, 155925),
                Fraction(21844, 6081075), Fraction(-929569, 638512875))
_TANH_SERIES_BELOW = 0.55


def _horner_lines(coefficients: tuple[Fraction, ...], var: str, out: str, indent: str) -> str:
    """Triton lines leaving c0 + var * (c1 + var * (...)) in `out`, one multiply-add a line."""
    lines = [f"{out} = {float(coefficients[-1])!r}"]
    lines += [f"{out} = {float(c)!r} + {var} * {out}" for c in reversed(coefficients[:-1])]
    return "".join(f"{indent}{line}\n" for line in lines)


# Helper functions emitted once into a generated file when an op needs them. tanh is written with one exp
# because the math library's tanh is spelled differently across Triton versions, and the interpreter has none.
#
# Their rounding, emulated in fp32 on a CPU against fp64 (4M points of N(0, 3^2); numpy's fp32 exp is within
# 2.3 ulp, about as tl.exp on a GPU): tanh as (1 - e) / (1 + e) lost all relative accuracy near 0 (1 - e cancels;
# tanh(1e-30) came out 0) and erred by up to 3.9 ulp elsewhere, where PyTorch's tanh erred by 0.51; written as
# below, 1.8 ulp, the rest from exp. Mish, x tanh(softplus x), erred by 1.26e-06 composed of those and log(1 + t)
# (which drops t's low bits where t = exp(-|x|) is small), against PyTorch's 6.84e-07; written as below, 6.85e-07
# (tests/test_pointwise_accuracy.py). _mish also keeps a convolution's epilogue small: composed, the extra
# temporaries made level2/87's convolution kernel spill registers.
HELPER_SOURCES: dict[str, str] = {
    "_maximum": f'''@triton.jit
def _maximum(a, b):
    return {maximum("a", "b")}
''',
    "_minimum": f'''@triton.jit
def _minimum(a, b):
    return {minimum("a", "b")}
''',
    # amax / amin of a tile along `axis`, a NaN in it the result, as torch.amax gives (tl.max skips NaNs)
    "_amax": '''@triton.jit
def _amax(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _maximum)
''',
    "_amin": '''@triton.jit
def _amin(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _minimum)
''',
    "_multiply": '''@triton.jit
def _multiply(a, b):
    return a * b
''',
    "_prod": '''@triton.jit
def _prod(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _multiply)
''',
    "_div": '''@triton.jit
def _div(n, d):
    # n / d for d finite and normal and a finite quotient, within 1 ulp and nearly always IEEE's: Triton's
    # reciprocal (within 2 ulp), then one Newton step on the quotient, whose residual n - q d an fma computes
    # exactly. (An infinite q or d would make the step NaN; guarding it cost level2/87's tile 24 bytes of
    # stack, so callers keep to finite operands instead.)
    r = 1.0 / d
    q = n * r
    return tl.fma(tl.fma(-q, d, n), r, q)
''',
    "_welford": '''@triton.jit
def _welford(mean_a, sq_a, n_a, mean_b, sq_b, n_b):
    # two lanes' (mean, sum of squared deviations, count) as one (Chan et al.): the deviations are summed
    # about each lane's own mean, so no large sum of squares cancels against a squared sum
    n = n_a + n_b
    w = tl.where(n > 0, _div(n_b, tl.maximum(n, 1.0)), 0.0)
    delta = mean_b - mean_a
    return mean_a + delta * w, sq_a + sq_b + delta * delta * n_a * w, n
''',
    "_sigmoid": f'''@triton.jit
def _sigmoid(x):
    # t = e / (1 + e) with e = exp(-|x|) <= 1, and sigmoid is t below 0 and 1 - t above: the divisor stays in
    # [1, 2] (no overflow), and near 1 only the last subtraction rounds. 1 / (1 + exp(-x)), PyTorch's formula,
    # rounds 1 + e first: above x = 3 it erred by 1.5 ulp of the result, this by 0.7 (H100 and CPU alike), and
    # level2/91's output by 9.3e-08 where eager's erred by 9.6e-08 (1.0e-07 before). tanh's series near 0 would
    # cut the error there too, but made level2/91 9 % slower (scripts/probe_sigmoid_gpu.py)
    e = tl.exp(-tl.abs(x))
    t = {divide("e", "1.0 + e", normal_divisor=True)}
    return tl.where(x < 0, t, 1.0 - t)
''',
    "_tanh": f'''@triton.jit
def _tanh(x):
    # tanh(a) = 1 - 2e / (1 + e) with e = exp(-2a), a = |x|: no overflow, one rounding near 1 for large a;
    # below {_TANH_SERIES_BELOW}, where 1 + e rounds away e's low bits, tanh's Taylor series
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    t = 1.0 - {divide("2.0 * e", "1.0 + e", normal_divisor=True)}
    s = a * a
{_horner_lines(_TANH_SERIES, "s", "p", "    ")}    series = a + a * s * p
    t = tl.where(a < {_TANH_SERIES_BELOW}, series, t)
    return tl.where(x < 0, -t, t)
''',
    "_log1p": f'''@triton.jit
def _log1p(t):
    # log(1 + t) with t's low bits kept: u = 1 + t rounds, and log(u) * t / (u - 1) corrects for that rounding
    u = 1.0 + t
    corrected = tl.log(u) * {divide("t", "u - 1.0")}
    return tl.where(u == 1.0, t, tl.where(u == float("inf"), u, corrected))
''',
    "_mish": f'''@triton.jit
def _mish(x):
    # x tanh(softplus x) = x n / (n + 2) with n = e (e + 2), e = exp(x), as tanh(log(1 + e)) = ((1 + e)^2 - 1) /
    # ((1 + e)^2 + 1): one exp and one division, nothing cancels; past 20, tanh(softplus x) is 1 in fp32.
    # n is an fma with a zero addend because a GPU would otherwise fuse n + 2 into fma(e, e + 2, 2), which
    # disagrees with the rounded n by up to half its ulp: n / (n + 2) then erred by an ulp of 1, and Mish by
    # 1.4 times PyTorch's error (H100, scripts/probe_mish_gpu.py). Written as 1 - 2 / (n + 2), it made
    # level2/87's convolution spill 40 bytes a thread.
    e = tl.exp(tl.minimum(x, 20.0))
    n = tl.fma(e, e + 2.0, 0.0)
    return tl.where(x > 20.0, x, x * {divide("n", "n + 2.0", normal_divisor=True)})
''',
    "_round": '''@triton.jit
def _round(x):
    # torch.round: to the nearest whole number, halves to the even one. x - floor(x) is exact but for x in
    # (-0.5, 0), where it rounds up, to 1.0 at most, and the answer (0) stays the same; from 2**23 on x is whole.
    r = tl.floor(x)
    d = x - r
    odd = r - 2.0 * tl.floor(r * 0.5)
    rounded = tl.where((d > 0.5) | ((d == 0.5) & (odd == 1.0)), r + 1.0, r)
    return tl.where(rounded == 0.0, x * 0.0, rounded)  # a zero keeps x's sign: round(-0.3) is -0.0
''',
    "_hypot": f'''@triton.jit
def _hypot(a, b):
    # sqrt(a^2 + b^2) without overflow or underflow: the larger magnitude times sqrt(1 + r^2), r <= 1; an
    # infinity wins over a NaN, as in C's hypot, which PyTorch calls
    big = {maximum("tl.abs(a)", "tl.abs(b)")}
    small = {minimum("tl.abs(a)", "tl.abs(b)")}
    ratio = tl.div_rn(small, big)
    h = tl.where(big == 0.0, 0.0, big * tl.sqrt_rn(1.0 + ratio * ratio))
    return tl.where((tl.abs(a) == float("inf")) | (tl.abs(b) == float("inf")), float("inf"), h)
''',
    "_remainder": '''@triton.jit
def _remainder(a, b):
    r = a % b
    return tl.where((r != 0.0) & ((r < 0.0) != (b < 0.0)), r + b, r)
''',
    "_softplus": f'''@triton.jit
def _softplus(x, beta, threshold):
    # log(1 + exp(z)) = max(z, 0) + log1p(exp(-|z|)), linear above the threshold as in torch
    z = x * beta
    soft = {divide("tl.maximum(z, 0.0) + _log1p(tl.exp(-tl.abs(z)))", "beta")}
    return tl.where(z > threshold, x, soft)
''',
}

_SQRT1_2 = "0.7071067811865476"
_SQRT_2_OVER_PI = "0.7978845608028654"


def _pow_const(a: list[str], attrs: dict[str, str]) -> str:
    """x ** c for a literal c: products for small integers, sqrt for 0.5, exp/log otherwise."""
    x, c = a[0], float(attrs["exponent"])
    if c == int(c) and abs(c) <= 4:
        n = int(abs(c))
        body = " * ".join([f"{x}"] * n) if n else "1.0"
        return divide("1.0", f"({body})") if c < 0 else f"({body})"
    if c == 0.5:
        return f"tl.sqrt_rn({x})"
    if c == -0.5:
        return f"tl.rsqrt({x})"
    if c == int(c):
        magnitude = f"tl.exp({c!r} * tl.log(tl.abs({x})))"
        return f"tl.where({x} < 0, -{magnitude}, {magnitude})" if int(c) % 2 else magnitude
    return f"tl.exp({c!r} * tl.log({x}))"


def _unary(template: str) -> PointwiseOp:
    return PointwiseOp(1, lambda a, attrs: template.format(x=a[0], **attrs))


def _binary(template: str, boolean: bool = False) -> PointwiseOp:
    return PointwiseOp(2, lambda a, attrs: template.format(a=a[0], b=a[1]), boolean=boolean)


OPS: dict[str, PointwiseOp] = {
    "identity": _unary("{x}"),
    # torch.zeros / ones / full: its one argument is the fill value, a number; no tensor is read
    "full": _unary("{x}"),
    "neg": _unary("(-{x})"),
    "abs": _unary("tl.abs({x})"),
    "exp": _unary("tl.exp({x})"),
    "exp2": _unary("tl.exp2({x})"),
    "expm1": _unary("(tl.exp({x}) - 1.0)"),
    "log": _unary("tl.log({x})"),
    "log2": _unary("tl.log2({x})"),
    "log1p": _unary("_log1p({x})"),
    "sqrt": _unary("tl.sqrt_rn({x})"),
    "rsqrt": _unary("tl.rsqrt({x})"),
    "reciprocal": _unary(divide("1.0", "{x}")),
    "square": _unary("({x} * {x})"),
    "sin": _unary("tl.sin({x})"),
    "cos": _unary("tl.cos({x})"),
    "erf": _unary("tl.erf({x})"),
    "floor": _unary("tl.floor({x})"),
    "ceil": _unary("tl.ceil({x})"),
    "trunc": _unary("tl.where({x} < 0.0, tl.ceil({x}), tl.floor({x}))"),
    "frac": _unary("({x} - tl.where({x} < 0.0, tl.ceil({x}), tl.floor({x})))"),
    "round": _unary("_round({x})"),
    "sign": _unary("tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))"),
    "relu": _unary(maximum("{x}", "0.0")),
    "relu6": _unary(minimum(maximum("{x}", "0.0"), "6.0")),
    "sigmoid": _unary("_sigmoid({x})"),
    "tanh": _unary("_tanh({x})"),
    "silu": _unary("({x} * _sigmoid({x}))"),
    "gelu": _unary("(0.5 * {x} * (1.0 + tl.erf({x} * " + _SQRT1_2 + ")))"),
    "gelu_tanh": _unary("(0.5 * {x} * (1.0 + _tanh(" + _SQRT_2_OVER_PI + " * ({x} + 0.044715 * {x} * {x} * {x}))))"),
    "mish": _unary("_mish({x})"),
    "softplus": _unary("_softplus({x}, {beta}, {threshold})"),
    "elu": _unary("tl.where({x} > 0, {x}, {alpha} * (tl.exp({x}) - 1.0))"),
    "selu": _unary("1.0507009873554805 * tl.where({x} > 0, {x}, 1.6732632423543772 * (tl.exp({x}) - 1.0))"),
    "celu": _unary("(" + maximum("{x}", "0.0") + " + "
                   + minimum("{alpha} * (tl.exp(" + divide("{x}", as_float("{alpha}")) + ") - 1.0)", "0.0") + ")"),
    "leaky_relu": _unary("tl.where({x} > 0, {x}, {x} * {negative_slope})"),
    "hardtanh": _unary(minimum(maximum("{x}", "{low}"), "{high}")),
    "clamp_min": _unary(maximum("{x}", "{low}")),
    "clamp_max": _unary(minimum("{x}", "{high}")),
    # x relu6(x + 3) / 6 as x (relu6(x + 3) / 6): the same two roundings, and a finite quotient for `_div`
    "hardswish": _unary("({x} * " + divide(minimum(maximum("{x} + 3.0", "0.0"), "6.0"), "6.0", normal_divisor=True)
                        + ")"),
    "hardsigmoid": _unary(divide(minimum(maximum("{x} + 3.0", "0.0"), "6.0"), "6.0", normal_divisor=True)),
    "logsigmoid": _unary("(tl.minimum({x}, 0.0) - _log1p(tl.exp(-tl.abs({x}))))"),
    "softsign": _unary(divide("{x}", "1.0 + tl.abs({x})", normal_divisor=True)),    # x infinite: NaN, as in PyTorch
    "tanhshrink": _unary("({x} - _tanh({x}))"),
    # a NaN passes through these, as in PyTorch: every comparison with it is false
    "threshold": _unary("tl.where(({x} > {threshold}) | ({x} != {x}), {x}, {value})"),
    "softshrink": _unary("tl.where({x} > {lambd}, {x} - {lambd}, tl.where({x} < -{lambd}, {x} + {lambd}, "
                         "tl.where({x} != {x}, {x}, 0.0)))"),
    "hardshrink": _unary("tl.where(({x} > {lambd}) | ({x} < -{lambd}) | ({x} != {x}), {x}, 0.0)"),
    "pow_const": PointwiseOp(1, _pow_const),
    "add": _binary("({a} + {b})"),
    "sub": _binary("({a} - {b})"),
    "mul": _binary("({a} * {b})"),
    # either side may be an integer attribute (level2/71's divisor = 2), passed as an int32 kernel argument
    "div": _binary(divide(as_float("{a}"), as_float("{b}"))),
    "hypot": _binary("_hypot({a}, {b})"),
    # torch.fmod: the remainder of a / b truncated, with a's sign, as C's fmod. Triton's % on floats is that; on
    # sm_90 it compiles to an IEEE division, a truncation and one fma (not exact where a / b rounds across an
    # integer, which PyTorch's fmodf is)
    "fmod": _binary("({a} % {b})"),
    # torch.remainder and Python's %: a - b floor(a / b), with b's sign; fmod moved by b where the signs differ
    "remainder": _binary("_remainder({a}, {b})"),
    "nan_to_num": _unary("tl.where({x} != {x}, {nan}, tl.where({x} == float(\"inf\"), {posinf}, "
                         "tl.where({x} == -float(\"inf\"), {neginf}, {x})))"),
    "maximum": _binary(maximum("{a}", "{b}")),
    "minimum": _binary(minimum("{a}", "{b}")),
    "fmax": _binary("tl.maximum({a}, {b})"),          # torch.fmax: a NaN loses, as tl.maximum's default
    "fmin": _binary("tl.minimum({a}, {b})"),
    "gt": _binary("({a} > {b})", boolean=True),
    "lt": _binary("({a} < {b})", boolean=True),
    "ge": _binary("({a} >= {b})", boolean=True),
    "le": _binary("({a} <= {b})", boolean=True),
    "eq": _binary("({a} == {b})", boolean=True),
    "ne": _binary("({a} != {b})", boolean=True),
    "logical_not": PointwiseOp(1, lambda a, attrs: f"({a[0]} == 0)", boolean=True),
    "isnan": PointwiseOp(1, lambda a, attrs: f"({a[0]} != {a[0]})", boolean=True),
    "isinf": PointwiseOp(1, lambda a, attrs: f"(tl.abs({a[0]}) == float(\"inf\"))", boolean=True),
    "isfinite": PointwiseOp(1, lambda a, attrs: f"(tl.abs({a[0]}) < float(\"inf\"))", boolean=True),
    "logical_and": _binary("({a} & {b})", boolean=True),
    "logical_or": _binary("({a} | {b})", boolean=True),
    "where": PointwiseOp(3, lambda a, attrs: f"tl.where({a[0]}, {a[1]}, {a[2]})"),
}


def literal(value: float | int | bool) -> str:
    """A Python number as Triton source: fp32 constants for numbers, inf and nan spelled out."""
    if isinstance(value, bool):
        return "True" if value else "False"
    value = float(value)
    if value != value:
        return 'float("nan")'
    if value in (float("inf"), float("-inf")):
        return 'float("inf")' if value > 0 else '(-float("inf"))'
    return repr(value)
