"""Every kind of kernel the builtin generator writes, in one table: `KINDS`.

A kind is a kernel template. The plan names each kernel's kind from here (`kind_of_anchor`, `POINTWISE`,
`ROWS`); the generator emits it with the kind's `emit`, picks its variants by `uses_dot` and counts its
FLOPs for the self-check's roofline with `flops`. Nothing else in kernels/ switches on a kind's name.

To add a kind, say a scan (cumsum):

1. IR node: a `Value` subclass in `ir.py` holding what the kernel needs (operands, dims, attributes), with
   `operands()` listing the tensors it reads.
2. Handler: a function in `handlers_math.py` (elementwise and reductions) or `handlers_layers.py` (layers,
   data movement), registered in that module's `FUNCTIONS` (torch functions and Tensor methods, by name)
   or `MODULES` (nn.Module classes), that checks the traced call's arguments and adds the node with
   `b.program.add(...)` (or a `Builder` method in `builders.py`, where several handlers build it).
3. Its place in the plan: nothing to write for a kernel built around one such node. Give the kind an
   `anchor` below: `plan.py` then makes the node's operands real tensors and the node a kernel's anchor,
   the elementwise values after it fused as its epilogue where `takes_epilogue` is set (GEMMs,
   convolutions, pooling; not attention, cat or gathers, whose templates write their result as is).
   Only a kind without an anchor node (like `rows`, formed around reductions) needs a branch in
   `plan._visit`.
4. Emitter: `emit_<kind>.py` with `emit_<kind>(kernel, name, variant, program) -> KernelSource`; start from
   `emit_pointwise.py` (flat blocks) or `emit_matmul.py` (tiles). Its kernel signature is a list of
   `signature.KernelParam`, one line and one comment each.
5. Registry entry: a `KernelKind` in `KINDS` below, with `uses_dot` when the template calls tl.dot (the
   variants then include tf32x3) and `flops` when its work is more than a few operations per element.

tests/test_builtin_registry.py then checks that the plan's kinds and ir.py's nodes are all registered;
add a subproblem to tests/subproblems/ so that tests/test_builtin_kernels.py runs the new kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .configs import Variant
from .emit_arange import emit_arange
from .emit_arg_reduce import emit_arg_reduce
from .emit_attention import attention_flops, emit_attention
from .emit_batch_stats import emit_batch_stats
from .emit_common import KernelSource
from .emit_concat import emit_concat, emit_gather, emit_pad, emit_reindex
from .emit_conv import conv_flops, conv_uses_dot, emit_conv
from .emit_matmul import emit_matmul, matmul_flops
from .emit_pointwise import emit_pointwise
from .emit_pool import emit_adaptive_pool, emit_pool, emit_pool_indices
from .emit_recurrence import emit_recurrence, recurrence_flops
from .emit_resize import emit_resize
from .emit_rows import emit_rows
from .emit_scan import emit_scan
from .emit_sort import emit_sort
from .emit_unpool import emit_unpool
from .emit_winograd import emit_winograd, winograd_fits
from .ir import (AdaptivePool, Arange, ArgReduce, Attention, BatchStats, Concat, Conv, Gather, Matmul, Pad, Pool,
                 PoolIndices, Program, Recurrence, Reindex, Resize, Scan, Sort, Unpool, Value)
from .kernel_plan import KernelPlan

Emitter = Callable[[KernelPlan, str, Variant, Program], KernelSource]


def _never(anchor: Value | None) -> bool:
    return False


def _always(anchor: Value | None) -> bool:
    return True


def _no_flops(anchor: Value | None, config: int) -> int:
    return 0


def _emit_conv(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    """A Winograd variant's stride-1 convolutions by transforms; every other convolution by emit_conv."""
    if variant.winograd and winograd_fits(kernel.anchor):
        return emit_winograd(kernel, name, variant, program)
    return emit_conv(kernel, name, variant, program)


def _winograd_conv(anchor: Value | None) -> bool:
    return isinstance(anchor, Conv) and winograd_fits(anchor)


@dataclass(frozen=True)
class KernelKind:
    """One kernel template and what the plan and the generator need to know about it."""

    name: str                  # KernelPlan.kind, and the stem of kernel names in the file (_matmul_kernel_0)
    emit: Emitter              # writes the kernel and its launcher
    anchor: type[Value] | None = None   # the IR node each kernel of this kind is built around (None:
                                        # pointwise and rows, formed around elementwise values and reductions)
    takes_epilogue: bool = False        # an anchor met inside an elementwise kernel becomes that kernel's
                                        # anchor, the elementwise values after it its epilogue
    uses_dot: Callable[[Value | None], bool] = _never    # the anchor's code calls tl.dot: precision variants
    flops: Callable[[Value | None, int], int] = _no_flops  # the anchor's FLOPs under input config c (2 per
                                                          # multiply-add); elementwise work is not counted
    winograd: Callable[[Value | None], bool] = _never    # a Winograd variant emits the anchor otherwise

    def kernel_uses_dot(self, kernel: KernelPlan) -> bool:
        return self.uses_dot(kernel.anchor)

    def kernel_flops(self, kernel: KernelPlan, config: int) -> int:
        return self.flops(kernel.anchor, config) if kernel.anchor is not None else 0


POINTWISE = KernelKind("pointwise", emit_pointwise)
ROWS = KernelKind("rows", emit_rows)

KINDS: tuple[KernelKind, ...] = (
    POINTWISE,
    ROWS,
    KernelKind("matmul", emit_matmul, Matmul, takes_epilogue=True, uses_dot=_always, flops=matmul_flops),
    # the implicit-GEMM template calls tl.dot; direct and outer-product convolutions do not
    KernelKind("conv", _emit_conv, Conv, takes_epilogue=True, uses_dot=conv_uses_dot, flops=conv_flops,
               winograd=_winograd_conv),
    KernelKind("pool", emit_pool, Pool, takes_epilogue=True),
    # a max pool's int64 positions (return_indices=True): nothing elementwise applies to them
    KernelKind("pool_indices", emit_pool_indices, PoolIndices),
    KernelKind("adaptive_pool", emit_adaptive_pool, AdaptivePool, takes_epilogue=True),
    KernelKind("attention", emit_attention, Attention, uses_dot=_always, flops=attention_flops),
    KernelKind("concat", emit_concat, Concat),
    KernelKind("gather", emit_gather, Gather),
    KernelKind("unpool", emit_unpool, Unpool),
    KernelKind("pad", emit_pad, Pad),
    KernelKind("resize", emit_resize, Resize),
    KernelKind("reindex", emit_reindex, Reindex),
    KernelKind("scan", emit_scan, Scan),
    KernelKind("arg_reduce", emit_arg_reduce, ArgReduce),
    KernelKind("sort", emit_sort, Sort),
    KernelKind("arange", emit_arange, Arange),
    KernelKind("batch_stats", emit_batch_stats, BatchStats),
    # one step of an RNN/LSTM/GRU layer a launch: h W_hh^T by tl.dot, then the cell
    KernelKind("recurrence", emit_recurrence, Recurrence, uses_dot=_always, flops=recurrence_flops),
)

_BY_NAME = {kind.name: kind for kind in KINDS}
_BY_ANCHOR = {kind.anchor: kind for kind in KINDS if kind.anchor is not None}

# The IR nodes that start a kernel of their own: GEMM, convolution, pooling (and a max pool's positions), attention,
# cat, gathers, max unpooling, padding, interpolation, reordering copies, scans, argmax/argmin, sorts, aranges read as
# numbers, a training-mode batch norm's statistics and recurrent layers' steps.
ANCHOR_TYPES: tuple[type[Value], ...] = tuple(_BY_ANCHOR)


def kind_named(name: str) -> KernelKind:
    return _BY_NAME[name]


def kind_of(kernel: KernelPlan) -> KernelKind:
    return _BY_NAME[kernel.kind]


def kind_of_anchor(value: Value) -> KernelKind:
    return _BY_ANCHOR[type(value)]


__all__ = ["ANCHOR_TYPES", "KINDS", "POINTWISE", "ROWS", "KernelKind", "kind_named", "kind_of", "kind_of_anchor"]
