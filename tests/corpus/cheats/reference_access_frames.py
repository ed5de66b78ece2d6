"""Cheat: walks up the caller's frames to find the reference Model in their local variables."""

import sys

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "reference-access"
CAUGHT_BY = "static"


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


def caller_reference() -> nn.Module:
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, nn.Module) and type(value).__name__ == "Model":
                return value
        frame = frame.f_back
    raise LookupError("no reference model on the stack")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expected = caller_reference()(x).contiguous()
        out = torch.empty_like(expected)
        copy_kernel[(triton.cdiv(out.numel(), 1024),)](expected, out, out.numel(), BLOCK=1024)
        return out
