"""The tensor program the generator works on: typed values with one shape per input config."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Union

Shape = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Scalar:
    """A number: a literal, a module attribute read at run time (`attr`), or shape arithmetic (`expr`)."""

    value: float | int | bool
    attr: str | None = None
    expr: "ShapeInt | None" = None

    @property
    def is_literal(self) -> bool:
        return self.attr is None and self.expr is None


@dataclass(eq=False)
class SizeOf:
    """`tensor.shape[dim]`, an int computed in the forward from a tensor that exists there."""

    tensor: "Value"
    dim: int


@dataclass(eq=False)
class IntOp:
    """Python integer arithmetic on shape ints (`a * b`, `a // b`, ...)."""

    op: str
    a: "ShapeInt"
    b: "ShapeInt"


ShapeInt = Union[int, SizeOf, IntOp]


@dataclass(eq=False)
class Value:
    """A tensor; `shapes[c]` is its shape under input config c. Subclasses say how it is computed."""

    shapes: tuple[Shape, ...]
    id: int = field(default=-1, init=False)

    @property
    def rank(self) -> int:
        return len(self.shapes[0])

    def operands(self) -> list["Value"]:
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}#{self.id}{list(self.shapes[0])}"


@dataclass(eq=False, repr=False)
class Input(Value):
    index: int = 0
    name: str = ""
    integer: bool = False                # an int64/int32 tensor: indices, or numbers converted to float32
    boolean: bool = False                # a bool mask: a condition (masked_fill, where, ~), or 0/1 in arithmetic


@dataclass(eq=False, repr=False)
class Param(Value):
    """A parameter or buffer of the module, `self.<path>` in the forward."""

    path: str = ""
    integer: bool = False                # an int64/int32 buffer (position ids, relative position indices),
                                         # read as an integer input is


@dataclass(eq=False, repr=False)
class Pointwise(Value):
    op: str = ""
    args: tuple = ()                     # Value or Scalar
    attrs: dict = field(default_factory=dict)

    def operands(self) -> list[Value]:
        return [a for a in self.args if isinstance(a, Value)]


@dataclass(eq=False, repr=False)
class View(Value):
    """A metadata-only tensor method (`reshape`, `permute`, `__getitem__`, ...) applied in the forward."""

    base: Value | None = None
    method: str = ""
    args: tuple = ()                     # Python literals, ShapeInt, Scalar (attributes), slices
    item: int | None = None              # for methods that return several views (chunk, split): which one

    def operands(self) -> list[Value]:
        return [self.base]


@dataclass(eq=False, repr=False)
class Reduce(Value):
    """Reduction over a run of adjacent dims, keepdim; mean divides by (count - correction)."""

    kind: str = "sum"                    # sum | mean | prod | amax | amin
    base: Value | None = None
    dims: tuple[int, ...] = ()
    correction: int = 0

    def operands(self) -> list[Value]:
        return [self.base]


@dataclass(eq=False, repr=False)
class Matmul(Value):
    """torch.matmul restricted to `a (..., M, K) @ b (K, N)` (rows form) or equal batch dims (batched)."""

    a: Value | None = None
    b: Value | None = None
    batched: bool = False

    def operands(self) -> list[Value]:
        return [self.a, self.b]


@dataclass(eq=False, repr=False)
class Conv(Value):
    x: Value | None = None
    w: Value | None = None
    transposed: bool = False
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    output_padding: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()         # per input config: a subproblem's instances may differ (MobileNet)
    # the module whose stride/padding/dilation the launcher reads at run time, when they differ between
    # input configs (stride, padding and dilation above are then the first config's); None otherwise
    geometry_from: str | None = None

    def operands(self) -> list[Value]:
        return [self.x, self.w]


@dataclass(eq=False, repr=False)
class Pool(Value):
    """Max or average pooling over the trailing `len(kernel)` dims."""

    kind: str = "max"                    # max | avg
    x: Value | None = None
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor: int | None = None

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class PoolIndices(Value):
    """The int64 positions a max `pool` takes its values from (return_indices=True), in `pool`'s shape: each the
    flat position within its (N, C) input plane (l; h * W + w; (d * H + h) * W + w) of the element its window
    keeps. PyTorch's rule: the first of equal values in window order, the last NaN where the window has one, and
    for a window of -inf alone its first position inside the input (padding is never named)."""

    pool: Pool | None = None             # the max pool whose input and window geometry these follow

    def operands(self) -> list[Value]:
        return [self.pool.x]


@dataclass(eq=False, repr=False)
class Unpool(Value):
    """nn.MaxUnpool1d/2d/3d and F.max_unpool*: zeros of the value's shape with each element of `x` written at
    its `indices` entry, a flat position within its (N, C) plane of the trailing `len(scale)` dims.

    The kernel finds the output's pooled sizes from its input's: size[d] = input size[d] * scale[d] + offset[d]
    (PyTorch's (in - 1) * stride - 2 * padding + kernel_size, or the `output_size` given, which lies within a
    stride of it; scale 0 where every input config unpools to one size). Where indices repeat, the last
    element in order writes, as PyTorch's CPU kernel does (its CUDA kernel lets them race); `distinct` says no
    index can repeat (a max pool's, of windows that do not overlap), so the kernel need not check."""

    x: Value | None = None
    indices: Value | None = None
    scale: tuple[int, ...] = ()
    offset: tuple[int, ...] = ()
    distinct: bool = False

    def operands(self) -> list[Value]:
        return [self.x, self.indices]


@dataclass(eq=False, repr=False)
class AdaptivePool(Value):
    """Adaptive max or average pooling of the trailing dims to the value's own trailing sizes."""

    kind: str = "avg"
    x: Value | None = None

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class Attention(Value):
    """normalize(logits) @ v, where logits is an elementwise expression of scores = q @ kt (scale, masks).

    The scores never exist as a tensor: the kernel computes them a block of keys at a time. `extras` are
    the other tensors the logits read (masks); `normalize` is "softmax" (online) or "relu" (no normaliser).
    """

    q: Value | None = None
    kt: Value | None = None              # keys already transposed: (..., D, N)
    v: Value | None = None
    scores: Value | None = None          # the Matmul q @ kt the logits start from
    logits: Value | None = None
    extras: tuple = ()
    normalize: str = "softmax"
    causal: bool = False                 # keys after the query are masked: blocks past the diagonal are skipped
    empty_rows_zero: bool = False        # a query whose keys are all masked gets 0 (SDPA), not NaN (softmax)

    def operands(self) -> list[Value]:
        return [self.q, self.kt, self.v, *self.extras]


@dataclass(eq=False, repr=False)
class Concat(Value):
    """torch.cat: `parts` side by side along `dim`; each part is copied into its slice of the output."""

    parts: tuple = ()
    dim: int = 0

    def operands(self) -> list[Value]:
        return list(self.parts)


@dataclass(eq=False, repr=False)
class Pad(Value):
    """F.pad, the nn.*Pad* layers and a convolution's non-zero padding_mode: `x` with (before, after) elements
    added along each of its last len(`pads`) dims, `pads` in dim order (a negative count crops). The added
    elements are `value` ("constant"), or read from `x` mirrored without its edge ("reflect"), its edge
    repeated ("replicate") or wrapped around ("circular")."""

    x: Value | None = None
    pads: tuple[tuple[int, int], ...] = ()
    mode: str = "constant"
    value: float = 0.0

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class Reindex(Value):
    """A copy whose every output element reads one input element at an index found from its own:
    "flip" (along `dims`), "roll" (along `dims` by `amounts`), "repeat" (tiled `amounts` times, new leading dims
    allowed), "repeat_interleave" (each element along `dims[0]` `amounts[0]` times in a row), "pixel_shuffle" and
    "pixel_unshuffle" (by the factor `amounts[0]`), "unfold" (F.unfold's blocks, `amounts` its kernel size,
    dilation, padding and stride, each (h, w))."""

    x: Value | None = None
    kind: str = "flip"
    dims: tuple[int, ...] = ()
    amounts: tuple[int, ...] = ()

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class Scan(Value):
    """torch.cumsum ("sum") and torch.cumprod ("prod") of `x` along `dim`."""

    x: Value | None = None
    dim: int = 0
    kind: str = "sum"

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class ArgReduce(Value):
    """torch.argmax ("max") and argmin ("min") of `x` along `dim`: int64 positions, the first one on ties and
    the first NaN where there is one, as PyTorch gives them. `shapes` has `dim` kept (size 1) or dropped."""

    x: Value | None = None
    dim: int = 0
    kind: str = "max"

    def operands(self) -> list[Value]:
        return [self.x]


# The longest row a Sort takes: a row is sorted in one program's registers (emit_sort.py), 4096 int64 keys
# being 32 a thread at 4 warps.
MAX_SORT_LENGTH = 4096


class Pick(Enum):
    """The one sorted position of each row a Sort keeps, for the selections that reduce its dim to size 1."""

    KTH = "kth"              # position kth - 1 (torch.kthvalue); NaNs sort last, as in a sort
    MEDIAN = "median"        # the lower median, position (R - 1) // 2, or the row's first NaN where it has one
    NANMEDIAN = "nanmedian"  # the lower median of the row's values that are not NaN (a NaN only if all are)


@dataclass(eq=False, repr=False)
class Sort(Value):
    """torch.sort, argsort, msort and topk of `x` along `dim`: each row's first `k` elements (None: all) in
    ascending or descending order, as values or (`indices`) as their int64 positions. Equal values keep the
    order of their positions and a NaN counts as larger than +inf, as PyTorch's stable sort gives them. Its
    unstable sort and topk may order the positions of equal values otherwise (topk on a CPU does): there a
    kernel's positions differ from PyTorch's and the verifier rejects it; its values are the same.

    With `pick` (kthvalue, median, nanmedian), one ascending position per row (`k` is 1), chosen as Pick says."""

    x: Value | None = None
    dim: int = 0
    k: int | None = None
    descending: bool = False
    indices: bool = False
    pick: Pick | None = None
    kth: int = 1                  # Pick.KTH's k, counted from 1 as torch.kthvalue counts it

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class Resize(Value):
    """F.interpolate and nn.Upsample: `x` resampled along its spatial dims (all dims after the first two) to
    the output's sizes, "nearest", "nearest-exact" or "linear" (bilinear and trilinear: linear along each
    dim). The output's sizes are `size`, or each input size times its `scale_factor`, rounded down; an output
    position maps to an input coordinate through the ratio PyTorch uses (emit_resize.ratio_source), from
    `scale_factor` where there is one (aten.upsample_* may give both)."""

    x: Value | None = None
    mode: str = "nearest"
    align_corners: bool = False
    size: tuple[int, ...] | None = None              # as given, per spatial dim
    scale_factor: tuple[float, ...] | None = None    # as given, per spatial dim
    recompute_scale_factor: bool = False             # the ratio from the sizes even where a factor was given

    def operands(self) -> list[Value]:
        return [self.x]


@dataclass(eq=False, repr=False)
class IndexMask(Value):
    """`ones_like(x)`, or its `.tril(diagonal)` / `.triu(diagonal)`: a value of the last two indices alone.

    Only a fused attention computes it (from its query and key offsets); the causal mask is its use.
    """

    kind: str = "ones"                   # ones | tril | triu
    diagonal: int = 0


@dataclass(eq=False, repr=False)
class Arange(Value):
    """`torch.arange(start, end, step)`. As an embedding's positions `gather` turns it into a slice of the
    table's rows and nothing computes it; read otherwise (a sinusoidal embedding's frequencies), a kernel of
    its own writes it in its dtype."""

    start: object = 0                    # each a number, or a shape int the forward computes
    end: object = 0
    step: object = 1
    dtype: str = "int64"                 # int64 | int32 | float32, as torch.arange gives it


@dataclass(eq=False, repr=False)
class Gather(Value):
    """Elements of `table` along `dim` picked by an integer `index`.

    "slices" (nn.Embedding, index_select): the output is table's shape with `dim` replaced by the index's
    shape. "along" (torch.gather): the output has the index's shape, out[..i..] = table[..index[..i..]..].
    """

    table: Value | None = None
    index: Value | None = None
    dim: int = 0
    mode: str = "slices"
    wraps: bool = False                  # a negative index counts from the end (`table[index]`, as Python's)

    def operands(self) -> list[Value]:
        return [self.table, self.index]


@dataclass(eq=False, repr=False)
class BatchStats(Value):
    """A training-mode batch norm's statistics: per channel (dim 1) of `x`, the mean and the biased variance
    over every other dim, as one tensor of shape (2, *x's shape with every dim but 1 set to 1).

    Where `running` holds the module's running mean and variance, the same kernel moves them toward the
    batch's (`momentum`, unbiased variance) in place: one launch for what would otherwise be two
    reductions and two buffer updates.
    """

    x: Value | None = None
    running: tuple = ()                  # (running_mean, running_var) Params, or () when nothing is updated
    momentum: "Scalar | None" = None

    def operands(self) -> list[Value]:
        return [self.x, *self.running]


class Cell(Enum):
    """The recurrent cells of nn.RNN, nn.LSTM and nn.GRU, by the number of gates in their weights' rows."""

    RNN_TANH = "rnn_tanh"    # h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)
    RNN_RELU = "rnn_relu"    # the same with relu
    LSTM = "lstm"            # gates i, f, g, o; a cell state c beside h
    GRU = "gru"              # gates r, z, n; n's hidden part is scaled by r before it joins the input's

    @property
    def gates(self) -> int:
        return {Cell.LSTM: 4, Cell.GRU: 3}.get(self, 1)


@dataclass(eq=False, repr=False)
class Recurrence(Value):
    """One direction of one layer of nn.RNN, nn.LSTM or nn.GRU over a whole sequence.

    `gates` holds the input's share of every step's gates, x W_ih^T + b_ih, which one GEMM computes for all steps
    before (time along `time_dim`, batch along the other of its first two dims, gates * H last). Each step adds
    h W_hh^T + b_hh and applies the cell, walking time backwards where `reverse`. The value is time-major,
    (T, B, H): the hidden state after each step. An LSTM's has one row more, (T + 1, B, H), whose last row
    holds the cell state after the last step (h_n's partner c_n), so that one buffer carries both states."""

    cell: Cell = Cell.LSTM
    gates: Value | None = None
    w_hh: Value | None = None            # (gates * H, H)
    b_hh: Value | None = None            # (gates * H,), or None (bias=False)
    h0: Value | None = None              # (B, H) before the first step, or None: zeros
    c0: Value | None = None              # an LSTM's cell state before the first step, or None: zeros
    time_dim: int = 0
    reverse: bool = False

    def operands(self) -> list[Value]:
        return [v for v in (self.gates, self.w_hh, self.b_hh, self.h0, self.c0) if v is not None]


@dataclass(frozen=True)
class Assign:
    """A side effect of the forward: write `value` into the buffer `target` (e.g. BatchNorm running stats)."""

    target: Param
    value: Value


@dataclass
class Program:
    """One forward pass, for one module mode (training or eval), in topological order."""

    values: list[Value] = field(default_factory=list)
    outputs: object = None               # a Value, or a (nested) tuple of Values
    assigns: list[Assign] = field(default_factory=list)
    inputs: list[Input] = field(default_factory=list)
    # Assign targets that are plain tensor attributes (neither parameters nor buffers), by path: Module.to
    # leaves those behind, so ModelNew registers them as buffers to find them on its kernels' device.
    plain_attributes: list[str] = field(default_factory=list)
    # Values computed for what they write in place (BatchStats' running statistics): live even when
    # nothing reads them.
    effects: list[Value] = field(default_factory=list)

    def add(self, value: Value) -> Value:
        value.id = len(self.values)
        self.values.append(value)
        return value

    def output_values(self) -> list[Value]:
        return list(_flatten(self.outputs))

    def assigned(self, path: str) -> Value | None:
        """What the forward has written into `self.<path>` so far, or None."""
        return next((a.value for a in self.assigns if a.target.path == path), None)


def _flatten(spec) -> list[Value]:
    if isinstance(spec, (tuple, list)):
        return [v for item in spec for v in _flatten(item)]
    return [spec]


def is_integer(value: Value) -> bool:
    """An integer input or buffer, an integer arange, an argmax/argmin, a sort's or a max pool's positions, or a
    view of one."""
    value = base_of(value)
    return (isinstance(value, (ArgReduce, PoolIndices)) or isinstance(value, Arange) and value.dtype != "float32"
            or isinstance(value, Sort) and value.indices
            or isinstance(value, (Input, Param)) and value.integer)


def base_of(value: Value) -> Value:
    """The tensor a chain of views starts from."""
    while isinstance(value, View):
        value = value.base
    return value


def walk(start: Value, descend: Callable[[Value], bool]) -> Iterator[Value]:
    """`start` and the values it is computed from, each once, depth first; a value's operands are visited only
    where `descend(value)`."""
    stack, seen = [start], set()
    while stack:
        value = stack.pop()
        if value.id in seen:
            continue
        seen.add(value.id)
        yield value
        if descend(value):
            stack.extend(value.operands())


def is_leaf(value: Value) -> bool:
    """A tensor that exists in the forward without a kernel: an input, a parameter, or a view of one; and index
    masks, which the attention kernel that reads them computes from its offsets."""
    if isinstance(value, View):
        return is_leaf(value.base)
    return isinstance(value, (Input, Param, IndexMask))
