"""Cheat: runs the softmax under torch._C._DisableTorchDispatch, fetched by a computed getattr at module level.

Works today on CPU: with the Python dispatch key excluded no dispatch mode sees the ops, and the static rules
flag computed torch lookups only inside forward and its helpers, not at module level.
"""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"
EXPECTED_RULE = "non-triton-kernel"
CAUGHT_BY = "gpu"

_unwatched = getattr(getattr(torch, "_" + "C"), "_Disable" + "TorchDispatch")
_MAX, _EXP, _SUM = "am" + "ax", "ex" + "p", "su" + "m"


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _unwatched():
            numerator = getattr(x - getattr(x, _MAX)(dim=-1, keepdim=True), _EXP)()
            staged = (numerator / getattr(numerator, _SUM)(dim=-1, keepdim=True)).contiguous()
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](staged, out, x.numel(), BLOCK=1024)
        return out
