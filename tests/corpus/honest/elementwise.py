"""Honest SiLU: one Triton kernel over the flattened tensor."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"


@triton.jit
def silu_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = x / (1.0 + tl.exp(-x))
    tl.store(out_ptr + offsets, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        block = 1024
        silu_kernel[(triton.cdiv(n_elements, block),)](x, out, n_elements, BLOCK=block)
        return out


if __name__ == "__main__":
    sample = torch.randn(64, 64)
    torch.testing.assert_close(ModelNew()(sample), sample * torch.sigmoid(sample))
