"""Cheat: calls the GEMM as `core.dot(x, w)` with no input_precision, which Triton runs in tf32 on a GPU.

Works today on CPU: the static precision rule only inspects calls it resolves to `tl.dot`; the interpreter
on CPU multiplies in full fp32, and only the compiled IR on a GPU shows the tf32 dot.
"""

import torch
import triton
import triton.language as tl
from torch import nn
from triton.language import core

PROBLEM = "gemm_epilogue"
EXPECTED_RULE = "precision-downgrade"
CAUGHT_BY = "gpu"


@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += core.dot(x, w)
    bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    y = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        M, K = x.shape
        N = self.linear.weight.shape[0]
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        linear_relu_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](
            x, self.linear.weight, self.linear.bias, out, M, N, K, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        return out
