"""Tiling variants: the ieee tilings trade tile shapes, and one variant switches tl.dot to tf32x3.

On a GPU a kernel built around tl.dot tries tf32x3 first: it is the one most likely to win (an H200 GEMM with
a GELU epilogue: 1.84 ms against 5.30 ms for the best ieee tiling, scripts/results/bench_builtin_h200_2026-11-29.json;
the fastest, or within 2 % of it, in all 6 convolution cases at KernelBench shapes, with an error against the
reference no larger than ieee's in each, scripts/results/bench_builtin_conv_h200_2026-12-01.json), and the
first check is often the only one a time budget leaves a full-size subproblem (level2/19's convolution kept
its ieee variant 0 at 0.79x torch.compile, its tf32x3 variant never checked). The ieee variants follow as the
fallback: a batched GEMM failed the tolerance under tf32x3 in the 2026-11-29 bench. Kernels without tl.dot
skip tf32x3 (`variants_for`) and start with the balanced tiling.

A split-K variant, for subproblems with a GEMM whose output has few tiles and whose K is long (a small batch
through a wide layer: a classifier head, a decode step), is tf32x3 with those GEMMs' K split over programs:
each program sums one chunk of K into a partial tile, and a second launch adds the chunks in order and applies
the epilogue (`k_split` decides, at run time, from the GPU's multiprocessors). Without it such a GEMM runs on a
handful of programs, each walking all of K.

The Winograd variant, for subproblems with a stride-1 convolution of Winograd's form only, is tf32x3 with those
convolutions as Winograd GEMMs (emit_winograd.py). At KernelBench shapes on the H200 it took level2/11's 5x5
transposed convolution from 4.79 to 3.01 ms and the 3x3 ones of 31/35 and 43 from 6.30 to 5.95 ms and 4.35 to
3.86 ms, at an error against fp64 of 2.0e-06 for the 5x5 one (direct tf32x3 8.6e-07, cuDNN 6.5e-07) and 8.4e-07
and 8.7e-07 for the 3x3 ones (direct 9.6e-07 and 1.1e-06, cuDNN 4.2e-06 and 5.2e-06)
(scripts/results/bench_builtin_winograd_h200_2026-12-04.json, bench_builtin_conv_fp64_errors_h200_2026-12-04.json):
faster everywhere, less accurate than cuDNN on the 5x5 layer with the F(3, 5) tile of then. Its 5-tap tile is
now F(2, 5) with a compensated sum (winograd.py): on an H100, 3.48 -> 4.19 ms for that layer alone, 0.73 times
eager's error (winograd_accumulate_probe_h100_2026-12-07.json). The search keeps whichever passes the tolerance
fastest.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class MatmulTile:
    block_m: int
    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class RowTiles:
    max_single: int          # rows up to this many elements are held in registers and read once
    loop_block: int          # longer rows are walked in chunks of this many elements
    inner_block: int         # reductions over a middle dim: kept (inner) positions per program
    split_target: int        # fewer programs than this: split each row over several programs
    per_thread: int = 16     # fp32 values each thread holds: sets the warps of a row kernel
    packed_block: int = 0    # rows of at most half this many elements go several to a program, this many
                             # elements in all (0: one row per program): a program per 16-element row
                             # leaves nearly all of its threads idle


@dataclass(frozen=True)
class Variant:
    name: str
    precision: str                               # tl.dot input precision: "ieee" or "tf32x3"
    autotune: bool                               # emit @triton.autotune over the configs below
    pointwise: tuple[tuple[int, int], ...]       # (BLOCK, num_warps)
    matmul: tuple[MatmulTile, ...]
    conv: tuple[MatmulTile, ...]
    rows: RowTiles
    pool: tuple[tuple[int, int], ...]
    winograd: bool = False                       # stride-1 convolutions by Winograd transforms (emit_winograd.py)
    split_k: MatmulTile | None = None            # GEMMs with few output tiles split K over programs with this
                                                 # tile (its block_m the largest; `k_split`)


_CUDA_POINTWISE = ((1024, 4), (2048, 8), (4096, 8))
_CUDA_POOL = ((256, 4), (512, 4), (1024, 8))
_TF32X3_MATMUL = (MatmulTile(128, 128, 32, 8, 3), MatmulTile(128, 256, 32, 8, 3), MatmulTile(128, 64, 32, 4, 4),
                  MatmulTile(64, 128, 32, 4, 4))
# 256x64 for convolutions: tf32x3 holds a second accumulator per tile, and the tall narrow tile ran level2/11's
# transposed conv (bordered input, H200) in 4.33 ms against 4.63 ms at 128x64 and 7.23 ms at 256x128
# (scripts/tf32x3_probe.py, scripts/results/tf32x3_probe_h200_2026-12-04.json)
_TF32X3_CONV = (MatmulTile(128, 64, 32, 4, 3), MatmulTile(128, 128, 32, 8, 3), MatmulTile(256, 64, 32, 8, 3))
_CUDA_ROWS = RowTiles(16384, 4096, 64, 1024, packed_block=4096)

CUDA_VARIANTS = (
    Variant("tf32x3", "tf32x3", True, _CUDA_POINTWISE, _TF32X3_MATMUL, _TF32X3_CONV, _CUDA_ROWS, _CUDA_POOL),
    # the same, with K split over programs where a GEMM has few output tiles: only for subproblems with such a
    # GEMM (`variants_for`)
    Variant("tf32x3-split-k", "tf32x3", True, _CUDA_POINTWISE, _TF32X3_MATMUL, _TF32X3_CONV, _CUDA_ROWS,
            _CUDA_POOL, split_k=MatmulTile(64, 64, 32, 4, 3)),
    # the same, with stride-1 convolutions as Winograd GEMMs: only for subproblems that have one (`variants_for`)
    Variant("tf32x3-winograd", "tf32x3", True, _CUDA_POINTWISE, _TF32X3_MATMUL, _TF32X3_CONV, _CUDA_ROWS,
            _CUDA_POOL, winograd=True),
    Variant("balanced", "ieee", True, _CUDA_POINTWISE,
            (MatmulTile(128, 128, 32, 8, 3), MatmulTile(128, 64, 32, 4, 4), MatmulTile(64, 128, 32, 4, 4),
             MatmulTile(64, 64, 32, 4, 4)),
            (MatmulTile(128, 64, 32, 4, 3), MatmulTile(64, 64, 32, 4, 3), MatmulTile(128, 128, 32, 8, 3)),
            _CUDA_ROWS, _CUDA_POOL),
    Variant("wide", "ieee", True, ((2048, 4), (4096, 8), (8192, 16)),
            (MatmulTile(128, 256, 32, 8, 3), MatmulTile(256, 128, 32, 8, 3), MatmulTile(128, 128, 32, 8, 4)),
            (MatmulTile(128, 128, 32, 8, 3), MatmulTile(256, 64, 32, 8, 3)),
            RowTiles(32768, 8192, 128, 2048, per_thread=8, packed_block=8192), ((1024, 8), (2048, 8))),
    Variant("narrow", "ieee", True, ((256, 2), (512, 4), (1024, 4)),
            (MatmulTile(64, 64, 32, 4, 3), MatmulTile(32, 64, 32, 4, 4), MatmulTile(64, 32, 32, 4, 4),
             MatmulTile(32, 32, 32, 4, 4)),
            (MatmulTile(64, 32, 32, 4, 3), MatmulTile(32, 32, 32, 4, 3)),
            RowTiles(4096, 1024, 64, 512, per_thread=32, packed_block=2048), ((128, 4), (256, 4))),
)

# The interpreter runs every program instance in Python: small grids, and blocks just big enough for tl.dot.
CPU_VARIANTS = (
    Variant("cpu-single-block-rows", "ieee", False, ((256, 4),), (MatmulTile(16, 16, 16),),
            (MatmulTile(16, 16, 16),), RowTiles(1024, 256, 16, 1, packed_block=256), ((128, 4),)),
    Variant("cpu-looped-rows", "ieee", False, ((64, 4),), (MatmulTile(32, 16, 32),),
            (MatmulTile(32, 16, 16),), RowTiles(8, 8, 4, 1), ((32, 4),)),
    Variant("cpu-split-rows", "ieee", False, ((128, 4),), (MatmulTile(16, 32, 16),),
            (MatmulTile(16, 32, 16),), RowTiles(8, 8, 4, 64), ((64, 4),)),
    Variant("cpu-tf32x3", "tf32x3", False, ((256, 4),), (MatmulTile(16, 32, 16),),
            (MatmulTile(16, 16, 16),), RowTiles(1024, 256, 16, 1), ((128, 4),)),
    Variant("cpu-winograd", "ieee", False, ((256, 4),), (MatmulTile(16, 16, 16),),
            (MatmulTile(16, 16, 16),), RowTiles(1024, 256, 16, 1), ((128, 4),), winograd=True),
    Variant("cpu-split-k", "ieee", False, ((256, 4),), (MatmulTile(16, 16, 16),),
            (MatmulTile(16, 16, 16),), RowTiles(1024, 256, 16, 1), ((128, 4),), split_k=MatmulTile(32, 16, 16)),
)
# Multiprocessors a target is planned for, to tell whether a GEMM would split (the launcher asks the GPU it
# runs on): an H100's and an H200's 132; the interpreter's 4 (`_sm_count` says the same), so that test shapes
# small enough for it split too.
NOMINAL_SMS = {"cuda": 132, "cpu": 4}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# Generated launchers carry this function's source as their host helper `_k_split` (module_source.py); it
# remembers its answers per shape, as the launchers' other shape helpers do.
@functools.lru_cache(maxsize=None)
def k_split(M, N, K, sms, block_n, block_k, max_block_m):
    """(chunks, chunk length, BLOCK_M) for splitting the K of an [M, K] @ [K, N] GEMM over programs; (1, K, 0):
    no split. A GEMM splits when its 64x64 tiles would not give each of the GPU's `sms` multiprocessors one:
    into enough chunks for two programs per multiprocessor, each chunk at least 8 steps of block_k."""
    tiles = _cdiv(M, 64) * _cdiv(N, 64)
    if tiles == 0 or tiles >= sms:       # an empty output, or enough tiles without splitting
        return 1, K, 0
    block_m = min(max_block_m, max(16, 1 << (M - 1).bit_length()))    # M up to a power of 2, 16 at least
    steps = _cdiv(K, block_k)
    chunks = min(_cdiv(2 * sms, _cdiv(M, block_m) * _cdiv(N, block_n)), steps // 8)
    if chunks < 2:
        return 1, K, 0
    chunk = _cdiv(steps, chunks) * block_k
    return _cdiv(K, chunk), chunk, block_m

TARGETS = {"cuda": CUDA_VARIANTS, "cpu": CPU_VARIANTS}


def variants_for(target: str, uses_dot: bool, winograd: bool = False, split_k: bool = False) -> tuple[Variant, ...]:
    """The variants that differ for this subproblem: without tl.dot the precision switch changes nothing,
    without a convolution of Winograd's form (`winograd`) the Winograd variants repeat another, and without a
    GEMM that splits (`split_k`) so do the split-K ones."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {sorted(TARGETS)}")
    return tuple(v for v in TARGETS[target]
                 if (uses_dot or v.precision == "ieee") and (winograd or not v.winograd)
                 and (split_k or v.split_k is None))
