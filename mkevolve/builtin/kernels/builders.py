"""Building the tensor program: typed constructors that infer every value's shape under every input config."""

from __future__ import annotations

import math
from typing import Sequence

from torch import nn

from .errors import UnsupportedSubproblem
from .geometry import sliding_windows, transposed_size
from .ir import (
    AdaptivePool,
    Concat,
    Conv,
    IntOp,
    Matmul,
    Param,
    Pointwise,
    Pool,
    Program,
    Reduce,
    Scalar,
    Shape,
    SizeOf,
    Value,
    View,
    is_leaf,
    walk,
)
from .pointwise_ops import OPS
from .trace import TaggedFloat, TaggedInt


def broadcast(shapes: Sequence[Shape]) -> Shape:
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise UnsupportedSubproblem(f"shapes {list(shapes)} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def normalize_dims(dims, rank: int) -> tuple[int, ...]:
    """Reduction dims as sorted non-negative ints; None means every dim."""
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    out = sorted({d % rank if rank else 0 for d in dims})
    return tuple(out)


def _kept_dims(shapes: tuple[Shape, ...], run: tuple[int, ...]) -> tuple[Shape, ...]:
    """`shapes` reduced over the dims in `run`, keepdim: those dims become 1."""
    return tuple(tuple(1 if d in run else s for d, s in enumerate(shape)) for shape in shapes)


_RESHAPES = ("reshape", "view", "flatten")   # views that keep the elements' order


def _mapped_run(x: Value, y: Value, run: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims of `y` holding what a run of dims of its reshape `x` holds, when the dims before and after the
    run are the same in both under every input config; else None."""
    tail = x.rank - run[-1] - 1
    last = y.rank - tail - 1
    if last < run[0]:
        return None
    for xs, ys in zip(x.shapes, y.shapes):
        if xs[:run[0]] != ys[:run[0]] or xs[run[-1] + 1:] != ys[last + 1:]:
            return None
    return tuple(range(run[0], last + 1))


def _row_run(y: Value, mapped: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims of a reduction `y` is computed from through elementwise ops, over a tensor of y's shape, when
    they end the run `mapped`: the rows a kernel already reduces to compute y. None when there is none."""
    for value in walk(y, lambda v: isinstance(v, Pointwise)):
        if isinstance(value, Reduce) and value.base.shapes == y.shapes and value.dims[-1] == mapped[-1] \
                and value.dims[0] >= mapped[0]:
            return value.dims
    return None


def adjacent_runs(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    runs: list[list[int]] = []
    for d in dims:
        if runs and runs[-1][-1] == d - 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return [tuple(r) for r in runs]


class Builder:
    """Appends values to a Program; `models` are the per-config module instances, for attribute checks."""

    def __init__(self, program: Program, models: list[nn.Module]):
        self.program = program
        self.models = models
        self._params: dict[str, Param] = {}
        self.softmax_inputs: dict[int, Value] = {}   # softmax over the last dim: result id -> its input

    @property
    def n_configs(self) -> int:
        return len(self.models)

    def param(self, path: str, shapes: tuple[Shape, ...], integer: bool = False) -> Param:
        """The leaf `self.<path>`; one value per path, so a tensor used twice is loaded as one operand."""
        if path not in self._params:
            self._params[path] = self.program.add(Param(shapes, path=path, integer=integer))
        return self._params[path]

    # --- constants -------------------------------------------------------------------------------

    def const(self, value, what: str):
        """A value that shapes the generated code: it must be the same under every input config."""
        if isinstance(value, (tuple, list)):
            return type(value)(self.const(v, what) for v in value)
        if isinstance(value, (TaggedFloat, TaggedInt)):
            per_config = {_resolve(m, value.attr) for m in self.models}
            if len(per_config) > 1:
                raise UnsupportedSubproblem(f"{what} (self.{value.attr}) differs between input configs")
            return float(value) if isinstance(value, TaggedFloat) else int(value)
        if isinstance(value, (SizeOf, IntOp)):
            raise UnsupportedSubproblem(f"{what} depends on tensor shapes; it must be a constant")
        return value

    def scalar(self, value) -> Scalar | Value:
        """An operand of a pointwise op: tensors stay, numbers become Scalars that remember their origin."""
        if isinstance(value, (Value, Scalar)):
            return value
        if isinstance(value, (TaggedFloat, TaggedInt)):
            return Scalar(value=float(value), attr=value.attr)
        if isinstance(value, (SizeOf, IntOp)):
            return Scalar(value=0, expr=value)
        if isinstance(value, bool):
            return Scalar(value)
        if isinstance(value, (int, float)):
            return Scalar(float(value))
        raise UnsupportedSubproblem(f"operand of type {type(value).__name__} is not supported")

    # --- pointwise -------------------------------------------------------------------------------

    def pw(self, op: str, *args, **attrs) -> Value:
        if op not in OPS:
            raise UnsupportedSubproblem(f"elementwise op {op!r} is not supported")
        operands = tuple(self.scalar(a) for a in args)
        tensors = [a for a in operands if isinstance(a, Value)]
        if not tensors:
            raise UnsupportedSubproblem(f"{op} on numbers only has no tensor to compute")
        shapes = tuple(broadcast([t.shapes[c] for t in tensors]) for c in range(self.n_configs))
        attrs = {k: self.scalar(v) for k, v in attrs.items()}
        return self.program.add(Pointwise(shapes, op=op, args=operands, attrs=attrs))

    def full(self, shapes: tuple[Shape, ...], value: float) -> Value:
        """torch.full (zeros, ones) of a float32 tensor: every element `value`, which elementwise code reads as a
        number. Where it would have to be a tensor of its own (an output, a GEMM's operand) no kernel writes it:
        emit_pointwise refuses it, having no tensor to take its device from."""
        return self.program.add(Pointwise(shapes, op="full", args=(Scalar(float(value)),)))

    # --- reductions ------------------------------------------------------------------------------

    def reduce(self, kind: str, x: Value, dims, correction: int = 0) -> Value:
        """keepdim reduction; dims that are not adjacent are reduced one adjacent run at a time."""
        dims = normalize_dims(dims, x.rank)
        if x.rank == 0:
            raise UnsupportedSubproblem("reduction of a 0-d tensor")
        runs = adjacent_runs(dims)
        if correction and len(runs) > 1:
            raise UnsupportedSubproblem("variance with a correction over non-adjacent dims")
        if len(runs) == 1 and not correction:
            by_rows = self._reduce_by_rows(kind, x, runs[0])
            if by_rows is not None:
                return by_rows
        out = x
        for run in reversed(runs):
            out = self._reduce_run(kind, out, run, correction)
        return out

    def _reduce_run(self, kind: str, x: Value, run: tuple[int, ...], correction: int = 0) -> Value:
        return self.program.add(Reduce(_kept_dims(x.shapes, run), kind=kind, base=x, dims=run, correction=correction))

    def _reduce_by_rows(self, kind: str, x: Value, run: tuple[int, ...]) -> Value | None:
        """A reduction over a reshape of a value computed from reductions over rows (a GroupNorm's output,
        then a mean over channels and space): each row first, then the rest. The first joins the kernel that
        reduces those rows, so the value never exists as a tensor: level2/23's and 27's GroupNorm wrote it and
        a second kernel read it back, 5 passes over it where 3 remain. Sums, means, maxima and minima of
        equal-size rows nest exactly. None when `x` is no such reshape."""
        y = x
        while isinstance(y, View) and y.method in _RESHAPES:   # a reshape of a reshape: of the first base
            y = y.base
        if y is x or is_leaf(y):
            return None
        mapped = _mapped_run(x, y, run)
        rows = _row_run(y, mapped) if mapped else None
        if rows is None:
            return None
        out = self._reduce_run(kind, y, rows)
        if rows[0] > mapped[0]:
            out = self._reduce_run(kind, out, tuple(range(mapped[0], rows[0])))
        tail = x.rank - run[-1] - 1    # dims after the run: the same sizes in x and y
        args = (tuple(self.size(out, d) for d in range(run[0])) + (1,) * len(run)
                + tuple(self.size(out, y.rank - tail + i) for i in range(tail)))
        return self.view(out, "reshape", args, _kept_dims(x.shapes, run))

    def squeeze(self, x: Value, dims: tuple[int, ...]) -> Value:
        if not dims:
            return x
        shapes = tuple(tuple(s for d, s in enumerate(shape) if d not in dims) for shape in x.shapes)
        return self.view(x, "squeeze", (tuple(dims),), shapes)

    def flatten_all(self, x: Value) -> Value:
        """x as one dim of all its elements (x.reshape(-1)), for a reduction of every element to one number."""
        return self.view(x, "reshape", (-1,), tuple((math.prod(s),) for s in x.shapes))

    def unsqueeze(self, x: Value, dim: int) -> Value:
        """x with a new size-1 dim at `dim` (0 <= dim <= x.rank)."""
        return self.view(x, "unsqueeze", (dim,), tuple(s[:dim] + (1,) + s[dim:] for s in x.shapes))

    def reduce_keep(self, kind: str, x: Value, dims, keepdim: bool, correction: int = 0) -> Value:
        dims = normalize_dims(dims, x.rank)
        out = self.reduce(kind, x, dims, correction)
        return out if keepdim else self.squeeze(out, dims)

    # --- views -----------------------------------------------------------------------------------

    def view(self, base: Value, method: str, args: tuple, shapes: tuple[Shape, ...], item: int | None = None) -> Value:
        return self.program.add(View(shapes, base=base, method=method, args=tuple(args), item=item))

    def channel_view(self, param: Value, rank: int, channel_dim: int = 1) -> Value:
        """A per-channel vector (C,) viewed as (C, 1, ..., 1) to broadcast against a rank-`rank` tensor."""
        trailing = rank - channel_dim - 1
        shapes = tuple((s[0],) + (1,) * trailing for s in param.shapes)
        return self.view(param, "reshape", (-1,) + (1,) * trailing, shapes)

    def size(self, x: Value, dim: int) -> SizeOf:
        return SizeOf(x, dim % x.rank)

    def swap01(self, x: Value) -> Value:
        """x with its first two dims swapped, a view (batch-first <-> time- or sequence-first)."""
        return self.view(x, "transpose", (0, 1), tuple((s[1], s[0]) + s[2:] for s in x.shapes))

    def linear(self, x: Value, weight: Value, bias: Value | None) -> Value:
        """x @ weight.T + bias: the transpose is a view, the bias add becomes the GEMM's epilogue."""
        out = self.matmul(x, self.view(weight, "t", (), tuple((s[1], s[0]) for s in weight.shapes)))
        return out if bias is None else self.pw("add", out, bias)

    # --- anchors ---------------------------------------------------------------------------------

    def matmul(self, a: Value, b: Value) -> Value:
        """torch.matmul for (..., M, K) @ (K, N), and for equal batch dims; vectors via unsqueeze."""
        if a.rank == 1:
            out = self.matmul(self.unsqueeze(a, 0), b)
            return self.squeeze(out, (out.rank - 2,) if b.rank > 1 else (0,))
        if b.rank == 1:
            out = self.matmul(a, self.unsqueeze(b, 1))
            return self.squeeze(out, (out.rank - 1,))
        for c in range(self.n_configs):
            if a.shapes[c][-1] != b.shapes[c][-2]:
                raise UnsupportedSubproblem(f"matmul of {a.shapes[c]} and {b.shapes[c]}")
        if b.rank == 2:
            shapes = tuple(sa[:-1] + (sb[-1],) for sa, sb in zip(a.shapes, b.shapes))
            return self.program.add(Matmul(shapes, a=a, b=b, batched=False))
        if a.rank != b.rank or any(sa[:-2] != sb[:-2] for sa, sb in zip(a.shapes, b.shapes)):
            raise UnsupportedSubproblem("matmul with broadcast batch dims "
                                        f"({a.shapes[0]} @ {b.shapes[0]}) is not supported")
        shapes = tuple(sa[:-1] + (sb[-1],) for sa, sb in zip(a.shapes, b.shapes))
        return self.program.add(Matmul(shapes, a=a, b=b, batched=True))

    def concat(self, parts: list[Value], dim: int) -> Value:
        """torch.cat: parts side by side along `dim`; one Concat, or the one part itself."""
        if len({p.rank for p in parts}) > 1 or parts[0].rank == 0:
            raise UnsupportedSubproblem("cat of tensors of different ranks (or 0-d)")
        dim %= parts[0].rank
        if len(parts) == 1:
            return parts[0]
        shapes = []
        for c in range(self.n_configs):
            first = parts[0].shapes[c]
            if any(p.shapes[c][:dim] + p.shapes[c][dim + 1:] != first[:dim] + first[dim + 1:] for p in parts):
                raise UnsupportedSubproblem(f"cat of shapes {[p.shapes[c] for p in parts]} along dim {dim}")
            shapes.append(first[:dim] + (sum(p.shapes[c][dim] for p in parts),) + first[dim + 1:])
        return self.program.add(Concat(tuple(shapes), parts=tuple(parts), dim=dim))

    def conv(self, x: Value, w: Value, *, transposed: bool, stride: list, padding: list, dilation: list,
             output_padding, groups: tuple[int, ...], geometry_from: str | None = None) -> Value:
        """stride, padding, dilation and groups: one entry per input config."""
        spatial = x.rank - 2
        if spatial not in (1, 2, 3) or w.rank != x.rank:
            raise UnsupportedSubproblem(f"convolution of a rank-{x.rank} input")
        shapes = []
        for xs, ws, g, stride_, padding_, dilation_ in zip(x.shapes, w.shapes, groups, stride, padding, dilation):
            out_channels = ws[1] * g if transposed else ws[0]
            sizes = []
            for d in range(spatial):
                s, p, dil = stride_[d], padding_[d], dilation_[d]
                size, k = xs[2 + d], ws[2 + d]
                if transposed:
                    sizes.append(transposed_size(size, k, s, p, dil, output_padding[d]))
                else:
                    sizes.append(sliding_windows(size, k, s, p, dil))
            shapes.append((xs[0], out_channels, *sizes))
        return self.program.add(Conv(tuple(shapes), x=x, w=w, transposed=transposed, stride=tuple(stride[0]),
                                     padding=tuple(padding[0]), dilation=tuple(dilation[0]),
                                     output_padding=tuple(output_padding), groups=tuple(groups),
                                     geometry_from=geometry_from))

    def pool(self, kind: str, x: Value, kernel, stride, padding, dilation, ceil_mode: bool,
             count_include_pad: bool = True, divisor: int | None = None) -> Value:
        spatial = len(kernel)
        shapes = []
        for xs in x.shapes:
            sizes = tuple(sliding_windows(xs[x.rank - spatial + d], kernel[d], stride[d], padding[d], dilation[d],
                                          ceil_mode) for d in range(spatial))
            shapes.append(xs[:x.rank - spatial] + sizes)
        return self.program.add(Pool(tuple(shapes), kind=kind, x=x, kernel=tuple(kernel), stride=tuple(stride),
                                     padding=tuple(padding), dilation=tuple(dilation), ceil_mode=ceil_mode,
                                     count_include_pad=count_include_pad, divisor=divisor))

    def adaptive_pool(self, kind: str, x: Value, out_sizes: Sequence[tuple[int, ...]]) -> Value:
        spatial = len(out_sizes[0])
        if all(all(s == 1 for s in sizes) for sizes in out_sizes):
            dims = tuple(range(x.rank - spatial, x.rank))
            return self.reduce("mean" if kind == "avg" else "amax", x, dims)
        shapes = tuple(xs[:x.rank - spatial] + tuple(sizes) for xs, sizes in zip(x.shapes, out_sizes))
        return self.program.add(AdaptivePool(shapes, kind=kind, x=x))


def _resolve(model: nn.Module, path: str):
    value = model
    for part in path.split("."):
        value = getattr(value, part)
    return value


def tuple_arg(value, n: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as an n-tuple (torch's `_pair`/`_triple`)."""
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            return tuple(int(value[0]) for _ in range(n))
        if len(value) != n:
            raise UnsupportedSubproblem(f"{what} {value!r} has {len(value)} entries, expected {n}")
        return tuple(int(v) for v in value)
    return tuple(int(value) for _ in range(n))

