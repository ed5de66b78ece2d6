"""The GEMM kernel (nn.Linear, matmul, bmm) with its fused elementwise epilogue."""

from __future__ import annotations

import math

from .configs import MatmulTile, Variant, k_split
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
from .indexing import GroupIndices, Indexer, Operand, Space
from .ir import Matmul, Program
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature


def tile_autotune(tiles: tuple[MatmulTile, ...], key: list[str], group_m: bool = True, block_k: bool = True) -> str:
    group = ', "GROUP_M": 8' if group_m else ""
    configs = ",\n        ".join(
        f'triton.Config({{"BLOCK_M": {t.block_m}, "BLOCK_N": {t.block_n}'
        + (f', "BLOCK_K": {t.block_k}' if block_k else "") + f"{group}}}, "
        f"num_warps={t.warps}, num_stages={t.stages})" for t in tiles)
    return f"@triton.autotune(\n    configs=[\n        {configs},\n    ],\n    key={key!r},\n)\n"


TILE_PARAMS = [constexpr("BLOCK_M", "rows of C per program"), constexpr("BLOCK_N", "columns of C per program"),
               constexpr("BLOCK_K", "K per step of the reduction loop"),
               constexpr("GROUP_M", "row tiles visited together, for L2 reuse")]


def _pointers(kernel: KernelPlan, a: Operand, b: Operand) -> list[KernelParam]:
    batch = "batch, " if kernel.anchor.batched else ""
    return [a.pointer(f"A [{batch}M, K]", "a_ptr"), b.pointer(f"B [{batch}K, N]", "b_ptr"),
            output_param(kernel, f"C [{batch}M, N] = epilogue(A @ B), contiguous")]


def _sizes_and_strides(anchor: Matmul) -> list[KernelParam]:
    """A rows-form GEMM (x @ W for any leading dims of x) is one batch: its batch strides are 0."""
    one_batch = "" if anchor.batched else " (0: one batch)"
    return [KernelParam("M", "rows of A and C"), KernelParam("N", "columns of B and C"),
            KernelParam("K", "columns of A, rows of B"),
            KernelParam("stride_ab", "A batch stride" + one_batch), KernelParam("stride_am", "A row stride"),
            KernelParam("stride_ak", "A column stride"),
            KernelParam("stride_bb", "B batch stride" + one_batch), KernelParam("stride_bk", "B row stride"),
            KernelParam("stride_bn", "B column stride")]


def emit_matmul(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Matmul = kernel.anchor
    operands = make_operands(kernel.leaves)
    epilogue_values = body_leaves(kernel, program)
    epilogue = [operands[v.id] for v in epilogue_values]
    rank = anchor.rank
    if anchor.batched:
        spaces = [Space("batch", tuple(range(rank - 2))), Space("rows", (rank - 2,)), Space("cols", (rank - 1,))]
        flat = {0: "pid_b", 1: "rm64[:, None]", 2: "rn64[None, :]"}
    else:
        spaces = [Space("rows", tuple(range(rank - 1))), Space("cols", (rank - 1,))]
        flat = {0: "rm64[:, None]", 1: "rn64[None, :]"}
    indexer = Indexer(kernel.root.shapes, spaces, epilogue)
    scalars = ScalarArgs()
    emitter = ExprEmitter(indexer, {v.id: operands[v.id] for v in epilogue_values}, scalars)
    lines: list[str] = []
    region = Region(lines, mask="mask", indices=GroupIndices(indexer, flat, lines, "e"),
                    bound={anchor.id: "acc"})
    result = emitter.value(kernel.root, region)
    ops = describe_body(kernel, program.values)
    a_name, b_name = operands[anchor.a.id].name, operands[anchor.b.id].name

    epilogue_pointers = [o.pointer("epilogue operand") for o in epilogue]
    params = (_pointers(kernel, operands[anchor.a.id], operands[anchor.b.id])
              + epilogue_pointers + _sizes_and_strides(anchor)
              + indexer.kernel_signature() + scalars.kernel_signature()
              + TILE_PARAMS + [constexpr("EVEN_K", "K % BLOCK_K == 0, so the K loop loads without masks")])
    decorator = tile_autotune(variant.matmul, ["M", "N", "K"]) if variant.autotune else ""
    source = f'''{decorator}@triton.heuristics({{"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0}})
@triton.jit
{signature(name, params)}
    # One [BLOCK_M, BLOCK_N] tile of C = A @ B per program, K walked in BLOCK_K steps; tiles are visited
    # GROUP_M rows at a time so neighbouring programs reuse A and B from L2. Epilogue: {ops or "none"}.
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # out-of-range rows/cols are wrapped into range for the loads and masked at the store
    ra = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    rb = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    a_ptrs = a_ptr + pid_b * stride_ab + ra[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + pid_b * stride_bb + rk[:, None] * stride_bk + rb[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision="{variant.precision}")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
{indent(lines, 4)}
    tl.store(out_ptr + pid_b * M * N + rm64[:, None] * N + rn64[None, :], {result}, mask=mask)
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    prologue = _operand_lines(anchor, a_name, b_name)
    strides = indexer.wrapper_lines("shape", {o.name: o.name for o in epilogue})
    call = ", ".join(["a", "b", "out"] + [o.name for o in epilogue] + ["M", "N", "K"]
                     + ["a_sb", "a.stride(-2)", "a.stride(-1)", "b_sb", "b.stride(-2)", "b.stride(-1)"]
                     + indexer.kernel_params() + [a.name for a in scalar_args])
    if variant.autotune:
        launch = ['grid = lambda meta: (_cdiv(M, meta["BLOCK_M"]) * _cdiv(N, meta["BLOCK_N"]), batch)',
                  f"{name}[grid]({call})"]
        tiles = f"autotuned over {len(variant.matmul)} tile configs"
    else:
        t = variant.matmul[0]
        launch = [f"grid = (_cdiv(M, {t.block_m}) * _cdiv(N, {t.block_n}), batch)",
                  f"{name}[grid]({call}, BLOCK_M={t.block_m}, BLOCK_N={t.block_n}, BLOCK_K={t.block_k}, "
                  f"GROUP_M=8, num_warps={t.warps})"]
        tiles = f"tile {t.block_m}x{t.block_n}x{t.block_k}"
    if variant.split_k is not None and not anchor.batched:
        epilogue_args = [o.name for o in epilogue] + indexer.kernel_params() + [a.name for a in scalar_args]
        source += "\n\n" + _split_kernels(name, variant, epilogue_pointers + indexer.kernel_signature()
                                          + scalars.kernel_signature(), lines, result, ops,
                                          output_param(kernel, "C = epilogue(sum of the chunks), contiguous"))
        launch = _split_launch(name, variant.split_k, epilogue_args, launch)
        tiles += f"; few output tiles: K split over programs, tile up to {variant.split_k.block_m}x" \
                 f"{variant.split_k.block_n}x{variant.split_k.block_k}"
    launcher = f'''def {name}_launch({", ".join(a.name for a in tensor_args + scalar_args)}):
{indent(prologue + strides + launch + ["return out"], 4)}
'''
    kind = "batched GEMM" if anchor.batched else "GEMM"
    description = f"{kind}{' + ' + ops if ops else ''} ({variant.precision} tl.dot, {tiles})"
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=description)


def _split_kernels(name: str, variant: Variant, epilogue_params: list[KernelParam], epilogue_lines: list[str],
                   result: str, ops: str, out: KernelParam) -> str:
    """`<name>_split`, one chunk of K per program into a partial tile, and `<name>_finish`, the chunks added in
    order, then the epilogue (the same lines as the one-launch kernel's, on the same names)."""
    tile = [constexpr("BLOCK_M", "rows of C per program"), constexpr("BLOCK_N", "columns of C per program")]
    split_params = [KernelParam("a_ptr", "A [M, K]"), KernelParam("b_ptr", "B [K, N]"),
                    KernelParam("part_ptr", "partial tiles [chunks, M, N]: A @ B over one chunk of K each"),
                    KernelParam("M", "rows of A and C"), KernelParam("N", "columns of B and C"),
                    KernelParam("K", "columns of A, rows of B"),
                    KernelParam("CHUNK", "K per program, a multiple of BLOCK_K"),
                    KernelParam("stride_am", "A row stride"), KernelParam("stride_ak", "A column stride"),
                    KernelParam("stride_bk", "B row stride"), KernelParam("stride_bn", "B column stride"),
                    *tile, constexpr("BLOCK_K", "K per step of the chunk's loop")]
    finish_params = [KernelParam("part_ptr", "partial tiles [chunks, M, N]"), out, *epilogue_params,
                     KernelParam("M", "rows of C"), KernelParam("N", "columns of C"),
                     KernelParam("CHUNKS", "partial tiles to add"), *tile]
    tile_of_program = '''pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    rm = (pid // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    mask = (rm[:, None] < M) & (rn[None, :] < N)'''
    return f'''@triton.jit
{signature(name + "_split", split_params)}
    # Few output tiles and a long K: each program sums one CHUNK of K for one [BLOCK_M, BLOCK_N] tile (the
    # grid's second axis picks the chunk) and stores it, without the epilogue, for {name}_finish.
    {tile_of_program}
    rk = tl.program_id(1) * CHUNK + tl.arange(0, BLOCK_K)
    # rows and columns past the end are wrapped into range for the loads and masked at the store
    a_ptrs = a_ptr + (rm64 % M)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + (rn64 % N)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, CHUNK, BLOCK_K):
        a = tl.load(a_ptrs, mask=rk[None, :] < K - k, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < K - k, other=0.0)
        acc = tl.dot(a, b, acc, input_precision="{variant.precision}")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(part_ptr + (tl.program_id(1) * M + rm64[:, None]) * N + rn64[None, :], acc, mask=mask)


@triton.jit
{signature(name + "_finish", finish_params)}
    # C = epilogue(the CHUNKS partial tiles added in chunk order), one [BLOCK_M, BLOCK_N] tile per program.
    # Epilogue: {ops or "none"}.
    {tile_of_program}
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, CHUNKS):
        acc += tl.load(part_ptr + (s * M + rm64[:, None]) * N + rn64[None, :], mask=mask, other=0.0)
{indent(epilogue_lines, 4)}
    tl.store(out_ptr + rm64[:, None] * N + rn64[None, :], {result}, mask=mask)
'''


def _split_launch(name: str, tile: MatmulTile, epilogue_args: list[str], launch: list[str]) -> list[str]:
    """The launcher's branch: split K (`_k_split`, from the GPU's multiprocessors), or `launch` as it was."""
    tail = ", ".join(epilogue_args + ["M", "N", "chunks"])
    return [f"chunks, chunk, block_m = _k_split(M, N, K, _sm_count(a.device), {tile.block_n}, {tile.block_k}, "
            f"{tile.block_m})",
            "if chunks > 1:",
            "    part = torch.empty((chunks, M, N), device=a.device, dtype=torch.float32)",
            f"    tiles = _cdiv(M, block_m) * _cdiv(N, {tile.block_n})",
            f"    {name}_split[(tiles, chunks)](a, b, part, M, N, K, chunk, a.stride(-2), a.stride(-1), "
            f"b.stride(-2), b.stride(-1), BLOCK_M=block_m, BLOCK_N={tile.block_n}, BLOCK_K={tile.block_k}, "
            f"num_warps={tile.warps}, num_stages={tile.stages})",
            f"    {name}_finish[(tiles,)](part, out, {tail}, BLOCK_M=block_m, BLOCK_N={tile.block_n}, "
            f"num_warps={tile.warps})",
            "else:"] + ["    " + line for line in launch]


def splits_k(anchor: Matmul, sms: int, tile: MatmulTile) -> bool:
    """Whether a rows-form GEMM splits its K under some input config on a GPU of `sms` multiprocessors."""
    if anchor.batched:
        return False
    for out, a in zip(anchor.shapes, anchor.a.shapes):
        chunks, _, _ = k_split(math.prod(out[:-1]), out[-1], a[-1], sms, tile.block_n, tile.block_k, tile.block_m)
        if chunks > 1:
            return True
    return False


def matmul_flops(anchor: Matmul, config: int) -> int:
    """2 FLOPs per multiply-add: 2 * M * N * K per batch entry, under input config `config`."""
    out, k = anchor.shapes[config], anchor.a.shapes[config][-1]
    return 2 * math.prod(out) * k


def _operand_lines(anchor: Matmul, a_name: str, b_name: str) -> list[str]:
    """A and B as (batch, M, K) / (batch, K, N) views: strides go to the kernel, no copies when avoidable."""
    if anchor.batched:
        return [f"M, K, N = {a_name}.shape[-2], {a_name}.shape[-1], {b_name}.shape[-1]",
                f"a = {a_name}.reshape(-1, M, K)",
                f"b = {b_name}.reshape(-1, K, N)",
                "batch, a_sb, b_sb = a.shape[0], a.stride(0), b.stride(0)",
                f"out = torch.empty((*{a_name}.shape[:-1], N), device=a.device, dtype=torch.float32)",
                "shape = out.shape"]
    return [f"K, N = {a_name}.shape[-1], {b_name}.shape[-1]",
            f"a = {a_name}.reshape(-1, K)",
            f"b = {b_name}",
            "M, batch, a_sb, b_sb = a.shape[0], 1, 0, 0",
            f"out = torch.empty((*{a_name}.shape[:-1], N), device=a.device, dtype=torch.float32)",
            "shape = out.shape"]

