"""Fault: writes 4 MiB of random bytes to fd 1 and to fd 2 (more than a pipe holds), then computes honestly.

The result channel must not be stdout, and whoever holds the other end of these streams must keep
draining them, or the candidate blocks on a full pipe: the verdict must still be ok.
"""
import os

import triton
import triton.language as tl
import torch
from torch import nn

EXPECTED_STATUS = "ok"


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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class ModelNew(nn.Module):
    def forward(self, x, y):
        garbage = os.urandom(4 << 20)
        write_all(1, garbage)
        write_all(2, garbage)
        print("\x00\xff not a result", flush=True)
        return launch(x, y)
