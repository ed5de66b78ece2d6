"""Convolutions (1-3 spatial dims, strided, padded, dilated, grouped, transposed) with a fused epilogue.

Two templates. Implicit GEMM: output positions x output channels of one group form the C tile, the
kernel window is unrolled, input channels are walked in BLOCK_K steps through tl.dot. Direct: one
program per BLOCK output elements, each summing its window with FMAs; used when a group has too few
channels to fill a tl.dot tile (depthwise convolutions, the first RGB layer).
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
    helper_sources,
    indent,
    make_operands,
)
from .emit_matmul import tile_autotune
from .indexing import GroupIndices, Indexer, Space
from .ir import Conv, Program
from .plan import KernelPlan

_MIN_DOT_CHANNELS = 8


def _group_channels(conv: Conv) -> tuple[set[int], set[int]]:
    """(input channels per group, output channels per group) over the configs."""
    if conv.transposed:
        return ({s[0] // conv.groups for s in conv.w.shapes}, {s[1] for s in conv.w.shapes})
    return ({s[1] for s in conv.w.shapes}, {s[0] // conv.groups for s in conv.w.shapes})


def conv_uses_dot(conv: Conv) -> bool:
    c_in, c_out = _group_channels(conv)
    return min(c_in) >= _MIN_DOT_CHANNELS and min(c_out) >= _MIN_DOT_CHANNELS


def emit_conv(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    conv: Conv = kernel.anchor
    if conv_uses_dot(conv):
        return _emit_implicit_gemm(kernel, name, variant, program)
    return _emit_direct(kernel, name, variant, program)


def _geometry_params(conv: Conv) -> list[str]:
    s = len(conv.stride)
    return ([f"STRIDE{d}: tl.constexpr" for d in range(s)] + [f"PAD{d}: tl.constexpr" for d in range(s)]
            + [f"DIL{d}: tl.constexpr" for d in range(s)] + [f"K{d}: tl.constexpr" for d in range(s)])


def _geometry_args(conv: Conv) -> list[str]:
    kernel_size = conv.w.shapes[0][2:]
    s = len(conv.stride)
    return ([f"STRIDE{d}={conv.stride[d]}" for d in range(s)] + [f"PAD{d}={conv.padding[d]}" for d in range(s)]
            + [f"DIL{d}={conv.dilation[d]}" for d in range(s)] + [f"K{d}={kernel_size[d]}" for d in range(s)])


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


def _position_lines(spatial: int, flat: str) -> list[str]:
    """Split a flat output position index into (batch, p0, p1, ...), row-major."""
    lines = []
    rest = flat
    for d in range(spatial - 1, -1, -1):
        lines.append(f"p{d} = {rest} % P{d}")
        lines.append(f"rest{d} = {rest} // P{d}")
        rest = f"rest{d}"
    lines.append(f"nb = {rest}")
    return lines


def _out_size_lines(conv: Conv, x: str, w: str) -> list[str]:
    spatial = len(conv.stride)
    lines = [f"D{d} = {x}.shape[{2 + d}]" for d in range(spatial)]
    for d in range(spatial):
        k = conv.w.shapes[0][2 + d]
        s, p, dil = conv.stride[d], conv.padding[d], conv.dilation[d]
        if conv.transposed:
            lines.append(f"P{d} = (D{d} - 1) * {s} - {2 * p} + {dil * (k - 1)} + {conv.output_padding[d]} + 1")
        else:
            lines.append(f"P{d} = (D{d} + {2 * p} - {dil * (k - 1)} - 1) // {s} + 1")
    groups = conv.groups
    if conv.transposed:
        lines += [f"C_in_g = {x}.shape[1] // {groups}", f"C_out_g = {w}.shape[1]",
                  f"w_group, w_out, w_in = C_in_g * {w}.stride(0), {w}.stride(1), {w}.stride(0)"]
    else:
        lines += [f"C_in_g = {w}.shape[1]", f"C_out_g = {w}.shape[0] // {groups}",
                  f"w_group, w_out, w_in = C_out_g * {w}.stride(0), {w}.stride(0), {w}.stride(1)"]
    sizes = ", ".join(f"P{d}" for d in range(spatial))
    lines += [f"C_out = C_out_g * {groups}",
              f"out = torch.empty(({x}.shape[0], C_out, {sizes}), device={x}.device, dtype=torch.float32)",
              "shape = out.shape"]
    return lines


def _stride_args(conv: Conv, x: str, w: str) -> list[str]:
    spatial = len(conv.stride)
    return ([f"{x}.stride(0)", f"{x}.stride(1)"] + [f"{x}.stride({2 + d})" for d in range(spatial)]
            + ["w_group", "w_out", "w_in"] + [f"{w}.stride({2 + d})" for d in range(spatial)])


def _stride_params(spatial: int) -> list[str]:
    return (["sxn", "sxc"] + [f"sx{d}" for d in range(spatial)] + ["swg", "swo", "swi"]
            + [f"sw{d}" for d in range(spatial)])


def _epilogue(kernel: KernelPlan, program: Program, operands, spaces, flat: dict[int, str], mask: str):
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


def _emit_implicit_gemm(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    conv: Conv = kernel.anchor
    spatial = len(conv.stride)
    operands = make_operands(kernel.leaves)
    x, w = operands[conv.x.id].name, operands[conv.w.id].name
    rank = conv.rank
    spaces = [Space("positions", (0,) + tuple(range(2, rank))), Space("channels", (1,))]
    epilogue, indexer, scalars, emitter, epi_lines, result = _epilogue(
        kernel, program, operands, spaces, {0: "rm64[:, None]", 1: "co64[None, :]"}, "mask")
    ops = describe_body(kernel, program.values)
    positions = [f"p{d}" for d in range(spatial)]
    window, prefixes, ok = _window_lines(conv, positions, "m_ok")
    inner = prefixes[-1]
    in_offset = " + ".join(f"in{d} * sx{d}" for d in range(spatial))
    w_offset = " + ".join(f"k{d} * sw{d}" for d in range(spatial))
    loop = [f"{inner}x_rows = x_base + {in_offset}",
            f"{inner}w_cols = w_base + {w_offset}",
            f"{inner}for c0 in range(0, C_in_g, BLOCK_K):",
            f"{inner}    c = c0 + tl.arange(0, BLOCK_K)",
            f"{inner}    c_ok = c < C_in_g",
            f"{inner}    a = tl.load(x_ptr + x_rows[:, None] + c[None, :] * sxc, "
            f"mask={ok}[:, None] & c_ok[None, :], other=0.0)",
            f"{inner}    b = tl.load(w_ptr + w_cols[None, :] + c[:, None] * swi, "
            "mask=c_ok[:, None] & n_ok[None, :], other=0.0)",
            f"{inner}    acc = tl.dot(a, b, acc, input_precision=\"{variant.precision}\")"]
    size_params = [f"D{d}" for d in range(spatial)] + [f"P{d}" for d in range(spatial)]
    params = (["x_ptr", "w_ptr", "out_ptr"] + [f"{o.name}_ptr" for o in epilogue] + ["M", "C_in_g", "C_out_g",
              "C_out"] + size_params + _stride_params(spatial) + indexer.kernel_declarations()
              + [n for n, _ in scalars.params] + _geometry_params(conv)
              + ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr"])
    out_positions = " * ".join(f"P{d}" for d in range(spatial))
    flat_position = "p0" if spatial == 1 else " + ".join(
        f"p{d}" + "".join(f" * P{e}" for e in range(d + 1, spatial)) for d in range(spatial))
    body = (["pid_m = tl.program_id(0)", "pid_n = tl.program_id(1)", "g = tl.program_id(2)",
             "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
             "m_ok = rm < M", "n_ok = rn < C_out_g"] + _position_lines(spatial, "rm")
            + ["x_base = nb.to(tl.int64) * sxn + (g * C_in_g).to(tl.int64) * sxc",
               "w_base = g.to(tl.int64) * swg + rn * swo",
               "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
            + window + loop
            + ["co = g * C_out_g + rn", "rm64 = rm.to(tl.int64)", "co64 = co.to(tl.int64)",
               "mask = m_ok[:, None] & n_ok[None, :]"] + epi_lines
            + [f"out_offs = (nb.to(tl.int64) * C_out)[:, None] * ({out_positions}) + co64[None, :] * "
               f"({out_positions}) + ({flat_position})[:, None]",
               f"tl.store(out_ptr + out_offs, {result}, mask=mask)"])
    decorator = tile_autotune(variant.conv, ["M", "C_in_g", "C_out_g"], group_m=False) if variant.autotune else ""
    kind = "transposed convolution" if conv.transposed else "convolution"
    source = f'''{decorator}@triton.jit
def {name}({", ".join(params)}):
    # Implicit-GEMM {spatial}-d {kind}: a [BLOCK_M output positions, BLOCK_N output channels] tile of one
    # group per program; the kernel window is unrolled and input channels are reduced BLOCK_K at a time.
    # Epilogue: {ops or "none"}.
{indent(body, 4)}
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    call = ", ".join(["x", "w", "out"] + [o.name for o in epilogue] + ["M", "C_in_g", "C_out_g", "C_out"]
                     + size_params + _stride_args(conv, "x", "w") + indexer.kernel_params()
                     + [a.name for a in scalar_args] + _geometry_args(conv))
    lines = [f"x, w = {x}, {w}"] + _out_size_lines(conv, "x", "w") + [
        f"M = x.shape[0] * {out_positions}"] + indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
    if variant.autotune:
        lines += [f'grid = lambda meta: (_cdiv(M, meta["BLOCK_M"]), _cdiv(C_out_g, meta["BLOCK_N"]), '
                  f"{conv.groups})", f"{name}[grid]({call})"]
        tiles = f"autotuned over {len(variant.conv)} tile configs"
    else:
        t = variant.conv[0]
        lines += [f"grid = (_cdiv(M, {t.block_m}), _cdiv(C_out_g, {t.block_n}), {conv.groups})",
                  f"{name}[grid]({call}, BLOCK_M={t.block_m}, BLOCK_N={t.block_n}, BLOCK_K={t.block_k}, "
                  f"num_warps={t.warps})"]
        tiles = f"tile {t.block_m}x{t.block_n}x{t.block_k}"
    launcher = f"def {name}_launch({', '.join(a.name for a in tensor_args + scalar_args)}):\n" \
               f"{indent(lines + ['return out'], 4)}\n"
    description = (f"implicit-GEMM {kind}{' + ' + ops if ops else ''} ({variant.precision} tl.dot, {tiles})")
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False,
                        helper_sources(emitter.helpers), uses_dot=True, description=description)


def _emit_direct(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    conv: Conv = kernel.anchor
    spatial = len(conv.stride)
    operands = make_operands(kernel.leaves)
    x, w = operands[conv.x.id].name, operands[conv.w.id].name
    spaces = [Space("flat", tuple(range(conv.rank)))]
    epilogue, indexer, scalars, emitter, epi_lines, result = _epilogue(
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
    params = (["x_ptr", "w_ptr", "out_ptr"] + [f"{o.name}_ptr" for o in epilogue] + ["numel", "C_in_g", "C_out_g",
              "C_out"] + size_params + _stride_params(spatial) + indexer.kernel_declarations()
              + [n for n, _ in scalars.params] + _geometry_params(conv) + ["BLOCK: tl.constexpr"])
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
def {name}({", ".join(params)}):
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
    lines = [f"x, w = {x}, {w}"] + _out_size_lines(conv, "x", "w") + ["numel = out.numel()"] + \
        indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
    if autotune:
        lines += ['grid = lambda meta: (_cdiv(numel, meta["BLOCK"]),)', f"{name}[grid]({call})"]
    else:
        block, warps = variant.pool[0]
        lines += [f"{name}[(_cdiv(numel, {block}),)]({call}, BLOCK={block}, num_warps={warps})"]
    launcher = f"def {name}_launch({', '.join(a.name for a in tensor_args + scalar_args)}):\n" \
               f"{indent(lines + ['return out'], 4)}\n"
    description = f"direct {kind}{' + ' + ops if ops else ''} (FMA, no tl.dot)"
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False,
                        helper_sources(emitter.helpers), description=description)

