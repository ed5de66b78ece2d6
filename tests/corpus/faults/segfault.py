"""Fault: the process dies of a segmentation fault in forward."""
import os
import signal
import triton
import triton.language as tl
import torch
from torch import nn


@triton.jit
def fused_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0) * 2.0 + y, mask=mask)


def launch(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    fused_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
    return out


class ModelNew(nn.Module):
    def forward(self, x, y):
        os.kill(os.getpid(), signal.SIGSEGV)
        return launch(x, y)
