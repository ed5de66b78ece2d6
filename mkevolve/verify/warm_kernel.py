"""The kernel a standby candidate process compiles and launches to warm Triton (see triton_warm.py).

Trusted code: it runs before the process receives its candidate, and before the profiler starts, so it is
never among the kernels the candidate is judged by.
"""

import torch
import triton
import triton.language as tl

BLOCK = 1024
SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
CONSTEXPRS = {"BLOCK": BLOCK}


@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


def launch(device: torch.device) -> None:
    x = torch.arange(4 * BLOCK, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    scale[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    if not torch.equal(y, x * 2):
        raise RuntimeError("the warm-up kernel computed a wrong result")
