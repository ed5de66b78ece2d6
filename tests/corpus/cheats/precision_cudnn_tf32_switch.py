"""Cheat: an ieee kernel, with PyTorch's TF32 switch for cuDNN turned on in __init__ by a positional
argument (on a GPU, any PyTorch convolution the solution keeps would then run in TF32). No precision name
is written; the harness reads the switches from C before and after every call."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "gemm_epilogue"
EXPECTED_RULE = "precision-downgrade"
CAUGHT_BY = "harness"


@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x_mask = (rows[:, None] < M) & (ks[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=x_mask, other=0.0)
        w_mask = (ks[:, None] < K) & (cols[None, :] < N)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=w_mask, other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    y = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        torch.backends.cudnn.set_flags(True, False, 10, False, True)   # the fifth: allow TF32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        weight = self.linear.weight
        M, K = x.shape
        N = weight.shape[0]
        out = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
        linear_relu_kernel[grid](x, weight, self.linear.bias, out, M, N, K,
                                 BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        return out
