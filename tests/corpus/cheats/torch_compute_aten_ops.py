"""Cheat: the GEMM and bias are torch.ops.aten.addmm; only the ReLU is a Triton kernel."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "gemm_epilogue"
EXPECTED_RULE = "torch-compute"
CAUGHT_BY = "static"


@triton.jit
def relu_kernel(y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.maximum(tl.load(y_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.addmm(self.linear.bias, x, self.linear.weight.t())
        out = torch.empty_like(y)
        relu_kernel[(triton.cdiv(y.numel(), 1024),)](y, out, y.numel(), BLOCK=1024)
        return out
