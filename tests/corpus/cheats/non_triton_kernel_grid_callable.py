"""Cheat: computes SiLU with torch inside the launch's grid callable, stashing it for a copy kernel to "produce".

Works today on CPU: the dispatcher guard ignores every op issued while a launch is in progress (to spare
Triton's own work), and the grid callable runs inside the launch, before the kernel.
"""

import math

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "non-triton-kernel"
CAUGHT_BY = "gpu"


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        staged = torch.empty_like(x)
        out = torch.empty_like(x)
        n = x.numel()

        def grid(meta):
            staged.copy_(x / (1.0 + math.e ** (-x)))
            return (triton.cdiv(n, meta["BLOCK"]),)

        copy_kernel[grid](staged, out, n, BLOCK=1024)
        return out
