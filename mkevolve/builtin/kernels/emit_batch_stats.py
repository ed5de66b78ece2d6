"""A training-mode batch norm's statistics in one launch: per channel, the mean and the biased variance over
every other dim, and the running statistics moved toward them in place.

x is seen as C channels of R elements each (R = N * spatial). A program takes one channel, or one chunk of
a channel when there are too few channels to fill the GPU. It reads its elements twice: once for their
mean, once for their squared distances from it (two passes, not E[x^2] - E[x]^2, whose cancellation loses
digits when the mean is large against the spread; the second pass mostly hits L2). Chunks are combined in
a second, small launch by the parallel formula M2 = sum(M2_k) + sum(n_k * (mean_k - mean)^2). All of it adds in
fp64 and rounds the statistics to fp32 once.

The row-kernel route this replaces took a launch per reduction over each adjacent run of dims (4 for a
4-d input, more when split) and one per buffer update: 7 or more launches, where a small batch's time is
the launches'.
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, ScalarArgs, indent, make_operands
from .emit_rows import split_lines
from .indexing import GroupIndices, Indexer, Space
from .ir import BatchStats, Program
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, shape_text, signature


def emit_batch_stats(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    stats: BatchStats = kernel.anchor
    operands = make_operands(kernel.leaves)
    x = operands[stats.x.id]
    rank = stats.x.rank
    indexer = Indexer(stats.x.shapes, [Space("channel", (1,)), Space("reduced", (0, *range(2, rank)))], [x],
                      frame_name="input")
    scalars = ScalarArgs()
    updates = bool(stats.running)
    running = [operands[p.id] for p in stats.running]
    momentum = scalars.render(stats.momentum) if updates else ""
    out = KernelParam("stats_ptr", "output [2, C]: the mean, then the biased variance",
                      detail=f"t{kernel.root.id} {shape_text(kernel.root.shapes)}")
    update_params = ([running[0].pointer("running mean [C], updated in place"),
                      running[1].pointer("running variance [C], updated in place")] if updates else [])
    sizes = [KernelParam("C", "channels"), KernelParam("R", "elements per channel (every dim but 1)"),
             KernelParam("CHUNK", "elements per program, a multiple of BLOCK_R"),
             KernelParam("SPLIT", "programs per channel")]
    tail = scalars.kernel_signature() + ([KernelParam("unbias", "R / (R - 1): the running variance is unbiased")]
                                         if updates else [])
    chunks = signature(name, [out, KernelParam("part_ptr", "per chunk [2, C, SPLIT]: its mean, then its squared "
                                                           "distances from it (unused when FINAL)"),
                              x.pointer("input"), *update_params, *sizes, *indexer.kernel_signature(), *tail,
                              constexpr("BLOCK_R", "elements per step"),
                              constexpr("FINAL", "one chunk per channel: this launch writes the statistics")])
    combine = signature(f"{name}_combine", [out, KernelParam("part_ptr", "per chunk [2, C, SPLIT], as written "
                                                                         "by the first launch"),
                                            *update_params, *sizes, *tail,
                                            constexpr("SPLIT_BLOCK", "SPLIT rounded up to a power of 2")])
    epilogue = _epilogue([o.name for o in running], momentum)
    source = f"""@triton.jit
{chunks}
    # One program per channel and chunk of CHUNK elements: two passes, the chunk's mean and then its
    # squared distances from that mean.
    c = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    r_begin = s * CHUNK
    r_end = tl.minimum(r_begin + CHUNK, R)
    # in fp64, as the row kernels add sums (emit_rows._WIDE), rounded to fp32 once at the end
    acc = tl.zeros([BLOCK_R], tl.float64)
{indent(_pass(indexer, x, "a", ["acc += v.to(tl.float64)"]), 4)}
    count = (r_end - r_begin).to(tl.float64)
    mean = tl.sum(acc, axis=0) / count
    acc = tl.zeros([BLOCK_R], tl.float64)
{indent(_pass(indexer, x, "b", ["d = tl.where(mask, v - mean, 0.0)", "acc += d * d"]), 4)}
    m2 = tl.sum(acc, axis=0)
    if FINAL:
        batch_mean = mean.to(tl.float32)
        batch_var = (m2 / count).to(tl.float32)
{indent(epilogue, 8)}
    else:
        tl.store(part_ptr + c * SPLIT + s, mean)
        tl.store(part_ptr + (C + c) * SPLIT + s, m2)


@triton.jit
{combine}
    # One program per channel: the chunks' means and squared distances, weighted by their sizes.
    c = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SPLIT_BLOCK)
    smask = s < SPLIT
    n = tl.where(smask, tl.minimum(CHUNK, R - s * CHUNK), 0).to(tl.float64)
    means = tl.load(part_ptr + c * SPLIT + s, mask=smask, other=0.0)     # fp64, as the first launch wrote them
    m2s = tl.load(part_ptr + (C + c) * SPLIT + s, mask=smask, other=0.0)
    mean = tl.sum(n * means, axis=0) / R
    d = means - mean
    batch_mean = mean.to(tl.float32)
    batch_var = ((tl.sum(m2s, axis=0) + tl.sum(n * d * d, axis=0)) / R).to(tl.float32)
{indent(epilogue, 4)}
"""
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    launcher = _launcher(name, indexer, x.name, [o.name for o in running], tensor_args + scalar_args, variant)
    what = "batch mean and variance per channel" + (" + running statistics" if updates else "")
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=what)


def _pass(indexer: Indexer, x, tag: str, update: list[str]) -> list[str]:
    """One walk over the program's chunk: `v` is each step's elements, 0 where masked."""
    lines = ["r = r0 + tl.arange(0, BLOCK_R)", "mask = r < r_end"]
    indices = GroupIndices(indexer, {0: "c", 1: "r"}, lines, tag)
    offset = indexer.offset(x, indices)
    lines += [f"v = tl.load({x.name}_ptr + {offset}, mask=mask, other=0.0)", *update]
    return ["for r0 in range(r_begin, r_end, BLOCK_R):", *("    " + line for line in lines)]


def _epilogue(running: list[str], momentum: str) -> list[str]:
    """Store the statistics; with running statistics (their operand names), move them toward the batch's."""
    lines = ["tl.store(stats_ptr + c, batch_mean)", "tl.store(stats_ptr + C + c, batch_var)"]
    if running:
        mean_ptr, var_ptr = (f"{name}_ptr" for name in running)
        lines += ["# running = (1 - momentum) * running + momentum * batch, with the unbiased batch variance",
                  f"old_mean = tl.load({mean_ptr} + c)",
                  f"tl.store({mean_ptr} + c, old_mean + (batch_mean - old_mean) * {momentum})",
                  f"old_var = tl.load({var_ptr} + c)",
                  f"tl.store({var_ptr} + c, old_var + (batch_var * unbias - old_var) * {momentum})"]
    return lines


def _launcher(name: str, indexer: Indexer, x: str, running: list[str], args: list[LauncherArg],
              variant: Variant) -> str:
    tiles = variant.rows
    unbias = ["unbias"] if running else []
    scalars = [a.name for a in args if a.scalar is not None] + unbias

    def call(kernel: str, grid: str, outputs: str, split: str, blocks: str, reads_x: bool = True) -> str:
        """The chunk kernel reads x through its sizes and strides; the combining one reads only the chunks."""
        layout = [x] if reads_x else []
        tail = indexer.kernel_params() if reads_x else []
        args = [outputs, *layout, *running, "C", "R", "chunk", split, *tail, *scalars]
        return f"{kernel}[{grid}]({', '.join(args)}, {blocks})"

    lines = [f"shape = tuple({x}.shape)",
             "C = shape[1]",
             f"R = {x}.numel() // C",
             *indexer.wrapper_lines("shape", {x: x}),
             f"stats = torch.empty((2, *(s if d == 1 else 1 for d, s in enumerate(shape))), device={x}.device, "
             "dtype=torch.float32)",
             *(["unbias = R / max(R - 1, 1)"] if running else []),
             f"block_r = min({tiles.loop_block}, _next_power_of_2(R))",
             f"warps = _row_warps(block_r, {tiles.per_thread})",
             "# too few channels to fill the GPU: each channel's elements go to several programs",
             *split_lines("C", tiles.split_target),
             "if split == 1:",
             "    " + call(name, "(C, 1)", "stats, stats", "1", "BLOCK_R=block_r, FINAL=True, num_warps=warps"),
             "else:",
             f"    part = torch.empty((2, C, split), device={x}.device, dtype=torch.float64)",
             "    " + call(name, "(C, split)", "stats, part", "split", "BLOCK_R=block_r, FINAL=False, num_warps=warps"),
             "    " + call(f"{name}_combine", "(C,)", "stats, part", "split", "SPLIT_BLOCK=_next_power_of_2(split)",
                          reads_x=False),
             "return stats"]
    return f"def {name}_launch({', '.join(a.name for a in args)}):\n{indent(lines, 4)}\n"
