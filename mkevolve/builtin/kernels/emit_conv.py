"""Convolutions (1-3 spatial dims, strided, padded, dilated, grouped, transposed) with a fused epilogue.

Three templates, chosen per instance shape (`instance_templates`).

Implicit GEMM, on tensor cores through tl.dot: for one group, C[M, N] = A[M, K] @ B[K, N] with
M = output positions (batch and spatial), N = output channels and K = (kernel tap, input channel).
The launcher hands the kernel the input channels-last ([N, D.., C_in], a pixel's channels adjacent)
inside a zero border as wide as any tap reaches past it (so no load needs a bounds mask), and the
weight as [groups, taps.., C_in_g, C_out_g], so both tiles are read along contiguous memory.
K is walked in BLOCK_K steps: when BLOCK_K divides the channels of a group each step stays inside
one kernel tap (its masks are per output position); otherwise a step spans several taps. A transposed
convolution is split by output phase (output coordinate mod stride): in one phase only every
stride-th kernel tap reaches an input pixel, so each program walks those taps alone instead of
masking the others.

Outer products, for forward convolutions with fewer than 16 input channels per group (an RGB or
8-channel input, where most tl.dot lanes would be padding): the same output tile, accumulated in
exact fp32 as one masked column of x times one row of w per (tap, channel). Made an implicit GEMM instead,
with tf32x3 steps spanning taps, such convolutions ran slower on an H100 at KernelBench's shapes, though
2 to 3 times more accurately: 1.27x the outer products' time at 8 channels (level2/67 and 87's conv2d), 1.47x
(level2/7's conv3d), 1.7 to 2.7x at 3 channels (scripts/results/bench_builtin_small_channel_tf32x3_h100_*.json,
measured with commit cf1d488's bench_builtin.py --tf32x3-channels 3).

Direct: one program per BLOCK output elements, each summing its window with FMAs; used when a group
has too few output channels for a tile (depthwise convolutions) and for transposed convolutions
whose dilation and stride share a factor.

A subproblem's instances may differ in groups, stride, padding, dilation and kernel size: the
launcher then reads them from the instance's module and weight, so one file serves them all. When
the instances of a forward convolution need different templates (a MobileNet's RGB stem and its
wide layers), the file holds one kernel per template and a launcher that sends each instance to
its own (`_emit_dispatch`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from enum import Enum

from .configs import MatmulTile, Variant
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
from .emit_matmul import tile_autotune
from .indexing import GroupIndices, Indexer, Space
from .ir import Conv, Program, Scalar
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature

_MIN_DOT_N = 8       # output channels per group below which a tl.dot tile is mostly padding
_MIN_DOT_K = 16      # (taps x input channels) per group below which the same holds for K
MIN_TILE = 16       # smallest tl.dot tile side
_MAX_BLOCK_K = 64
# (tap, channel) steps an outer-product kernel unrolls inside its rolled tap loops. Unrolling all 216 steps
# of a 3x3x3 conv3d of 8 channels took 40 s to compile for sm_90 per tile config on a 2-core CPU; with at
# most 32 unrolled, 1.2 to 2.4 s, against 3.7 to 12 s at 96 (scripts/results/conv_compile_time_cpu_*.json).
# On the H200 the two limits ran KernelBench's small-channel convolutions within 3 % of each other, 32 the
# faster on the 8-channel conv3d (scripts/results/bench_builtin_conv_unroll_h200_2026-12-04.json).
_MAX_UNROLLED_STEPS = 32
_MIN_IMAGE_POSITIONS = 2048   # output positions per image from which tiles stay inside one image
_OUTER_PRODUCT_ACCUMULATORS = 64   # fp32 sums a thread of an outer-product tile holds (and as many partial ones)
_OUTER_PRODUCT_CHANNELS = 16       # BLOCK_N of an outer-product tile, at most: its thread then holds 4 positions


def _instance_channels(conv: Conv) -> list[tuple[int, int]]:
    """(input channels per group, output channels per group) of each input config."""
    if conv.transposed:   # w is [C_in, C_out_g, K..]
        return [(w[0] // g, w[1]) for w, g in zip(conv.w.shapes, conv.groups)]
    return [(w[1], w[0] // g) for w, g in zip(conv.w.shapes, conv.groups)]


def _group_channels(conv: Conv) -> tuple[set[int], set[int]]:
    """(input channels per group, output channels per group) over the configs."""
    channels = _instance_channels(conv)
    return {c for c, _ in channels}, {n for _, n in channels}


def _groups_line(conv: Conv, x: str, w: str) -> str:
    """`G = ...` in a launcher: a literal, or (when the instances differ) read off the shapes."""
    if len(set(conv.groups)) == 1:
        return f"G = {conv.groups[0]}  # groups"
    return f"G = {x}.shape[1] // {w}.shape[1]  # groups: C_in / (C_in per group), different per instance"


def _taps(conv: Conv, weight_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Kernel taps per spatial dim that one program walks: all of them, or for a transposed
    convolution the ceil(K / stride) that can land on one output phase."""
    kernel = weight_shape[2:]
    if not conv.transposed:
        return tuple(kernel)
    return tuple(-(-k // s) for k, s in zip(kernel, conv.stride))


def _reductions(conv: Conv) -> list[int]:
    """The GEMM depth (taps x input channels of a group) of each input config."""
    return [c * math.prod(_taps(conv, w)) for (c, _), w in zip(_instance_channels(conv), conv.w.shapes)]


def _min_reduction(conv: Conv) -> int:
    return min(_reductions(conv))


def _kernel_exprs(conv: Conv) -> list[str]:
    """The kernel size per spatial dim in a launcher: literals, or read off the weight when the
    instances differ (a pointwise 1x1 and a depthwise 3x3 convolution sharing one subproblem)."""
    sizes = {tuple(w[2:]) for w in conv.w.shapes}
    if len(sizes) == 1:
        return [str(k) for k in sizes.pop()]
    return [f"w.shape[{2 + d}]" for d in range(len(conv.stride))]


def _tap_exprs(conv: Conv) -> list[str]:
    if conv.transposed:  # one kernel size for every config (the handler refuses others)
        return [str(t) for t in _taps(conv, conv.w.shapes[0])]
    return _kernel_exprs(conv)


def _phases_split(conv: Conv) -> bool:
    """A transposed convolution splits by output phase when each phase's taps are every stride-th
    one: true when dilation and stride share no factor (then dilation has an inverse mod stride)."""
    return all(math.gcd(d, s) == 1 for d, s in zip(conv.dilation, conv.stride))


class ConvTemplate(Enum):
    IMPLICIT_GEMM = "implicit GEMM"                                  # each BLOCK_K step inside one tap
    IMPLICIT_GEMM_SPANNING = "implicit GEMM, steps spanning taps"
    OUTER_PRODUCT = "outer products"
    DIRECT = "direct"


_DOT_TEMPLATES = (ConvTemplate.IMPLICIT_GEMM, ConvTemplate.IMPLICIT_GEMM_SPANNING)


def _instance_template(c_in_g: int, c_out_g: int, reduction: int) -> ConvTemplate:
    """The template of one forward-convolution instance (see the module docstring). `_dispatch_test`
    writes the same rule into a launcher: keep the two together."""
    if c_out_g < _MIN_DOT_N or reduction < _MIN_DOT_K:
        return ConvTemplate.DIRECT
    if c_in_g < MIN_TILE:
        return ConvTemplate.OUTER_PRODUCT
    return ConvTemplate.IMPLICIT_GEMM if c_in_g % MIN_TILE == 0 else ConvTemplate.IMPLICIT_GEMM_SPANNING


def _transposed_template(conv: Conv) -> ConvTemplate:
    """One template for every instance of a transposed convolution: the least demanding one."""
    _, c_out = _group_channels(conv)
    if min(c_out) < _MIN_DOT_N or _min_reduction(conv) < _MIN_DOT_K or not _phases_split(conv):
        return ConvTemplate.DIRECT
    return ConvTemplate.IMPLICIT_GEMM if _tap_per_block(conv) else ConvTemplate.IMPLICIT_GEMM_SPANNING


def instance_templates(conv: Conv) -> list[ConvTemplate]:
    """The template of each input config."""
    if conv.transposed:
        return [_transposed_template(conv)] * len(conv.groups)
    return [_instance_template(c_in, c_out, reduction)
            for (c_in, c_out), reduction in zip(_instance_channels(conv), _reductions(conv))]


def conv_uses_dot(conv: Conv) -> bool:
    return any(t in _DOT_TEMPLATES for t in instance_templates(conv))


def conv_flops(conv: Conv, config: int) -> int:
    """2 FLOPs per multiply-add under input config `config`: each output element of a convolution sums
    C_in_g x taps products; each input element of a transposed one adds into C_out_g x taps outputs. The
    weight's dims 1 and 2.. are those counts in both layouts ([C_out, C_in_g, K..] / [C_in, C_out_g, K..])."""
    w = conv.w.shapes[config]
    elements = conv.x.shapes[config] if conv.transposed else conv.shapes[config]
    return 2 * math.prod(elements) * w[1] * math.prod(w[2:])


def emit_conv(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    configs = _configs_by_template(kernel.anchor)
    if len(configs) == 1:
        return _emit_template(kernel, name, variant, program, next(iter(configs)))
    return _emit_dispatch(kernel, name, variant, program, configs)


def _emit_template(kernel: KernelPlan, name: str, variant: Variant, program: Program,
                   template: ConvTemplate) -> KernelSource:
    if template is ConvTemplate.DIRECT:
        return _emit_direct(kernel, name, variant, program)
    return _emit_tiled(kernel, name, variant, program, dot=template in _DOT_TEMPLATES)


def _geometry_params(conv: Conv) -> list[KernelParam]:
    docs = {"STRIDE": "stride", "PAD": "padding", "DIL": "dilation", "K": "kernel size"}
    return [constexpr(f"{k}{d}", f"{doc} along spatial dim {d}") for k, doc in docs.items()
            for d in range(len(conv.stride))]


def _spatial(stem: str, conv: Conv) -> str:
    """"D0, D1": one name per spatial dim, for the shapes in comments."""
    return ", ".join(f"{stem}{d}" for d in range(len(conv.stride)))


def _tensor_params(kernel: KernelPlan, operands, x_layout: str, w_layout: str) -> list[KernelParam]:
    """x, w and out pointers: the layout the launcher hands the kernel, and the tensors the forward passes."""
    conv: Conv = kernel.anchor
    return [operands[conv.x.id].pointer(f"input as {x_layout}", "x_ptr"),
            operands[conv.w.id].pointer(f"weight as {w_layout}", "w_ptr"),
            output_param(kernel, f"output [N, C_out, {_spatial('P', conv)}], contiguous")]


def _size_params(conv: Conv, direct: bool, bounded: bool = True) -> list[KernelParam]:
    """Spatial sizes: input D (for kernels that mask taps by the input's bounds), output P and, transposed,
    Q output positions per phase."""
    dims = range(len(conv.stride))
    return ([KernelParam(f"D{d}", f"input size along spatial dim {d}") for d in dims if bounded]
            + [KernelParam(f"P{d}", f"output size along spatial dim {d}") for d in dims]
            + ([KernelParam(f"Q{d}", f"output positions per phase along spatial dim {d}") for d in dims]
               if conv.transposed and not direct else []))


def _geometry(conv: Conv) -> tuple[list[str], list[str], list[str]]:
    """Stride, padding and dilation per spatial dim as the launcher writes them: literals, or the launcher's
    own arguments when the subproblem's instances differ (see `_geometry_launcher_args`)."""
    dims = range(len(conv.stride))
    if conv.geometry_from is None:
        return ([str(v) for v in conv.stride], [str(v) for v in conv.padding], [str(v) for v in conv.dilation])
    return ([f"stride[{d}]" for d in dims], [f"padding[{d}]" for d in dims], [f"dilation[{d}]" for d in dims])


def _geometry_launcher_args(conv: Conv) -> list[LauncherArg]:
    """`self.<conv>.stride`, `.padding`, `.dilation`, passed to the launcher when they differ between instances."""
    if conv.geometry_from is None:
        return []
    return [LauncherArg(name, scalar=Scalar(0, attr=f"{conv.geometry_from}.{name}"))
            for name in ("stride", "padding", "dilation")]


def _geometry_args(conv: Conv) -> list[str]:
    kernel_size = _kernel_exprs(conv)
    dims = range(len(conv.stride))
    stride, padding, dilation = _geometry(conv)
    return ([f"STRIDE{d}={stride[d]}" for d in dims] + [f"PAD{d}={padding[d]}" for d in dims]
            + [f"DIL{d}={dilation[d]}" for d in dims] + [f"K{d}={kernel_size[d]}" for d in dims])


def _position_lines(spatial: int, flat: str, size: str = "P", coordinate: str = "p") -> list[str]:
    """Split a flat index into (nb, p0, p1, ...) over sizes (batch, P0, P1, ...), row-major."""
    lines = []
    rest = flat
    for d in range(spatial - 1, -1, -1):
        lines.append(f"{coordinate}{d} = {rest} % {size}{d}")
        lines.append(f"rest{d} = {rest} // {size}{d}")
        rest = f"rest{d}"
    lines.append(f"nb = {rest}")
    return lines


def flat_index(names: list[str], sizes: list[str]) -> str:
    """Row-major flat index of coordinates `names` over `sizes`."""
    return " + ".join(n + "".join(f" * {s}" for s in sizes[i + 1:]) for i, n in enumerate(names))


def out_size_lines(conv: Conv, x: str, w: str) -> list[str]:
    """Launcher lines from input `x` and weight `w`: sizes D*, output sizes P*, groups, channels, `out`."""
    spatial = len(conv.stride)
    lines = [f"D{d} = {x}.shape[{2 + d}]" for d in range(spatial)]
    strides, paddings, dilations = _geometry(conv)
    kernel = _kernel_exprs(conv)
    for d in range(spatial):
        s, p, dil, k = strides[d], paddings[d], dilations[d], kernel[d]
        if conv.transposed and conv.geometry_from is None and k.isdigit():
            lines.append(f"P{d} = _transposed_size(D{d}, {k}, {s}, {p}, {dil}, {conv.output_padding[d]})")
        else:   # per-instance values (geometry_from) are forward-only convolutions
            lines.append(f"P{d} = _sliding_windows(D{d}, {k}, {s}, {p}, {dil})")
    lines.append(_groups_line(conv, x, w))
    if conv.transposed:
        lines += [f"C_in_g = {x}.shape[1] // G", f"C_out_g = {w}.shape[1]"]
    else:
        lines += [f"C_in_g = {w}.shape[1]", f"C_out_g = {w}.shape[0] // G"]
    sizes = ", ".join(f"P{d}" for d in range(spatial))
    lines += ["C_out = C_out_g * G",
              f"out = torch.empty(({x}.shape[0], C_out, {sizes}), device={x}.device, dtype=torch.float32)",
              "shape = out.shape"]
    return lines


def conv_epilogue(kernel: KernelPlan, program: Program, operands, spaces, flat: dict[int, str], mask: str):
    """The pointwise chain after the convolution, applied to its tile `acc`: (epilogue operands, indexer,
    runtime scalars, emitter, the lines that compute it, the expression of its result)."""
    leaves = body_leaves(kernel, program)
    epilogue = [operands[v.id] for v in leaves]
    indexer = Indexer(kernel.root.shapes, spaces, epilogue)
    scalars = ScalarArgs()
    emitter = ExprEmitter(indexer, {v.id: operands[v.id] for v in leaves}, scalars)
    lines: list[str] = []
    region = Region(lines, mask=mask, indices=GroupIndices(indexer, flat, lines, "e"),
                    bound={kernel.anchor.id: "acc"})
    result = emitter.value(kernel.root, region)
    return epilogue, indexer, scalars, emitter, lines, result


# -- tiled: implicit GEMM and outer products --------------------------------------------------------

def _tap_per_block(conv: Conv) -> bool:
    """Every group has a multiple of 16 input channels: a BLOCK_K step then stays inside one tap."""
    return all(c % MIN_TILE == 0 for c in _group_channels(conv)[0])


def conv_tiles(conv: Conv, tiles: tuple[MatmulTile, ...], dot: bool = True) -> tuple[MatmulTile, ...]:
    """The variant's tiles cut to this convolution: BLOCK_N no wider than its output channels per group,
    BLOCK_K no deeper than its reduction, and a divisor of the channels when steps stay in one tap.
    Outer products have no BLOCK_K (tiles that differ only there are one), and their BLOCK_M follows from
    their warps (`_outer_product_tile`)."""
    _, c_out = _group_channels(conv)
    n_cap = max(MIN_TILE, 1 << (max(c_out) - 1).bit_length())
    if not dot:
        k_cap = MIN_TILE
    elif _tap_per_block(conv):
        k_cap = _per_tap_block_k(conv)
    else:
        k_cap = max(MIN_TILE, 1 << (_min_reduction(conv) - 1).bit_length())
    cut = (replace(t, block_n=min(t.block_n, n_cap), block_k=min(t.block_k, k_cap)) for t in tiles)
    if not dot:
        cut = (_outer_product_tile(t) for t in cut)
    return tuple(dict.fromkeys(cut))


def _outer_product_tile(tile: MatmulTile) -> MatmulTile:
    """An outer-product tile: the variant's warps, at most one per 32 of its BLOCK_M positions, each thread
    then holding as many positions as keep its running tile at _OUTER_PRODUCT_ACCUMULATORS sums (BLOCK_N
    channels a position, `_outer_product_lines`), so each weight row it loads serves several positions.
    More warps a tile than one per 32 positions left ptxas (sm_90, Triton 3.6) at 32 registers and 1 to 5 KB
    of stack a thread.

    BLOCK_N stops at _OUTER_PRODUCT_CHANNELS: a step's 64 FMAs a thread then wait on 4 x loads and 4 16-byte
    weight loads, against 2 and 8 at 32 channels x 2 positions and 1 and 16 at 64 x 1. On an H100, with the
    same sums, that took the kernels of level2/67, 87 and 71 (64 output channels: 64 x 1 before) from 6.12 to
    4.81 ms, 5.4 to 4.2-4.5 and 1.34 to 1.12, those of 23 and 7 (32 x 2 before) from 1.27 to 1.09 and 5.63 to
    5.58 (scripts/results/generator_trees_h100_2026-12-06_b.json); 1 x 32 took 7 from 5.5 to 7.3 ms."""
    warps = max(1, min(tile.warps, tile.block_m // 32))
    block_n = min(tile.block_n, _OUTER_PRODUCT_CHANNELS)
    positions = max(1, _OUTER_PRODUCT_ACCUMULATORS // block_n)
    return replace(tile, block_m=32 * warps * positions, block_n=block_n, warps=warps)


def _per_tap_block_k(conv: Conv) -> int:
    """The deepest BLOCK_K, at most 64, that divides every group's input channels: each step then reads
    one tap. At least 16 when the channels are multiples of 16."""
    common = math.gcd(*_group_channels(conv)[0])
    k_cap = _MAX_BLOCK_K
    while common % k_cap:
        k_cap //= 2
    return k_cap


def _image_tiles(conv: Conv) -> bool:
    """Tiles of a forward convolution stay inside one image when images have enough output positions
    to fill them (the last tile of each image is partly masked): the tile's positions are then one
    contiguous run, which Triton sees, so the output is stored coalesced along them."""
    return not conv.transposed and min(math.prod(s[2:]) for s in conv.shapes) >= _MIN_IMAGE_POSITIONS


def _row_lines(conv: Conv) -> list[str]:
    """This program's output rows: `nb` the image; per spatial dim `base{d}`, the input coordinate that
    tap 0 (of this phase) reads; `pos`, the flat spatial output index; `m_ok`, which rows exist."""
    spatial = len(conv.stride)
    dims = range(spatial)
    positions = " * ".join(f"P{d}" for d in dims)
    if _image_tiles(conv):
        return ([f"tiles = tl.cdiv({positions}, BLOCK_M)  # per image", "nb = pid_m // tiles",
                 "pos = (pid_m - nb * tiles) * BLOCK_M + tl.arange(0, BLOCK_M)", f"m_ok = pos < {positions}"]
                + _position_lines(spatial, "pos")[:-1]   # all but `nb = ...`: pos is inside one image
                + [f"base{d} = p{d} * STRIDE{d} - PAD{d}" for d in dims])
    lines = ["rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "m_ok = rm < M"]
    if not conv.transposed:
        return (lines + _position_lines(spatial, "rm")
                + [f"base{d} = p{d} * STRIDE{d} - PAD{d}" for d in dims]
                + [f"pos = {flat_index([f'p{d}' for d in dims], [f'P{d}' for d in dims])}"])
    # phase r = output coordinate mod STRIDE; rows are (batch, q0, q1, ..) with output o = r + STRIDE * q
    lines += ["phase = tl.program_id(2) // GROUPS"]
    for d in reversed(dims):
        lines += [f"r{d} = phase % STRIDE{d}", f"phase = phase // STRIDE{d}"]
    lines += _position_lines(spatial, "rm", size="Q", coordinate="q")
    for d in dims:
        lines += [f"o{d} = r{d} + STRIDE{d} * q{d}",
                  f"m_ok = m_ok & (o{d} < P{d})",
                  f"kf{d} = ((r{d} + PAD{d}) * INV{d}) % STRIDE{d}  # first kernel tap landing on this phase",
                  f"base{d} = q{d} + (r{d} + PAD{d} - kf{d} * DIL{d}) // STRIDE{d}  # an exact division"]
    return lines + [f"pos = {flat_index([f'o{d}' for d in dims], [f'P{d}' for d in dims])}"]


def _reduction_lines(conv: Conv, precision: str) -> list[str]:
    """The K loop: `t` numbers this program's taps (T0 x T1 x ..), `tap{d}` is the kernel tap it reads,
    `c` the input channel within the group."""
    dims = range(len(conv.stride))
    if _tap_per_block(conv):
        lines = ["    t = k0 // C_in_g  # BLOCK_K divides C_in_g: the whole step reads one kernel tap",
                 "    c = k0 - t * C_in_g + tl.arange(0, BLOCK_K)"]
        lane, k_ok = "", []   # t is a scalar and every lane a real channel
    else:
        lines = ["    kk = k0 + tl.arange(0, BLOCK_K)  # the step spans several taps: decode each lane",
                 "    t = kk // C_in_g",
                 "    c = kk - t * C_in_g"]
        lane, k_ok = "[None, :]", ["(kk < K_TOTAL)"]
    rest = "t"
    for d in reversed(dims):
        lines += [f"    t{d} = {rest} % T{d}", f"    rest_t{d} = {rest} // T{d}"]
        rest = f"rest_t{d}"
    step = "-DIL" if conv.transposed else "DIL"   # input coordinate moved per tap
    for d in dims:
        tap = f"kf{d} + STRIDE{d} * t{d}" if conv.transposed else f"t{d}"
        lines += [f"    tap{d} = {tap}"]
        k_ok += [f"(tap{d} < K{d})"] if _taps_overrun(conv, d) else []
    if k_ok and not lane:
        # one tap for the whole step: its lanes are all real channels, or none when the tap falls outside
        # the kernel. A splat, not `c < ...`: Triton then sees the mask constant along the step and loads
        # 16 bytes at a time (a lane vector: 0-d masks do not broadcast in Triton's interpreter)
        lines.append(f"    k_ok = tl.full([BLOCK_K], 1, tl.int1) & {' & '.join(k_ok)}")
    elif k_ok:
        lines.append(f"    k_ok = {' & '.join(k_ok)}")
    # no bounds masks: x_cl's zero border holds every coordinate a real row's tap reads (`_input_border`)
    a_mask = " & ".join(["m_ok[:, None]"] + (["k_ok[None, :]"] if k_ok else []))
    b_mask = " & ".join((["k_ok[:, None]"] if k_ok else []) + ["n_ok[None, :]"])
    x_lane = " + ".join(["c"] + [f"{step}{d} * t{d} * sx{d}" for d in dims])
    w_row = f"({flat_index([f'tap{d}' for d in dims], [f'K{d}' for d in dims])}) * C_in_g + c"
    lines += [f"    a = tl.load(x_ptr + x_rows[:, None] + ({x_lane})[None, :], mask={a_mask}, other=0.0)",
              f"    b = tl.load(w_ptr + w_group + ({w_row})[:, None] * C_out_g + rn[None, :], "
              f"mask={b_mask}, other=0.0)",
              f'    acc = tl.dot(a, b, acc, input_precision="{precision}")']
    return ["for k0 in range(0, K_TOTAL, BLOCK_K):"] + lines


def _taps_overrun(conv: Conv, dim: int) -> bool:
    """Whether a transposed convolution's phase can walk past the kernel along `dim`: its T = ceil(K / stride)
    taps kf + stride * t reach K when stride does not divide K (a 3-tap kernel at stride 2: one phase has
    taps 0 and 2, the other tap 1 and a tap 3 that does not exist). A forward convolution walks its K taps."""
    return conv.transposed and any(w[2 + dim] % conv.stride[dim] for w in conv.w.shapes)


def _rolled_tap_dims(conv: Conv) -> int:
    """How many of the outermost tap loops an outer-product kernel keeps as loops: the fewest that leave
    at most _MAX_UNROLLED_STEPS (tap, channel) steps unrolled inside them. Rolling the outer loops keeps
    each iteration's body long (loads issued ahead of their FMAs); rolling the inner ones left one load and
    one outer product per iteration: level2/67's conv took 5.39 ms that way on the H200, 4.28 ms this way."""
    kernel = [max(w[2 + d] for w in conv.w.shapes) for d in range(len(conv.stride))]
    steps = max(c for c, _ in _instance_channels(conv))
    rolled = len(kernel)
    while rolled > 0 and steps * kernel[rolled - 1] <= _MAX_UNROLLED_STEPS:
        rolled -= 1
        steps *= kernel[rolled]
    return rolled


def _outer_product_lines(conv: Conv) -> list[str]:
    """Few input channels per group: for each kernel tap and channel, x column x w row, a [BLOCK_M] gather
    masked per output position and a [BLOCK_N] weight row, as fp32 FMAs. The channel loop and the inner tap
    loops are unrolled; the outer tap loops stay loops where unrolling all would pass _MAX_UNROLLED_STEPS
    steps (`_rolled_tap_dims`).

    The sums are kept transposed, [BLOCK_N channels, BLOCK_M positions] (the kernel's header says why), and the
    weight is zero-padded to W_N channels so its rows load without a mask. On an H100 that took level2/7's
    kernel from 6.03 to 5.5 ms, 87's from 5.88 to 5.47, 67's from 6.24 to 5.94, 27's from 5.85 to 4.29 and 71's
    from 1.43 to 1.38, and 23's from 1.18 to 1.25 (scripts/results/generator_trees_h100_2026-12-06.json).

    Each pass of the rolled loops sums its unrolled steps into `part_t`, added to `acc_t` once: blocked
    summation. A single running sum over all 72 steps of an 8-channel 3x3 conv2d missed an fp64 reference
    by up to 8.5e-07 (rms 5.3e-08) on KernelBench's uniform [0, 1) inputs, blocks of 24 steps by 3.4e-07
    (rms 3.3e-08), for one more add per block (fp32 FMAs emulated on the CPU, 8.3M outputs). On an H100
    at KernelBench's sizes: 3.8e-07 against 9.2e-07 (cuDNN 7.8e-07) for 21 % more time, and 3.4e-07
    against 1.25e-06 for the 8-channel conv3d (cuDNN 1.31e-06) for 7 % more: the second tile of
    accumulators costs registers (scripts/results/bench_builtin_conv_blocked_sums_h100_2026-12-05.json). On
    the H200, level2/7's whole kernel (conv3d and its epilogue) took 6.0 to 6.2 ms with blocks, 5.6 ms
    without, its autotuner choosing a 64x32 tile on 2 warps over 128x32 on 4
    (scripts/results/generator_trees_h200_2026-12-06.json)."""
    dims = range(len(conv.stride))
    rolled = _rolled_tap_dims(conv)
    total = "part_t" if rolled else "acc_t"
    lines, mask = ["acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # transposed: see the header"], "m_ok"
    for d in dims:
        pad = "    " * d
        loop = "range" if d < rolled else "tl.static_range"
        lines += [f"{pad}for k{d} in {loop}(K{d}):",
                  f"{pad}    in{d} = base{d} + k{d} * DIL{d}",
                  f"{pad}    ok{d} = {mask} & (in{d} >= 0) & (in{d} < D{d})"]
        if d + 1 == rolled:
            lines.append(f"{pad}    part_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)")
        mask = f"ok{d}"
    inner = "    " * len(dims)
    tap = flat_index([f"k{d}" for d in dims], [f"K{d}" for d in dims])
    lines += [
        f"{inner}x_tap = x_image + " + " + ".join(f"in{d}.to(tl.int64) * sx{d}" for d in dims),
        f"{inner}w_tap = w_group + ({tap}) * C_in_g * W_N",
        f"{inner}for c in tl.static_range(C_in_g):",
        f"{inner}    a = tl.load(x_ptr + x_tap + c * sxc, mask={mask}, other=0.0)",
        f"{inner}    b = tl.load(w_ptr + w_tap + c * W_N + rn)  # zero-padded to W_N channels: no mask",
        f"{inner}    {total} += b[:, None] * a[None, :]"]
    if rolled:
        lines.append("    " * rolled + "acc_t += part_t")
    return lines + ["acc = tl.trans(acc_t)  # [BLOCK_M, BLOCK_N], as the epilogue indexes it"]


def _tiled_body(conv: Conv, dot: bool, precision: str, epi_lines: list[str], result: str) -> list[str]:
    dims = range(len(conv.stride))
    out_positions = " * ".join(f"P{d}" for d in dims)
    if dot:  # channels-last x: a row's channels are adjacent, the taps are added per lane
        x_lines = ["x_rows = nb.to(tl.int64) * sxn + g * C_in_g + "
                   + " + ".join(f"base{d}.to(tl.int64) * sx{d}" for d in dims)]
        reduction = _reduction_lines(conv, precision)
    else:
        x_lines = ["x_image = nb.to(tl.int64) * sxn + (g * C_in_g).to(tl.int64) * sxc"]
        reduction = _outer_product_lines(conv)
    return (["pid_m = tl.program_id(0)", "pid_n = tl.program_id(1)", "g = tl.program_id(2) % GROUPS",
             "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)", "n_ok = rn < C_out_g"] + _row_lines(conv)
            + x_lines + ["w_group = g.to(tl.int64) * swg"]
            + (["acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"] if dot else [])
            + reduction
            + ["co = g * C_out_g + rn", "pos64 = pos.to(tl.int64)", "nb64 = nb.to(tl.int64)",
               f"ro64 = nb64 * ({out_positions}) + pos64", "co64 = co.to(tl.int64)",
               "mask = m_ok[:, None] & n_ok[None, :]"] + epi_lines
            + [f"out_offs = (nb64{'' if _image_tiles(conv) else '[:, None]'} * C_out + co64[None, :]) "
               f"* ({out_positions}) + pos64[:, None]",
               f"tl.store(out_ptr + out_offs, {result}, mask=mask)"])


_CONSTANT_DOCS = {"T": "kernel taps a program walks along spatial dim {d}", "GROUPS": "groups",
                  "INV": "inverse of the dilation mod the stride along spatial dim {d}"}


def _tiled_params(kernel: KernelPlan, dot: bool, operands, epilogue, indexer, scalars) -> list[KernelParam]:
    conv: Conv = kernel.anchor
    dims = range(len(conv.stride))
    x_layout = (f"channels-last [N, {_spatial('D', conv)}, C_in] in a zero border" if dot
                else f"[N, C_in, {_spatial('D', conv)}]")
    sizes = [KernelParam("M", "GEMM rows, images x output positions" + (" per phase" if conv.transposed else "")),
             KernelParam("C_in_g", "input channels per group", constexpr=not dot),
             KernelParam("C_out_g", "output channels per group"), KernelParam("C_out", "output channels")]
    sizes += ([KernelParam("K_TOTAL", "GEMM depth, C_in_g x taps")] if dot
              else [KernelParam("W_N", "weight row length: C_out_g zero-padded to a multiple of BLOCK_N")])
    strides = ([KernelParam("sxn", "input stride between images")]
               + ([] if dot else [KernelParam("sxc", "input stride between channels")])
               + [KernelParam(f"sx{d}", f"input stride along spatial dim {d}") for d in dims]
               + [KernelParam("swg", "weight stride between groups")])
    constants = []
    for assignment in _tiled_constants(conv, dot):
        name = assignment.split("=")[0]
        doc = _CONSTANT_DOCS[name.rstrip("0123456789")].format(d=name[-1])
        constants.append(constexpr(name, doc))
    blocks = ([constexpr("BLOCK_M", "output positions per program"),
               constexpr("BLOCK_N", "output channels per program")]
              + ([constexpr("BLOCK_K", "GEMM depth per step")] if dot else []))
    w_layout = f"[GROUPS, {_spatial('K', conv)}, C_in_g, {'C_out_g' if dot else 'W_N'}]"
    return (_tensor_params(kernel, operands, x_layout, w_layout)
            + [o.pointer("epilogue operand") for o in epilogue] + sizes
            + _size_params(conv, direct=False, bounded=not dot) + strides
            + indexer.kernel_signature() + scalars.kernel_signature() + _geometry_params(conv) + constants + blocks)


def _tiled_call(conv: Conv, dot: bool, epilogue, indexer, scalar_args) -> str:
    dims = range(len(conv.stride))
    x = "x_cl" if dot else "x"
    # an implicit GEMM reads a bordered input without bounds masks: no input sizes
    sizes = (["M", "C_in_g", "C_out_g", "C_out"] + (["K_TOTAL"] if dot else ["W_N"] + [f"D{d}" for d in dims])
             + [f"P{d}" for d in dims] + ([f"Q{d}" for d in dims] if conv.transposed else []))
    strides = ([f"{x}.stride(0)"] + ([] if dot else [f"{x}.stride(1)"])
               + [f"{x}.stride({(1 if dot else 2) + d})" for d in dims] + ["w_gemm.stride(0)"])
    return ", ".join([x, "w_gemm", "out"] + [o.name for o in epilogue] + sizes + strides + indexer.kernel_params()
                     + [a.name for a in scalar_args] + _geometry_args(conv) + _tiled_constants(conv, dot))


def _tiled_constants(conv: Conv, dot: bool) -> list[str]:
    """Keyword arguments for the kernel's constexprs beyond the geometry."""
    dims = range(len(conv.stride))
    taps = _tap_exprs(conv)
    constants = ([f"T{d}={taps[d]}" for d in dims] if dot else []) + ["GROUPS=G"]
    if conv.transposed:  # inverse of the dilation mod the stride (0 when the stride is 1: one phase)
        constants += [f"INV{d}={pow(conv.dilation[d], -1, conv.stride[d]) if conv.stride[d] > 1 else 0}"
                      for d in dims]
    return constants


def _input_border(conv: Conv) -> list[tuple[str, str]]:
    """Zero rows (before, after) per spatial dim that hold every input coordinate a real output row's taps
    read, so the implicit GEMM loads them without bounds masks (7 to 12 % faster at KernelBench's shapes on the
    H200, scripts/results/bench_builtin_conv_border_h200_2026-12-04.json). A forward convolution reads from
    -padding to D - 1 + padding. A transposed one reads in = (o + padding - tap * dilation) / stride for outputs
    o in [0, P): down to -floor(reach / stride) and up to D - 1 + floor((reach + output_padding) / stride),
    reach = dilation * (K - 1) - padding."""
    if not conv.transposed:
        return [(p, p) for p in _geometry(conv)[1]]
    border = []
    for d, (k, s, p, dil) in enumerate(zip(conv.w.shapes[0][2:], conv.stride, conv.padding, conv.dilation)):
        reach = dil * (k - 1) - p
        border.append((str(max(0, reach // s)), str(max(0, (reach + conv.output_padding[d]) // s))))
    return border


def _bordered_input_lines(conv: Conv) -> list[str]:
    """x_cl: the input channels-last (a pixel's channels adjacent) inside its zero border, as a view whose
    (0, 0, ..) is the input's first pixel; the border lies at negative coordinates and past D."""
    border = _input_border(conv)
    plain = "x_cl = x.movedim(1, -1).contiguous()  # channels-last: a pixel's input channels adjacent"
    if all(before == after == "0" for before, after in border):
        return [plain]
    sizes = ", ".join(f"D{d} + {before} + {after}" for d, (before, after) in enumerate(border))
    inside = ", ".join(f"{before}:{before} + D{d}" for d, (before, _) in enumerate(border))
    origin = ", ".join(f"{before}:" for before, _ in border)
    bordered = [f"x_cl = x.new_zeros((x.shape[0], {sizes}, x.shape[1]))  # channels-last, in a zero border",
                f"x_cl[:, {inside}] = x.movedim(1, -1)",
                f"x_cl = x_cl[:, {origin}]  # (0, ..) is the input's first pixel"]
    if any(side.isdigit() and side != "0" for sides in border for side in sides):
        return bordered
    # The border is known at run time only (a kernel shared by layers of several paddings): an unpadded
    # layer (a 1x1 convolution) skips filling one
    unpadded = " and ".join(f"{side} == 0" for sides in border for side in dict.fromkeys(sides))
    return [f"if {unpadded}:", "    " + plain, "else:"] + ["    " + line for line in bordered]


def _tiled_launch_lines(conv: Conv, dot: bool, name: str, call: str, tiles, autotune: bool) -> list[str]:
    dims = range(len(conv.stride))
    rows = " * ".join((f"Q{d}" if conv.transposed else f"P{d}") for d in dims)
    grid_z = f"G * {math.prod(conv.stride)}" if conv.transposed else "G"
    # [C_out, C_in_g, K..] (transposed: [C_in, C_out_g, K..]) -> [GROUPS, K.., C_in_g, C_out_g]
    to_gemm = ".movedim(1, -1).movedim(1, -1)" if conv.transposed else ".movedim(2, -1).movedim(1, -1)"
    w_gemm = f"w.reshape(G, -1, *w.shape[1:]){to_gemm}"
    if dot:
        weight = _bordered_input_lines(conv) + [f"w_gemm = {w_gemm}.contiguous()"]
    else:   # rows zero-padded to a multiple of every tile's BLOCK_N, so the kernel loads them unmasked
        widest = max(t.block_n for t in tiles)
        weight = [f"W_N = _cdiv(C_out_g, {widest}) * {widest}",
                  "w_gemm = w.new_zeros((G, *w.shape[2:], C_in_g, W_N))",
                  f"w_gemm[..., :C_out_g] = {w_gemm}"]
    lines = ([f"Q{d} = _cdiv(P{d}, {conv.stride[d]})" for d in dims if conv.transposed] + weight
             + [f"M = x.shape[0] * {rows}"]
             + ([f"K_TOTAL = C_in_g * {' * '.join(_tap_exprs(conv))}"] if dot else []))
    positions = " * ".join(f"P{d}" for d in dims)

    def row_tiles(block_m) -> str:
        return f"x.shape[0] * _cdiv({positions}, {block_m})" if _image_tiles(conv) else f"_cdiv(M, {block_m})"

    if autotune:
        rows_grid = row_tiles('meta["BLOCK_M"]')
        return lines + [f'grid = lambda meta: ({rows_grid}, _cdiv(C_out_g, meta["BLOCK_N"]), {grid_z})',
                        f"{name}[grid]({call})"]
    t = tiles[0]
    block_k = f", BLOCK_K={t.block_k}" if dot else ""
    return lines + [f"grid = ({row_tiles(t.block_m)}, _cdiv(C_out_g, {t.block_n}), {grid_z})",
                    f"{name}[grid]({call}, BLOCK_M={t.block_m}, BLOCK_N={t.block_n}{block_k}, "
                    f"num_warps={t.warps})"]


def _emit_tiled(kernel: KernelPlan, name: str, variant: Variant, program: Program, dot: bool) -> KernelSource:
    """Implicit GEMM (dot=True) or outer products: an output tile [BLOCK_M positions, BLOCK_N channels]."""
    conv: Conv = kernel.anchor
    operands = make_operands(kernel.leaves)
    x, w = operands[conv.x.id].name, operands[conv.w.id].name
    spaces = [Space("positions", (0,) + tuple(range(2, conv.rank))), Space("channels", (1,))]
    epilogue, indexer, scalars, emitter, epi_lines, result = conv_epilogue(
        kernel, program, operands, spaces, {0: "ro64[:, None]", 1: "co64[None, :]"}, "mask")
    ops = describe_body(kernel, program.values)
    params = _tiled_params(kernel, dot, operands, epilogue, indexer, scalars)
    tiles = conv_tiles(conv, variant.conv, dot)
    decorator = tile_autotune(tiles, ["M", "C_in_g", "C_out_g"], group_m=False, block_k=dot) \
        if variant.autotune else ""
    kind = f"{len(conv.stride)}-d {'transposed convolution' if conv.transposed else 'convolution'}"
    if dot:
        split = "; the grid's third axis is (output phase, group)" if conv.transposed else ""
        header = (f"# Implicit-GEMM {kind}: a [BLOCK_M output positions, BLOCK_N output channels] tile of one\n"
                  f"    # group per program, reducing over (kernel tap, input channel) BLOCK_K at a time{split}.\n"
                  f"    # x is channels-last [N, D.., C_in] inside a zero border that every tap's coordinate\n"
                  f"    # falls in (no bounds masks); w is [GROUPS, K.., C_in_g, C_out_g].")
    else:
        header = (f"# Outer-product {kind}: a [BLOCK_M output positions, BLOCK_N output channels] tile of one\n"
                  f"    # group per program; too few input channels for tl.dot, so each (kernel tap, input\n"
                  f"    # channel) adds a column of x times a row of w, w being [GROUPS, K.., C_in_g, W_N].\n"
                  f"    # The sums are kept transposed, [BLOCK_N, BLOCK_M]: Triton's layout then gives each thread\n"
                  f"    # whole weight rows (16-byte loads, one per 4 channels) and its own positions, where\n"
                  f"    # [BLOCK_M, BLOCK_N] spread a weight row over a warp and shared every x column through\n"
                  f"    # shared memory, two barriers per step.")
    body = _tiled_body(conv, dot, variant.precision, epi_lines, result)
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    {header} Epilogue: {ops or "none"}.
{indent(body, 4)}
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    call = _tiled_call(conv, dot, epilogue, indexer, scalar_args)
    scalar_args += _geometry_launcher_args(conv)
    lines = ([f"x, w = {x}, {w}"] + out_size_lines(conv, "x", "w")
             + indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
             + _tiled_launch_lines(conv, dot, name, call, tiles, variant.autotune))
    launcher = f"def {name}_launch({', '.join(a.name for a in tensor_args + scalar_args)}):\n" \
               f"{indent(lines + ['return out'], 4)}\n"
    how = (f"{variant.precision} tl.dot{'' if _tap_per_block(conv) else ', steps spanning taps'}" if dot
           else "fp32 FMA")
    description = (f"{'implicit-GEMM' if dot else 'outer-product'} "
                   f"{'transposed convolution' if conv.transposed else 'convolution'}"
                   f"{' + ' + ops if ops else ''} ({how}, {tile_text(tiles, variant.autotune, dot)})")
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=description)


def tile_text(tiles: tuple[MatmulTile, ...], autotune: bool, block_k: bool = True) -> str:
    """The tiling a description names: the autotuned configs' count, or the one tile."""
    if autotune:
        return f"autotuned over {len(tiles)} tile configs"
    t = tiles[0]
    return f"tile {t.block_m}x{t.block_n}" + (f"x{t.block_k}" if block_k else "")


# -- direct -----------------------------------------------------------------------------------------

def _window_lines(conv: Conv, positions: list[str], valid: str) -> tuple[list[str], list[str], str]:
    """Loop headers over the window and the input coordinate/mask per spatial dim, innermost last.

    Returns (lines, loop indentation prefixes, the combined validity mask name).
    """
    lines, prefixes = [], []
    mask = valid
    for d, p in enumerate(positions):
        pad = "    " * d
        lines.append(f"{pad}for k{d} in tl.static_range(K{d}):")
        inner = pad + "    "
        if conv.transposed:
            lines += [f"{inner}num{d} = {p} + PAD{d} - k{d} * DIL{d}",
                      f"{inner}in{d} = num{d} // STRIDE{d}",
                      f"{inner}ok{d} = {mask} & (num{d} >= 0) & (num{d} % STRIDE{d} == 0) & (in{d} < D{d})"]
        else:
            lines += [f"{inner}in{d} = {p} * STRIDE{d} - PAD{d} + k{d} * DIL{d}",
                      f"{inner}ok{d} = {mask} & (in{d} >= 0) & (in{d} < D{d})"]
        mask = f"ok{d}"
        prefixes.append(inner)
    return lines, prefixes, mask


def _direct_weight_strides(conv: Conv, w: str) -> list[str]:
    if conv.transposed:
        return [f"w_group, w_out, w_in = C_in_g * {w}.stride(0), {w}.stride(1), {w}.stride(0)"]
    return [f"w_group, w_out, w_in = C_out_g * {w}.stride(0), {w}.stride(0), {w}.stride(1)"]


def _stride_args(conv: Conv, x: str, w: str) -> list[str]:
    spatial = len(conv.stride)
    return ([f"{x}.stride(0)", f"{x}.stride(1)"] + [f"{x}.stride({2 + d})" for d in range(spatial)]
            + ["w_group", "w_out", "w_in"] + [f"{w}.stride({2 + d})" for d in range(spatial)])


def _stride_params(conv: Conv) -> list[KernelParam]:
    dims = range(len(conv.stride))
    return ([KernelParam("sxn", "input stride between images"), KernelParam("sxc", "input stride between channels")]
            + [KernelParam(f"sx{d}", f"input stride along spatial dim {d}") for d in dims]
            + [KernelParam("swg", "weight stride between groups"),
               KernelParam("swo", "weight stride between output channels of a group"),
               KernelParam("swi", "weight stride between input channels of a group")]
            + [KernelParam(f"sw{d}", f"weight stride along kernel dim {d}") for d in dims])


def _emit_direct(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    conv: Conv = kernel.anchor
    spatial = len(conv.stride)
    operands = make_operands(kernel.leaves)
    x, w = operands[conv.x.id].name, operands[conv.w.id].name
    spaces = [Space("flat", tuple(range(conv.rank)))]
    epilogue, indexer, scalars, emitter, epi_lines, result = conv_epilogue(
        kernel, program, operands, spaces, {0: "offs"}, "mask")
    ops = describe_body(kernel, program.values)
    positions = [f"p{d}" for d in range(spatial)]
    window, prefixes, ok = _window_lines(conv, positions, "mask")
    inner = prefixes[-1]
    in_offset = " + ".join(f"in{d} * sx{d}" for d in range(spatial))
    w_offset = " + ".join(f"k{d} * sw{d}" for d in range(spatial))
    loop = [f"{inner}for c in range(0, C_in_g):",
            f"{inner}    xv = tl.load(x_ptr + x_base + c * sxc + {in_offset}, mask={ok}, other=0.0)",
            f"{inner}    wv = tl.load(w_ptr + w_base + c * swi + {w_offset}, mask=mask, other=0.0)",
            f"{inner}    acc += xv * wv"]
    size_params = [f"D{d}" for d in range(spatial)] + [f"P{d}" for d in range(spatial)]
    w_layout = "[C_in, C_out_g, K..]" if conv.transposed else "[C_out, C_in_g, K..]"
    params = (_tensor_params(kernel, operands, f"[N, C_in, {_spatial('D', conv)}]", w_layout)
              + [o.pointer("epilogue operand") for o in epilogue]
              + [KernelParam("numel", "output elements"), KernelParam("C_in_g", "input channels per group"),
                 KernelParam("C_out_g", "output channels per group"), KernelParam("C_out", "output channels")]
              + _size_params(conv, direct=True) + _stride_params(conv) + indexer.kernel_signature()
              + scalars.kernel_signature() + _geometry_params(conv)
              + [constexpr("BLOCK", "output elements per program")])
    body = (["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "mask = offs < numel"]
            + _position_lines(spatial, "offs")
            + ["co = nb % C_out", "nb = nb // C_out", "g = co // C_out_g",
               "x_base = nb * sxn + g * C_in_g * sxc",
               "w_base = g * swg + (co - g * C_out_g) * swo",
               "acc = tl.zeros([BLOCK], dtype=tl.float32)"]
            + window + loop + epi_lines + [f"tl.store(out_ptr + offs, {result}, mask=mask)"])
    kind = "transposed convolution" if conv.transposed else "convolution"
    autotune = variant.autotune
    decorator = block_autotune(variant.pool, ["numel", "C_in_g"]) if autotune else ""
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # Direct {spatial}-d {kind} (few channels per group, so no tl.dot): each program computes BLOCK
    # consecutive output elements, summing input channels of its group over the unrolled window.
    # Epilogue: {ops or "none"}.
{indent(body, 4)}
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    call = ", ".join(["x", "w", "out"] + [o.name for o in epilogue] + ["numel", "C_in_g", "C_out_g", "C_out"]
                     + size_params + _stride_args(conv, "x", "w") + indexer.kernel_params()
                     + [a.name for a in scalar_args] + _geometry_args(conv))
    lines = [f"x, w = {x}, {w}"] + out_size_lines(conv, "x", "w") + _direct_weight_strides(conv, "w") + \
        ["numel = out.numel()"] + indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
    if autotune:
        lines += ['grid = lambda meta: (_cdiv(numel, meta["BLOCK"]),)', f"{name}[grid]({call})"]
    else:
        block, warps = variant.pool[0]
        lines += [f"{name}[(_cdiv(numel, {block}),)]({call}, BLOCK={block}, num_warps={warps})"]
    scalar_args += _geometry_launcher_args(conv)
    launcher = f"def {name}_launch({', '.join(a.name for a in tensor_args + scalar_args)}):\n" \
               f"{indent(lines + ['return out'], 4)}\n"
    description = f"direct {kind}{' + ' + ops if ops else ''} (FMA, no tl.dot)"
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=description)


# -- per-instance dispatch --------------------------------------------------------------------------

_SUFFIXES = {ConvTemplate.DIRECT: "direct", ConvTemplate.OUTER_PRODUCT: "outer",
             ConvTemplate.IMPLICIT_GEMM: "gemm", ConvTemplate.IMPLICIT_GEMM_SPANNING: "gemm_spanning"}


def _configs_by_template(conv: Conv) -> dict[ConvTemplate, list[int]]:
    """The input configs each template serves, in the order a dispatching launcher tests them."""
    templates = instance_templates(conv)
    return {t: [c for c, own in enumerate(templates) if own is t] for t in _SUFFIXES if t in templates}


def _for_configs(kernel: KernelPlan, configs: list[int]) -> KernelPlan:
    """`kernel` as if its convolution had only these input configs: each template's tiles, step depth
    and loop shapes then follow the instances it serves. Values keep their ids, so operands still match."""
    conv: Conv = kernel.anchor
    x, w, anchor = copy.copy(conv.x), copy.copy(conv.w), copy.copy(conv)
    x.shapes = tuple(conv.x.shapes[c] for c in configs)
    w.shapes = tuple(conv.w.shapes[c] for c in configs)
    anchor.shapes = tuple(conv.shapes[c] for c in configs)
    anchor.groups = tuple(conv.groups[c] for c in configs)
    anchor.x, anchor.w = x, w
    return replace(kernel, anchor=anchor)


def _dispatch_test(template: ConvTemplate, conv: Conv) -> str:
    """The launcher's test that sends an instance to `template`'s kernel: the rule of `_instance_template`
    over the launcher's C_in_g, C_out_g and taps, tested in `_SUFFIXES` order. The per-tap implicit GEMM
    asks for channels that its deepest BLOCK_K divides, which every instance it was made for has."""
    return {ConvTemplate.DIRECT: f"C_out_g < {_MIN_DOT_N} or C_in_g * taps < {_MIN_DOT_K}",
            ConvTemplate.OUTER_PRODUCT: f"C_in_g < {MIN_TILE}",
            ConvTemplate.IMPLICIT_GEMM: f"C_in_g % {_per_tap_block_k(conv)} == 0",
            ConvTemplate.IMPLICIT_GEMM_SPANNING: f"C_in_g >= {MIN_TILE}"}[template]


def _emit_dispatch(kernel: KernelPlan, name: str, variant: Variant, program: Program,
                   configs: dict[ConvTemplate, list[int]]) -> KernelSource:
    """One kernel per template the instances need, and a launcher that picks one by the instance's shapes.
    Every template's launcher takes the same arguments: the same operands, epilogue scalars and geometry."""
    restricted = {t: _for_configs(kernel, c) for t, c in configs.items()}
    parts = {t: _emit_template(k, f"{name}_{_SUFFIXES[t]}", variant, program, t) for t, k in restricted.items()}
    args = next(iter(parts.values())).args
    params = ", ".join(a.name for a in args)
    conv: Conv = kernel.anchor
    operands = make_operands(kernel.leaves)
    x, w = operands[conv.x.id].name, operands[conv.w.id].name
    lines = ["# The instances differ in channels per group: each goes to the kernel of its template.",
             f"C_in_g = {w}.shape[1]", f"C_out_g = {w}.shape[0] // ({x}.shape[1] // C_in_g)",
             f"taps = {w}.shape[2:].numel()"]
    for template, part in parts.items():
        lines += [f"if {_dispatch_test(template, restricted[template].anchor)}:",
                  f"    return {part.launcher_name}({params})"]
    lines.append(f'raise ValueError(f"{name}: no kernel of this file takes {{C_in_g}} input channels per group")')
    launcher = "\n\n\n".join([p.launcher.rstrip() for p in parts.values()]
                               + [f"def {name}_launch({params}):\n{indent(lines, 4)}\n"])
    total = len(conv.groups)
    description = "per instance: " + "; ".join(f"{p.description} for {len(configs[t])} of {total} instances"
                                               for t, p in parts.items())
    return KernelSource("\n\n\n".join(p.kernel.rstrip() for p in parts.values()) + "\n", launcher,
                        f"{name}_launch", args, False,
                        description=description)
