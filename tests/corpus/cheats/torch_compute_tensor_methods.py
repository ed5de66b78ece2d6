"""Cheat: max, exp and sum are tensor methods; only the final division is a Triton kernel."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"
EXPECTED_RULE = "torch-compute"
CAUGHT_BY = "static"


@triton.jit
def divide_rows_kernel(num_ptr, den_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    numerator = tl.load(num_ptr + row * n_cols + cols, mask=mask)
    denominator = tl.load(den_ptr + row)
    tl.store(out_ptr + row * n_cols + cols, numerator / denominator, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        numerator = (x - x.amax(dim=-1, keepdim=True)).exp().contiguous()
        denominator = numerator.sum(dim=-1).contiguous()
        out = torch.empty_like(numerator)
        rows, cols = numerator.shape
        divide_rows_kernel[(rows,)](numerator, denominator, out, cols, BLOCK=triton.next_power_of_2(cols))
        return out
