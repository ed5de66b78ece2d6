"""Cheat: computes SiLU on a raw _thread.start_new_thread thread (module found by a computed name).

Works today on CPU: dispatch modes are per thread, so the guard on the calling thread sees none of the ops,
and its thread check only watches threading.Thread.start and threading.enumerate().
"""

import math
import sys

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "non-triton-kernel"
CAUGHT_BY = "gpu"

_raw_threads = vars(sys)["modules"]["_th" + "read"]


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        staged = torch.empty_like(x)
        done = _raw_threads.allocate_lock()
        done.acquire()

        def work() -> None:
            staged.copy_(x / (1.0 + math.e ** (-x)))
            done.release()

        getattr(_raw_threads, "start_new_" + "thread")(work, ())
        done.acquire()
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](staged, out, x.numel(), BLOCK=1024)
        return out
