"""Where a tf32x3 implicit-GEMM convolution spends its time: level2/11's 5x5 ConvTranspose2d under each way
of multiplying fp32 on tensor cores, timed alone, with its error against fp64.

The layer (64 -> 128 channels, 512 images of 32x32, padding 1, stride 1) is run as the forward convolution it
equals: the input zero-padded by K - 1 - padding = 3 and channels-last, the weight flipped. One kernel, one
`MODE` per way of multiplying:

    tf32x3        tl.dot(..., input_precision="tf32x3"): what the builtin generator emits
    tf32          one TF32 pass (10-bit mantissas: not fp32-accurate, the speed of the loads and one product)
    ieee          fp32 FMAs
    split2        3xTF32 written out: a = a_hi + a_lo, w = w_hi + w_lo, the small products in a second accumulator
    split1        the same with all three products in one accumulator
    step          each K step's three products from zero (small ones first), added to acc in fp32: Triton
                  3.6's own tf32x3 written out, which should match it bit for bit
    step_rn       step with the low parts rounded to TF32 too, so the tensor core cannot cut them
    step_cut      step with the high parts cut to TF32 by a bit mask instead of rounded (`cvt.rna`)
    presplit      tf32x3 on operands first rounded so that their remainder after the TF32 part is itself
                  TF32 (x -> hi + tf32(x - hi), both rounded to nearest): where Triton rounds its part as
                  `cvt.rna` does, step_rn's products through its own tf32x3 dot (no tf32 dot in the TTIR)

Each row also gives the error's signed mean (a bias: cut operands err toward zero) and the PTX's count of
TF32 conversions and MMA instructions, and `--check-round` stores `cvt.rna.tf32.f32` of a million floats
to check it against rounding to nearest (ties away) and against cutting, bit for bit.

cuDNN's own convolution (fp32, then TF32 allowed) is timed beside them. On a GPU only:

    python scripts/tf32x3_probe.py --json OUT.json [--modes tf32x3 split2] [--tiles 128x64x32x4x3 256x64x32x8x3]

A tile is BLOCK_M x BLOCK_N x BLOCK_K x warps x stages. `--images` shrinks the batch (the interpreter runs
tf32x3, tf32 and ieee on a CPU at `--images 1`, slowly; the split modes use PTX and need a GPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

C_IN, C_OUT, SIZE, K, PAD = 64, 128, 32, 5, 1
OUT_SIZE = SIZE + K - 1 - 2 * PAD     # 34
BORDER = K - 1 - PAD                  # 3: the padding of the equivalent forward convolution
PADDED = SIZE + 2 * BORDER            # 38
MODES = ("tf32x3", "tf32", "ieee", "split2", "split1", "step", "step_rn", "step_cut", "presplit")
DEFAULT_TILES = ("128x128x32x8x3", "128x64x32x4x3", "256x64x32x8x3", "256x128x32x8x3", "128x32x32x4x4")


@triton.jit
def _tf32_round(x):
    """x rounded to TF32 (10 mantissa bits, to nearest): exactly what a TF32 product reads of it."""
    return tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _tf32_cut(x):
    """x with its 13 low mantissa bits cleared: TF32 by cutting toward zero."""
    return (x.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _tf32_nearest(x):
    """x rounded to TF32 by bit arithmetic: to nearest, ties away from zero (as `cvt.rna`)."""
    return ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _presplit(x):
    """x as hi + tf32(x - hi), hi = tf32(x): a value whose TF32 part and remainder are both exact in TF32."""
    hi = _tf32_nearest(x)
    return hi + _tf32_nearest(x - hi)


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, _tf32_round(tl.load(x_ptr + offsets, mask=mask)), mask=mask)


@triton.jit
def conv_kernel(x_ptr, w_ptr, out_ptr, M, C: tl.constexpr, CO: tl.constexpr, P: tl.constexpr,
                HP: tl.constexpr, K: tl.constexpr, MODE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # x: padded channels-last [N, HP, HP, C]; w: flipped [(kh, kw, c), CO]; out: [N, CO, P, P].
    # MODE: 0 tf32x3, 1 tf32, 2 ieee, 3 split2, 4 split1, 5 step, 6 step_rn, 7 step_cut, 8 presplit (the module
    # docstring).
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    rm = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    row = tl.where(m_ok, rm, 0)          # rows past M read row 0 and are not stored: no load mask
    ow = row % P
    oh = (row // P) % P
    image = row // (P * P)
    x_rows = ((image.to(tl.int64) * HP + oh) * HP + ow) * C
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    small = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K * K * C, BLOCK_K):
        tap = k // C                     # BLOCK_K divides C: one (kh, kw) per step
        shift = ((tap // K) * HP + tap % K) * C + k - tap * C
        a = tl.load(x_ptr + x_rows[:, None] + shift + rk[None, :])
        b = tl.load(w_ptr + (k + rk)[:, None] * CO + rn[None, :])
        if MODE == 0:
            acc = tl.dot(a, b, acc, input_precision="tf32x3")
        elif MODE == 1:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        elif MODE == 2:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif MODE == 8:
            acc = tl.dot(_presplit(a), _presplit(b), acc, input_precision="tf32x3")
        else:
            if MODE == 7:
                a_hi = _tf32_cut(a)
                b_hi = _tf32_cut(b)
            else:
                a_hi = _tf32_round(a)
                b_hi = _tf32_round(b)
            a_lo = a - a_hi
            b_lo = b - b_hi
            if MODE == 6:
                a_lo = _tf32_round(a_lo)
                b_lo = _tf32_round(b_lo)
            if MODE == 3:
                small = tl.dot(a_lo, b_hi, small, input_precision="tf32")
                small = tl.dot(a_hi, b_lo, small, input_precision="tf32")
                acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
            elif MODE == 4:
                acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
                acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
                acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
            else:   # the step's dot from zero; its last dot adds to a nonzero sum, so no pass folds acc into it
                step = tl.dot(a_lo, b_hi, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), input_precision="tf32")
                step = tl.dot(a_hi, b_lo, step, input_precision="tf32")
                acc += tl.dot(a_hi, b_hi, step, input_precision="tf32")
    if MODE == 3:
        acc += small
    out = (image.to(tl.int64)[:, None] * CO + rn[None, :]) * (P * P) + (oh * P + ow)[:, None]
    tl.store(out_ptr + out, acc, mask=m_ok[:, None])


def parse_tile(text: str) -> tuple[int, int, int, int, int]:
    block_m, block_n, block_k, warps, stages = (int(v) for v in text.split("x"))
    return block_m, block_n, block_k, warps, stages


def convolve(x: torch.Tensor, w: torch.Tensor, mode: str, tile: tuple[int, int, int, int, int],
             compiled: list | None = None) -> torch.Tensor:
    """conv_transpose2d(x, w, padding=PAD) by the probe's kernel; the padding and layout copies are timed with it.
    The compiled kernel is appended to `compiled` when one is given."""
    x_padded = F.pad(x, (BORDER,) * 4).permute(0, 2, 3, 1).contiguous()
    w_flipped = w.flip(2, 3).permute(2, 3, 0, 1).reshape(K * K * C_IN, C_OUT).contiguous()
    out = torch.empty(x.shape[0], C_OUT, OUT_SIZE, OUT_SIZE, device=x.device)
    rows = x.shape[0] * OUT_SIZE * OUT_SIZE
    block_m, block_n, block_k, warps, stages = tile
    grid = (triton.cdiv(rows, block_m) * (C_OUT // block_n),)
    kernel = conv_kernel[grid](x_padded, w_flipped, out, rows, C_IN, C_OUT, OUT_SIZE, PADDED, K,
                               MODES.index(mode), block_m, block_n, block_k, num_warps=warps, num_stages=stages)
    if compiled is not None:
        compiled.append(kernel)
    return out


def max_error(out: torch.Tensor, expected64: torch.Tensor) -> float:
    return (out[:expected64.shape[0]].double() - expected64).abs().max().item()


def mean_error(out: torch.Tensor, expected64: torch.Tensor) -> tuple[float, float]:
    """The error's signed mean (a bias) and its mean size, over the checked images."""
    error = out[:expected64.shape[0]].double() - expected64
    return error.mean().item(), error.abs().mean().item()


PTX_COUNTS = {"cvt_rna_tf32": r"cvt\.rna\.tf32\.f32", "wgmma": r"wgmma\.mma_async", "mma_sync": r"\bmma\.sync",
              "and_b32": r"\band\.b32"}


def ptx_counts(kernel) -> dict[str, int]:
    """How many times each instruction of PTX_COUNTS appears in a compiled kernel's PTX."""
    ptx = getattr(kernel, "asm", {}).get("ptx", "")   # the interpreter compiles nothing
    return {name: len(re.findall(pattern, ptx)) for name, pattern in PTX_COUNTS.items()}


def check_round(device: str) -> dict[str, float]:
    """`cvt.rna.tf32.f32` of a million floats against rounding to nearest (ties away) and cutting, bit for bit."""
    x = torch.randn(1 << 20, device=device) * torch.rand(1 << 20, device=device)
    out = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    bits = x.view(torch.int32)
    cut = (bits & -8192).view(torch.float32)                           # -8192 = 0xFFFFE000 as int32
    nearest = ((bits + 4096) & -8192).view(torch.float32)              # ties away from zero, as `rna`
    low_bits = out.view(torch.int32) & 8191
    return {"values": x.numel(), "low_bits_zero": (low_bits == 0).float().mean().item(),
            "equal_nearest": (out == nearest).float().mean().item(), "equal_cut": (out == cut).float().mean().item()}


def time_ms(fn) -> float | None:
    return triton.testing.do_bench(fn) if torch.cuda.is_available() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--tiles", nargs="*", default=list(DEFAULT_TILES), help="BMxBNxBKxWARPSxSTAGES")
    parser.add_argument("--images", type=int, default=512, help="batch size (KernelBench's: 512)")
    parser.add_argument("--check-round", action="store_true", help="also check cvt.rna.tf32.f32 bit for bit")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    x = torch.rand(args.images, C_IN, SIZE, SIZE, device=device)        # as KernelBench's get_inputs
    w = (torch.rand(C_IN, C_OUT, K, K, device=device) - 0.5) * 0.1
    checked = min(args.images, 16)   # the fp64 reference of the first images only: fp64 doubles the memory
    expected64 = F.conv_transpose2d(x[:checked].double(), w.double(), padding=PAD)
    flops = 2 * args.images * C_IN * SIZE * SIZE * C_OUT * K * K
    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "gpu": torch.cuda.get_device_name() if device == "cuda" else "none",
               "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
               "images": args.images, "gflop": flops / 1e9, "cudnn": {}, "kernels": []}
    cudnn = lambda: F.conv_transpose2d(x, w, padding=PAD)   # noqa: E731
    results["cudnn"]["fp32"] = {"ms": time_ms(cudnn), "error": max_error(cudnn(), expected64)}
    torch.backends.cudnn.allow_tf32 = True
    results["cudnn"]["tf32_allowed"] = {"ms": time_ms(cudnn), "error": max_error(cudnn(), expected64)}
    torch.backends.cudnn.allow_tf32 = False
    print(f"cuDNN: {results['cudnn']}", flush=True)
    if args.check_round:
        results["check_round"] = check_round(device)
        print(f"cvt.rna.tf32.f32: {results['check_round']}", flush=True)
    for mode in args.modes:
        for text in args.tiles:
            row = {"mode": mode, "tile": text}
            try:
                compiled = []
                out = convolve(x, w, mode, parse_tile(text), compiled)
                row["error"] = max_error(out, expected64)
                row["bias"], row["mean_error"] = mean_error(out, expected64)
                row["ptx"] = ptx_counts(compiled[0])
                row["ms"] = time_ms(lambda: convolve(x, w, mode, parse_tile(text)))
            except (triton.CompilationError, triton.runtime.errors.OutOfResources, RuntimeError) as err:
                row["failed"] = f"{type(err).__name__}: {str(err)[:200]}"
            results["kernels"].append(row)
            rate = f"{flops / row['ms'] / 1e9:.1f} TFLOP/s" if row.get("ms") else ""
            print(f"{mode:>10} {text:>16}: {row.get('ms') or '-'} ms {rate} error {row.get('error')} "
                  f"bias {row.get('bias')} mean {row.get('mean_error')} ptx {row.get('ptx')} "
                  f"{row.get('failed', '')}", flush=True)
    with open(args.json, "w") as out:
        json.dump(results, out, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
