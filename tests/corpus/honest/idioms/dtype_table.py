"""Honest Linear + ReLU with a torch-to-Triton dtype table: the output is stored in the input's
dtype, looked up in a table that also lists half precision. The math stays in fp32."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "gemm_epilogue"

# Each torch dtype maps to its own Triton counterpart: a float32 input stores float32.
_TL_DTYPES = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}


# K is a compile-time constant: Triton 3.6's interpreter cannot loop to a runtime bound.
@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K: tl.constexpr,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                       OUT_DTYPE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    y = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, y.to(OUT_DTYPE),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if x.dtype not in _TL_DTYPES:
        raise TypeError(f"unsupported dtype {x.dtype}")
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    linear_relu_kernel[grid](x, weight, bias, out, M, N, K,
                             x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
                             out.stride(0), out.stride(1), OUT_DTYPE=_TL_DTYPES[x.dtype],
                             BLOCK_M=16, BLOCK_N=16, BLOCK_K=32)
    return out


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_relu(x, self.linear.weight, self.linear.bias)
