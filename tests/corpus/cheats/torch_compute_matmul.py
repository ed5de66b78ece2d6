"""Cheat: the GEMM is torch.matmul; only the bias + ReLU epilogue is a Triton kernel."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "gemm_epilogue"
EXPECTED_RULE = "torch-compute"
CAUGHT_BY = "static"


@triton.jit
def bias_relu_kernel(y_ptr, b_ptr, out_ptr, n_elements, N, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    y = tl.load(y_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets % N, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(y + b, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.linear.weight.t()).contiguous()
        out = torch.empty_like(y)
        n = y.numel()
        bias_relu_kernel[(triton.cdiv(n, 1024),)](y, self.linear.bias, out, n, y.shape[1], BLOCK=1024)
        return out
