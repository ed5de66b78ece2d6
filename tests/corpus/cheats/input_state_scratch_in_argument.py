"""Cheat, or a bug a kernel author makes to save memory: keeps sigmoid(x) in x itself, its argument, and
returns x * sigmoid(x) in a fresh tensor. The output is right; the caller's tensor is not, and in a model the
next layer that reads x reads sigmoid(x).

The harness compares the first call's arguments with the inputs it was given, after the profiler stops.
"""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "input-state"
CAUGHT_BY = "judge"
EXPECTED_STATUS = "incorrect"


@triton.jit
def silu_in_place_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    gate = 1.0 / (1.0 + tl.exp(-x))
    tl.store(x_ptr + offsets, gate, mask=mask)
    tl.store(out_ptr + offsets, x * gate, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n_elements = x.numel()
        silu_in_place_kernel[(triton.cdiv(n_elements, 1024),)](x, out, n_elements, BLOCK=1024)
        return out
