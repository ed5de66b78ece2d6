"""Sort kernels: torch.sort, argsort, msort and topk along one dim, as values or as int64 positions.

The input is seen as (O, R, I): O outer positions, R along the sorted dim, I inner positions. A program owns
one outer position and BLOCK_I inner ones, and holds their whole rows (BLOCK_R >= R) as a [BLOCK_I, BLOCK_R]
tile of int64 keys that tl.sort orders along R:

    key = (the value's bits as an order-keeping int32) << 32 | its position

so equal values keep the order of their positions (a stable sort), and a value is read back by its position,
exactly (-0.0 stays -0.0). NaNs get the largest int32, above +inf, where PyTorch puts them; a descending sort
flips the value's half of the key (~v), not the position's. K keys of each row are written from position
`first`: 0 for a sort or topk; for kthvalue and the medians (K = 1) the position they pick (`_first_lines`).
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, indent, make_operands
from .emit_scan import along_dim_params, along_dim_view_lines
from .errors import UnsupportedSubproblem
from .ir import MAX_SORT_LENGTH, Pick, Program, Sort
from .kernel_plan import KernelPlan
from .signature import KernelParam, signature


def emit_sort(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Sort = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("a sort written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    what = "int64 positions" if anchor.indices else "values"
    params = along_dim_params(x, kernel, f"output [O, K, I], K sorted {what} of each row, contiguous",
                              "sorted")
    params.insert(3, KernelParam("K", "elements kept per row: R, topk's k, or 1 (kthvalue, median)"))
    flip = ["order = ~order  # descending: larger values first, positions still in order"] if anchor.descending \
        else []
    # every NaN above +inf, as a sort places it; first for a median, whose answer is a row's first NaN
    nan_order = ("-0x80000000", "first") if anchor.pick is Pick.MEDIAN else ("0x7FFFFFFF", "above +inf")
    written = "at.to(tl.int64)" if anchor.indices else "tl.load(row + at.to(tl.int64) * stride_r, mask=keep)"
    body = [
        "o = tl.program_id(0).to(tl.int64)",
        "i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)",
        "r = tl.arange(0, BLOCK_R)  # the whole row: BLOCK_R >= R",
        "mask = (i[:, None] < I) & (r[None, :] < R)",
        "row = x_ptr + o * stride_o + i[:, None].to(tl.int64) * stride_i",
        "x = tl.load(row + r[None, :].to(tl.int64) * stride_r, mask=mask, other=0.0)",
        "bits = (x + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 sorts as 0.0 does",
        "order = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats' bits reversed: float order as int order",
        f"order = tl.where(x != x, {nan_order[0]}, order)  # every NaN {nan_order[1]}",
        *flip,
        "key = (order.to(tl.int64) << 32) | r[None, :].to(tl.int64)",
        "key = tl.where(mask, key, 0x7FFFFFFFFFFFFFFF)  # lanes past R sort last",
        "key = tl.sort(key, dim=1)",
        "at = key.to(tl.int32)  # the low 32 bits: each sorted element's position in its row",
        *_first_lines(anchor),
        "keep = mask & (r[None, :] >= first) & (r[None, :] < first + K)  # first + K <= R",
        f"tl.store(out_ptr + (o * K + r[None, :] - first) * I + i[:, None], {written}, mask=keep)",
    ]
    order = "descending" if anchor.descending else "ascending"
    source = f'''@triton.jit
{signature(name, params)}
    # Sort along R of an (O, R, I) view, {order}: one outer position and BLOCK_I whole rows per program, each
    # element a key of its value's order and its position, sorted in registers; K written from position first.
{indent(body, 4)}
'''
    dim = anchor.dim
    kept = "length" if anchor.k is None else str(anchor.k)
    lines = along_dim_view_lines(x.name, dim) + [
        f"kept = {kept}",
        f"out = torch.empty((*{x.name}.shape[:{dim}], kept, *{x.name}.shape[{dim + 1}:]), device={x.name}.device, "
        f"dtype={'torch.int64' if anchor.indices else 'torch.float32'})",
        "if out.numel():",
        "    block_r = _next_power_of_2(length)",
        f"    block_i = max(1, min(_next_power_of_2(inner), {MAX_SORT_LENGTH} // block_r))",
        f"    {name}[(outer, _cdiv(inner, block_i))](src, out, length, kept, inner, *src.stride(), "
        "BLOCK_R=block_r, BLOCK_I=block_i, num_warps=4)",
        "return out"]
    launcher = f"def {name}_launch({x.name}):\n{indent(lines, 4)}\n"
    if anchor.pick is not None:
        picked = f"kthvalue (k={anchor.kth})" if anchor.pick is Pick.KTH else anchor.pick.value
        description = f"{picked} along dim {dim}, by sorting ({what})"
    else:
        k_text = "" if anchor.k is None else f", first {anchor.k}"
        description = f"{order} sort along dim {dim}{k_text} ({what})"
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x)], False,
                        description=description)


def _first_lines(anchor: Sort) -> list[str]:
    """Kernel lines setting `first`, the first sorted position of each row written: a number, or one per row
    ([BLOCK_I, 1]) where it depends on the row's NaNs."""
    if anchor.pick is None:
        return ["first = 0  # a sort or topk: each row from its start"]
    if anchor.pick is Pick.KTH:
        return [f"first = {anchor.kth - 1}"]
    nans = "nans = tl.sum(tl.where(mask & (x != x), 1, 0), axis=1)[:, None]"
    if anchor.pick is Pick.MEDIAN:
        return [nans, "first = tl.where(nans > 0, 0, (R - 1) // 2)  # with a NaN, the first: it sorted first"]
    return [nans, "first = tl.maximum((R - nans - 1) // 2, 0)  # the R - nans numbers sort first; all NaN: 0"]
