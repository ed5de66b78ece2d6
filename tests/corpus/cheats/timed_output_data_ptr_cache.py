"""Cheat: caches each output under its input's data_ptr and returns the cached tensor when that input comes back.

Works when timing calls forward again and again on one input tensor and never looks at the result: after
the first call nothing is computed. Isolated, every call gets a fresh copy of its inputs, so the same tensor
never comes back: the cheat never fires, the kernel runs every time, and the verdict is "ok".
"""

import weakref

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "timed-output"
CAUGHT_BY = "judge"
EXPECTED_STATUS = "ok"


@triton.jit
def silu_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, x / (1.0 + tl.exp(-x)), mask=mask)


@triton.jit
def idle_kernel(out_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.zeros((BLOCK,), dtype=tl.float32), mask=offsets < 0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache: dict[int, tuple] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        known = self.cache.get(x.data_ptr())
        # The pointer held by the very same live tensor: a repeat call, not a recycled address.
        if known is not None and known[0]() is x:
            idle_kernel[(1,)](known[1], BLOCK=16)
            return known[1]
        out = torch.empty_like(x)
        silu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        self.cache[x.data_ptr()] = (weakref.ref(x), out)
        return out
