"""Fused attention in the style of Triton's fused-attention tutorial: the scores never reach memory."""

from __future__ import annotations

import math

from .configs import Variant
from .emit_common import (ExprEmitter, KernelSource, LauncherArg, Region, ScalarArgs, indent,
                          make_operands, output_param)
from .indexing import GroupIndices, Indexer, Space
from .ir import Attention, IndexMask, Pointwise, Program, Value
from .kernel_plan import KernelPlan
from .pointwise_ops import divide
from .signature import KernelParam, constexpr, signature


# Q, K^T and V are read as [Z batches, H heads, rows, cols] through their strides.
_SIZES_AND_STRIDES = (
    [KernelParam("H", "heads"), KernelParam("M", "queries"), KernelParam("N", "keys"),
     KernelParam("D", "query/key width"), KernelParam("DV", "value width")]
    + [KernelParam(f"stride_q{d}", f"Q stride along {what}") for d, what in
       (("z", "batches"), ("h", "heads"), ("m", "queries"), ("d", "D"))]
    + [KernelParam(f"stride_k{d}", f"K^T stride along {what}") for d, what in
       (("z", "batches"), ("h", "heads"), ("d", "D"), ("n", "keys"))]
    + [KernelParam(f"stride_v{d}", f"V stride along {what}") for d, what in
       (("z", "batches"), ("h", "heads"), ("n", "keys"), ("d", "DV"))])
_BLOCKS = [constexpr("BLOCK_M", "queries per program"), constexpr("BLOCK_N", "keys per step"),
           constexpr("BLOCK_D", "D rounded up to a power of 2, at least 16"),
           constexpr("BLOCK_DV", "DV rounded up to a power of 2, at least 16")]


def _pointers(kernel: KernelPlan, operands) -> list[KernelParam]:
    anchor: Attention = kernel.anchor
    return [operands[anchor.q.id].pointer("Q [Z, H, M, D]", "q_ptr"),
            operands[anchor.kt.id].pointer("K^T [Z, H, D, N]", "kt_ptr"),
            operands[anchor.v.id].pointer("V [Z, H, N, DV]", "v_ptr"),
            output_param(kernel, "output [Z * H, M, DV], contiguous")]


def emit_attention(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Attention = kernel.anchor
    operands = make_operands(kernel.leaves)
    q, kt, v = (operands[x.id].name for x in (anchor.q, anchor.kt, anchor.v))
    extras = [operands[x.id] for x in anchor.extras]
    logits_lines, logits, indexer, scalars = _logits(anchor, operands)
    tiles = _tiles(variant)
    params = (_pointers(kernel, operands) + [o.pointer("logits operand") for o in extras]
              + _SIZES_AND_STRIDES + indexer.kernel_signature() + scalars.kernel_signature() + _BLOCKS)
    decorator = _autotune(tiles) if variant.autotune else ""
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # One program per (batch * head, block of BLOCK_M queries). Keys and values are walked BLOCK_N at a
    # time; each block of scores lives only in registers.
    # {_summary(anchor)}
    pid_m = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    pid_z = pid_b // H
    pid_h = pid_b % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_m64 = offs_m.to(tl.int64)
    q_ptrs = q_ptr + pid_z * stride_qz + pid_h * stride_qh + offs_m64[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < M) & (offs_d[None, :] < D), other=0.0)
    kt_base = kt_ptr + pid_z * stride_kz + pid_h * stride_kh + offs_d[:, None] * stride_kd
    v_base = v_ptr + pid_z * stride_vz + pid_h * stride_vh + offs_dv[None, :] * stride_vd
{indent(_state(anchor), 4)}
    for start_n in range(0, {_key_end(anchor)}, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_n64 = offs_n.to(tl.int64)
        kt = tl.load(kt_base + offs_n64[None, :] * stride_kn, mask=(offs_d[:, None] < D) & (offs_n[None, :] < N),
                     other=0.0)
        scores = tl.dot(q, kt, input_precision="{variant.precision}")
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
{indent(logits_lines, 8)}
        # keys past N (and, causal, past the query) take no weight
        keep = {_keep(anchor)}
        vv = tl.load(v_base + offs_n64[:, None] * stride_vn, mask=(offs_n[:, None] < N) & (offs_dv[None, :] < DV),
                     other=0.0)
{indent(_update(anchor, logits, variant.precision), 8)}
{indent(_finish(anchor), 4)}
    out_ptrs = out_ptr + pid_b * M * DV + offs_m64[:, None] * DV + offs_dv[None, :]
    tl.store(out_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_dv[None, :] < DV))
'''
    tensor_args = [LauncherArg(o.name, value=x) for x, o in zip(kernel.leaves, operands.values())]
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    lines, tile_text = _launch_lines(name, variant, tiles, (q, kt, v), extras, indexer, scalar_args)
    launcher = f'''def {name}_launch({", ".join(a.name for a in tensor_args + scalar_args)}):
{indent(lines + ["return out"], 4)}
'''
    description = (f"fused {'causal ' if anchor.causal else ''}{anchor.normalize} attention "
                   f"({variant.precision} tl.dot, {tile_text})")
    return KernelSource(source, launcher, f"{name}_launch", tensor_args + scalar_args, False, description=description)


def attention_flops(anchor: Attention, config: int) -> int:
    """2 FLOPs per multiply-add of scores = q @ kt and out = weights @ v, under input config `config`:
    2 * rows * N * (D + DV), rows counting every batch and head. Causal: about half the (query, key)
    pairs take part."""
    d, (n, dv) = anchor.q.shapes[config][-1], anchor.v.shapes[config][-2:]
    rows = math.prod(anchor.shapes[config][:-1])
    flops = 2 * rows * n * (d + dv)
    return flops // 2 if anchor.causal else flops


def _launch_lines(name: str, variant: Variant, tiles, qkv: tuple[str, str, str], extras, indexer: Indexer,
                  scalar_args: list[LauncherArg]) -> tuple[list[str], str]:
    """The launcher body (sizes, 4-d views, grid, launch) and the tiling it uses, in words."""
    q, kt, v = qkv
    call = ", ".join(["q4", "kt4", "v4", "out"] + [o.name for o in extras] + ["q4.shape[1]", "M", "N", "D", "DV"]
                     + ["*q4.stride()", "*kt4.stride()", "*v4.stride()"]
                     + indexer.kernel_params() + [a.name for a in scalar_args]
                     + ["BLOCK_D=max(16, _next_power_of_2(D))", "BLOCK_DV=max(16, _next_power_of_2(DV))"])
    lines = [f"M, D = {q}.shape[-2], {q}.shape[-1]",
             f"N, DV = {v}.shape[-2], {v}.shape[-1]",
             f"out = torch.empty((*{q}.shape[:-1], DV), device={q}.device, dtype=torch.float32)",
             "scores_shape = (*out.shape[:-1], N)",
             "# (batch, heads, rows, cols) views: heads split from the batch keeps transposed inputs uncopied",
             f"q4, kt4, v4 = (t.reshape(-1, *t.shape[-3:]) if t.dim() > 3 else t.unsqueeze(0) "
             f"for t in ({q}, {kt}, {v}))"]
    lines += indexer.wrapper_lines("scores_shape", {o.name: o.name for o in extras})
    if variant.autotune:
        lines += ['grid = lambda meta: (_cdiv(M, meta["BLOCK_M"]), q4.shape[0] * q4.shape[1])',
                  f"{name}[grid]({call})"]
        tile_text = f"autotuned over {len(tiles)} tile configs"
    else:
        bm, bn, warps = tiles[0]
        lines += [f"grid = (_cdiv(M, {bm}), q4.shape[0] * q4.shape[1])",
                  f"{name}[grid]({call}, BLOCK_M={bm}, BLOCK_N={bn}, num_warps={warps})"]
        tile_text = f"tile {bm}x{bn}"
    return lines, tile_text


def _logits(anchor: Attention, operands):
    """The elementwise code from the scores block to the logits block (scale, masks), read per [m, n]."""
    rank = anchor.scores.rank
    extras = [operands[x.id] for x in anchor.extras]
    spaces = [Space("batch", tuple(range(rank - 2))), Space("rows", (rank - 2,)), Space("cols", (rank - 1,))]
    indexer = Indexer(anchor.scores.shapes, spaces, extras, frame_name="scores")
    scalars = ScalarArgs()
    emitter = ExprEmitter(indexer, {x.id: operands[x.id] for x in anchor.extras}, scalars)
    lines: list[str] = []
    flat = {0: "pid_b", 1: "offs_m64[:, None]", 2: "offs_n64[None, :]"}
    bound = {anchor.scores.id: "scores", **{m.id: _index_mask(m) for m in _index_masks(anchor.logits)}}
    region = Region(lines, mask="mask", indices=GroupIndices(indexer, flat, lines, "e"), bound=bound)
    logits = emitter.value(anchor.logits, region)
    return lines, logits, indexer, scalars


def _index_masks(logits: Value) -> list[IndexMask]:
    found, stack, seen = [], [logits], set()
    while stack:
        value = stack.pop()
        if value.id not in seen:
            seen.add(value.id)
            found += [value] if isinstance(value, IndexMask) else []
            stack += value.operands() if isinstance(value, Pointwise) else []
    return found


def _index_mask(mask: IndexMask) -> str:
    """ones_like / tril / triu from the query and key offsets: no tensor is read."""
    if mask.kind == "ones":
        return "((offs_m[:, None] >= 0) & (offs_n[None, :] >= 0))"
    diagonal = f"offs_m[:, None] + {mask.diagonal}" if mask.diagonal else "offs_m[:, None]"
    return f"(offs_n[None, :] {'<=' if mask.kind == 'tril' else '>='} {diagonal})"


def _summary(anchor: Attention) -> str:
    if anchor.normalize == "relu":
        return "ReLU weights need no normaliser: each key block adds relu(logits) @ v to the fp32 accumulator."
    return "Softmax runs online: a running max and sum rescale what is accumulated so far, all in fp32."


def _state(anchor: Attention) -> list[str]:
    lines = ["acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)"]
    if anchor.normalize == "softmax":
        lines += ['m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)',
                  "l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)"]
    return lines


def _key_end(anchor: Attention) -> str:
    """Causal: key blocks wholly after this block's last query are skipped, not just masked."""
    return "tl.minimum(N, (pid_m + 1) * BLOCK_M)" if anchor.causal else "N"


def _keep(anchor: Attention) -> str:
    keep = "offs_n[None, :] < N"
    return f"({keep}) & (offs_m[:, None] >= offs_n[None, :])" if anchor.causal else keep


def _update(anchor: Attention, logits: str, precision: str) -> list[str]:
    if anchor.normalize == "relu":
        return [f"weights = tl.where(keep, tl.maximum({logits}, 0.0), 0.0)",
                f'acc = tl.dot(weights, vv, acc, input_precision="{precision}")']
    return [f'logits = tl.where(keep, {logits}, float("-inf"))',
            "m_new = tl.maximum(m_i, tl.max(logits, 1))",
            "# a row whose keys so far are all masked keeps max -inf: shift by 0 there, not by -inf",
            'm_safe = tl.where(m_new == float("-inf"), 0.0, m_new)',
            "p = tl.exp(logits - m_safe[:, None])",
            "alpha = tl.exp(m_i - m_safe)",
            "l_i = l_i * alpha + tl.sum(p, 1)",
            f'acc = tl.dot(p, vv, acc * alpha[:, None], input_precision="{precision}")',
            "m_i = m_new"]


def _finish(anchor: Attention) -> list[str]:
    if anchor.normalize != "softmax":
        return []
    if anchor.empty_rows_zero:   # l_i is 0 only where every key was masked: its weights were all exp(-inf)
        return [f"acc = tl.where(l_i[:, None] == 0.0, 0.0, {divide('acc', 'l_i[:, None]')})"]
    return [f"acc = {divide('acc', 'l_i[:, None]')}"]


def _tiles(variant: Variant) -> list[tuple[int, int, int]]:
    """(BLOCK_M, BLOCK_N, warps) from the variant's GEMM tiles; key blocks above 64 spill the scores."""
    tiles = [(t.block_m, min(t.block_n, 64), t.warps) for t in variant.matmul]
    return list(dict.fromkeys(tiles))


def _autotune(tiles: list[tuple[int, int, int]]) -> str:
    configs = ", ".join(f'triton.Config({{"BLOCK_M": {m}, "BLOCK_N": {n}}}, num_warps={w})' for m, n, w in tiles)
    return f'@triton.autotune(configs=[{configs}], key=["M", "N", "D", "DV"])\n'
