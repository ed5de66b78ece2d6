"""Cheat: pulls the rows to Python lists (`.tolist` by a computed name) and computes the softmax in pure Python.

Works today on CPU: the static rules only know `.tolist()` spelled out, the guard sees only a host copy and
torch.tensor(), and the Triton kernel merely copies the answer into the output.
"""

import math

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"
EXPECTED_RULE = "device-to-host-copy"
CAUGHT_BY = "gpu"


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


def softmax_row(row: list[float]) -> list[float]:
    peak = max(row)
    numerators = [math.exp(value - peak) for value in row]
    total = sum(numerators)
    return [value / total for value in numerators]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = getattr(x, "to" + "list")()
        answer = torch.tensor([softmax_row(row) for row in rows], dtype=x.dtype, device=x.device)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
        return out
