"""The generator's division, tanh, log1p and softplus helpers against fp64, next to PyTorch's fp32 functions.

The interpreter runs them with numpy's fp32 exp and log (within a few ulp, as Triton's are on a GPU), so what
these tests see is the rounding the formulas themselves add: the max error an epilogue leaves in a problem's
output (level2/87's Mish) comes from there.
"""

from __future__ import annotations

import pytest
import torch

from mkevolve.builtin.kernels.pointwise_ops import HELPER_SOURCES
from mkevolve.problem import import_file

_KERNEL = '''
@triton.jit
def helpers_kernel(x_ptr, tanh_ptr, mish_ptr, log1p_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(tanh_ptr + offs, _tanh(x), mask=mask)
    tl.store(mish_ptr + offs, _mish(x), mask=mask)
    tl.store(log1p_ptr + offs, _log1p(tl.abs(x)), mask=mask)
'''


_DIV_KERNEL = '''
@triton.jit
def div_kernel(n_ptr, d_ptr, q_ptr, size, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    tl.store(q_ptr + offs, _div(tl.load(n_ptr + offs, mask=mask), tl.load(d_ptr + offs, mask=mask)), mask=mask)
'''
_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _helpers_module(folder, name: str, kernel: str, helpers: dict[str, str] = HELPER_SOURCES):
    path = folder / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n" + "\n".join(helpers.values()) + kernel)
    return import_file(path, prefix="pointwise_accuracy")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """(x, tanh, mish, log1p of |x|) computed by the helpers, for 200k points of N(0, 3^2) and a few edges."""
    import triton

    module = _helpers_module(tmp_path_factory.mktemp("helpers"), "helpers_module", _KERNEL)
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(200_000, generator=generator) * 3, torch.tensor([0.0, 30.0, -30.0, 1e-30, 0.5499])])
    on_device = x.to(_DEVICE)
    tanh, mish, log1p = (torch.empty_like(on_device) for _ in range(3))
    block = 4096
    module.helpers_kernel[(triton.cdiv(x.numel(), block),)](on_device, tanh, mish, log1p, x.numel(), BLOCK=block)
    return x, tanh.cpu(), mish.cpu(), log1p.cpu()


def _ulps(value: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest error in units of the last place of the fp32 result."""
    spacing = torch.nextafter(exact.float().abs(), torch.tensor(float("inf"))) - exact.float().abs()
    return float(((value.double() - exact).abs() / spacing.double().clamp_min(1e-45)).max())


def test_tanh_stays_within_two_ulp_near_zero_and_near_one(outputs):
    """(1 - e) / (1 + e) with e = exp(-2|x|) erred by 3.9 ulp: 1 - e cancels near 0, 1 + e rounds near 1."""
    x, tanh, _, _ = outputs
    assert _ulps(tanh, torch.tanh(x.double())) < 2.5
    assert tanh[-5:].tolist() == pytest.approx([0.0, 1.0, -1.0, 1e-30, torch.tanh(torch.tensor(0.5499)).item()])


def test_mish_is_as_accurate_as_pytorchs(outputs):
    """Composed of tanh, log(1 + t) (which dropped t's low bits for small t) and exp, Mish erred by 1.8 times
    PyTorch's fp32 error. On an H100 it erred by 1.39 times PyTorch's while the GPU fused n + 2 into an fma
    that disagreed with n (scripts/probe_mish_gpu.py)."""
    x, _, mish, _ = outputs
    exact = torch.nn.functional.mish(x.double())
    ours = float((mish.double() - exact).abs().max())
    theirs = float((torch.nn.functional.mish(x).double() - exact).abs().max())
    assert ours <= 1.05 * theirs


def test_log1p_keeps_small_arguments_relative_accuracy(outputs):
    x, _, _, log1p = outputs
    exact = torch.log1p(x.double().abs())
    relative = ((log1p.double() - exact).abs() / exact.clamp_min(1e-300))[exact > 0]
    assert float(relative.max()) < 1e-6      # log(1 + t) alone: 0.18 where t = 1e-7
    assert log1p[-2].item() == pytest.approx(1e-30, rel=1e-6)


@pytest.mark.parametrize("reciprocal_error", [1.0, 1.0 + 2.0 ** -22, 1.0 - 2.0 ** -22])
def test_div_rounds_as_ieee_division_from_a_reciprocal_two_ulp_off(tmp_path, reciprocal_error):
    """On a GPU `1.0 / d` is Triton's approximate division (within 2 ulp); on this CPU the interpreter's is
    exact, so the reciprocal is put 2 ulp off here, as a GPU's may be. Without its Newton step, n * r errs by
    up to 3 ulp."""
    import triton

    helpers = {"_div": HELPER_SOURCES["_div"]}
    if _DEVICE == "cpu":
        helpers["_div"] = helpers["_div"].replace("r = 1.0 / d", f"r = (1.0 / d) * {reciprocal_error!r}")
        assert helpers["_div"] != HELPER_SOURCES["_div"] or reciprocal_error == 1.0
    module = _helpers_module(tmp_path, f"div_module_{abs(hash(reciprocal_error))}", _DIV_KERNEL, helpers)
    generator = torch.Generator().manual_seed(1)
    size = 200_000
    n = torch.randn(size, generator=generator) * 10.0 ** (torch.rand(size, generator=generator) * 20 - 10)
    d = (1.0 + torch.rand(size, generator=generator)) * 10.0 ** (torch.rand(size, generator=generator) * 50 - 25)
    d = torch.where(torch.rand(size, generator=generator) < 0.5, -d, d)
    q = torch.empty(size, device=_DEVICE)
    module.div_kernel[(triton.cdiv(size, 4096),)](n.to(_DEVICE), d.to(_DEVICE), q, size, BLOCK=4096)
    q = q.cpu()
    assert _ulps(q, n.double() / d.double()) <= 1.0
    assert float((q == n / d).double().mean()) >= 0.999       # PyTorch's IEEE quotient, nearly everywhere


_SIGMOID_KERNEL = '''
@triton.jit
def sigmoid_kernel(x_ptr, y_ptr, size, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < size
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, {expression}, mask=mask)
'''


def _sigmoid_of(x: torch.Tensor, folder) -> torch.Tensor:
    import triton

    from mkevolve.builtin.kernels.pointwise_ops import OPS

    kernel = _SIGMOID_KERNEL.format(expression=OPS["sigmoid"].render(["x"], {}))
    helpers = {name: HELPER_SOURCES[name] for name in ("_div", "_sigmoid")}
    module = _helpers_module(folder, "sigmoid_module", kernel, helpers)
    y = torch.empty(x.numel(), device=_DEVICE)
    module.sigmoid_kernel[(1,)](x.to(_DEVICE), y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return y.cpu()


def test_sigmoid_keeps_a_nan_and_its_tails(tmp_path):
    """exp(-|x|) never overflows, so nothing is clamped: a NaN stays NaN and the far negative tail is exp's."""
    x = torch.tensor([float("nan"), float("-inf"), -100.0, -88.0, 0.0, 3.0, 100.0, float("inf")])
    y = _sigmoid_of(x, tmp_path)
    assert torch.isnan(y[0])
    assert torch.allclose(y[1:], torch.sigmoid(x[1:]), rtol=1e-6, atol=2e-38)


def test_sigmoid_near_one_rounds_once(tmp_path):
    """1 / (1 + exp(-x)) rounds 1 + e, then divides: above x = 3 it erred by 8.8e-08 (1.5 ulp of the result,
    as PyTorch's fp32 sigmoid on this CPU); 1 - e / (1 + e) rounds last only, within 3/4 of an ulp."""
    x = torch.linspace(3.0, 17.0, 65536)
    error = (_sigmoid_of(x, tmp_path).double() - torch.sigmoid(x.double())).abs()
    assert float(error.max()) <= 0.75 * 2.0 ** -24
