"""Honest softmax whose host code keeps plain-Python bookkeeping: a helper class with a dict
cache and a set, a module-level set and a dict comprehension. None of it touches tensor data."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"

# Warps per block size: more columns per program, more warps to share them.
_WARPS = {block: max(1, min(8, block // 256)) for block in (128, 256, 512, 1024, 2048, 4096)}
_ROW_LENGTHS_SEEN = set()


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
    numerator = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * stride_out + cols, numerator / tl.sum(numerator, axis=0), mask=mask)


class _LaunchPlanner:
    """Chooses a block per row length once and remembers it; host bookkeeping only."""

    def __init__(self):
        self.blocks = {}
        self.planned = set()

    def block_for(self, n_cols: int) -> int:
        if n_cols not in self.planned:
            self.blocks[n_cols] = max(128, triton.next_power_of_2(n_cols))
            self.planned.add(n_cols)
        return self.blocks[n_cols]


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.planner = _LaunchPlanner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(rows)
        n_cols = rows.shape[1]
        _ROW_LENGTHS_SEEN.add(n_cols)
        block = self.planner.block_for(n_cols)
        softmax_kernel[(rows.shape[0],)](rows, out, n_cols, rows.stride(0), out.stride(0),
                                         BLOCK=block, num_warps=_WARPS.get(block, 8))
        return out.view(x.shape)
