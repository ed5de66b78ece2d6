"""Data movement kernels: torch.cat (one copy launch per part), gathers (nn.Embedding, index_select,
torch.gather), padding (F.pad, the nn.*Pad* layers) and reordering copies (flip, roll, repeat, pixel shuffle)."""

from __future__ import annotations

from .configs import Variant
from .emit_common import (KernelSource, LauncherArg, flat_autotune, flat_launch, flat_launcher, indent,
                          make_operands, output_param, unravel_lines, unravel_params)
from .errors import UnsupportedSubproblem
from .ir import Concat, Gather, Pad, Program, Reindex
from .kernel_plan import KernelPlan
from .pointwise_ops import literal
from .signature import KernelParam, constexpr, signature

# out[o, start + l, i] = part[o, l, i]: one launch per part.
_CONCAT_PARAMS = [
    KernelParam("src_ptr", "part [outer, length, inner], read through its strides"),
    KernelParam("out_ptr", "output [outer, total, inner], contiguous"),
    KernelParam("start", "first output row of this part along the cat dim"),
    KernelParam("numel", "part elements"),
    KernelParam("length", "part size along the cat dim"),
    KernelParam("inner", "elements after the cat dim"),
    KernelParam("total", "output size along the cat dim"),
    KernelParam("stride_o", "part stride over outer"),
    KernelParam("stride_l", "part stride along the cat dim"),
    KernelParam("stride_i", "part stride over inner"),
    constexpr("BLOCK", "part elements per program"),
]


def emit_concat(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Concat = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("cat written into a module buffer")
    operands = make_operands(kernel.leaves)
    parts = [operands[p.id].name for p in anchor.parts]
    decorator = flat_autotune(variant)
    source = f'''{decorator}@triton.jit
{signature(name, _CONCAT_PARAMS)}
    # Copy one part, seen as (outer, length, inner), into rows [start, start + length) of the
    # (outer, total, inner) output. The part is read through its strides (an expand or transpose is not
    # copied first); the output is written contiguously.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i = offs % inner
    row = offs // inner
    l = row % length
    o = row // length
    x = tl.load(src_ptr + o * stride_o + l * stride_l + i * stride_i, mask=mask)
    tl.store(out_ptr + (o * total + start + l) * inner + i, x, mask=mask)
'''
    dim = anchor.dim
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    call = f"{name}[grid](src, out, start, numel, length, inner, total, *src.stride()"
    launch = flat_launch(call, variant)
    lines = [f"parts = ({', '.join(parts)},)",
             f"total = sum(p.shape[{dim}] for p in parts)",
             f"out = torch.empty((*parts[0].shape[:{dim}], total, *parts[0].shape[{dim + 1}:]), "
             f"device=parts[0].device, dtype=torch.float32)",
             f"outer, inner = out.shape[:{dim}].numel(), out.shape[{dim + 1}:].numel()",
             "start = 0",
             "for part in parts:",
             f"    length = part.shape[{dim}]",
             "    numel = part.numel()",
             "    if numel:",
             "        # a view when the part's dims allow it; dims that cannot merge are copied by reshape",
             "        src = part.reshape(outer, length, inner)",
             *("        " + line for line in launch),
             "    start += length",
             "return out"]
    launcher = f'''def {name}_launch({", ".join(a.name for a in tensor_args)}):
{indent(lines, 4)}
'''
    return KernelSource(source, launcher, f"{name}_launch", tensor_args, False,
                        description=f"cat of {len(parts)} parts along dim {dim}")


def emit_gather(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    """nn.Embedding, index_select and `table[index]`: out[o, j, i] = table[o, index[j], i], one flat output
    block per program. An index outside the table reads 0: a loss's ignore_index (-100) is such an index, and
    nothing outside the table is ever read; `table[index]` first counts a negative index from the end."""
    anchor: Gather = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("embedding written into a module buffer")
    if anchor.mode == "along":
        return emit_take_along(kernel, name, variant)
    operands = make_operands(kernel.leaves)
    table, index = operands[anchor.table.id].name, operands[anchor.index.id].name
    dim = anchor.dim
    decorator = flat_autotune(variant)
    wrap = "\n    picked = tl.where(picked < 0, picked + rows, picked)  # from the end" if anchor.wraps else ""
    params = [operands[anchor.table.id].pointer("table [outer, rows, inner]", "table_ptr"),
              operands[anchor.index.id].pointer("indices [picks], read flat", "index_ptr"),
              output_param(kernel, "output [outer, picks, inner], contiguous"),
              KernelParam("numel", "output elements"), KernelParam("picks", "number of indices"),
              KernelParam("inner", "elements after the picked dim"), KernelParam("rows", "table size along it"),
              KernelParam("stride_o", "table stride over outer"),
              KernelParam("stride_l", "table stride along the picked dim"),
              KernelParam("stride_i", "table stride over inner"), constexpr("BLOCK", "output elements per program")]
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # The table seen as (outer, rows, inner): output element (o, j, i) copies table[o, index[j], i].
    # Consecutive programs read consecutive indices, so each picked row is read as one contiguous run.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i = offs % inner
    row = offs // inner
    j = row % picks
    o = row // picks
    picked = tl.load(index_ptr + j, mask=mask, other=0).to(tl.int64){wrap}
    inside = mask & (picked >= 0) & (picked < rows)
    x = tl.load(table_ptr + o * stride_o + picked * stride_l + i * stride_i, mask=inside, other=0.0)
    tl.store(out_ptr + offs, x, mask=mask)
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    call = f"{name}[grid](src, flat_index, out, numel, flat_index.numel(), inner, src.shape[1], *src.stride()"
    launch = flat_launch(call, variant)
    lines = [f"out = torch.empty((*{table}.shape[:{dim}], *{index}.shape, *{table}.shape[{dim + 1}:]), "
             f"device={table}.device, dtype=torch.float32)",
             f"outer, inner = {table}.shape[:{dim}].numel(), {table}.shape[{dim + 1}:].numel()",
             f"src = {table}.reshape(outer, {table}.shape[{dim}], inner)",
             f"flat_index = {index}.reshape(-1)",
             "numel = out.numel()",
             "if numel:",
             *("    " + line for line in launch),
             "return out"]
    launcher = f'''def {name}_launch({", ".join(a.name for a in tensor_args)}):
{indent(lines, 4)}
'''
    what = "embedding lookup" if dim == 0 and anchor.table.rank == 2 else f"index_select along dim {dim}"
    return KernelSource(source, launcher, f"{name}_launch", tensor_args, False, description=what)


def emit_take_along(kernel: KernelPlan, name: str, variant: Variant) -> KernelSource:
    """torch.gather: each output position reads its index, then the input at that index along `dim` (0 for
    an index outside the input, as in `emit_gather`)."""
    anchor: Gather = kernel.anchor
    operands = make_operands(kernel.leaves)
    table, index = operands[anchor.table.id].name, operands[anchor.index.id].name
    rank, dim = anchor.rank, anchor.dim
    sizes = [f"n{d}" for d in range(1, rank)]
    index_strides, table_strides = [f"is{d}" for d in range(rank)], [f"ts{d}" for d in range(rank)]
    at_index = " + ".join(f"i{d} * is{d}" for d in range(rank))
    at_table = " + ".join(("picked" if d == dim else f"i{d}") + f" * ts{d}" for d in range(rank))
    decorator = flat_autotune(variant)
    params = ([operands[anchor.table.id].pointer("table", "table_ptr"),
               operands[anchor.index.id].pointer("indices", "index_ptr"),
               output_param(kernel, "output, the indices' shape, contiguous"),
               KernelParam("numel", "output elements"), KernelParam("rows", f"table size along dim {dim}")]
              + [constexpr(n, f"index size along dim {n[1:]}") for n in sizes]
              + [KernelParam(n, f"index stride along dim {n[2:]}") for n in index_strides]
              + [KernelParam(n, f"table stride along dim {n[2:]}") for n in table_strides]
              + [constexpr("BLOCK", "output elements per program")])
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # out[i] = table[i with dim {dim} replaced by index[i]]: the output has the index's shape, so its
    # flat position unravels into the index's coordinates (sizes constexpr: div/mod become shifts).
{indent(unravel_lines(rank), 4)}
    picked = tl.load(index_ptr + {at_index}, mask=mask, other=0).to(tl.int64)
    inside = mask & (picked >= 0) & (picked < rows)
    x = tl.load(table_ptr + {at_table}, mask=inside, other=0.0)
    tl.store(out_ptr + offs, x, mask=mask)
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    call = (f"{name}[grid]({table}, {index}, out, numel, {table}.shape[{dim}], *{index}.shape[1:], "
            f"*{index}.stride(), *{table}.stride()")
    launcher = flat_launcher(name, [a.name for a in tensor_args],
                             [f"out = torch.empty({index}.shape, device={table}.device, dtype=torch.float32)"],
                             call, variant)
    return KernelSource(source, launcher, f"{name}_launch", tensor_args, False, description=f"gather along dim {dim}")


# How each mode finds the input index {j} of an output position that falls outside the input (size {D}):
# F.pad's modes, for pads smaller than the dim (PyTorch's own limit for reflect and circular).
_PAD_INDEX = {
    "constant": [],                                            # outside: the mask, and the fill value
    "reflect": ["{j} = tl.where({j} < 0, -{j}, {j})", "{j} = tl.where({j} >= {D}, 2 * {D} - 2 - {j}, {j})"],
    "replicate": ["{j} = tl.minimum(tl.maximum({j}, 0), {D} - 1)"],
    "circular": ["{j} = tl.where({j} < 0, {j} + {D}, tl.where({j} >= {D}, {j} - {D}, {j}))"],
}
_PAD_MEANING = {"constant": "outside the input, the fill value", "reflect": "mirrored at the edges, without them",
                "replicate": "the edge repeated", "circular": "wrapped around"}


def emit_pad(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    """F.pad: each output position reads the input at its position less the pad before it, along each padded
    dim; outside the input, at the mode's index (or, constant, the fill value)."""
    anchor: Pad = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("padding written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    rank, first = anchor.rank, anchor.rank - len(anchor.pads)
    padded = range(first, rank)
    index, inside = [], []
    for d, (before, _) in zip(padded, anchor.pads):
        index.append(f"j{d} = i{d}" + (f" - {before}" if before > 0 else f" + {-before}" if before < 0 else ""))
        index += [line.format(j=f"j{d}", D=f"D{d}") for line in _PAD_INDEX[anchor.mode]]
        inside.append(f"(j{d} >= 0) & (j{d} < D{d})")
    at = " + ".join((f"j{d}" if d >= first else f"i{d}") + f" * s{d}" for d in range(rank))
    mask = "mask & " + " & ".join(inside) if anchor.mode == "constant" else "mask"
    decorator = flat_autotune(variant)
    params = unravel_params(x, kernel, rank, [constexpr(f"D{d}", f"input size along padded dim {d}") for d in padded],
                            range(rank))
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # {anchor.mode} padding of {_dims_text(padded)}: output position i reads the input at i less the
    # pad before it ({_PAD_MEANING[anchor.mode]}). Sizes are constexpr: the div/mod become shifts.
{indent(unravel_lines(rank) + index, 4)}
    x = tl.load(x_ptr + {at}, mask={mask}, other={literal(anchor.value)})
    tl.store(out_ptr + offs, x, mask=mask)
'''
    sizes = "".join(f"{x.name}.shape[{d}] + {lo + hi}, " for d, (lo, hi) in zip(padded, anchor.pads))
    call = (f"{name}[grid]({x.name}, out, numel, *out.shape[1:], "
            + "".join(f"{x.name}.shape[{d}], " for d in padded) + f"*{x.name}.stride()")
    launcher = flat_launcher(name, [x.name], [f"out = torch.empty((*{x.name}.shape[:{first}], {sizes}), "
                                              f"device={x.name}.device, dtype=torch.float32)"], call, variant)
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x)], False,
                        description=f"{anchor.mode} pad of {_dims_text(padded)}")


def _reindex_lines(anchor: Reindex) -> list[str]:
    """Kernel lines giving the input index j{d} of each input dim from the output indices i{d}."""
    rank_in, lead = anchor.x.rank, anchor.rank - anchor.x.rank
    if anchor.kind == "flip":
        return [f"j{d} = D{d} - 1 - i{d}" if d in anchor.dims else f"j{d} = i{d}" for d in range(rank_in)]
    if anchor.kind == "roll":
        lines = [f"j{d} = i{d}" for d in range(rank_in) if d not in anchor.dims]
        for d in anchor.dims:     # k{d}: the shift along d, in [0, D{d}) (the launcher takes it modulo the size)
            lines += [f"j{d} = i{d} - k{d}", f"j{d} = tl.where(j{d} < 0, j{d} + D{d}, j{d})"]
        return lines
    if anchor.kind == "repeat":
        return [f"j{d} = i{d + lead} % D{d}" for d in range(rank_in)]
    if anchor.kind == "repeat_interleave":
        r = anchor.amounts[0]
        return [f"j{d} = i{d} // {r}" if d in anchor.dims else f"j{d} = i{d}" for d in range(rank_in)]
    if anchor.kind == "unfold":
        return _unfold_lines(anchor)
    r, (c, h, w) = anchor.amounts[0], range(rank_in - 3, rank_in)
    lines = [f"j{d} = i{d}" for d in range(rank_in - 3)]
    if anchor.kind == "pixel_shuffle":   # output (c, h, w) reads channel c*r*r + (h % r)*r + w % r at (h // r, w // r)
        return lines + [f"j{c} = i{c} * {r * r} + (i{h} % {r}) * {r} + i{w} % {r}", f"j{h} = i{h} // {r}",
                        f"j{w} = i{w} // {r}"]
    return lines + [f"j{c} = i{c} // {r * r}", f"j{h} = i{h} * {r} + (i{c} // {r}) % {r}",   # pixel_unshuffle
                    f"j{w} = i{w} * {r} + i{c} % {r}"]


def _unfold_lines(anchor: Reindex) -> list[str]:
    """F.unfold: output (.., column, block) reads channel column // (kh kw) at the block's corner plus the
    column's tap; taps in the padding read nothing (`inside`, the load's extra mask) and give 0."""
    kh, kw, dh, dw, ph, pw, sh, sw = anchor.amounts
    lead = anchor.x.rank - 3
    col, block = lead, lead + 1
    c, h, w = range(lead, lead + 3)
    return ([f"j{d} = i{d}" for d in range(lead)]
            + [f"blocks_w = {_blocks(f'D{w}', kw, dw, pw, sw)}  # blocks along the width",
               f"tap = i{col} % {kh * kw}",
               f"j{c} = i{col} // {kh * kw}",
               f"j{h} = (i{block} // blocks_w) * {sh} + (tap // {kw}) * {dh} - {ph}",
               f"j{w} = (i{block} % blocks_w) * {sw} + (tap % {kw}) * {dw} - {pw}",
               f"inside = (j{h} >= 0) & (j{h} < D{h}) & (j{w} >= 0) & (j{w} < D{w})",
               f"j{h} = tl.where(inside, j{h}, 0)",
               f"j{w} = tl.where(inside, j{w}, 0)"])


def _blocks(size: str, kernel: int, dilation: int, padding: int, stride: int) -> str:
    """Source of the number of unfold blocks along a dim of `size` elements, written out: the kernel computes it
    too, where geometry.sliding_windows (a Python function) cannot be called."""
    offset = 2 * padding - dilation * (kernel - 1) - 1
    shift = f" + {offset}" if offset > 0 else f" - {-offset}" if offset < 0 else ""
    return f"({size}{shift}) // {stride} + 1"


def _reindex_out_shape(anchor: Reindex, x: str) -> str:
    """Python source of the output's shape, from the input's."""
    if anchor.kind in ("flip", "roll"):
        return f"{x}.shape"
    if anchor.kind == "repeat":
        lead = anchor.rank - anchor.x.rank
        return ("(" + "".join(f"{t}, " for t in anchor.amounts[:lead])
                + "".join(f"{x}.shape[{d}] * {t}, " for d, t in enumerate(anchor.amounts[lead:])) + ")")
    if anchor.kind == "unfold":
        kh, kw, dh, dw, ph, pw, sh, sw = anchor.amounts
        blocks = f"({_blocks(f'{x}.shape[-2]', kh, dh, ph, sh)}) * ({_blocks(f'{x}.shape[-1]', kw, dw, pw, sw)})"
        return f"(*{x}.shape[:-3], {x}.shape[-3] * {kh * kw}, {blocks})"
    r = anchor.amounts[0]
    if anchor.kind == "repeat_interleave":
        return "(" + "".join(f"{x}.shape[{d}]{f' * {r}' if d in anchor.dims else ''}, "
                             for d in range(anchor.rank)) + ")"
    if anchor.kind == "pixel_shuffle":
        return f"(*{x}.shape[:-3], {x}.shape[-3] // {r * r}, {x}.shape[-2] * {r}, {x}.shape[-1] * {r})"
    return f"(*{x}.shape[:-3], {x}.shape[-3] * {r * r}, {x}.shape[-2] // {r}, {x}.shape[-1] // {r})"


_REINDEX_MEANING = {"flip": "reversed along dims {dims}", "roll": "rolled along dims {dims}",
                    "repeat": "tiled {amounts} times", "repeat_interleave": "each element repeated {r[0]} times "
                    "along dim {dims[0]}", "pixel_shuffle": "pixel shuffle by {r[0]}",
                    "pixel_unshuffle": "pixel unshuffle by {r[0]}",
                    "unfold": "im2col: {amounts[0]}x{amounts[1]} blocks, dilation {amounts[2]}x{amounts[3]}, "
                    "padding {amounts[4]}x{amounts[5]}, stride {amounts[6]}x{amounts[7]}"}


def emit_reindex(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    """flip, roll, repeat, repeat_interleave and pixel (un)shuffle: each output element copies the input element
    at the index its own maps to (`_reindex_lines`)."""
    anchor: Reindex = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem(f"{anchor.kind} written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    rank, rank_in = anchor.rank, anchor.x.rank
    rolled = anchor.dims if anchor.kind == "roll" else ()
    what = _REINDEX_MEANING[anchor.kind].format(dims=anchor.dims, amounts=anchor.amounts, r=anchor.amounts[:1])
    decorator = flat_autotune(variant)
    sizes = [constexpr(f"D{d}", f"input size along dim {d}") for d in range(rank_in)]
    shifts = [KernelParam(f"k{d}", f"shift along dim {d}, in [0, D{d})") for d in rolled]
    params = unravel_params(x, kernel, rank, sizes + shifts, range(rank_in))
    at = " + ".join(f"j{d} * s{d}" for d in range(rank_in))
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # A copy, {what}: output element i reads the input at the index j its own maps to.
{indent(unravel_lines(rank) + _reindex_lines(anchor), 4)}
    y = tl.load(x_ptr + {at}, mask={"mask & inside, other=0.0" if anchor.kind == "unfold" else "mask"})
    tl.store(out_ptr + offs, y, mask=mask)
'''
    shifts = "".join(f"{k} % {x.name}.shape[{d}], " for d, k in zip(rolled, anchor.amounts))
    call = f"{name}[grid]({x.name}, out, numel, *out.shape[1:], *{x.name}.shape, {shifts}*{x.name}.stride()"
    out = f"out = torch.empty({_reindex_out_shape(anchor, x.name)}, device={x.name}.device, dtype=torch.float32)"
    return KernelSource(source, flat_launcher(name, [x.name], [out], call, variant), f"{name}_launch",
                        [LauncherArg(x.name, value=anchor.x)], False, description=what)


def _dims_text(dims: range) -> str:
    return f"dim {dims[0]}" if len(dims) == 1 else f"dims {dims[0]} to {dims[-1]}"
