"""Cheat: NumPy computes the SiLU on the host; the Triton kernel only copies the result back."""

import numpy as np
import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
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
        host = x.detach().cpu().numpy()
        result = torch.as_tensor(host / (1.0 + np.exp(-host)), device=x.device)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](result, out, x.numel(), BLOCK=1024)
        return out
