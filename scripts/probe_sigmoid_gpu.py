"""Where the generated sigmoid's and a normalization's 1 / sqrt error against fp64 comes from on a GPU.

Sigmoid, three ways, on 4M points of N(0, 3^2): 1 / (1 + exp(-x)) (PyTorch's formula, the generator's before),
`_sigmoid` as generated (t = e / (1 + e) with e = exp(-|x|), 1 - t above 0), and that with 1/2 +- tanh(|x| / 2) / 2
from tanh's series where |x| < 1.1. 1 / sqrt(v), two ways, on 4M variances between 1e-4 and 10: tl.rsqrt and a
rounded square root then a rounded division. Each line: the max abs (or relative) error, by range of x for
sigmoid, next to PyTorch's fp32 error on the same points.

On an H100 (Triton 3.6): sigmoid 9.17e-08 as 1 / (1 + exp(-x)), 8.75e-08 as generated (above x = 3: 4.2e-08
against 9.2e-08), 7.09e-08 with the series, PyTorch 8.92e-08; 1 / sqrt 1.24e-07 relative for tl.rsqrt (and
torch.rsqrt), 8.9e-08 rounded twice. scripts/results/probe_sigmoid_h100_2026-12-07.json.

    PYTHONPATH=. python3 scripts/probe_sigmoid_gpu.py --json $OUT/probe_sigmoid.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from datetime import date
from pathlib import Path

import torch
import triton

from mkevolve.builtin.kernels.pointwise_ops import HELPER_SOURCES, OPS
from mkevolve.problem import import_file

_KERNEL = '''
@triton.jit
def probe_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    tl.store(y_ptr + offs, {expression}, mask=mask)
'''
_NEAR_ZERO = '''
@triton.jit
def _sigmoid_near_zero(x):
    a = tl.abs(x)
    half = 0.5 * _tanh(0.5 * a)
    near = tl.where(x < 0, 0.5 - half, 0.5 + half)
    return tl.where(a < 1.1, near, _sigmoid(x))
'''
SIGMOIDS = {
    "1 / (1 + exp(-x))": "_div(1.0, 1.0 + tl.exp(tl.minimum(-x, 87.0, propagate_nan=tl.PropagateNan.ALL)))",
    "as generated": OPS["sigmoid"].render(["x"], {}),
    "tanh series below |x| 1.1": "_sigmoid_near_zero(x)",
}
RSQRTS = {"tl.rsqrt": OPS["rsqrt"].render(["x"], {}), "div_rn(1, sqrt_rn)": "tl.div_rn(1.0, tl.sqrt_rn(x))"}
_RANGES = ((-20.0, -3.0), (-3.0, -1.0), (-1.0, 0.0), (0.0, 1.0), (1.0, 3.0), (3.0, 20.0))


def _run(index: int, expression: str, x: torch.Tensor) -> torch.Tensor:
    path = Path(tempfile.mkdtemp()) / f"sigmoid_probe_{index}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n" + "\n".join(HELPER_SOURCES.values())
                    + _NEAR_ZERO + _KERNEL.format(expression=expression))
    module = import_file(path, prefix="sigmoid_probe")
    y = torch.empty_like(x)
    module.probe_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y.cpu().double()


def _by_range(x: torch.Tensor, error: torch.Tensor) -> dict[str, float]:
    return {f"[{lo:g}, {hi:g})": float(error[(x >= lo) & (x < hi)].max()) for lo, hi in _RANGES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    x = (torch.randn(4_000_000, generator=torch.Generator().manual_seed(0)) * 3).to(device)
    exact = torch.sigmoid(x.cpu().double())
    theirs = (torch.sigmoid(x).cpu().double() - exact).abs()
    rows.append({"function": "sigmoid", "variant": "torch.sigmoid", "max_abs_err": float(theirs.max()),
                 "by_range": _by_range(x.cpu(), theirs)})
    for index, (label, expression) in enumerate(SIGMOIDS.items()):
        error = (_run(index, expression, x) - exact).abs()
        rows.append({"function": "sigmoid", "variant": label, "max_abs_err": float(error.max()),
                     "by_range": _by_range(x.cpu(), error)})
    v = 10.0 ** (torch.rand(4_000_000, generator=torch.Generator().manual_seed(1)) * 5 - 4)
    v = v.to(device)
    exact = 1.0 / torch.sqrt(v.cpu().double())
    theirs = ((torch.rsqrt(v).cpu().double() - exact) / exact).abs()
    rows.append({"function": "rsqrt", "variant": "torch.rsqrt", "max_rel_err": float(theirs.max())})
    for index, (label, expression) in enumerate(RSQRTS.items()):
        error = ((_run(10 + index, expression, v) - exact) / exact).abs()
        rows.append({"function": "rsqrt", "variant": label, "max_rel_err": float(error.max())})
    environment = {"date": date.today().isoformat(), "python": platform.python_version(), "torch": torch.__version__,
                   "triton": triton.__version__,
                   "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"}
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({**environment, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
