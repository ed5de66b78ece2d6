"""Fault: reads the whole environment for credentials and reports what it found in its error message.

Error messages go back into prompts and logs, so this is an exfiltration channel: the candidate's
environment must hold no *_API_KEY / *_TOKEN / *_SECRET, and with none found the verdict is ok.
"""
import os

import triton
import triton.language as tl
import torch
from torch import nn

EXPECTED_STATUS = "ok"

_CREDENTIAL_SUFFIXES = ("_API_KEY", "_KEY", "_TOKEN", "_SECRET", "_PASSWORD")


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


def found_credentials() -> list[str]:
    """Names of credential-like variables; values only for the test's fake ones (no real key in logs)."""
    found = []
    for name, value in sorted(os.environ.items()):
        if name.upper().endswith(_CREDENTIAL_SUFFIXES):
            found.append(f"{name}={value}" if name.startswith("FAKE_") else name)
    return found


class ModelNew(nn.Module):
    def forward(self, x, y):
        found = found_credentials()
        if found:
            raise RuntimeError("credentials in reach: " + ", ".join(found))
        return launch(x, y)
