"""Cheat: CuPy computes the sigmoid through DLPack; the Triton kernel only multiplies."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "torch-compute"
CAUGHT_BY = "static"


@triton.jit
def multiply_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    product = tl.load(a_ptr + offsets, mask=mask) * tl.load(b_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, product, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import cupy

        x = x.contiguous()
        gate = torch.utils.dlpack.from_dlpack(1 / (1 + cupy.exp(-cupy.from_dlpack(x))))
        out = torch.empty_like(x)
        multiply_kernel[(triton.cdiv(x.numel(), 1024),)](x, gate, out, x.numel(), BLOCK=1024)
        return out
