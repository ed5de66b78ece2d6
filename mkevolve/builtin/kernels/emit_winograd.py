"""Stride-1 convolutions by Winograd's minimal filtering along the last spatial dim (`winograd.py`).

With r taps along the last dim and m outputs per tile (alpha = m + r - 1 inputs), the convolution becomes
four kernels:

    weight transform  U[p, taps.., c, co] = sum_k G[p, k] w[co, c, taps.., k]    (in fp64: G's fractions)
    input transform   V[p, n, h.., t, c]  = sum_j BT[p, j] x[n, c, h.. - pad, t * m + j - pad]   (zero outside)
    alpha GEMMs       X[p, (n, o.., t), co] = sum_{taps.., c} V[p, n, o.. + taps.., t, c] U[p, taps.., c, co]
    output transform  y[n, co, o.., t * m + i] = epilogue(sum_p AT[i, p] X[p, (n, o.., t), co])

The GEMMs are implicit GEMMs over the leading dims' taps, like the direct template's, on tensor cores (the
variant's tl.dot precision), and do alpha / (m * r) of its multiply-adds: 7/15 for 5 taps, 4/6 for 3. A
transposed convolution of stride 1 is the forward convolution of the flipped, transposed weight with padding
K - 1 - padding.

Used by the variants that ask for it (`Variant.winograd`), for one-instance, one-group, stride-1, undilated
convolutions whose last kernel dim has a tile in `OUTPUTS_PER_TILE` and whose input channels a 16-deep step
divides.
"""

from __future__ import annotations

import math

from .configs import MatmulTile, Variant
from .emit_common import KernelSource, LauncherArg, describe_body, indent, make_operands, output_param
from .emit_conv import MIN_TILE, conv_epilogue, conv_tiles, flat_index, out_size_lines, tile_text
from .emit_matmul import tile_autotune
from .indexing import Space
from .ir import Conv, Program
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature
from .winograd import OUTPUTS_PER_TILE, WinogradTransform, combination, transform

_TRANSFORM_BLOCK = (32, 32, 4)     # rows, channels, warps of a program of the input and output transforms
_WEIGHT_BLOCK = 256                # transformed weights per program of the weight transform


def winograd_fits(conv: Conv) -> bool:
    """Whether the Winograd template computes this convolution (see the module docstring)."""
    if len(conv.shapes) != 1 or conv.geometry_from is not None or conv.groups != (1,):
        return False
    if any(s != 1 for s in conv.stride) or any(d != 1 for d in conv.dilation):
        return False
    w = conv.w.shapes[0]
    c_in, c_out = (w[0], w[1]) if conv.transposed else (w[1], w[0])
    padding_fits = all(k - 1 - p >= 0 for k, p in zip(w[2:], conv.padding)) if conv.transposed else True
    # the GEMMs step through one tap's input channels a tl.dot step (at least 16 deep) at a time
    return w[-1] in OUTPUTS_PER_TILE and c_in % MIN_TILE == 0 and c_out >= MIN_TILE and padding_fits


def _geometry(conv: Conv) -> tuple[list[int], list[int]]:
    """(kernel size, padding) per spatial dim of the forward convolution computed."""
    kernel = list(conv.w.shapes[0][2:])
    if conv.transposed:
        return kernel, [k - 1 - p for k, p in zip(kernel, conv.padding)]
    return kernel, list(conv.padding)


def _decode_lines(flat: str, sizes: list[str], names: list[str], rest: str = "rest") -> list[str]:
    """`names` (outermost first, then `nb` for what is left) from a row-major flat index over `sizes`. Inside
    a loop `rest` needs a name of its own: Triton keeps one type per name across a loop."""
    lines, left = [], flat
    for size, name in reversed(list(zip(sizes, names))):
        lines += [f"{name} = {left} % {size}", f"{rest} = {left} // {size}"]
        left = rest
    return lines + [f"nb = {left}"]


def _input_transform(name: str, spatial: int, wt: WinogradTransform) -> str:
    lead = range(spatial - 1)
    last = spatial - 1
    params = ([KernelParam("x_ptr", f"input [N, C_in, {', '.join(f'D{d}' for d in range(spatial))}]"),
               KernelParam("v_ptr", "transformed input [ALPHA, R, C_in], R = (image, padded leading dims.., tile)"),
               KernelParam("R", "rows of the transformed input per point"),
               KernelParam("plane", "elements of V per point, R x C_in"),
               KernelParam("C_in", "input channels"), KernelParam("T", "tiles along the last dim")]
              + [KernelParam(f"D{d}", f"input size along spatial dim {d}") for d in range(spatial)]
              + [KernelParam(f"HP{d}", f"padded input size along spatial dim {d}") for d in lead]
              + [KernelParam("sxn", "input stride between images"),
                 KernelParam("sxc", "input stride between channels")]
              + [KernelParam(f"sx{d}", f"input stride along spatial dim {d}") for d in range(spatial)]
              + [constexpr(f"PAD{d}", f"padding along spatial dim {d}") for d in range(spatial)]
              + [constexpr("M_OUT", "outputs per tile"), constexpr("BLOCK_R", "rows per program"),
                 constexpr("BLOCK_C", "channels per program")])
    inputs = [f"d{j}" for j in range(wt.alpha)]
    body = (["rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)",
             "cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
             "ok = (rr < R)[:, None] & (cc < C_in)[None, :]",
             "store_ok = ok"]
            + _decode_lines("rr", [f"HP{d}" for d in lead] + ["T"], [f"h{d}" for d in lead] + ["t"])
            + [f"in{d} = h{d} - PAD{d}" for d in lead]
            + [f"ok = ok & ((in{d} >= 0) & (in{d} < D{d}))[:, None]" for d in lead]
            + ["base = " + " + ".join(["nb.to(tl.int64) * sxn"] + [f"in{d}.to(tl.int64) * sx{d}" for d in lead]),
               "x_tile = x_ptr + base[:, None] + cc.to(tl.int64)[None, :] * sxc",
               f"first = t * M_OUT - PAD{last}  # the tile's first input column"])
    for j in range(wt.alpha):
        body += [f"col = first + {j}",
                 f"d{j} = tl.load(x_tile + (col * sx{last})[:, None], "
                 f"mask=ok & ((col >= 0) & (col < D{last}))[:, None], other=0.0)"]
    body.append("v_tile = v_ptr + rr.to(tl.int64)[:, None] * C_in + cc[None, :]")
    for p, row in enumerate(wt.bt):
        body.append(f"tl.store(v_tile, {combination(row, inputs)}, mask=store_ok)")
        body += ["v_tile += plane  # the next point's V"] if p + 1 < wt.alpha else []
    return f'''@triton.jit
{signature(f"{name}_input_transform", params)}
    # Winograd input transform: for each point p, V[p] = BT[p] @ (the tile's {wt.alpha} input columns along the
    # last dim), per (image, padded leading position, tile) row and input channel, channels-last. Rows and
    # columns outside the input read the padding's zeros.
{indent(body, 4)}
'''


def _accumulate_lines(precision: str, compensated: bool) -> list[str]:
    """The K step's products added to acc: chained through tl.dot's accumulator, or (`compensated`) by Kahan's
    sum, which also carries what each fp32 add rounds away (`lost`). An output transform whose coefficients
    exceed 1 amplifies those roundings: on an H100, F(2, 5)'s error against fp64 on level2/11's layer fell from
    0.88 to 0.73 times eager fp32's for 20 % more time, F(3, 5)'s from 1.23 to 0.98 for 9 %
    (scripts/results/winograd_accumulate_probe_h100_2026-12-07.json; the whole problem: winograd.py)."""
    if not compensated:
        return [f'    acc = tl.dot(a, b, acc, input_precision="{precision}")']
    return ["    # Kahan's sum: `lost` carries what each fp32 add rounds away, which the output transform amplifies",
            f'    step = tl.dot(a, b, input_precision="{precision}")',
            "    kept = step - lost",
            "    total = acc + kept",
            "    lost = (total - acc) - kept",
            "    acc = total"]


def _gemm(name: str, spatial: int, precision: str, tiles: tuple[MatmulTile, ...], autotune: bool,
          compensated: bool) -> str:
    lead = range(spatial - 1)
    params = ([KernelParam("v_ptr", "transformed input [ALPHA, R, C_in]"),
               KernelParam("u_ptr", "transformed weight [ALPHA, leading taps.., C_in, C_out]"),
               KernelParam("x_ptr", "products [ALPHA, M, C_out]"),
               KernelParam("M", "GEMM rows: images x leading output positions x tiles"),
               KernelParam("R", "rows of the transformed input per point"), KernelParam("C_in", "input channels"),
               KernelParam("C_out", "output channels"), KernelParam("K_TOTAL", "GEMM depth, C_in x leading taps"),
               KernelParam("T", "tiles along the last dim")]
              + [KernelParam(f"P{d}", f"output size along spatial dim {d}") for d in lead]
              + [KernelParam(f"HP{d}", f"padded input size along spatial dim {d}") for d in lead]
              + [constexpr(f"K{d}", f"kernel size along spatial dim {d}") for d in lead]
              + [constexpr("BLOCK_M", "GEMM rows per program"), constexpr("BLOCK_N", "output channels per program"),
                 constexpr("BLOCK_K", "GEMM depth per step, a divisor of C_in")])
    taps = flat_index([f"j{d}" for d in lead], [f"HP{d}" for d in lead]) if spatial > 1 else "0"
    body = (["point = tl.program_id(2)",
             "rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
             "rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
             "m_ok = rm < M",
             "n_ok = rn < C_out",
             "row = tl.where(m_ok, rm, 0)  # rows past M read row 0 and are not stored: no load mask"]
            + _decode_lines("row", [f"P{d}" for d in lead] + ["T"], [f"o{d}" for d in lead] + ["t"])
            + ["v_row = " + flat_index(["nb", *[f"o{d}" for d in lead], "t"], ["N", *[f"HP{d}" for d in lead], "T"])
               + "  # the row tap (0, ..) reads",
               "a_rows = point.to(tl.int64) * R * C_in + v_row.to(tl.int64) * C_in",
               "b_point = point.to(tl.int64) * K_TOTAL * C_out",
               "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
            + (["lost = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"] if compensated else [])
            + ["for k0 in range(0, K_TOTAL, BLOCK_K):",
               "    tap = k0 // C_in  # BLOCK_K divides C_in: the whole step reads one leading tap",
               "    c = k0 - tap * C_in + tl.arange(0, BLOCK_K)"]
            + [f"    {line}"
               for line in _decode_lines("tap", [f"K{d}" for d in lead], [f"j{d}" for d in lead], "rest_tap")[:-1]]
            + [f"    shift = ({taps}) * T * C_in  # V rows between tap (0, ..) and this one",
               "    a = tl.load(v_ptr + a_rows[:, None] + (shift + c)[None, :])",
               "    b = tl.load(u_ptr + b_point + (k0 + tl.arange(0, BLOCK_K))[:, None] * C_out + rn[None, :], "
               "mask=n_ok[None, :], other=0.0)"]
            + _accumulate_lines(precision, compensated)
            + ["x_offs = point.to(tl.int64) * M * C_out + rm.to(tl.int64)[:, None] * C_out + rn[None, :]",
               "tl.store(x_ptr + x_offs, acc, mask=m_ok[:, None] & n_ok[None, :])"])
    decorator = tile_autotune(tiles, ["M", "C_in", "C_out"], group_m=False) if autotune else ""
    return f'''{decorator}@triton.jit
{signature(f"{name}_gemm", params)}
    # The Winograd products: for point p (the grid's third axis), X[p] = V[p] @ U[p] as an implicit GEMM whose
    # rows are (image, leading output position, tile) and whose depth is (leading tap, input channel).
{indent(body, 4)}
'''


def _output_transform(name: str, spatial: int, wt: WinogradTransform, params_epilogue: list[KernelParam],
                      epi_lines: list[str], result: str) -> str:
    lead = range(spatial - 1)
    last = spatial - 1
    positions = " * ".join(f"P{d}" for d in range(spatial))
    params = ([KernelParam("x_ptr", "products [ALPHA, M, C_out]")] + params_epilogue
              + [KernelParam("M", "rows of the products: images x leading output positions x tiles"),
                 KernelParam("plane", "products per point, M x C_out"),
                 KernelParam("C_out", "output channels"), KernelParam("T", "tiles along the last dim")]
              + [KernelParam(f"P{d}", f"output size along spatial dim {d}") for d in range(spatial)])
    products = [f"x{p}" for p in range(wt.alpha)]
    body = (["rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
             "co = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
             "m_ok = rm < M",
             "tile_ok = m_ok[:, None] & (co < C_out)[None, :]",
             "x_tile = x_ptr + rm.to(tl.int64)[:, None] * C_out + co[None, :]"]
            + [line for p in range(wt.alpha)
               for line in [f"x{p} = tl.load(x_tile, mask=tile_ok, other=0.0)"]
               + (["x_tile += plane  # the next point's products"] if p + 1 < wt.alpha else [])]
            + _decode_lines("rm", [f"P{d}" for d in lead] + ["T"], [f"o{d}" for d in lead] + ["t"])
            + ["nb64 = nb.to(tl.int64)", "co64 = co.to(tl.int64)"])
    for i, row in enumerate(wt.at):   # output i of each tile: its own epilogue and store
        body += [f"# output {i} of each tile",
                 f"acc = {combination(row, products)}",
                 f"o{last} = t * M_OUT + {i}",
                 f"mask = tile_ok & (o{last} < P{last})[:, None]",
                 f"pos64 = ({flat_index([f'o{d}' for d in range(spatial)], [f'P{d}' for d in range(spatial)])})"
                 ".to(tl.int64)",
                 f"ro64 = nb64 * ({positions}) + pos64"]
        body += epi_lines
        body += [f"out_offs = (nb64[:, None] * C_out + co64[None, :]) * ({positions}) + pos64[:, None]",
                 f"tl.store(out_ptr + out_offs, {result}, mask=mask)"]
    params += [constexpr("M_OUT", "outputs per tile"), constexpr("BLOCK_M", "rows per program"),
               constexpr("BLOCK_N", "output channels per program")]
    return f'''@triton.jit
{signature(f"{name}_output_transform", params)}
    # Winograd output transform: the tile's {wt.outputs} outputs along the last dim are AT @ (its {wt.alpha}
    # products), each then through the epilogue and stored to y [N, C_out, P..].
{indent(body, 4)}
'''


def _weight_transform(name: str, conv: Conv, wt: WinogradTransform) -> str:
    spatial = len(conv.stride)
    lead = range(spatial - 1)
    last = spatial - 1
    layout = "[C_in, C_out, K..]" if conv.transposed else "[C_out, C_in, K..]"
    params = ([KernelParam("w_ptr", f"weight {layout}"),
               KernelParam("u_ptr", "transformed weight [ALPHA, E], E = (leading taps.., C_in, C_out)"),
               KernelParam("E", "transformed weights per point"), KernelParam("C_in", "input channels"),
               KernelParam("C_out", "output channels"),
               KernelParam("swo", "weight stride between output channels"),
               KernelParam("swi", "weight stride between input channels")]
              + [KernelParam(f"sw{d}", f"weight stride along kernel dim {d}") for d in range(spatial)]
              + [constexpr(f"K{d}", f"kernel size along spatial dim {d}") for d in lead]
              + [constexpr("BLOCK", "transformed weights per program")])
    # a transposed convolution is the forward one of its weight flipped along every kernel dim
    def tap(j: str | int, size: str | int) -> str:
        if not conv.transposed:
            return str(j)
        return str(size - 1 - j) if isinstance(j, int) else f"({size} - 1 - {j})"

    body = (["e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             "ok = e < E",
             "co = e % C_out",
             "rest = e // C_out",
             "c = rest % C_in",
             "rest = rest // C_in"]
            + _decode_lines("rest", [f"K{d}" for d in lead], [f"j{d}" for d in lead])[:-1]
            + ["w_tap = w_ptr + " + " + ".join(["co * swo", "c * swi"]
                                                + [f"{tap(f'j{d}', f'K{d}')} * sw{d}" for d in lead])]
            + [f"w{k} = tl.load(w_tap + {tap(k, wt.taps)} * sw{last}, mask=ok, other=0.0).to(tl.float64)"
               for k in range(wt.taps)]
            + [f"tl.store(u_ptr + {p} * E + e, ({combination(row, [f'w{k}' for k in range(wt.taps)], exact=True)})"
               ".to(tl.float32), mask=ok)" for p, row in enumerate(wt.g)])
    return f'''@triton.jit
{signature(f"{name}_weight_transform", params)}
    # Winograd weight transform: U[p] = G[p] @ (the {wt.taps} taps along the last kernel dim), per leading tap,
    # input and output channel, in fp64 (G's fractions) and rounded to fp32 once.
{indent(body, 4)}
'''


def _amplifies(wt: WinogradTransform) -> bool:
    """Whether the output transform multiplies a product by more than 1 (F(2, 5): by up to 2; F(2, 3): no)."""
    return any(abs(c) > 1 for row in wt.at for c in row)


def emit_winograd(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    conv: Conv = kernel.anchor
    spatial = len(conv.stride)
    lead = range(spatial - 1)
    last = spatial - 1
    kernel_size, padding = _geometry(conv)
    wt = transform(OUTPUTS_PER_TILE[kernel_size[-1]], kernel_size[-1])
    operands = make_operands(kernel.leaves)
    x, w = operands[conv.x.id].name, operands[conv.w.id].name
    spaces = [Space("positions", (0,) + tuple(range(2, conv.rank))), Space("channels", (1,))]
    epilogue, indexer, scalars, emitter, epi_lines, result = conv_epilogue(
        kernel, program, operands, spaces, {0: "ro64[:, None]", 1: "co64[None, :]"}, "mask")
    epilogue_params = ([output_param(kernel, f"output [N, C_out, {', '.join(f'P{d}' for d in range(spatial))}]")]
                       + [o.pointer("epilogue operand") for o in epilogue] + indexer.kernel_signature()
                       + scalars.kernel_signature())
    tiles = conv_tiles(conv, variant.conv)
    source = "\n\n".join([_weight_transform(name, conv, wt), _input_transform(name, spatial, wt),
                          _gemm(name, spatial, variant.precision, tiles, variant.autotune, _amplifies(wt)),
                          _output_transform(name, spatial, wt, epilogue_params, epi_lines, result)])
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    rows, channels, warps = _TRANSFORM_BLOCK
    padded = [f"HP{d}" for d in lead]
    lead_outputs = [f"P{d}" for d in lead]
    lines = ([f"x, w = {x}, {w}"] + out_size_lines(conv, "x", "w")
             + indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
             + [f"u = torch.empty(({', '.join([str(wt.alpha)] + [str(k) for k in kernel_size[:-1]])}, C_in_g, C_out), "
                "device=x.device, dtype=torch.float32)",
                "E = u[0].numel()",
                f"{name}_weight_transform[(_cdiv(E, {_WEIGHT_BLOCK}),)]("
                + ", ".join(["w", "u", "E", "C_in_g", "C_out"]
                            + (["w.stride(1)", "w.stride(0)"] if conv.transposed else ["w.stride(0)", "w.stride(1)"])
                            + [f"w.stride({2 + d})" for d in range(spatial)]
                            + [f"K{d}={kernel_size[d]}" for d in lead] + [f"BLOCK={_WEIGHT_BLOCK}"]) + ")"]
             + [f"HP{d} = D{d} + {2 * padding[d]}" for d in lead]
             + [f"T = _cdiv(P{last}, {wt.outputs})  # tiles of {wt.outputs} outputs along the last dim",
                f"v = torch.empty(({wt.alpha}, x.shape[0], {', '.join(padded + ['T'])}, C_in_g), device=x.device, "
                "dtype=torch.float32)",
                "R = v[0].numel() // C_in_g",
                f"{name}_input_transform[(_cdiv(R, {rows}), _cdiv(C_in_g, {channels}))]("
                + ", ".join(["x", "v", "R", "R * C_in_g", "C_in_g", "T"] + [f"D{d}" for d in range(spatial)] + padded
                            + ["x.stride(0)", "x.stride(1)"] + [f"x.stride({2 + d})" for d in range(spatial)]
                            + [f"PAD{d}={padding[d]}" for d in range(spatial)]
                            + [f"M_OUT={wt.outputs}", f"BLOCK_R={rows}", f"BLOCK_C={channels}",
                               f"num_warps={warps}"]) + ")",
                "M = " + " * ".join(["x.shape[0]"] + lead_outputs + ["T"]),
                f"products = torch.empty(({wt.alpha}, M, C_out), device=x.device, dtype=torch.float32)",
                f"K_TOTAL = C_in_g * {math.prod(kernel_size[:-1])}"]
             + _gemm_launch_lines(name, kernel_size, tiles, variant.autotune, wt.alpha)
             + [f"{name}_output_transform[(_cdiv(M, {rows}), _cdiv(C_out, {channels}), 1)]("
                + ", ".join(["products", "out"] + [o.name for o in epilogue] + indexer.kernel_params()
                            + [a.name for a in scalar_args] + ["M", "M * C_out", "C_out", "T"]
                            + [f"P{d}" for d in range(spatial)]
                            + [f"M_OUT={wt.outputs}", f"BLOCK_M={rows}", f"BLOCK_N={channels}",
                               f"num_warps={warps}"]) + ")"])
    launcher = f"def {name}_launch({', '.join(a.name for a in tensor_args + scalar_args)}):\n" \
               f"{indent(lines + ['return out'], 4)}\n"
    ops = describe_body(kernel, program.values)
    kind = "transposed convolution" if conv.transposed else "convolution"
    description = (f"Winograd F({wt.outputs}, {wt.taps}) {kind}{' + ' + ops if ops else ''} "
                   f"({wt.alpha} {variant.precision} tl.dot GEMMs, {tile_text(tiles, variant.autotune)})")
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=description)


def _gemm_launch_lines(name: str, kernel_size: list[int], tiles: tuple[MatmulTile, ...], autotune: bool,
                       alpha: int) -> list[str]:
    lead = range(len(kernel_size) - 1)
    args = ", ".join(["v", "u", "products", "M", "R", "C_in_g", "C_out", "K_TOTAL", "T"]
                     + [f"P{d}" for d in lead] + [f"HP{d}" for d in lead] + [f"K{d}={kernel_size[d]}" for d in lead])
    if autotune:
        return [f'grid = lambda meta: (_cdiv(M, meta["BLOCK_M"]), _cdiv(C_out, meta["BLOCK_N"]), {alpha})',
                f"{name}_gemm[grid]({args})"]
    t = tiles[0]
    return [f"{name}_gemm[(_cdiv(M, {t.block_m}), _cdiv(C_out, {t.block_n}), {alpha})]({args}, "
            f"BLOCK_M={t.block_m}, BLOCK_N={t.block_n}, BLOCK_K={t.block_k}, num_warps={t.warps})"]
