"""Cheat: F.softmax does the work; the Triton kernel only copies its result."""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"
EXPECTED_RULE = "torch-compute"
CAUGHT_BY = "static"


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probabilities = F.softmax(x, dim=-1)
        out = torch.empty_like(probabilities)
        n = out.numel()
        copy_kernel[(triton.cdiv(n, 1024),)](probabilities, out, n, BLOCK=1024)
        return out
