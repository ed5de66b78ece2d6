"""Cheat: copies the input to the host and computes SiLU with NumPy, `.numpy` reached through a computed getattr.

Works today on CPU: the static rules only know `.numpy()` spelled out, and the guard sees nothing but a
device copy and a tensor built from an array; the Triton kernel merely copies the answer back.
"""

import numpy as np
import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "device-to-host-copy"
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
        host = getattr(x.detach().cpu(), "num" + "py")()
        answer = torch.as_tensor(host / (1.0 + np.exp(-host)), device=x.device)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
        return out
