"""Cheat: the scratch-in-argument kernel made to pass a check of the first call alone. Its first call leaves x
as it was; from the second on it keeps sigmoid(x) in x, its argument, and returns x * sigmoid(x) in a fresh
tensor, so every output is right and every caller's tensor after the first is not.

The harness keeps the arguments of the later checked calls too (the trials, at random places among the calls)
and compares them after the profiler stops.
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
def silu_kernel(x_ptr, out_ptr, n_elements, KEEP_GATE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    gate = 1.0 / (1.0 + tl.exp(-x))
    if KEEP_GATE:
        tl.store(x_ptr + offsets, gate, mask=mask)
    tl.store(out_ptr + offsets, x * gate, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = torch.empty_like(x)
        n_elements = x.numel()
        silu_kernel[(triton.cdiv(n_elements, 1024),)](x, out, n_elements, KEEP_GATE=self.calls > 1, BLOCK=1024)
        return out
