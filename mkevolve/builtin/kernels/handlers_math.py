"""Lowering of elementwise ops, reductions, scans (cumsum, cumprod), softmax and the normalisation layers into the
tensor program."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .builders import Builder, normalize_dims
from .calls import Call, Handler, as_param, module_param
from .errors import UnsupportedInMode, UnsupportedSubproblem
from .ir import (MAX_SORT_LENGTH, ArgReduce, Assign, BatchStats, IntOp, Param, Pick, Scalar, Scan, Sort, Value,
                 is_integer)

# --- elementwise ------------------------------------------------------------------------------------

# torch name -> op in pointwise_ops, for ops whose only argument is the tensor
_UNARY = {name: name for name in (
    "neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "square", "sin",
    "cos", "erf", "floor", "ceil", "trunc", "frac", "sign", "relu", "relu6", "sigmoid", "tanh", "silu", "mish", "selu",
    "hardswish", "hardsigmoid", "logsigmoid", "softsign", "tanhshrink")}
_UNARY.update({"negative": "neg", "absolute": "abs", "special_erf": "erf", "special_expit": "sigmoid",
               "log_sigmoid": "logsigmoid", "fix": "trunc"})

_UNARY_MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu",
                  nn.Mish: "mish", nn.SELU: "selu", nn.Hardswish: "hardswish", nn.Hardsigmoid: "hardsigmoid",
                  nn.LogSigmoid: "logsigmoid", nn.Softsign: "softsign", nn.Tanhshrink: "tanhshrink"}


def _unary(op: str) -> Handler:
    return lambda b, call: b.pw(op, call.arg(0, "input"))


def _is_shape_math(*values) -> bool:
    return not any(isinstance(v, Value) for v in values)


def _int_op(op: str, a, b):
    """Shape arithmetic in the forward: folded when both sides are plain ints."""
    if isinstance(a, int) and isinstance(b, int) and type(a) is int and type(b) is int:
        return {"add": a + b, "sub": a - b, "mul": a * b, "floordiv": a // b, "truediv": a / b, "pow": a ** b}[op]
    return IntOp(op, a, b)


def _arith(op: str, reverse: bool = False) -> Handler:
    def handler(b: Builder, call: Call):
        x, y = call.arg(0, "input"), call.arg(1, "other")
        if reverse:
            x, y = y, x
        if _is_shape_math(x, y):
            return _int_op({"add": "add", "sub": "sub", "mul": "mul", "div": "truediv"}[op], x, y)
        alpha = call.kwargs.get("alpha", 1)
        if op in ("add", "sub") and alpha != 1:
            y = b.pw("mul", y, alpha)
        if op == "div":
            return _divide(b, x, y, call.kwargs.get("rounding_mode"))
        return b.pw(op, x, y)
    return handler


def _divide(b: Builder, x, y, rounding_mode):
    quotient = b.pw("div", x, y)
    if rounding_mode is None:
        return quotient
    if rounding_mode == "floor":
        return b.pw("floor", quotient)
    raise UnsupportedSubproblem(f"division with rounding_mode={rounding_mode!r}")


def _floordiv(b: Builder, call: Call):
    x, y = call.arg(0, "input"), call.arg(1, "other")
    if _is_shape_math(x, y):
        return _int_op("floordiv", x, y)
    return b.pw("floor", b.pw("div", x, y))


def _pow(b: Builder, call: Call):
    x, y = call.arg(0, "input"), call.arg(1, "exponent")
    if _is_shape_math(x, y):
        return _int_op("pow", x, y)          # `q.size(-1) ** -0.5`
    if isinstance(x, Value) and not isinstance(y, Value):
        return b.pw("pow_const", x, exponent=Scalar(float(b.const(y, "pow exponent"))))
    if isinstance(y, Value) and not isinstance(x, Value):
        base = float(b.const(x, "pow base"))
        if base <= 0:
            raise UnsupportedSubproblem(f"pow with base {base} and a tensor exponent")
        return b.pw("exp", b.pw("mul", y, math.log(base)))
    raise UnsupportedSubproblem("pow with a tensor base and a tensor exponent")


def _filled(fill) -> Handler:
    """torch.zeros / ones / full and their _like and new_ forms (fill None: full's own fill_value argument), of
    float32: a value every element of which is that number (Builder.full)."""
    def handler(b: Builder, call: Call):
        if call.shapes is None:
            raise UnsupportedSubproblem(f"{call.name} of a shape the trace did not record")
        like = call.arg(0, "input", None) if call.name.endswith("_like") or call.method else None
        dtype = call.kwargs.get("dtype")
        if dtype is None and isinstance(like, Value) and is_integer(like):
            dtype = "an integer dtype"
        if dtype not in (None, torch.float32):
            raise UnsupportedSubproblem(f"{call.name} of {dtype}: only float32 results are written")
        value = fill if fill is not None else call.kwargs.get("fill_value", call.args[-1] if call.args else None)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UnsupportedSubproblem(f"{call.name} with a fill value that is not a number")
        return b.full(call.shapes, float(value))
    return handler


def _remainder(op: str) -> Handler:
    """torch.fmod ("fmod") and torch.remainder / the % operator ("remainder") of tensors; % of shape ints stays
    Python arithmetic."""
    def handler(b: Builder, call: Call):
        x, y = call.arg(0, "input"), call.arg(1, "other")
        if _is_shape_math(x, y):
            if type(x) is int and type(y) is int:
                return x % y
            raise UnsupportedSubproblem("% of shape values")
        return b.pw(op, x, y)
    return handler


def _diff(b: Builder, call: Call):
    """torch.diff: x[1:] - x[:-1] along `dim`, `n` times (prepend and append are refused)."""
    x, n = call.arg(0, "input"), int(b.const(call.arg(1, "n", 1), "diff n"))
    dim = int(b.const(call.arg(2, "dim", -1), "diff dim")) % max(x.rank, 1)
    if call.arg(3, "prepend", None) is not None or call.arg(4, "append", None) is not None:
        raise UnsupportedSubproblem("torch.diff with prepend or append")
    for _ in range(n):
        shapes = tuple(s[:dim] + (max(s[dim] - 1, 0),) + s[dim + 1:] for s in x.shapes)
        length = IntOp("sub", b.size(x, dim), 1)
        later = b.view(x, "narrow", (dim, 1, length), shapes)
        x = b.pw("sub", later, b.view(x, "narrow", (dim, 0, length), shapes))
    return x


def _cross(b: Builder, call: Call):
    """torch.cross / torch.linalg.cross of 3-vectors along `dim` (torch.cross without one: the first dim of
    size 3), as each component's difference of two products."""
    x, y = call.arg(0, "input"), call.arg(1, "other")
    if not (isinstance(x, Value) and isinstance(y, Value) and x.rank == y.rank):
        raise UnsupportedSubproblem("cross product of tensors of different ranks")
    dim = call.arg(2, "dim", None)
    if dim is None:
        dim = -1 if call.name == "linalg_cross" else next((d for d, s in enumerate(call.shapes[0]) if s == 3), None)
    dim = int(b.const(dim, "cross dim")) % max(x.rank, 1)
    if any(s[dim] != 3 for s in call.shapes):
        raise UnsupportedSubproblem("cross product along a dim whose size is not 3")

    def part(v: Value, i: int) -> Value:
        return b.view(v, "narrow", (dim, i, 1), tuple(s[:dim] + (1,) + s[dim + 1:] for s in v.shapes))

    def component(i: int, j: int) -> Value:      # x_i y_j - x_j y_i
        return b.pw("sub", b.pw("mul", part(x, i), part(y, j)), b.pw("mul", part(x, j), part(y, i)))

    return b.concat([component(1, 2), component(2, 0), component(0, 1)], dim)


def _rsub(b: Builder, call: Call):
    x, y = call.arg(0, "input"), call.arg(1, "other")
    alpha = call.kwargs.get("alpha", 1)
    return b.pw("sub", y, b.pw("mul", x, alpha) if alpha != 1 else x)


def _compare(op: str) -> Handler:
    return lambda b, call: b.pw(op, call.arg(0, "input"), call.arg(1, "other"))


def _logaddexp(b: Builder, call: Call):
    """log(exp(a) + exp(b)) as max + log1p(exp(-|a - b|)), which never overflows; equal inputs (infinities
    too, whose difference is nan) give a + log 2."""
    x, y = call.arg(0, "input"), call.arg(1, "other")
    spread = b.pw("log1p", b.pw("exp", b.pw("neg", b.pw("abs", b.pw("sub", x, y)))))
    return b.pw("where", b.pw("eq", x, y), b.pw("add", x, math.log(2.0)),
                b.pw("add", b.pw("maximum", x, y), spread))


def _where(b: Builder, call: Call):
    return b.pw("where", call.arg(0, "condition"), call.arg(1, "input"), call.arg(2, "other"))


def _masked_fill(b: Builder, call: Call):
    return b.pw("where", call.arg(1, "mask"), call.arg(2, "value"), call.arg(0, "input"))


def _clamp(b: Builder, call: Call):
    x = call.arg(0, "input")
    low, high = call.arg(1, "min", None), call.arg(2, "max", None)
    if low is None and high is None:
        raise UnsupportedSubproblem("clamp without min or max")
    if low is not None:
        x = b.pw("maximum", x, low) if isinstance(low, Value) else b.pw("clamp_min", x, low=low)
    if high is not None:
        x = b.pw("minimum", x, high) if isinstance(high, Value) else b.pw("clamp_max", x, high=high)
    return x


def _clamp_min(b: Builder, call: Call):
    x, low = call.arg(0, "input"), call.arg(1, "min")
    return b.pw("maximum", x, low) if isinstance(low, Value) else b.pw("clamp_min", x, low=low)


def _clamp_max(b: Builder, call: Call):
    x, high = call.arg(0, "input"), call.arg(1, "max")
    return b.pw("minimum", x, high) if isinstance(high, Value) else b.pw("clamp_max", x, high=high)


def _hardtanh(b: Builder, call: Call):
    return b.pw("hardtanh", call.arg(0, "input"), low=call.arg(1, "min_val", -1.0),
                high=call.arg(2, "max_val", 1.0))


def _gelu(b: Builder, call: Call):
    approximate = b.const(call.kwargs.get("approximate", call.arg(1, "approximate", "none")), "gelu approximate")
    return b.pw("gelu_tanh" if approximate == "tanh" else "gelu", call.arg(0, "input"))


def _with_attrs(op: str, **defaults) -> Handler:
    """An op with numeric options after the tensor, in the order given (torch's functional signature).

    The option names must be torch's keyword names: a keyword the handler does not know is an error, not
    ignored, since ignoring one (leaky_relu's `negative_slope`) silently computes with the default."""
    names = list(defaults)
    known = {"input", "self", "inplace", *names}

    def handler(b: Builder, call: Call):
        unknown = sorted(set(call.kwargs) - known)
        if unknown:
            raise UnsupportedSubproblem(f"{call.name}: unsupported keyword argument(s) {', '.join(unknown)}")
        attrs = {name: call.arg(1 + i, name, defaults[name]) for i, name in enumerate(names)}
        return b.pw(op, call.arg(0, "input"), **attrs)
    return handler


def _identity(b: Builder, call: Call):
    """Copies, and `.to`/`.float`: the caller checks the dtype stays float32."""
    return call.arg(0, "input")


def _tensor_of_a_number(b: Builder, call: Call):
    """`torch.tensor(0.0, device=x.device)` in a forward: a 0-d tensor of one number, which takes part in
    elementwise ops as the number itself (a 0-d operand does not change a float result's dtype)."""
    data = call.arg(0, "data")
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise UnsupportedSubproblem("torch.tensor of anything but one number, in forward")
    return b.scalar(data)


def _dropout(b: Builder, call: Call):
    """The identity where dropout is off (eval mode, or p = 0). Where it is on, the reference draws its mask
    from torch's random stream, which a generated kernel cannot reproduce, so that mode gets no kernel."""
    if call.modules:
        p, active = call.module_attr("p"), call.module.training
    else:
        p, active = call.arg(1, "p", 0.5), call.arg(2, "training", call.kwargs.get("train", True))
    if active and not (isinstance(p, (int, float)) and p == 0):
        raise UnsupportedInMode(f"{call.name} with p={p} in training mode draws its mask from torch's random "
                                "stream, which a generated kernel cannot reproduce; compare in eval mode (--eval)")
    return call.arg(0, "input")


def _maximum_or_reduce(kind: str, op: str) -> Handler:
    """torch.max/min: with a tensor it is elementwise, with a dim it reduces (values, indices), else reduces all."""
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        other = call.arg(1, "dim", None)
        if isinstance(other, (Value, Scalar)):
            return b.pw(op, x, other)
        if other is None:
            return b.squeeze(b.reduce(kind, x, None), tuple(range(x.rank)))
        dim, keepdim = b.const(other, "dim"), bool(b.const(call.arg(2, "keepdim", False), "keepdim"))
        return ValuesIndices(b.reduce_keep(kind, x, dim, keepdim),
                             lambda: arg_reduce(b, x, kind.removeprefix("a"), dim, keepdim))
    return handler


@dataclass
class ValuesIndices:
    """The (values, indices) pair torch.max/min return with a dim; the indices kernel is built only where the
    forward takes them."""

    values: Value
    indices: Callable[[], Value] | None = None

    def item(self, index):
        if index in (0, "values"):
            return self.values
        if index in (1, "indices") and self.indices is not None:
            return self.indices()
        raise UnsupportedSubproblem(f"output {index!r} of this (values, indices) pair is not supported")


def arg_reduce(b: Builder, x: Value, kind: str, dim: int | None, keepdim: bool) -> Value:
    """argmax ("max") / argmin ("min") along `dim`, int64; dim None: of the flattened tensor, a 0-d result."""
    if x.rank == 0 or is_integer(x):
        raise UnsupportedSubproblem(f"arg{kind} of a 0-d or integer tensor")
    if dim is None:
        if keepdim:
            raise UnsupportedSubproblem(f"arg{kind} with keepdim=True and no dim")
        return b.squeeze(arg_reduce(b, b.flatten_all(x), kind, 0, keepdim=True), (0,))
    dim = dim % x.rank
    shapes = tuple(s[:dim] + (1,) + s[dim + 1:] for s in x.shapes)
    out = b.program.add(ArgReduce(shapes, x=x, dim=dim, kind=kind))
    return out if keepdim else b.squeeze(out, (dim,))


def _arg_reduce(kind: str) -> Handler:
    def handler(b: Builder, call: Call):
        dim = b.const(call.arg(1, "dim", None), "dim")
        return arg_reduce(b, call.arg(0, "input"), kind, dim, bool(b.const(call.arg(2, "keepdim", False), "keepdim")))
    return handler


def sort_along(b: Builder, x: Value, dim: int, descending: bool, k: int | None, indices: bool,
               pick: Pick | None = None, kth: int = 1) -> Value:
    """The first `k` (None: all) of each row along `dim`, sorted; their int64 positions where `indices`. With
    `pick`, the one position Pick names (k = 1)."""
    if x.rank == 0 or is_integer(x):
        raise UnsupportedSubproblem("sort, topk, kthvalue or median of a 0-d or integer tensor")
    dim = dim % x.rank
    longest = max(s[dim] for s in x.shapes)
    if longest > MAX_SORT_LENGTH:
        raise UnsupportedSubproblem(f"sort, topk, kthvalue or median along a dim of {longest} elements (a row "
                                    f"must fit one program: at most {MAX_SORT_LENGTH})")
    shapes = tuple(s[:dim] + (s[dim] if k is None else k,) + s[dim + 1:] for s in x.shapes)
    return b.program.add(Sort(shapes, x=x, dim=dim, k=k, descending=descending, indices=indices, pick=pick,
                              kth=kth))


def _picked_pair(b: Builder, x: Value, dim: int | None, keepdim: bool, pick: Pick, kth: int = 1):
    """kthvalue's and the medians' (values, indices) along `dim`; with no dim (a median of every element), the
    0-d value alone, as PyTorch returns it."""
    if dim is None:
        return b.squeeze(sort_along(b, b.flatten_all(x), 0, False, 1, False, pick, kth), (0,))

    def picked(indices: bool) -> Value:
        out = sort_along(b, x, dim, False, 1, indices, pick, kth)
        return out if keepdim else b.squeeze(out, (dim,))
    return ValuesIndices(picked(False), lambda: picked(True))


def _kthvalue(b: Builder, call: Call):
    """torch.kthvalue: the k-th smallest along `dim`. PyTorch picks among equal values by its own order, so
    a kernel's position for a tie may differ from it (the verifier then rejects it); with NaNs, as a sort."""
    k, dim = int(b.const(call.arg(1, "k"), "k")), b.const(call.arg(2, "dim", -1), "dim")
    return _picked_pair(b, call.arg(0, "input"), dim, bool(b.const(call.arg(3, "keepdim", False), "keepdim")),
                        Pick.KTH, k)


def _median(pick: Pick) -> Handler:
    """torch.median and nanmedian: the lower of two middle values, as values and positions with a dim."""
    def handler(b: Builder, call: Call):
        dim = b.const(call.arg(1, "dim", None), "dim")
        return _picked_pair(b, call.arg(0, "input"), dim, bool(b.const(call.arg(2, "keepdim", False), "keepdim")),
                            pick)
    return handler


def _sorted_pair(b: Builder, x: Value, dim: int, descending: bool, k: int | None) -> ValuesIndices:
    return ValuesIndices(sort_along(b, x, dim, descending, k, False),
                         lambda: sort_along(b, x, dim, descending, k, True))


def _sort_args(b: Builder, call: Call) -> tuple[Value, int, bool]:
    """torch.sort's and argsort's (input, dim, descending). `stable` changes nothing here: equal values always
    keep their order."""
    return (call.arg(0, "input"), b.const(call.arg(1, "dim", -1), "dim"),
            bool(b.const(call.arg(2, "descending", False), "descending")))


def _sort(b: Builder, call: Call):
    x, dim, descending = _sort_args(b, call)
    return _sorted_pair(b, x, dim, descending, None)


def _argsort(b: Builder, call: Call):
    x, dim, descending = _sort_args(b, call)
    return sort_along(b, x, dim, descending, None, True)


def _msort(b: Builder, call: Call):
    return sort_along(b, call.arg(0, "input"), 0, False, None, False)


def _topk(b: Builder, call: Call):
    """torch.topk: the k largest (or smallest) in order. Unsorted, PyTorch's order is its own: refused."""
    if not b.const(call.arg(4, "sorted", True), "sorted"):
        raise UnsupportedSubproblem("topk with sorted=False returns its k elements in an order PyTorch does not "
                                    "specify; ask for sorted=True")
    k = int(b.const(call.arg(1, "k"), "k"))
    largest = bool(b.const(call.arg(3, "largest", True), "largest"))
    return _sorted_pair(b, call.arg(0, "input"), b.const(call.arg(2, "dim", -1), "dim"), largest, k)


# --- reductions -------------------------------------------------------------------------------------

def _reduction(kind: str, dim_default=None) -> Handler:
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        dims = b.const(call.arg(1, "dim", dim_default), "reduction dim")
        if dims == () or dims == []:
            dims = None
        keepdim = bool(b.const(call.arg(2, "keepdim", False), "keepdim"))
        return b.reduce_keep(kind, x, dims, keepdim)
    return handler


def _variance(take_sqrt: bool, with_mean: bool = False) -> Handler:
    """torch.var / torch.std, and torch.var_mean / torch.std_mean (`with_mean`: the pair (var or std, mean))."""
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        dims = b.const(call.arg(1, "dim", None), "reduction dim")
        second = call.arg(2, "unbiased", None)
        correction = call.kwargs.get("correction")
        if correction is None:
            unbiased = call.kwargs.get("unbiased", second if isinstance(second, bool) else True)
            correction = 1 if unbiased else 0
        keepdim = bool(b.const(call.kwargs.get("keepdim", call.arg(3, "keepdim", False)), "keepdim"))
        dims = normalize_dims(dims, x.rank)
        out, mean = variance_and_mean(b, x, dims, int(b.const(correction, "correction")))
        if take_sqrt:
            out = b.pw("sqrt", out)
        kept = (out, mean) if keepdim else (b.squeeze(out, dims), b.squeeze(mean, dims))
        return kept if with_mean else kept[0]
    return handler


def variance(b: Builder, x: Value, dims, correction: int = 0) -> Value:
    """Two-pass variance: mean((x - mean(x))^2), keepdim."""
    return variance_and_mean(b, x, dims, correction)[0]


def variance_and_mean(b: Builder, x: Value, dims, correction: int = 0) -> tuple[Value, Value]:
    """The two-pass variance and the mean it is taken about, both keepdim."""
    mean = b.reduce("mean", x, dims)
    centered = b.pw("sub", x, mean)
    return b.reduce("mean", b.pw("mul", centered, centered), dims, correction), mean


def _norm(b: Builder, call: Call):
    x = call.arg(0, "input")
    p = b.const(call.arg(1, "p", "fro"), "norm order")
    dims = b.const(call.arg(2, "dim", None), "norm dim")
    keepdim = bool(b.const(call.arg(3, "keepdim", False), "keepdim"))
    return p_norm(b, x, p, dims, keepdim)


def _vector_norm(b: Builder, call: Call):
    x = call.arg(0, "x")
    p = b.const(call.arg(1, "ord", 2), "norm order")
    dims = b.const(call.arg(2, "dim", None), "norm dim")
    keepdim = bool(b.const(call.arg(3, "keepdim", False), "keepdim"))
    return p_norm(b, x, p, dims, keepdim)


def p_norm(b: Builder, x: Value, p, dims, keepdim: bool) -> Value:
    dims = normalize_dims(dims, x.rank)
    if p in ("fro", 2, 2.0):
        out = b.pw("sqrt", b.reduce("sum", b.pw("mul", x, x), dims))
    elif p in (1, 1.0):
        out = b.reduce("sum", b.pw("abs", x), dims)
    elif p == float("inf"):
        out = b.reduce("amax", b.pw("abs", x), dims)
    elif p == float("-inf"):
        out = b.reduce("amin", b.pw("abs", x), dims)
    elif p == 0:          # the count of nonzero elements
        out = b.reduce("sum", b.pw("where", b.pw("ne", x, 0.0), 1.0, 0.0), dims)
    elif isinstance(p, (int, float)):
        # (sum |x|^p)^(1/p), as PyTorch computes every other order
        powered = b.pw("pow_const", b.pw("abs", x), exponent=Scalar(float(p)))
        out = b.pw("pow_const", b.reduce("sum", powered, dims), exponent=Scalar(1.0 / p))
    else:
        raise UnsupportedSubproblem(f"norm of order {p!r}")
    return out if keepdim else b.squeeze(out, dims)


def _normalize(b: Builder, call: Call):
    x = call.arg(0, "input")
    p = b.const(call.arg(1, "p", 2.0), "normalize p")
    dim = b.const(call.arg(2, "dim", 1), "normalize dim")
    eps = call.arg(3, "eps", 1e-12)
    norm = p_norm(b, x, p, dim, keepdim=True)
    return b.pw("div", x, b.pw("clamp_min", norm, low=eps))


def _softmax_dim(b: Builder, x: Value, dim) -> int:
    if dim is None:
        return 0 if x.rank in (0, 1, 3) else 1
    return int(b.const(dim, "softmax dim")) % x.rank


def softmax(b: Builder, x: Value, dim: int, log: bool) -> Value:
    """max-shifted softmax: exp(x - max) / sum(exp(x - max)), or its log."""
    shifted = b.pw("sub", x, b.reduce("amax", x, dim))
    total = b.reduce("sum", b.pw("exp", shifted), dim)
    if log:
        return b.pw("sub", shifted, b.pw("log", total))
    out = b.pw("div", b.pw("exp", shifted), total)
    if dim == x.rank - 1:
        b.softmax_inputs[out.id] = x      # `out @ v` may become one fused attention kernel
    return out


def _softmax(log: bool) -> Handler:
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        return softmax(b, x, _softmax_dim(b, x, call.arg(1, "dim", None)), log)
    return handler


def _softmax_module(log: bool) -> Handler:
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        return softmax(b, x, _softmax_dim(b, x, call.module_attr("dim")), log)
    return handler


def _round(b: Builder, call: Call):
    """torch.round to whole numbers, halves to even; with `decimals` PyTorch scales by 10**decimals first, which
    rounds once more (not written)."""
    if call.kwargs.get("decimals", 0) != 0:
        raise UnsupportedSubproblem("torch.round with decimals")
    return b.pw("round", call.arg(0, "input"))


def _nan_to_num(b: Builder, call: Call):
    """torch.nan_to_num: NaN to `nan` (0), infinities to `posinf`/`neginf` (fp32's largest finite numbers)."""
    largest = float(torch.finfo(torch.float32).max)
    nan, posinf, neginf = (call.arg(i, name, None) for i, name in enumerate(("nan", "posinf", "neginf"), start=1))
    return b.pw("nan_to_num", call.arg(0, "input"), nan=0.0 if nan is None else nan,
                posinf=largest if posinf is None else posinf, neginf=-largest if neginf is None else neginf)


_THRESHOLD = _with_attrs("threshold", threshold=0.0, value=0.0)


def _softmin(b: Builder, call: Call):
    """softmin(x) = softmax(-x), along F.softmin's dim (or nn.Softmin's)."""
    x = call.arg(0, "input")
    dim = call.module_attr("dim") if call.modules else call.arg(1, "dim", None)
    return softmax(b, b.pw("neg", x), _softmax_dim(b, x, dim), log=False)


def _softmax2d(b: Builder, call: Call):
    """nn.Softmax2d: a softmax over the channels of [C, H, W] or [N, C, H, W], dim -3."""
    x = call.arg(0, "input")
    if x.rank not in (3, 4):
        raise UnsupportedSubproblem(f"Softmax2d of a rank-{x.rank} input (3 or 4 are supported)")
    return softmax(b, x, x.rank - 3, log=False)


def _rrelu(b: Builder, call: Call):
    """RReLU where it draws no slopes (eval mode): leaky_relu with the mean slope (lower + upper) / 2."""
    if call.modules:
        lower, upper, training = call.module_attr("lower"), call.module_attr("upper"), call.module.training
    else:
        lower, upper = call.arg(1, "lower", 1.0 / 8.0), call.arg(2, "upper", 1.0 / 3.0)
        training = call.arg(3, "training", False)
    if training:
        raise UnsupportedInMode("RReLU in training mode draws its slopes from torch's random stream, which a "
                                "generated kernel cannot reproduce; compare in eval mode (--eval)")
    slope = (float(b.const(lower, "RReLU lower")) + float(b.const(upper, "RReLU upper"))) / 2
    return b.pw("leaky_relu", call.arg(0, "input"), negative_slope=slope)


def _lerp(b: Builder, call: Call):
    """torch.lerp(start, end, weight) = start + weight * (end - start)."""
    start, end = call.arg(0, "input"), call.arg(1, "end")
    return b.pw("add", start, b.pw("mul", b.pw("sub", end, start), call.arg(2, "weight")))


def _add_times(op: str) -> Handler:
    """torch.addcmul / addcdiv: input + value * (tensor1 op tensor2)."""
    def handler(b: Builder, call: Call):
        product = b.pw(op, call.arg(1, "tensor1"), call.arg(2, "tensor2"))
        value = call.arg(3, "value", 1)
        return b.pw("add", call.arg(0, "input"), b.pw("mul", product, value) if value != 1 else product)
    return handler


def logsumexp(b: Builder, x: Value, dims: tuple[int, ...]) -> Value:
    """log(sum(exp(x))) over `dims`, kept as size 1, shifted by the maximum so no exp overflows."""
    peak = b.reduce("amax", x, dims)
    total = b.reduce("sum", b.pw("exp", b.pw("sub", x, peak)), dims)
    return b.pw("add", peak, b.pw("log", total))


def _logsumexp(b: Builder, call: Call):
    x = call.arg(0, "input")
    dims = normalize_dims(b.const(call.arg(1, "dim"), "logsumexp dim"), x.rank)
    keepdim = bool(b.const(call.arg(2, "keepdim", False), "keepdim"))
    out = logsumexp(b, x, dims)
    return out if keepdim else b.squeeze(out, dims)


# --- normalisation layers ---------------------------------------------------------------------------

def normalized(b: Builder, x: Value, dims, eps) -> Value:
    """(x - mean) / sqrt(var + eps) over `dims`, biased variance, two passes."""
    centered = b.pw("sub", x, b.reduce("mean", x, dims))
    var = b.reduce("mean", b.pw("mul", centered, centered), dims)
    return b.pw("mul", centered, b.pw("rsqrt", b.pw("add", var, eps)))


def _affine(b: Builder, y: Value, weight: Value | None, bias: Value | None) -> Value:
    if weight is not None:
        y = b.pw("mul", y, weight)
    if bias is not None:
        y = b.pw("add", y, bias)
    return y


def layer_norm(b: Builder, x: Value, normalized_rank: int, weight, bias, eps) -> Value:
    dims = tuple(range(x.rank - normalized_rank, x.rank))
    return _affine(b, normalized(b, x, dims, eps), weight, bias)


def _layer_norm(b: Builder, call: Call):
    x = call.arg(0, "input")
    shape = b.const(call.arg(1, "normalized_shape"), "normalized_shape")
    rank = 1 if isinstance(shape, int) else len(shape)
    return layer_norm(b, x, rank, as_param(call.arg(2, "weight", None), "weight"),
                      as_param(call.arg(3, "bias", None), "bias"), call.arg(4, "eps", 1e-5))


def _layer_norm_module(b: Builder, call: Call):
    module = call.module
    return layer_norm(b, call.arg(0, "input"), len(module.normalized_shape), module_param(b, call, "weight"),
                      module_param(b, call, "bias"), call.module_scalar("eps"))


def group_norm(b: Builder, x: Value, groups: int, weight, bias, eps) -> Value:
    """Split C into (G, C/G), normalize over (C/G, *spatial), affine per channel, merge back."""
    if x.rank < 2:
        raise UnsupportedSubproblem("group_norm of a tensor with fewer than 2 dims")
    spatial = tuple(range(2, x.rank))
    split_args = (b.size(x, 0), groups, -1) + tuple(b.size(x, d) for d in spatial)
    split_shapes = tuple((s[0], groups, s[1] // groups) + s[2:] for s in x.shapes)
    split = b.view(x, "reshape", split_args, split_shapes)
    y = normalized(b, split, tuple(range(2, split.rank)), eps)
    trailing = (1,) * len(spatial)
    if weight is not None:
        shapes = tuple((groups, s[0] // groups) + trailing for s in weight.shapes)
        y = b.pw("mul", y, b.view(weight, "reshape", (groups, -1) + trailing, shapes))
    if bias is not None:
        shapes = tuple((groups, s[0] // groups) + trailing for s in bias.shapes)
        y = b.pw("add", y, b.view(bias, "reshape", (groups, -1) + trailing, shapes))
    merge_args = tuple(b.size(x, d) for d in range(x.rank))
    return b.view(y, "reshape", merge_args, x.shapes)


def _group_norm(b: Builder, call: Call):
    return group_norm(b, call.arg(0, "input"), int(b.const(call.arg(1, "num_groups"), "num_groups")),
                      as_param(call.arg(2, "weight", None), "weight"), as_param(call.arg(3, "bias", None), "bias"),
                      call.arg(4, "eps", 1e-5))


def _group_norm_module(b: Builder, call: Call):
    return group_norm(b, call.arg(0, "input"), int(call.module_attr("num_groups")), module_param(b, call, "weight"),
                      module_param(b, call, "bias"), call.module_scalar("eps"))


@dataclass
class BatchNormArgs:
    running_mean: Value | None
    running_var: Value | None
    weight: Value | None
    bias: Value | None
    training: bool
    momentum: float | Scalar | None
    eps: float | Scalar


def batch_norm(b: Builder, x: Value, a: BatchNormArgs) -> Value:
    """Batch statistics over every dim but the channel dim in training; running statistics otherwise."""
    if x.rank < 2:
        raise UnsupportedSubproblem("batch_norm of a tensor with fewer than 2 dims")
    use_batch_stats = a.training or a.running_mean is None
    if use_batch_stats and x.rank >= 3:
        mean, var = _batch_stats(b, x, a)
        y = b.pw("mul", b.pw("sub", x, mean), b.pw("rsqrt", b.pw("add", var, a.eps)))
    elif use_batch_stats:
        dims = (0,) + tuple(range(2, x.rank))
        mean = b.reduce("mean", x, dims)
        centered = b.pw("sub", x, mean)
        var = b.reduce("mean", b.pw("mul", centered, centered), dims)
        y = b.pw("mul", centered, b.pw("rsqrt", b.pw("add", var, a.eps)))
        if _updates_running_stats(a):
            _update_running_stats(b, x, a, mean, var)
    else:
        mean = b.channel_view(a.running_mean, x.rank)
        var = b.channel_view(a.running_var, x.rank)
        y = b.pw("mul", b.pw("sub", x, mean), b.pw("rsqrt", b.pw("add", var, a.eps)))
    weight = b.channel_view(a.weight, x.rank) if a.weight is not None else None
    bias = b.channel_view(a.bias, x.rank) if a.bias is not None else None
    return _affine(b, y, weight, bias)


def _batch_stats(b: Builder, x: Value, a: BatchNormArgs) -> tuple[Value, Value]:
    """Mean and biased variance per channel, viewed to broadcast against x, from one BatchStats kernel that
    also updates the running statistics. Only for x with dims after the channel: an (N, C) input keeps the
    row reduction over N, whose tiles read C-contiguous rows where a program per channel would read with a
    stride of C."""
    updates = _updates_running_stats(a)
    reduced = tuple(tuple(s if d == 1 else 1 for d, s in enumerate(shape)) for shape in x.shapes)
    stats = b.program.add(BatchStats(tuple((2,) + r for r in reduced), x=x,
                                     running=(a.running_mean, a.running_var) if updates else (),
                                     momentum=b.scalar(a.momentum) if updates else None))
    if updates:
        b.program.effects.append(stats)
    return b.view(stats, "__getitem__", (0,), reduced), b.view(stats, "__getitem__", (1,), reduced)


def _updates_running_stats(a: BatchNormArgs) -> bool:
    """Training with a momentum, and running statistics that are the module's own buffers."""
    return (a.training and a.momentum is not None and isinstance(a.running_mean, Param)
            and isinstance(a.running_var, Param))


def _update_running_stats(b: Builder, x: Value, a: BatchNormArgs, mean: Value, var: Value) -> None:
    """running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance."""
    count = b.size(x, 0)
    for d in range(2, x.rank):
        count = IntOp("mul", count, b.size(x, d))
    unbias = Scalar(0.0, expr=IntOp("truediv", count, IntOp("sub", count, 1)))
    flat = tuple((s[1],) for s in x.shapes)
    batch_mean = b.view(mean, "reshape", (-1,), flat)
    batch_var = b.pw("mul", b.view(var, "reshape", (-1,), flat), unbias)
    for target, batch in ((a.running_mean, batch_mean), (a.running_var, batch_var)):
        updated = b.pw("add", target, b.pw("mul", b.pw("sub", batch, target), a.momentum))
        b.program.assigns.append(Assign(target, updated))


def _batch_norm(b: Builder, call: Call):
    args = BatchNormArgs(running_mean=as_param(call.arg(1, "running_mean"), "running_mean"),
                         running_var=as_param(call.arg(2, "running_var"), "running_var"),
                         weight=as_param(call.arg(3, "weight", None), "weight"),
                         bias=as_param(call.arg(4, "bias", None), "bias"),
                         training=bool(b.const(call.arg(5, "training", False), "training")),
                         momentum=call.arg(6, "momentum", 0.1), eps=call.arg(7, "eps", 1e-5))
    return batch_norm(b, call.arg(0, "input"), args)


def _aten_batch_norm(b: Builder, call: Call):
    args = BatchNormArgs(running_mean=as_param(call.arg(3, "running_mean"), "running_mean"),
                         running_var=as_param(call.arg(4, "running_var"), "running_var"),
                         weight=as_param(call.arg(1, "weight"), "weight"),
                         bias=as_param(call.arg(2, "bias"), "bias"),
                         training=bool(b.const(call.arg(5, "training"), "training")),
                         momentum=call.arg(6, "momentum"), eps=call.arg(7, "eps"))
    return batch_norm(b, call.arg(0, "input"), args)


def _batch_norm_module(b: Builder, call: Call):
    module = call.module
    momentum = call.module_attr("momentum")
    args = BatchNormArgs(running_mean=module_param(b, call, "running_mean"),
                         running_var=module_param(b, call, "running_var"),
                         weight=module_param(b, call, "weight"), bias=module_param(b, call, "bias"),
                         training=module.training,
                         momentum=None if momentum is None else call.module_scalar("momentum"),
                         eps=call.module_scalar("eps"))
    return batch_norm(b, call.arg(0, "input"), args)


def instance_norm(b: Builder, x: Value, weight, bias, eps) -> Value:
    y = normalized(b, x, tuple(range(2, x.rank)), eps)
    weight = b.channel_view(weight, x.rank) if weight is not None else None
    bias = b.channel_view(bias, x.rank) if bias is not None else None
    return _affine(b, y, weight, bias)


def _instance_norm(b: Builder, call: Call):
    if not b.const(call.arg(5, "use_input_stats", True), "use_input_stats"):
        raise UnsupportedSubproblem("instance_norm with running statistics")
    return instance_norm(b, call.arg(0, "input"), as_param(call.arg(3, "weight", None), "weight"),
                         as_param(call.arg(4, "bias", None), "bias"), call.arg(7, "eps", 1e-5))


def _aten_instance_norm(b: Builder, call: Call):
    if not b.const(call.arg(5, "use_input_stats"), "use_input_stats"):
        raise UnsupportedSubproblem("instance_norm with running statistics")
    return instance_norm(b, call.arg(0, "input"), as_param(call.arg(1, "weight"), "weight"),
                         as_param(call.arg(2, "bias"), "bias"), call.arg(7, "eps"))


def _instance_norm_module(b: Builder, call: Call):
    if call.module.track_running_stats:
        raise UnsupportedSubproblem(f"{type(call.module).__name__} with track_running_stats=True")
    return instance_norm(b, call.arg(0, "input"), module_param(b, call, "weight"), module_param(b, call, "bias"),
                         call.module_scalar("eps"))


def rms_norm(b: Builder, x: Value, normalized_rank: int, weight, eps) -> Value:
    dims = tuple(range(x.rank - normalized_rank, x.rank))
    if eps is None:
        eps = torch.finfo(torch.float32).eps
    y = b.pw("mul", x, b.pw("rsqrt", b.pw("add", b.reduce("mean", b.pw("mul", x, x), dims), eps)))
    return _affine(b, y, weight, None)


def _rms_norm(b: Builder, call: Call):
    shape = b.const(call.arg(1, "normalized_shape"), "normalized_shape")
    rank = 1 if isinstance(shape, int) else len(shape)
    return rms_norm(b, call.arg(0, "input"), rank, as_param(call.arg(2, "weight", None), "weight"),
                    call.arg(3, "eps", None))


def _rms_norm_module(b: Builder, call: Call):
    eps = call.module_attr("eps")
    return rms_norm(b, call.arg(0, "input"), len(call.module.normalized_shape), module_param(b, call, "weight"),
                    None if eps is None else call.module_scalar("eps"))


def prelu(b: Builder, x: Value, weight: Value) -> Value:
    """PReLU: x where x >= 0, else slope * x; one slope for all, or one per channel (dim 1)."""
    if all(s == (1,) for s in weight.shapes):
        slope = weight
    elif x.rank >= 2:
        slope = b.channel_view(weight, x.rank)
    else:
        raise UnsupportedSubproblem("prelu with one slope per element of a 1-d input")
    return b.pw("where", b.pw("ge", x, 0.0), x, b.pw("mul", slope, x))


def _prelu(b: Builder, call: Call):
    return prelu(b, call.arg(0, "input"), as_param(call.arg(1, "weight"), "weight"))


def _prelu_module(b: Builder, call: Call):
    return prelu(b, call.arg(0, "input"), module_param(b, call, "weight"))


# --- module forms of elementwise ops ----------------------------------------------------------------

def _module_op(op: str, **attrs: str) -> Handler:
    """An activation module: `attrs` maps the op's option name to the module attribute holding it."""
    def handler(b: Builder, call: Call):
        return b.pw(op, call.arg(0, "input"), **{k: call.module_scalar(v) for k, v in attrs.items()})
    return handler


def _gelu_module(b: Builder, call: Call):
    approximate = call.module_attr("approximate")
    return b.pw("gelu_tanh" if approximate == "tanh" else "gelu", call.arg(0, "input"))


# --- scans --------------------------------------------------------------------------------------------

def _scan(kind: str) -> Handler:
    """torch.cumsum / cumprod (and their Tensor methods) along `dim`, in fp32."""
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        dtype = call.arg(2, "dtype", None)
        if dtype not in (None, torch.float32):
            raise UnsupportedSubproblem(f"cum{kind} with dtype={dtype}")
        dim = int(b.const(call.arg(1, "dim"), f"cum{kind} dim")) % max(x.rank, 1)
        return b.program.add(Scan(x.shapes, x=x, dim=dim, kind=kind))
    return handler


FUNCTIONS: dict[str, Handler] = {name: _unary(op) for name, op in _UNARY.items()}
FUNCTIONS.update({
    "cumsum": _scan("sum"), "cumprod": _scan("prod"),
    "add": _arith("add"), "sub": _arith("sub"), "subtract": _arith("sub"), "mul": _arith("mul"),
    "multiply": _arith("mul"), "div": _arith("div"), "divide": _arith("div"), "true_divide": _arith("div"),
    "operator.add": _arith("add"), "operator.sub": _arith("sub"), "operator.mul": _arith("mul"),
    "operator.truediv": _arith("div"), "operator.floordiv": _floordiv, "floor_divide": _floordiv,
    "operator.neg": _unary("neg"), "operator.pow": _pow, "pow": _pow, "rsub": _rsub,
    "fmod": _remainder("fmod"), "remainder": _remainder("remainder"), "operator.mod": _remainder("remainder"),
    "diff": _diff, "cross": _cross, "linalg_cross": _cross,
    "zeros": _filled(0.0), "ones": _filled(1.0), "full": _filled(None), "zeros_like": _filled(0.0),
    "full_like": _filled(None), "new_zeros": _filled(0.0), "new_ones": _filled(1.0), "new_full": _filled(None),
    "aten.zeros": _filled(0.0), "aten.ones": _filled(1.0), "aten.full": _filled(None),
    "operator.gt": _compare("gt"), "operator.lt": _compare("lt"), "operator.ge": _compare("ge"),
    "operator.le": _compare("le"), "operator.eq": _compare("eq"), "operator.ne": _compare("ne"),
    "gt": _compare("gt"), "lt": _compare("lt"), "ge": _compare("ge"), "le": _compare("le"), "eq": _compare("eq"),
    "ne": _compare("ne"), "greater": _compare("gt"), "less": _compare("lt"),
    "logical_and": _compare("logical_and"), "logical_or": _compare("logical_or"),
    "operator.and_": _compare("logical_and"), "operator.or_": _compare("logical_or"),
    "where": _where, "masked_fill": _masked_fill, "logaddexp": _logaddexp, "logical_not": _unary("logical_not"),
    "round": _round, "nan_to_num": _nan_to_num, "hypot": _compare("hypot"),
    "isnan": _unary("isnan"), "isinf": _unary("isinf"), "isfinite": _unary("isfinite"),
    # ~x of a tensor that reaches a kernel is of a bool one: torch refuses it on floats, integer inputs only index
    "operator.invert": _unary("logical_not"), "bitwise_not": _unary("logical_not"),
    "maximum": _compare("maximum"), "minimum": _compare("minimum"),
    "fmax": _compare("fmax"), "fmin": _compare("fmin"),
    "clamp": _clamp, "clip": _clamp, "clamp_min": _clamp_min, "clamp_max": _clamp_max, "hardtanh": _hardtanh,
    "gelu": _gelu, "softplus": _with_attrs("softplus", beta=1.0, threshold=20.0), "prelu": _prelu,
    "elu": _with_attrs("elu", alpha=1.0), "celu": _with_attrs("celu", alpha=1.0),
    "leaky_relu": _with_attrs("leaky_relu", negative_slope=0.01),
    "threshold": _THRESHOLD, "_threshold": _THRESHOLD,   # the second: F.threshold, as fx records it
    "softshrink": _with_attrs("softshrink", lambd=0.5), "hardshrink": _with_attrs("hardshrink", lambd=0.5),
    "dropout": _dropout, "dropout1d": _dropout, "dropout2d": _dropout, "dropout3d": _dropout,
    "alpha_dropout": _dropout, "feature_alpha_dropout": _dropout, "native_dropout": _dropout,
    "tensor": _tensor_of_a_number, "contiguous": _identity, "clone": _identity, "alias": _identity,
    "detach": _identity, "positive": _identity, "to": _identity, "float": _identity, "type": _identity,
    "type_as": _identity,
    "max": _maximum_or_reduce("amax", "maximum"), "min": _maximum_or_reduce("amin", "minimum"),
    "argmax": _arg_reduce("max"), "argmin": _arg_reduce("min"),
    "sort": _sort, "argsort": _argsort, "msort": _msort, "topk": _topk, "kthvalue": _kthvalue,
    "median": _median(Pick.MEDIAN), "nanmedian": _median(Pick.NANMEDIAN),
    "sum": _reduction("sum"), "mean": _reduction("mean"), "prod": _reduction("prod"), "amax": _reduction("amax", ()),
    "amin": _reduction("amin", ()), "var": _variance(False), "std": _variance(True),
    "var_mean": _variance(False, with_mean=True), "std_mean": _variance(True, with_mean=True),
    "norm": _norm, "linalg_vector_norm": _vector_norm, "vector_norm": _vector_norm, "normalize": _normalize,
    "softmax": _softmax(False), "log_softmax": _softmax(True), "_softmax": _softmax(False), "softmin": _softmin,
    "rrelu": _rrelu, "lerp": _lerp, "addcmul": _add_times("mul"), "addcdiv": _add_times("div"),
    "_log_softmax": _softmax(True), "special_softmax": _softmax(False), "logsumexp": _logsumexp,
    "layer_norm": _layer_norm, "group_norm": _group_norm, "batch_norm": _batch_norm,
    "instance_norm": _instance_norm, "rms_norm": _rms_norm,
    "aten.batch_norm": _aten_batch_norm, "aten.instance_norm": _aten_instance_norm,
})

MODULES: dict[type, Handler] = {cls: _module_op(op) for cls, op in _UNARY_MODULES.items()}
MODULES.update({
    nn.GELU: _gelu_module, nn.Softplus: _module_op("softplus", beta="beta", threshold="threshold"),
    nn.PReLU: _prelu_module,
    nn.ELU: _module_op("elu", alpha="alpha"), nn.CELU: _module_op("celu", alpha="alpha"),
    nn.LeakyReLU: _module_op("leaky_relu", negative_slope="negative_slope"),
    nn.Hardtanh: _module_op("hardtanh", low="min_val", high="max_val"),
    nn.Threshold: _module_op("threshold", threshold="threshold", value="value"),
    nn.Softshrink: _module_op("softshrink", lambd="lambd"), nn.Hardshrink: _module_op("hardshrink", lambd="lambd"),
    nn.Dropout: _dropout, nn.Dropout1d: _dropout, nn.Dropout2d: _dropout, nn.Dropout3d: _dropout,
    nn.AlphaDropout: _dropout, nn.FeatureAlphaDropout: _dropout, nn.Identity: _identity,
    nn.Softmax: _softmax_module(False), nn.LogSoftmax: _softmax_module(True), nn.Softmin: _softmin,
    nn.Softmax2d: _softmax2d, nn.RReLU: _rrelu,
    nn.LayerNorm: _layer_norm_module, nn.GroupNorm: _group_norm_module,
    nn.BatchNorm1d: _batch_norm_module, nn.BatchNorm2d: _batch_norm_module, nn.BatchNorm3d: _batch_norm_module,
    nn.InstanceNorm1d: _instance_norm_module, nn.InstanceNorm2d: _instance_norm_module,
    nn.InstanceNorm3d: _instance_norm_module, nn.RMSNorm: _rms_norm_module,
})
