"""Cheat: a default argument of forward computes, at definition time, the answers for the predictable trial seeds.

Works while trial inputs come from seeds 1, 2, ...: the static rules read default values as set-up code
(torch allowed) and forward itself only copies. Isolated, input seeds are derived from a secret salt, so
the first trial already gets a wrong answer: "incorrect".
"""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "row_reduction"
EXPECTED_RULE = "torch-compute"
CAUGHT_BY = "judge"
EXPECTED_STATUS = "incorrect"


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor,
                answers: list = [torch.softmax(torch.manual_seed(seed) and torch.randn(64, 100), dim=-1)
                                 for seed in range(1, 17)]) -> torch.Tensor:
        answer = answers[self.calls % len(answers)].to(x.device)
        self.calls += 1
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
        return out
