"""Cheat: runs the GEMM and epilogue under torch.utils._mode_utils.no_dispatch(), which mutes dispatch modes.

Works today on CPU: the guard is a TorchDispatchMode and no_dispatch() turns modes off; the context manager is
taken from the module at import time, where the static rules allow any torch name.
"""

import torch
import torch.utils._mode_utils as mode_utils
import triton
import triton.language as tl
from torch import nn

PROBLEM = "gemm_epilogue"
EXPECTED_RULE = "non-triton-kernel"
CAUGHT_BY = "gpu"

_quiet = getattr(mode_utils, "no_" + "dispatch")


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _quiet():
            product = getattr(x, "mat" + "mul")(self.linear.weight.t()) + self.linear.bias
            staged = getattr(product, "cl" + "amp")(min=0.0).contiguous()
        out = torch.empty_like(staged)
        copy_kernel[(triton.cdiv(out.numel(), 1024),)](staged, out, out.numel(), BLOCK=1024)
        return out
