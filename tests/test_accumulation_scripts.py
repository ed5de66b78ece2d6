"""The accumulation studies compute what they claim to: scripts/winograd_accumulate_probe.py's rewrites add a
GEMM's K steps another way and still compute the convolution, and scripts/tf32x3_emulation.py emulates
each way of splitting and adding within rounding of the exact correlation."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
from script_loader import load_script

from mkevolve.builtin.kernels import generate_kernel, variant_count
from mkevolve.problem import import_file

probe = load_script("winograd_accumulate_probe")
emulation = load_script("tf32x3_emulation")

PROBLEM = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.ConvTranspose2d(16, 16, 5, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x))

    def get_inputs():
        return [torch.randn(1, 16, 6, 6)]

    def get_init_inputs():
        return []
''')


def _kernel(path, kind: str):
    with probe.chained_gemms():
        generated = [generate_kernel(path, v, "cpu") for v in range(variant_count(path, "cpu"))]
    if kind == "winograd":
        return next(g for g in generated if g.description.startswith("Winograd"))
    return next(g for g in generated if g.description.startswith("implicit-GEMM") and "tf32x3" in g.description)


@pytest.mark.parametrize("kind, mode", [("direct", "step"), ("direct", "kahan"), ("winograd", "kahan"),
                                        ("winograd", "tap"), ("direct", "step_rn"), ("winograd", "kahan_rn"),
                                        ("winograd", "chain_pre"), ("direct", "kahan_pre")])
def test_each_way_of_adding_the_steps_computes_the_convolution(kind, mode, tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(PROBLEM)
    kernel = _kernel(path, kind)
    source = probe.rewrite(kernel.source, mode)
    assert source != kernel.source
    assert not probe.CHAINED.search(source)          # no step still chained through tl.dot's accumulator
    calls_split = re.search(r"[=(] ?_tf32x3_rn\(a, b\)", source) is not None   # each step's tf32x3 written out
    assert calls_split == mode.endswith("_rn")
    assert ("tl.dot(_presplit(a), _presplit(b)," in source) == mode.endswith("_pre")
    file = tmp_path / f"{kind}_{mode}.py"
    file.write_text(source)
    module = import_file(file, prefix=f"accumulate_{kind}_{mode}")
    reference = import_file(path, prefix="accumulate_problem")
    torch.manual_seed(0)
    model = reference.Model()
    torch.manual_seed(0)
    candidate = module.ModelNew()
    x = torch.randn(1, 16, 6, 6)
    torch.testing.assert_close(candidate(x), model(x), atol=1e-4, rtol=1e-4)


def test_the_emulation_errs_by_rounding_and_only_rounding_toward_zero_makes_one_accumulator_far_worse():
    rows = emulation.errors(depth=320, outputs=60, seeds=1)
    assert len(rows) == 1 + len(emulation.TILES) * len(emulation.SPLITS) * len(emulation.MMA_ROUNDINGS) * len(
        emulation.SUMS)
    assert all(0 < row["median_max_error"] < 1e-4 for row in rows.values())
    assert rows["direct fp32"]["vs_direct_fp32"] == 1.0
    error = lambda rounding, sum_mode: rows[f"direct, nearest split, mma {rounding}, {sum_mode}"][  # noqa: E731
        "median_max_error"]
    assert error("nearest", "kahan") < error("nearest", "step")
    # 3xTF32 written out through one accumulator erred 28 times tf32x3 on the H200 (tf32x3_probe_h200_2026-12-04)
    assert error("nearest", "one-acc") < 4 * error("nearest", "step")
    assert error("toward-zero", "one-acc") > 10 * error("toward-zero", "step")
