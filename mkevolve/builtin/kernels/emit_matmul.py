"""The GEMM kernel (nn.Linear, matmul, bmm) with its fused elementwise epilogue."""

from __future__ import annotations

import math

from .configs import MatmulTile, Variant
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

    params = (_pointers(kernel, operands[anchor.a.id], operands[anchor.b.id])
              + [o.pointer("epilogue operand") for o in epilogue] + _sizes_and_strides(anchor)
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
    launcher = f'''def {name}_launch({", ".join(a.name for a in tensor_args + scalar_args)}):
{indent(prologue + strides + launch + ["return out"], 4)}
'''
    kind = "batched GEMM" if anchor.batched else "GEMM"
    description = f"{kind}{' + ' + ops if ops else ''} ({variant.precision} tl.dot, {tiles})"
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=description)


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

