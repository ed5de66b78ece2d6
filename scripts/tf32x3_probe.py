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

cuDNN's own convolution (fp32, then TF32 allowed) is timed beside them. On a GPU only:

    python scripts/tf32x3_probe.py --json OUT.json [--modes tf32x3 split2] [--tiles 128x64x32x4x3 256x64x32x8x3]

A tile is BLOCK_M x BLOCK_N x BLOCK_K x warps x stages. `--images` shrinks the batch (the interpreter runs
tf32x3, tf32 and ieee on a CPU at `--images 1`, slowly; the split modes use PTX and need a GPU).
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

C_IN, C_OUT, SIZE, K, PAD = 64, 128, 32, 5, 1
OUT_SIZE = SIZE + K - 1 - 2 * PAD     # 34
BORDER = K - 1 - PAD                  # 3: the padding of the equivalent forward convolution
PADDED = SIZE + 2 * BORDER            # 38
MODES = ("tf32x3", "tf32", "ieee", "split2", "split1")
DEFAULT_TILES = ("128x128x32x8x3", "128x64x32x4x3", "256x64x32x8x3", "256x128x32x8x3", "128x32x32x4x4")


@triton.jit
def _tf32_round(x):
    """x rounded to TF32 (10 mantissa bits, to nearest): exactly what a TF32 product reads of it."""
    return tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def conv_kernel(x_ptr, w_ptr, out_ptr, M, C: tl.constexpr, CO: tl.constexpr, P: tl.constexpr,
                HP: tl.constexpr, K: tl.constexpr, MODE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # x: padded channels-last [N, HP, HP, C]; w: flipped [(kh, kw, c), CO]; out: [N, CO, P, P].
    # MODE: 0 tf32x3, 1 tf32, 2 ieee, 3 split2, 4 split1 (see the module docstring).
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
        else:
            a_hi = _tf32_round(a)
            b_hi = _tf32_round(b)
            a_lo = a - a_hi
            b_lo = b - b_hi
            if MODE == 3:
                small = tl.dot(a_lo, b_hi, small, input_precision="tf32")
                small = tl.dot(a_hi, b_lo, small, input_precision="tf32")
            else:
                acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
                acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
            acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
    if MODE == 3:
        acc += small
    out = (image.to(tl.int64)[:, None] * CO + rn[None, :]) * (P * P) + (oh * P + ow)[:, None]
    tl.store(out_ptr + out, acc, mask=m_ok[:, None])


def parse_tile(text: str) -> tuple[int, int, int, int, int]:
    block_m, block_n, block_k, warps, stages = (int(v) for v in text.split("x"))
    return block_m, block_n, block_k, warps, stages


def convolve(x: torch.Tensor, w: torch.Tensor, mode: str, tile: tuple[int, int, int, int, int]) -> torch.Tensor:
    """conv_transpose2d(x, w, padding=PAD) by the probe's kernel; the padding and layout copies are timed with it."""
    x_padded = F.pad(x, (BORDER,) * 4).permute(0, 2, 3, 1).contiguous()
    w_flipped = w.flip(2, 3).permute(2, 3, 0, 1).reshape(K * K * C_IN, C_OUT).contiguous()
    out = torch.empty(x.shape[0], C_OUT, OUT_SIZE, OUT_SIZE, device=x.device)
    rows = x.shape[0] * OUT_SIZE * OUT_SIZE
    block_m, block_n, block_k, warps, stages = tile
    grid = (triton.cdiv(rows, block_m) * (C_OUT // block_n),)
    conv_kernel[grid](x_padded, w_flipped, out, rows, C_IN, C_OUT, OUT_SIZE, PADDED, K, MODES.index(mode),
                      block_m, block_n, block_k, num_warps=warps, num_stages=stages)
    return out


def max_error(out: torch.Tensor, expected64: torch.Tensor) -> float:
    return (out[:expected64.shape[0]].double() - expected64).abs().max().item()


def time_ms(fn) -> float | None:
    return triton.testing.do_bench(fn) if torch.cuda.is_available() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--tiles", nargs="*", default=list(DEFAULT_TILES), help="BMxBNxBKxWARPSxSTAGES")
    parser.add_argument("--images", type=int, default=512, help="batch size (KernelBench's: 512)")
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
    for mode in args.modes:
        for text in args.tiles:
            row = {"mode": mode, "tile": text}
            try:
                out = convolve(x, w, mode, parse_tile(text))
                row["error"] = max_error(out, expected64)
                row["ms"] = time_ms(lambda: convolve(x, w, mode, parse_tile(text)))
            except (triton.CompilationError, triton.runtime.errors.OutOfResources, RuntimeError) as err:
                row["failed"] = f"{type(err).__name__}: {str(err)[:200]}"
            results["kernels"].append(row)
            rate = f"{flops / row['ms'] / 1e9:.1f} TFLOP/s" if row.get("ms") else ""
            print(f"{mode:>7} {text:>16}: {row.get('ms') or '-'} ms {rate} error {row.get('error')} "
                  f"{row.get('failed', '')}", flush=True)
    with open(args.json, "w") as out:
        json.dump(results, out, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
