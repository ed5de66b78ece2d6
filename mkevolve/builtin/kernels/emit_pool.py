"""Max and average pooling (fixed windows and adaptive ones) with a fused elementwise epilogue, and the int64
positions of a max pool's maxima (return_indices=True) by the same window walk.

A max window keeps a value as PyTorch's kernels do: a tap is taken where it is larger than the value kept so
far, or a NaN; so equal values keep the first in window order, NaNs the last, and a window of -inf alone keeps
-inf, its position the first tap inside the input, where PyTorch's starts (`_first_position`).
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import (
    ExprEmitter,
    KernelSource,
    LauncherArg,
    Region,
    ScalarArgs,
    block_autotune,
    body_leaves,
    describe_body,
    indent,
    make_operands,
    output_param,
)
from .errors import UnsupportedSubproblem
from .indexing import GroupIndices, Indexer, Space
from .ir import AdaptivePool, Pool, PoolIndices, Program
from .kernel_plan import KernelPlan
from .pointwise_ops import divide
from .signature import KernelParam, constexpr, signature


def _positions(spatial: int) -> list[str]:
    """Split the flat output index into plane (all leading dims) and p0, p1, ... (row-major)."""
    lines, rest = [], "offs"
    for d in range(spatial - 1, -1, -1):
        lines += [f"p{d} = {rest} % P{d}", f"rest{d} = {rest} // P{d}"]
        rest = f"rest{d}"
    return lines + [f"plane = {rest}"]


def _epilogue(kernel: KernelPlan, program: Program, operands, result: str):
    """The elementwise code after the window walk, which leaves the anchor's value in `result`."""
    leaves = body_leaves(kernel, program)
    epilogue = [operands[v.id] for v in leaves]
    indexer = Indexer(kernel.root.shapes, [Space("flat", tuple(range(kernel.root.rank)))], epilogue)
    scalars = ScalarArgs()
    emitter = ExprEmitter(indexer, {v.id: operands[v.id] for v in leaves}, scalars)
    lines: list[str] = []
    region = Region(lines, mask="mask", indices=GroupIndices(indexer, {0: "offs"}, lines, "e"),
                    bound={kernel.anchor.id: result})
    result = emitter.value(kernel.root, region)
    return epilogue, indexer, scalars, emitter, lines, result


def _fixed_window(pool: Pool, positions: bool) -> list[str]:
    spatial = len(pool.kernel)
    lines = []
    mask = "mask"
    for d in range(spatial):
        pad = "    " * d
        lines += [f"{pad}for k{d} in tl.static_range(K{d}):",
                  f"{pad}    in{d} = p{d} * STRIDE{d} - PAD{d} + k{d} * DIL{d}",
                  f"{pad}    ok{d} = {mask} & (in{d} >= 0) & (in{d} < D{d})"]
        mask = f"ok{d}"
    return lines + _accumulate(pool.kind, spatial, mask, positions)


def _first_position(spatial: int) -> list[str]:
    """Kernel lines starting each window's position `at` where PyTorch starts it: the window's first tap at or
    past 0 along each dim. A tap inside the input replaces it (the first one may be -inf); only a window of
    padding alone keeps it."""
    lines = []
    for d in range(spatial):
        lines += [f"start{d} = p{d} * STRIDE{d} - PAD{d}",
                  f"first{d} = start{d} + tl.maximum(DIL{d} - 1 - start{d}, 0) // DIL{d} * DIL{d}  # tap >= 0"]
    return lines + [f"at = {_plane_position(spatial, 'first')}  # PyTorch's start: a window of -inf keeps it"]


def _plane_position(spatial: int, stem: str) -> str:
    """The flat position within an input plane of the element at (stem0, stem1, ...): stem0 * D1 + stem1, and
    (stem0 * D1 + stem1) * D2 + stem2 in 3d, as PyTorch's indices count it."""
    position = f"{stem}0"
    for d in range(1, spatial):
        position = f"{'(' + position + ')' if d > 1 else position} * D{d} + {stem}{d}"
    return position


def _avg_divisor(pool: Pool) -> list[str]:
    """torch's divisor: the override, else the window clipped to the padded (or, without pads, real) input."""
    if pool.divisor is not None:
        return [f"acc = {divide('acc', repr(float(pool.divisor)))}"]
    spatial = len(pool.kernel)
    lines = []
    for d in range(spatial):
        lines += [f"start{d} = p{d} * STRIDE{d} - PAD{d}",
                  f"end{d} = tl.minimum(start{d} + K{d}, D{d} + PAD{d})"]
        if not pool.count_include_pad:
            lines += [f"size{d} = tl.minimum(end{d}, D{d}) - tl.maximum(start{d}, 0)"]
        else:
            lines += [f"size{d} = end{d} - start{d}"]
    count = " * ".join(f"size{d}" for d in range(spatial))
    return lines + [f"acc = {divide('acc', f'({count}).to(tl.float32)')}"]


def _adaptive_window(pool: AdaptivePool, spatial: int) -> list[str]:
    lines = []
    for d in range(spatial):
        lines += [f"start{d} = (p{d} * D{d}) // P{d}", f"end{d} = ((p{d} + 1) * D{d} + P{d} - 1) // P{d}"]
    mask = "mask"
    for d in range(spatial):
        pad = "    " * d
        lines += [f"{pad}for k{d} in range(0, KMAX{d}):",
                  f"{pad}    in{d} = start{d} + k{d}",
                  f"{pad}    ok{d} = {mask} & (in{d} < end{d})"]
        mask = f"ok{d}"
    lines += _accumulate(pool.kind, spatial, mask, positions=False)
    if pool.kind != "max":
        count = " * ".join(f"(end{d} - start{d})" for d in range(spatial))
        lines.append(f"acc = {divide('acc', f'({count}).to(tl.float32)')}")
    return lines


def _accumulate(kind: str, spatial: int, mask: str, positions: bool) -> list[str]:
    """The innermost loop body: fold one masked input element into `acc` (max, or a sum for avg), and for
    `positions` keep the taken element's position in `at`."""
    inner = "    " * spatial
    offset = " + ".join(f"in{d} * sx{d}" for d in range(spatial))
    if kind != "max":
        return [f"{inner}acc += tl.load(x_ptr + plane * sxp + {offset}, mask={mask}, other=0.0)"]
    lines = [f"{inner}v = tl.load(x_ptr + plane * sxp + {offset}, mask={mask}, other=-float(\"inf\"))",
             f"{inner}take = (v > acc) | (v != v)  # larger, or a NaN: PyTorch's rule (a masked tap is -inf)",
             f"{inner}acc = tl.where(take, v, acc)"]
    if positions:
        lines.append(f"{inner}at = tl.where(take, {_plane_position(spatial, 'in')}, at)")
    return lines


def _emit(kernel: KernelPlan, name: str, variant: Variant, program: Program, adaptive: bool) -> KernelSource:
    positions = isinstance(kernel.anchor, PoolIndices)     # a max pool's int64 positions, not its values
    pool = kernel.anchor.pool if positions else kernel.anchor
    spatial = len(pool.kernel) if not adaptive else _adaptive_rank(pool)
    operands = make_operands(kernel.leaves)
    x = operands[pool.x.id].name
    epilogue, indexer, scalars, emitter, epi_lines, result = _epilogue(kernel, program, operands,
                                                                       "at" if positions else "acc")
    ops = describe_body(kernel, program.values)
    init = '-float("inf")' if pool.kind == "max" else "0.0"
    window = _adaptive_window(pool, spatial) if adaptive else _fixed_window(pool, positions) + (
        _avg_divisor(pool) if pool.kind == "avg" else [])
    sizes = [f"D{d}" for d in range(spatial)] + [f"P{d}" for d in range(spatial)]
    role = "int64 positions in the input planes" if positions else "output"
    params = ([operands[pool.x.id].pointer(f"input [planes, {', '.join(sizes[:spatial])}]", "x_ptr"),
               output_param(kernel, f"{role} [planes, {', '.join(sizes[spatial:])}], contiguous")]
              + [o.pointer("epilogue operand") for o in epilogue] + [KernelParam("numel", "output elements")]
              + [KernelParam(f"D{d}", f"input size along pooled dim {d}") for d in range(spatial)]
              + [KernelParam(f"P{d}", f"output size along pooled dim {d}") for d in range(spatial)]
              + [KernelParam("sxp", "input stride between planes")]
              + [KernelParam(f"sx{d}", f"input stride along pooled dim {d}") for d in range(spatial)]
              + indexer.kernel_signature() + scalars.kernel_signature() + _geometry_params(spatial, adaptive)
              + [constexpr("BLOCK", "output elements per program")])
    body = (["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "mask = offs < numel"]
            + _positions(spatial) + [f"acc = tl.full([BLOCK], {init}, tl.float32)"]
            + (_first_position(spatial) if positions else []) + window + epi_lines
            + [f"tl.store(out_ptr + offs, {result}, mask=mask)"])
    what = f"adaptive {pool.kind}" if adaptive else pool.kind
    then = ("It writes where each maximum is, an int64 position in its input plane (no epilogue)."
            if positions else f"Epilogue: {ops or 'none'}.")
    decorator = block_autotune(variant.pool, ["numel"]) if variant.autotune else ""
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # {what} pooling over {spatial} trailing dims: each program computes BLOCK consecutive outputs.
    # {then}
{indent(body, 4)}
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    lines = [f"x = {x}.reshape(-1, *{x}.shape[-{spatial}:])"]
    lines += [f"D{d} = x.shape[{1 + d}]" for d in range(spatial)]
    lines += _out_sizes(pool, spatial, adaptive, x)
    lines += [f"out = torch.empty((*{x}.shape[:-{spatial}], {', '.join(f'P{d}' for d in range(spatial))}), "
              f"device=x.device, dtype=torch.{'int64' if positions else 'float32'})", "shape = out.shape",
              "numel = out.numel()"]
    lines += indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
    call_geometry = ([f"KMAX{d}" for d in range(spatial)] if adaptive else
                     [f"{k}{d}={v[d]}" for k, v in (("K", pool.kernel), ("STRIDE", pool.stride),
                                                     ("PAD", pool.padding), ("DIL", pool.dilation))
                      for d in range(spatial)])
    call = ", ".join(["x", "out"] + [o.name for o in epilogue] + ["numel"] + sizes + ["x.stride(0)"]
                     + [f"x.stride({1 + d})" for d in range(spatial)] + indexer.kernel_params()
                     + [a.name for a in scalar_args] + call_geometry)
    if variant.autotune:
        lines += ['grid = lambda meta: (_cdiv(numel, meta["BLOCK"]),)', f"{name}[grid]({call})"]
    else:
        block, warps = variant.pool[0]
        lines += [f"{name}[(_cdiv(numel, {block}),)]({call}, BLOCK={block}, num_warps={warps})"]
    launcher = f"def {name}_launch({', '.join(a.name for a in tensor_args + scalar_args)}):\n" \
               f"{indent(lines + ['return out'], 4)}\n"
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False,
                        description=f"{what} pool{' positions' if positions else ''}{' + ' + ops if ops else ''}")


def _geometry_params(spatial: int, adaptive: bool) -> list[KernelParam]:
    dims = range(spatial)
    if adaptive:
        return [KernelParam(f"KMAX{d}", f"widest window along pooled dim {d}") for d in dims]
    docs = {"K": "window size", "STRIDE": "stride", "PAD": "padding", "DIL": "dilation"}
    return [constexpr(f"{k}{d}", f"{doc} along pooled dim {d}") for k, doc in docs.items() for d in dims]


def _adaptive_rank(pool: AdaptivePool) -> int:
    """Adaptive pools keep the leading (batch, channel) dims; the rest are pooled."""
    rank = pool.x.rank
    return rank - 2 if rank >= 3 else rank - 1


def _out_sizes(pool, spatial: int, adaptive: bool, x: str) -> list[str]:
    if adaptive:
        lines = [f"P{d} = {pool.shapes[0][pool.rank - spatial + d]}" for d in range(spatial)]
        lines += [f"KMAX{d} = max(((p + 1) * D{d} + P{d} - 1) // P{d} - (p * D{d}) // P{d} for p in range(P{d}))"
                  for d in range(spatial)]
        return lines
    lines = []
    for d in range(spatial):
        geometry = f"{pool.kernel[d]}, {pool.stride[d]}, {pool.padding[d]}, {pool.dilation[d]}"
        lines.append(f"P{d} = _sliding_windows(D{d}, {geometry}{', True' if pool.ceil_mode else ''})")
    return lines


def emit_pool(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    return _emit(kernel, name, variant, program, adaptive=False)


def emit_pool_indices(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    """A max pool's int64 positions: its window walk, keeping where each maximum is; nothing elementwise
    follows positions (the kind takes no epilogue)."""
    if kernel.target is not None:
        raise UnsupportedSubproblem("max pooling's indices written into a module buffer")
    return _emit(kernel, name, variant, program, adaptive=False)


def emit_adaptive_pool(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    return _emit(kernel, name, variant, program, adaptive=True)
