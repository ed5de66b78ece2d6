"""Row kernels: reductions (softmax, norms, sum/mean/max...) with their elementwise prologue and epilogue.

The reduced tensor is seen as (O, R, I): O outer positions, R reduced, I inner positions. A program owns
one outer position and BLOCK_I inner ones, and runs the reductions in dependency order. Rows that fit in
one block are loaded once ("single" kernel); longer rows are walked in BLOCK_R chunks, once per
reduction and once more for a full-size output ("looped" kernel). Values that do not vary along the row
(the reductions, per-row parameters) are computed once per program, outside the loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import Variant
from .emit_common import (helper_sources, ExprEmitter, KernelSource, LauncherArg, Region, ScalarArgs, body_leaves, describe_body,
                          indent, make_operands)
from .indexing import GroupIndices, Indexer, Space
from .ir import Program, Reduce, Value
from .plan import KernelPlan

_INIT = {"sum": "0.0", "mean": "0.0", "amax": '-float("inf")', "amin": 'float("inf")'}
_FINAL = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}


def _combine(kind: str, acc: str, value: str) -> str:
    if kind in ("sum", "mean"):
        return f"{acc} + {value}"
    return f"tl.{'maximum' if kind == 'amax' else 'minimum'}({acc}, {value})"


@dataclass
class _Layout:
    """Where the tile's axes are: 1-d tiles when nothing follows the reduced dims, else [BLOCK_R, BLOCK_I]."""

    inner: bool

    def r(self) -> str:
        return "r[:, None]" if self.inner else "r"

    def i(self) -> str:
        return "i[None, :]"

    def row_mask(self) -> str:
        return "(r[:, None] < R) & imask[None, :]" if self.inner else "r < R"

    def spread(self, name: str) -> str:
        """A per-row value (scalar, or [BLOCK_I]) used in a full tile."""
        return f"{name}[None, :]" if self.inner else name

    def tile(self) -> str:
        return "[BLOCK_R, BLOCK_I]" if self.inner else "[BLOCK_R]"


class _RowEmitter(ExprEmitter):
    """Hoists row-invariant values out of the row loops into the per-program region."""

    def __init__(self, *args, dims: tuple[int, ...], rank: int, configs: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.dims, self.rank, self.configs = dims, rank, configs
        self.per_row: Region | None = None
        self.layout: _Layout | None = None

    def invariant(self, value: Value) -> bool:
        lead = self.rank - value.rank
        return all(d - lead < 0 or shape[d - lead] == 1 for shape in value.shapes for d in self.dims)

    def value(self, value: Value, region: Region) -> str:
        if region is not self.per_row and self.invariant(value):
            return self.layout.spread(super().value(value, self.per_row))
        return super().value(value, region)


def emit_rows(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    row = kernel.row
    rank = len(row.shapes[0])
    first, last = row.dims[0], row.dims[-1]
    inner_dims = tuple(range(last + 1, rank))
    layout = _Layout(inner=any(s[d] != 1 for s in row.shapes for d in inner_dims))
    leaves = body_leaves(kernel, program)
    operands = make_operands(leaves)
    spaces = [Space("outer", tuple(range(first))), Space("reduced", row.dims), Space("inner", inner_dims)]
    indexer = Indexer(row.shapes, spaces, list(operands.values()))
    ops = describe_body(kernel, program.values)
    kinds = "+".join(dict.fromkeys(r.kind for r in kernel.reductions))
    output = "full rows" if kernel.full_space else "reduced"

    scalars = ScalarArgs()
    single = _emit_body(kernel, indexer, operands, layout, scalars, looped=False)
    looped = _emit_body(kernel, indexer, operands, layout, scalars, looped=True)
    params = (["out_ptr"] + [f"{o.name}_ptr" for o in operands.values()] + ["R", "I"] + indexer.kernel_params()
              + [n for n, _ in scalars.params] + ["BLOCK_R: tl.constexpr", "BLOCK_I: tl.constexpr"])
    sources = [_kernel_source(name, params, layout, single.lines, looped=False),
               _kernel_source(f"{name}_looped", params, layout, looped.lines, looped=True)]
    helpers = helper_sources(single.helpers | looped.helpers)
    helpers["_row_warps"] = ROW_WARPS_HELPER
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    launcher = _launcher(name, kernel, indexer, tensor_args, scalar_args, layout, variant, row.dims)
    description = f"row reduction {kinds} ({output}){' + ' + ops if ops else ''}"
    return KernelSource("\n\n".join(sources), launcher, f"{name}_launch", tensor_args + scalar_args, False,
                        helpers, description=description)


@dataclass
class _Body:
    lines: list[str]
    helpers: set[str]


def _kernel_source(name: str, params: list[str], layout: _Layout, body: list[str], looped: bool) -> str:
    how = "walked in BLOCK_R chunks, once per reduction" if looped else "held in registers and read once"
    start = ["o = tl.program_id(0).to(tl.int64)"]
    if layout.inner:
        start += ["i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)", "imask = i < I"]
    where = " and BLOCK_I inner positions" if layout.inner else ""
    return f"""@triton.jit
def {name}({", ".join(params)}):
    # One program per outer position{where}; the row is {how}.
{indent(start + body, 4)}
"""


def _emit_body(kernel: KernelPlan, indexer: Indexer, operands, layout: _Layout, scalars: ScalarArgs,
               looped: bool) -> _Body:
    row = kernel.row
    emitter = _RowEmitter(indexer, operands, scalars, dims=row.dims, rank=len(row.shapes[0]),
                          configs=len(row.shapes))
    emitter.layout = layout
    full_flat = {0: "o", 1: layout.r(), 2: layout.i()}
    row_flat = {0: "o", 2: "i"}
    per_row_lines: list[str] = []
    per_row = Region(per_row_lines, mask="imask" if layout.inner else None,
                     indices=GroupIndices(indexer, row_flat, per_row_lines, "p"))
    emitter.per_row = per_row
    body: list[str] = []
    if not looped:
        full = Region(per_row_lines, mask="mask", indices=GroupIndices(indexer, full_flat, per_row_lines, "f"))
        per_row_lines.append("r = tl.arange(0, BLOCK_R)")
        per_row_lines.append(f"mask = {layout.row_mask()}")
        for k, reduction in enumerate(kernel.reductions):
            value = emitter.value(reduction.base, full)
            neutral = _INIT[reduction.kind]
            per_row_lines.append(f"red{k} = {_FINAL[reduction.kind]}(tl.where(mask, {value}, {neutral}), axis=0)"
                                 + _mean_scale(reduction))
            per_row.bound[reduction.id] = f"red{k}"
        if kernel.full_space:
            result = emitter.value(kernel.root, full)
            per_row_lines.append(f"tl.store(out_ptr + {_full_offset(layout)}, {result}, mask=mask)")
        else:
            result = emitter.value(kernel.root, per_row)
            per_row_lines.append(_reduced_store(layout, result))
        body = per_row_lines
    else:
        for k, reduction in enumerate(kernel.reductions):
            mark = len(per_row_lines)
            loop: list[str] = []
            full = Region(loop, mask="mask", indices=GroupIndices(indexer, full_flat, loop, f"f{k}"))
            value = emitter.value(reduction.base, full)
            neutral = _INIT[reduction.kind]
            body += per_row_lines[mark:]
            body += [f"acc{k} = tl.full({layout.tile()}, {neutral}, tl.float32)",
                     "for r0 in range(0, R, BLOCK_R):",
                     "    r = r0 + tl.arange(0, BLOCK_R)",
                     f"    mask = {layout.row_mask()}"]
            body += ["    " + line for line in loop]
            body += [f"    acc{k} = {_combine(reduction.kind, f'acc{k}', f'tl.where(mask, {value}, {neutral})')}",
                     f"red{k} = {_FINAL[reduction.kind]}(acc{k}, axis=0){_mean_scale(reduction)}"]
            per_row.bound[reduction.id] = f"red{k}"
        mark = len(per_row_lines)
        if kernel.full_space:
            loop = []
            full = Region(loop, mask="mask", indices=GroupIndices(indexer, full_flat, loop, "fo"))
            result = emitter.value(kernel.root, full)
            body += per_row_lines[mark:]
            body += ["for r0 in range(0, R, BLOCK_R):", "    r = r0 + tl.arange(0, BLOCK_R)",
                     f"    mask = {layout.row_mask()}"]
            body += ["    " + line for line in loop]
            body += [f"    tl.store(out_ptr + {_full_offset(layout)}, {result}, mask=mask)"]
        else:
            result = emitter.value(kernel.root, per_row)
            body += per_row_lines[mark:] + [_reduced_store(layout, result)]
    return _Body(body, emitter.helpers)


def _mean_scale(reduction: Reduce) -> str:
    if reduction.kind != "mean":
        return ""
    return f" / (R - {reduction.correction})" if reduction.correction else " / R"


def _full_offset(layout: _Layout) -> str:
    return "o * R * I + r[:, None] * I + i[None, :]" if layout.inner else "o * R + r"


def _reduced_store(layout: _Layout, result: str) -> str:
    if layout.inner:
        return f"tl.store(out_ptr + o * I + i, {result}, mask=imask)"
    return f"tl.store(out_ptr + o, {result})"


def _launcher(name: str, kernel: KernelPlan, indexer: Indexer, tensor_args: list[LauncherArg],
              scalar_args: list[LauncherArg], layout: _Layout, variant: Variant, dims: tuple[int, ...]) -> str:
    first, last = dims[0], dims[-1]
    tiles = variant.rows
    lines = [f"shape = _broadcast_shape({', '.join(a.name + '.shape' for a in tensor_args)})",
             f"O, R, I = _group_sizes(shape, ({tuple(range(first))!r}, {dims!r}, "
             f"{tuple(range(last + 1, len(kernel.row.shapes[0])))!r}))"]
    if kernel.full_space:
        lines.append(f"out = torch.empty(shape, device={tensor_args[0].name}.device, dtype=torch.float32)")
    else:
        lines.append(f"out_shape = tuple(1 if d in {dims!r} else s for d, s in enumerate(shape))")
        lines.append(f"out = torch.empty(out_shape, device={tensor_args[0].name}.device, dtype=torch.float32)")
    lines += indexer.wrapper_lines("shape", {a.name: a.name for a in tensor_args})
    args = ", ".join(["out"] + [a.name for a in tensor_args] + ["R", "I"] + indexer.kernel_params()
                     + [a.name for a in scalar_args])
    if layout.inner:
        lines.append(f"block_i = min(triton.next_power_of_2(I), {tiles.inner_block})")
    else:
        lines.append("block_i = 1")
    lines += [f"grid = (O, triton.cdiv(I, block_i))",
              f"if triton.next_power_of_2(R) * block_i <= {tiles.max_single}:",
              "    # the whole row fits in registers: one read",
              "    block_r = triton.next_power_of_2(R)",
              f"    {name}[grid]({args}, BLOCK_R=block_r, BLOCK_I=block_i, num_warps=_row_warps(block_r * block_i))",
              "else:",
              f"    block_r = max(1, {tiles.loop_block} // block_i)",
              f"    {name}_looped[grid]({args}, BLOCK_R=block_r, BLOCK_I=block_i, "
              "num_warps=_row_warps(block_r * block_i))",
              "return out"]
    signature = ", ".join(a.name for a in tensor_args + scalar_args)
    return f"def {name}_launch({signature}):\n{indent(lines, 4)}\n"


ROW_WARPS_HELPER = '''def _row_warps(block):
    """Warps for a row kernel: about 16 fp32 values per thread, between 1 and 32 warps."""
    return max(1, min(32, block // 512))
'''
