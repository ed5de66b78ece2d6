"""Row kernels: reductions (softmax, norms, sum/mean/max...) with their elementwise prologue and epilogue.

The reduced tensor is seen as (O, R, I): O outer positions, R reduced, I inner positions. A program owns
one outer position and BLOCK_I inner ones, and runs the reductions in dependency order. Rows that fit in
one block are loaded once ("single" kernel); short rows with nothing after the reduced dims go BLOCK_O
to a program, as the rows of a [BLOCK_O, BLOCK_R] tile ("packed" kernel: a GroupNorm of 16-element
groups would otherwise start a program per 16 elements); longer rows are walked in BLOCK_R chunks, once
per reduction (a mean and the variance about it in one walk, by Welford's update) and once more for a
full-size output ("looped" kernel). When there are too few rows to fill
the GPU, each row is split over several programs: one launch per reduction writes partial results, the
next launch combines them ("split" kernels). Values that do not vary along the row (the reductions,
per-row parameters) are computed once per program, outside the loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import Variant
from .emit_common import (
    ExprEmitter,
    KernelSource,
    LauncherArg,
    Region,
    ScalarArgs,
    body_leaves,
    describe_body,
    indent,
    make_operands,
    output_param,
)
from .indexing import GroupIndices, Indexer, Space
from .ir import Pointwise, Program, Reduce, Value, walk
from .kernel_plan import KernelPlan
from .pointwise_ops import as_float, divide, maximum, minimum
from .signature import KernelParam, constexpr, signature

_INIT = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "amax": '-float("inf")', "amin": 'float("inf")'}
# Sums and means add in fp64 and round once to fp32 at the end. In fp32, a tree of n values rounds log2(n) times
# along every path, an error that scales with the values added, not with their sum: in level2/27 (a mean of
# 10933 GroupNorm outputs per channel) it made most of the output's error, 1.2 times eager fp32's (H100). A row
# kernel reads 4 bytes per add and an H100 adds fp64 at half fp32's rate; the cost on a GPU is not measured yet.
_WIDE = ("sum", "mean")
# amax and amin keep a NaN, as PyTorch's do (tl.max and tl.min skip it)
_FINAL = {"sum": "tl.sum", "mean": "tl.sum", "prod": "_prod", "amax": "_amax", "amin": "_amin"}


def _combine(kind: str, acc: str, value: str) -> str:
    if kind in ("sum", "mean"):
        return f"{acc} + {value}"
    if kind == "prod":
        return f"{acc} * {value}"
    return maximum(acc, value) if kind == "amax" else minimum(acc, value)


@dataclass
class _Layout:
    """Where the tile's axes are: 1-d tiles when nothing follows the reduced dims, else [BLOCK_R, BLOCK_I];
    packed, [BLOCK_O, BLOCK_R]: several rows per program (never with inner positions)."""

    inner: bool
    packed: bool = False

    def o(self) -> str:
        return "o[:, None]" if self.packed else "o"

    def r(self) -> str:
        if self.packed:
            return "r[None, :]"
        return "r[:, None]" if self.inner else "r"

    def i(self) -> str:
        return "i[None, :]"

    def row_mask(self) -> str:
        if self.packed:
            return "omask[:, None] & (r[None, :] < R)"
        return "(r[:, None] < R) & imask[None, :]" if self.inner else "r < R"

    def per_row_mask(self) -> str | None:
        if self.packed:
            return "omask"
        return "imask" if self.inner else None

    def axis(self) -> int:
        """The tile axis a reduction runs along."""
        return 1 if self.packed else 0

    def spread(self, name: str, single: bool = False) -> str:
        """A per-row value (scalar, [BLOCK_I], or [BLOCK_O] when packed) used in a full tile. A `single`
        value, the same for every row (all its dims 1), is a scalar in a packed kernel too."""
        if self.packed:
            return name if single else f"{name}[:, None]"
        return f"{name}[None, :]" if self.inner else name

    def tile(self) -> str:
        return "[BLOCK_R, BLOCK_I]" if self.inner else "[BLOCK_R]"

    def partial(self, stage: str, split: str) -> str:
        """Offset of one partial result in the (reductions, O, SPLIT, I) buffer."""
        if self.inner:
            return f"(({stage} * O + o) * SPLIT + {split}) * I + i"
        return f"({stage} * O + o) * SPLIT + {split}"


class _RowEmitter(ExprEmitter):
    """Hoists row-invariant values out of the row loops into the per-program region."""

    def __init__(self, *args, dims: tuple[int, ...], rank: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.dims, self.rank = dims, rank
        self.per_row: Region | None = None
        self.layout: _Layout | None = None

    def invariant(self, value: Value) -> bool:
        lead = self.rank - value.rank
        return all(d - lead < 0 or shape[d - lead] == 1 for shape in value.shapes for d in self.dims)

    def value(self, value: Value, region: Region) -> str:
        if region is not self.per_row and self.invariant(value):
            return self.layout.spread(super().value(value, self.per_row), self._same_for_every_row(value))
        return super().value(value, region)

    def _same_for_every_row(self, value: Value) -> bool:
        """A value of all dims 1 that this kernel computes from no reduction of its own: a scalar even where
        a program holds several rows (its reductions give one value per row)."""
        computed_from = walk(value, lambda v: isinstance(v, Pointwise) and v.id not in self.operands)
        return (all(size == 1 for shape in value.shapes for size in shape)
                and not any(isinstance(v, Reduce) and v.id not in self.operands for v in computed_from))


def emit_rows(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    row = kernel.row
    rank = len(row.shapes[0])
    first, last = row.dims[0], row.dims[-1]
    inner_dims = tuple(range(last + 1, rank))
    layout = _Layout(inner=any(s[d] != 1 for s in row.shapes for d in inner_dims))
    leaves = body_leaves(kernel, program)
    operands = make_operands(leaves)
    spaces = [Space("outer", tuple(range(first))), Space("reduced", row.dims), Space("inner", inner_dims)]
    indexer = Indexer(row.shapes, spaces, list(operands.values()), frame_name="input")
    scalars = ScalarArgs()
    stages = len(kernel.reductions)
    bodies = {"": _BodyWriter(kernel, indexer, operands, layout, scalars).single(),
              "_looped": _BodyWriter(kernel, indexer, operands, layout, scalars).looped()}
    packs = not layout.inner and variant.rows.packed_block > 0
    if packs:
        packed = _Layout(inner=False, packed=True)
        bodies["_packed"] = _BodyWriter(kernel, indexer, operands, packed, scalars).single()
    for stage in range(stages + 1):
        bodies[f"_split{stage}"] = _BodyWriter(kernel, indexer, operands, layout, scalars).split(stage)
    common = ([o.pointer() for o in operands.values()]
              + [KernelParam("R", "elements per row (the reduced dims)"),
                 KernelParam("I", "inner positions (the dims after the reduced ones)")]
              + indexer.kernel_signature() + scalars.kernel_signature())
    blocks = [constexpr("BLOCK_R", "row elements per step"), constexpr("BLOCK_I", "inner positions per program")]
    out = output_param(kernel, f"output {'[O, R, I]' if kernel.full_space else '[O, I]'}, contiguous")
    sources = []
    for suffix, lines in bodies.items():
        split, packing = suffix.startswith("_split"), suffix == "_packed"
        params = [out] + (_split_params(stages) if split else []) + (_packed_params() if packing else []) + (
            common + blocks)
        params += [constexpr("SPLIT_BLOCK", "SPLIT rounded up to a power of 2")] if split else []
        params += [constexpr("BLOCK_O", "rows per program")] if packing else []
        sources.append(_kernel_source(name + suffix, params, packed if packing else layout, lines,
                                      _how(suffix, stages)))
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    launcher = _launcher(name, kernel, indexer, tensor_args, scalar_args, layout, variant, packs)
    ops = describe_body(kernel, program.values)
    kinds = "+".join(dict.fromkeys(r.kind for r in kernel.reductions))
    output = "full rows" if kernel.full_space else "reduced"
    description = f"row reduction {kinds} ({output}){' + ' + ops if ops else ''}"
    return KernelSource("\n\n".join(sources), launcher, f"{name}_launch", tensor_args + scalar_args, False,
                        description=description)


def _split_params(stages: int) -> list[KernelParam]:
    return [KernelParam("part_ptr", f"partial results [{stages}, O, SPLIT, I], one per reduction and program"),
            KernelParam("O", "outer positions (the dims before the reduced ones)"),
            KernelParam("SPLIT", "programs per row"),
            KernelParam("CHUNK", "row elements per program, a multiple of BLOCK_R")]


def _packed_params() -> list[KernelParam]:
    return [KernelParam("O", "outer positions (rows)")]


def _how(suffix: str, stages: int) -> str:
    if suffix == "":
        return "the row is held in registers and read once"
    if suffix == "_packed":
        return "its BLOCK_O rows are held in registers, one per tile row, and read once"
    if suffix == "_looped":
        return "the row is walked in BLOCK_R chunks, once per reduction (a mean and its variance: once)"
    stage = int(suffix.removeprefix("_split"))
    done = "combines the earlier reductions' partial results and " if stage else ""
    work = f"reduces its chunk for reduction {stage}" if stage < stages else "writes its chunk of the output"
    return f"the row is split over SPLIT programs of CHUNK elements; this launch {done}{work}"


def _kernel_source(name: str, params: list[KernelParam], layout: _Layout, body: list[str], how: str) -> str:
    if layout.packed:
        start = ["o = tl.program_id(0).to(tl.int64) * BLOCK_O + tl.arange(0, BLOCK_O)", "omask = o < O"]
        who = "BLOCK_O outer positions"
    else:
        start = ["o = tl.program_id(0).to(tl.int64)"]
        who = "outer position"
    if layout.inner:
        start += ["i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)", "imask = i < I"]
    where = " and BLOCK_I inner positions" if layout.inner else ""
    return f"""@triton.jit
{signature(name, params)}
    # One program per {who}{where}; {how}.
{indent(start + body, 4)}
"""


class _BodyWriter:
    """Writes one row kernel's body; each instance writes one kernel (its emitter caches are per kernel)."""

    def __init__(self, kernel: KernelPlan, indexer: Indexer, operands, layout: _Layout, scalars: ScalarArgs):
        self.kernel, self.indexer, self.layout = kernel, indexer, layout
        row = kernel.row
        self.emitter = _RowEmitter(indexer, operands, scalars, dims=row.dims, rank=len(row.shapes[0]))
        self.emitter.layout = layout
        self.per_row_lines: list[str] = []
        self.per_row = Region(self.per_row_lines, mask=layout.per_row_mask(),
                              indices=GroupIndices(indexer, {0: "o", 2: "i"}, self.per_row_lines, "p"))
        self.emitter.per_row = self.per_row
        self.taken = 0

    def _full(self, lines: list[str], tag: str) -> Region:
        flat = {0: self.layout.o(), 1: self.layout.r(), 2: self.layout.i()}
        return Region(lines, mask="mask", indices=GroupIndices(self.indexer, flat, lines, tag))

    def _new_per_row_lines(self) -> list[str]:
        """Per-program lines emitted since the last call: they go before the loop that needed them."""
        lines = self.per_row_lines[self.taken:]
        self.taken = len(self.per_row_lines)
        return lines

    def _loop(self, bounds: str, body: list[str], update: list[str]) -> list[str]:
        return ([f"for r0 in range({bounds}, BLOCK_R):", "    r = r0 + tl.arange(0, BLOCK_R)",
                 f"    mask = {self.layout.row_mask()}"] + ["    " + line for line in body + update])

    def _reduce_loop(self, k: int, reduction: Reduce, bounds: str) -> list[str]:
        loop: list[str] = []
        value = self.emitter.value(reduction.base, self._full(loop, f"f{k}"))
        neutral = _INIT[reduction.kind]
        added = _widened(reduction, f"tl.where(mask, {value}, {neutral})")
        update = [f"acc{k} = {_combine(reduction.kind, f'acc{k}', added)}"]
        dtype = "tl.float64" if reduction.kind in _WIDE else "tl.float32"
        return (self._new_per_row_lines() + [f"acc{k} = tl.full({self.layout.tile()}, {neutral}, {dtype})"]
                + self._loop(bounds, loop, update))

    def _output(self, bounds: str) -> list[str]:
        if not self.kernel.full_space:
            result = self.emitter.value(self.kernel.root, self.per_row)
            return self._new_per_row_lines() + [_reduced_store(self.layout, result)]
        loop: list[str] = []
        result = self.emitter.value(self.kernel.root, self._full(loop, "fo"))
        store = [f"tl.store(out_ptr + {_full_offset(self.layout)}, {result}, mask=mask)"]
        return self._new_per_row_lines() + self._loop(bounds, loop, store)

    def single(self) -> list[str]:
        lines = self.per_row_lines
        full = self._full(lines, "f")
        lines += ["r = tl.arange(0, BLOCK_R)", f"mask = {self.layout.row_mask()}"]
        for k, reduction in enumerate(self.kernel.reductions):
            value = self.emitter.value(reduction.base, full)
            neutral = _INIT[reduction.kind]
            added = _widened(reduction, f"tl.where(mask, {value}, {neutral})")
            total = f"{_FINAL[reduction.kind]}({added}, axis={self.layout.axis()})"
            lines.append(f"red{k} = {_rounded(reduction, total)}")
            self.per_row.bound[reduction.id] = f"red{k}"
        if self.kernel.full_space:
            result = self.emitter.value(self.kernel.root, full)
            lines.append(f"tl.store(out_ptr + {_full_offset(self.layout)}, {result}, mask=mask)")
        else:
            lines.append(_reduced_store(self.layout, self.emitter.value(self.kernel.root, self.per_row)))
        return lines

    def looped(self) -> list[str]:
        body: list[str] = []
        reductions = self.kernel.reductions
        variances = {mean.id: var for var in reductions if (mean := _mean_of_variance(var, reductions))}
        for k, reduction in enumerate(reductions):
            if reduction.id in self.per_row.bound:     # a variance, computed with its mean
                continue
            var = variances.get(reduction.id)
            if var is not None:
                body += self._welford_loop(k, reduction, reductions.index(var), var)
                continue
            body += self._reduce_loop(k, reduction, "0, R")
            body.append(f"red{k} = {_rounded(reduction, f'{_FINAL[reduction.kind]}(acc{k}, axis=0)')}")
            self.per_row.bound[reduction.id] = f"red{k}"
        return body + self._output("0, R")

    def _welford_loop(self, k: int, mean: Reduce, v: int, var: Reduce) -> list[str]:
        """A mean and the variance about it in one walk over the row (Welford's update per lane, Chan's
        combination across lanes: `_welford`), where two walks read it twice: a GroupNorm over rows too
        long for registers read its input three times, now twice.

        A lane is in the row from the first pass to its last, so in pass i it has seen i + 1 values: one
        reciprocal per pass, not a division per value. Dividing each value (`_div`) made level2/23's GroupNorm
        + mean 1.5 times slower than two walks on an H100 (0.50 ms against 0.33)."""
        loop: list[str] = []
        value = self.emitter.value(mean.base, self._full(loop, f"f{k}"))
        tile = self.layout.tile()
        update = [f"v{k} = tl.where(mask, {value}, avg{k})       # a lane past the row's end stays put",
                  f"dev{k} = v{k} - avg{k}",
                  f"avg{k} = avg{k} + dev{k} * (1.0 / (r0 // BLOCK_R + 1))",
                  f"sq{k} = sq{k} + dev{k} * (v{k} - avg{k})",
                  f"seen{k} = tl.where(mask, r0 // BLOCK_R + 1.0, seen{k})"]
        start = [f"{name}{k} = tl.zeros({tile}, tl.float32)" for name in ("avg", "sq", "seen")]
        combined = f"red{k}, sq{k}, seen{k} = tl.reduce((avg{k}, sq{k}, seen{k}), 0, _welford)"
        self.per_row.bound[mean.id], self.per_row.bound[var.id] = f"red{k}", f"red{v}"
        return (self._new_per_row_lines() + start + self._loop("0, R", loop, update)
                + [combined, f"red{v} = {_scaled(var, f'sq{k}')}"])

    def split(self, stage: int) -> list[str]:
        """Reductions before `stage` come from the partial buffer; `stage` itself is computed over this
        program's chunk (or, past the last reduction, the output is)."""
        body = ["s = tl.program_id(2)", "r_begin = s * CHUNK", "r_end = tl.minimum(r_begin + CHUNK, R)"]
        reductions = self.kernel.reductions
        computed = self.kernel.root if stage == len(reductions) else reductions[stage].base
        read = _reductions_read(computed, {r.id for r in reductions}, {leaf.id for leaf in self.kernel.leaves})
        for k, reduction in enumerate(reductions[:stage]):
            if reduction.id not in read:     # e.g. a mean of a GroupNorm's output reads only its own partials
                continue
            neutral = _INIT[reduction.kind]
            if self.layout.inner:
                offsets = f"((({k} * O + o) * SPLIT + t[:, None]) * I + i[None, :])"
                mask = "(t[:, None] < SPLIT) & imask[None, :]"
            else:
                offsets, mask = f"({k} * O + o) * SPLIT + t", "t < SPLIT"
            body += ["t = tl.arange(0, SPLIT_BLOCK)",
                     f"part{k} = tl.load(part_ptr + {offsets}, mask={mask}, other={neutral})",
                     f"red{k} = {_rounded(reduction, f'{_FINAL[reduction.kind]}(part{k}, axis=0)', partials=True)}"]
            self.per_row.bound[reduction.id] = f"red{k}"
        if stage == len(self.kernel.reductions):
            return body + self._output("r_begin, r_end")
        reduction = self.kernel.reductions[stage]
        body += self._reduce_loop(stage, reduction, "r_begin, r_end")
        mask = ", mask=imask" if self.layout.inner else ""
        body += [f"partial = {_FINAL[reduction.kind]}(acc{stage}, axis=0)",
                 f"tl.store(part_ptr + {self.layout.partial(str(stage), 's')}, partial{mask})"]
        return body


def _mean_of_variance(reduction: Reduce, reductions: list[Reduce]) -> Reduce | None:
    """The mean among the kernel's `reductions` that `reduction` is the variance about, mean((B - m)^2)
    with m = mean(B) over the same rows (handlers_math.normalized and variance write it so); else None."""
    square = reduction.base
    if reduction.kind != "mean" or not isinstance(square, Pointwise) or square.op != "mul" \
            or square.args[0] is not square.args[1]:
        return None
    centered = square.args[0]
    if not isinstance(centered, Pointwise) or centered.op != "sub":
        return None
    base, mean = centered.args
    if any(mean is r for r in reductions) and mean.kind == "mean" and not mean.correction and mean.base is base:
        return mean
    return None


def _reductions_read(value: Value, reductions: set[int], leaves: set[int]) -> set[int]:
    """The kernel's reductions (by id) that computing `value` per row reads: those met through its operands
    short of the kernel's tensor operands (`leaves`), or the value itself when it is one."""
    reached = walk(value, lambda v: v.id not in reductions and v.id not in leaves)
    return {v.id for v in reached if v.id in reductions}


def _count(reduction: Reduce) -> str:
    return f"(R - {reduction.correction})" if reduction.correction else "R"


def _scaled(reduction: Reduce, total: str) -> str:
    """A mean's (or a variance's) value from its fp32 `total`: divided by its count."""
    if reduction.kind != "mean":
        return total
    return divide(total, as_float(_count(reduction)))


def _widened(reduction: Reduce, value: str) -> str:
    """An fp32 `value` as the reduction adds it: in fp64 for a sum or a mean (_WIDE)."""
    return f"{value}.to(tl.float64)" if reduction.kind in _WIDE else value


def _rounded(reduction: Reduce, total: str, partials: bool = False) -> str:
    """The fp32 value of a reduction from its `total` as accumulated: a sum's or a mean's is fp64 (a mean is
    divided by its count there, fp64's `/` being IEEE division), so it rounds once. The split kernels' partial
    results are all fp64 (their buffer is): a max or a product combined from them converts back exactly."""
    if reduction.kind not in _WIDE and not partials:
        return total
    if reduction.kind == "mean":
        total = f"{total} / {_count(reduction)}"
    return f"({total}).to(tl.float32)"


def _full_offset(layout: _Layout) -> str:
    if layout.packed:
        return "o[:, None] * R + r[None, :]"
    return "o * R * I + r[:, None] * I + i[None, :]" if layout.inner else "o * R + r"


def _reduced_store(layout: _Layout, result: str) -> str:
    if layout.inner:
        return f"tl.store(out_ptr + o * I + i, {result}, mask=imask)"
    if layout.packed:
        return f"tl.store(out_ptr + o, {result}, mask=omask)"
    return f"tl.store(out_ptr + o, {result})"


def _launcher(name: str, kernel: KernelPlan, indexer: Indexer, tensor_args: list[LauncherArg],
              scalar_args: list[LauncherArg], layout: _Layout, variant: Variant, packs: bool) -> str:
    dims = kernel.row.dims
    rank = len(kernel.row.shapes[0])
    tiles = variant.rows
    device = f"{tensor_args[0].name}.device"
    lines = [f"shape = _broadcast_shape({', '.join(a.name + '.shape' for a in tensor_args)})",
             f"O, R, I = _group_sizes(shape, ({tuple(range(dims[0]))!r}, {dims!r}, "
             f"{tuple(range(dims[-1] + 1, rank))!r}))"]
    if kernel.full_space:
        lines.append(f"out = torch.empty(shape, device={device}, dtype=torch.float32)")
    else:
        lines += [f"out_shape = tuple(1 if d in {dims!r} else s for d, s in enumerate(shape))",
                  f"out = torch.empty(out_shape, device={device}, dtype=torch.float32)"]
    lines += indexer.wrapper_lines("shape", {a.name: a.name for a in tensor_args})
    args = ", ".join([a.name for a in tensor_args] + ["R", "I"] + indexer.kernel_params()
                     + [a.name for a in scalar_args])
    stages = len(kernel.reductions)
    block_i = f"min(_next_power_of_2(I), {tiles.inner_block})" if layout.inner else "1"
    blocks = f"BLOCK_R=block_r, BLOCK_I=block_i, num_warps=_row_warps(block_r * block_i, {tiles.per_thread})"
    lines += [f"block_i = {block_i}",
              "programs = O * _cdiv(I, block_i)",
              "grid = (O, _cdiv(I, block_i))",
              f"if _next_power_of_2(R) * block_i <= {tiles.max_single}:",
              "    # the whole row fits in registers: one read",
              "    block_r = _next_power_of_2(R)"]
    if packs:
        lines += ["    # short rows go several to a program, while that still leaves enough programs",
                  f"    block_o = max(1, {tiles.packed_block} // block_r)",
                  f"    while block_o > 1 and _cdiv(O, block_o) < {tiles.split_target}:",
                  "        block_o //= 2",
                  "    if block_o > 1:",
                  f"        {name}_packed[(_cdiv(O, block_o),)](out, O, {args}, BLOCK_R=block_r, BLOCK_I=1, "
                  f"BLOCK_O=block_o, num_warps=_row_warps(block_r * block_o, {tiles.per_thread}))",
                  "    else:",
                  f"        {name}[grid](out, {args}, {blocks})"]
    else:
        lines += [f"    {name}[grid](out, {args}, {blocks})"]
    lines += [f"elif programs >= {tiles.split_target}:",
              f"    block_r = max(1, {tiles.loop_block} // block_i)",
              f"    {name}_looped[grid](out, {args}, {blocks})",
              "else:",
              "    # few long rows: split each over several programs, combine partial results per reduction",
              f"    block_r = max(1, {tiles.loop_block} // block_i)",
              *("    " + line for line in split_lines("programs", tiles.split_target)),
              f"    part = torch.empty(({stages}, O, split, I), device={device}, dtype=torch.float64)",
              "    split_grid = (O, _cdiv(I, block_i), split)"]
    split_blocks = blocks + ", SPLIT_BLOCK=_next_power_of_2(split)"
    for stage in range(stages):
        lines.append(f"    {name}_split{stage}[split_grid](out, part, O, split, chunk, {args}, {split_blocks})")
    last_grid = "split_grid" if kernel.full_space else "(O, _cdiv(I, block_i), 1)"
    lines += [f"    {name}_split{stages}[{last_grid}](out, part, O, split, chunk, {args}, {split_blocks})",
              "return out"]
    launcher_args = ", ".join(a.name for a in tensor_args + scalar_args)
    return f"def {name}_launch({launcher_args}):\n{indent(lines, 4)}\n"


def split_lines(programs: str, split_target: int) -> list[str]:
    """Launcher lines that split rows of R elements over `split` programs each, so that `programs` (a
    launcher expression: the programs without a split) times split reaches about `split_target`; each
    program takes `chunk` elements, a multiple of block_r."""
    return [f"split = max(1, min(_cdiv(R, block_r), {split_target} // {programs}))",
            "chunk = _cdiv(_cdiv(R, split), block_r) * block_r",
            "split = _cdiv(R, chunk)"]
