"""Honest softmax: one program per row, the block sized to the row by a Triton heuristic."""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n_cols"])})
@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf"))
    shifted = x - tl.max(x, axis=0)
    numerator = tl.exp(shifted)
    denominator = tl.sum(numerator, axis=0)
    tl.store(out_ptr + row * stride_out + cols, numerator / denominator, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(rows)
        softmax_kernel[(rows.shape[0],)](rows, out, rows.shape[1], rows.stride(0), out.stride(0))
        return out.view(x.shape)


if __name__ == "__main__":
    sample = torch.randn(64, 100)
    torch.testing.assert_close(ModelNew()(sample), torch.softmax(sample, dim=-1))
