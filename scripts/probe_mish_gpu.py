"""Where the generated Mish's error against fp64 comes from on a GPU: the helper as generated, and with one part
changed at a time (IEEE division for _div, exp computed with its argument reduced first, n as a plain product
that the GPU may fuse into n + 2). Prints one JSON line per variant: the max abs error, the x where it is, and
PyTorch's fp32 error on the same points.

On an H100 (Triton 3.6), with n then a plain product: 9.5e-07, alike with IEEE division or the reduced exp, and
6.85e-07 (PyTorch's) with n as fma(e, e + 2, 0), which kept the GPU from fusing n + 2 into fma(e, e + 2, 2):
the two had disagreed by up to half an ulp of n, and n / (n + 2) by an ulp of 1. Hence the fma in _mish.

    PYTHONPATH=. python3 scripts/probe_mish_gpu.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import triton

from mkevolve.builtin.kernels.pointwise_ops import HELPER_SOURCES
from mkevolve.problem import import_file

_KERNEL = '''
@triton.jit
def mish_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, _mish(tl.load(x_ptr + offs, mask=mask)), mask=mask)
'''
_REDUCED_EXP = '''
@triton.jit
def _exp_reduced(x):
    k = tl.floor(x * 1.4426950408889634 + 0.5)
    r = tl.fma(k, -0.693145751953125, x)
    r = tl.fma(k, -1.428606765330187e-06, r)
    return tl.exp(r) * ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
'''
VARIANTS = {
    "as generated": lambda s: s,
    "div_rn for _div": lambda s: s.replace("_div(n, n + 2.0)", "tl.div_rn(n, n + 2.0)"),
    "reduced exp": lambda s: s.replace("e = tl.exp(tl.minimum(x, 20.0))",
                                       "e = _exp_reduced(tl.maximum(tl.minimum(x, 20.0), -87.0))"),
    "n a plain product": lambda s: s.replace("n = tl.fma(e, e + 2.0, 0.0)", "n = e * (e + 2.0)"),
}


def _module(name: str, helpers: dict[str, str]):
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n" + "\n".join(helpers.values()) + _REDUCED_EXP
                    + _KERNEL)
    return import_file(path, prefix="mish_probe")


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0)) * 3
    exact = torch.nn.functional.mish(x.double())
    theirs = (torch.nn.functional.mish(x.to(device)).cpu().double() - exact).abs()
    for index, (label, change) in enumerate(VARIANTS.items()):
        helpers = {**HELPER_SOURCES, "_mish": change(HELPER_SOURCES["_mish"])}
        assert index == 0 or helpers["_mish"] != HELPER_SOURCES["_mish"], f"{label}: the change left _mish as it was"
        module = _module(f"mish_probe_{index}", helpers)
        y = torch.empty(x.numel(), device=device)
        module.mish_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(device), y, x.numel(), BLOCK=1024)
        error = (y.cpu().double() - exact).abs()
        worst = int(error.argmax())
        print(json.dumps({"variant": label, "max_err": float(error.max()), "at_x": float(x[worst]),
                          "torch_max_err": float(theirs.max()), "torch_err_there": float(theirs[worst]),
                          "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}))


if __name__ == "__main__":
    main()
