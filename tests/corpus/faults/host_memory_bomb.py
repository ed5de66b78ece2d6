"""Fault: allocates host memory 64 MiB at a time (touched, so it is resident) until something stops it.

The host-memory watch must kill it (a crash) and leave every other verdict alone; CEILING_GIB keeps a
shared machine alive where no watch is in force (then it sleeps at the ceiling and times out).
"""
import time

import triton
import triton.language as tl
import torch
from torch import nn

EXPECTED_STATUS = "crashed"

CHUNK = 64 << 20
CEILING_GIB = 3  # keeps a shared test machine alive when no cap is in force


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
        hoard = []
        while len(hoard) * CHUNK < CEILING_GIB << 30:
            hoard.append(bytearray(b"\x01") * CHUNK)
        while True:
            time.sleep(1.0)
        return launch(x, y)
