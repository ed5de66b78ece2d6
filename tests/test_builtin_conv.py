"""The builtin convolution kernels over the geometries users write: every form matches PyTorch.

Each case is a small KernelBench-form problem written to a temporary file; every variant the
generator offers (on the CPU: single tiles, so each case stays fast in the interpreter) must match
the reference within the verifier's default tolerance.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
import torch

from mkevolve.builtin.kernels import generate_kernel, variant_count
from mkevolve.builtin.kernels.configs import MatmulTile
from mkevolve.builtin.kernels.emit_conv import conv_tiles
from mkevolve.builtin.kernels.ir import Conv
from mkevolve.config import TOLERANCE
from mkevolve.problem import call_inputs, fp32_strict, import_file, load_problem

ON_GPU = torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1"
TARGET, DEVICE = ("cuda", "cuda") if ON_GPU else ("cpu", "cpu")

# name: (layer, input shape, epilogue applied to the layer's output)
CASES = {
    # few input channels: a BLOCK_K step spans several kernel taps
    "conv2d_rgb": ("nn.Conv2d(3, 16, 3)", (2, 3, 7, 6), "torch.relu(y)"),
    "conv3d_rgb": ("nn.Conv3d(3, 16, 3, padding=1)", (1, 3, 4, 5, 4), "y * 2.0"),
    # 8 channels x 27 taps: more steps than an outer-product kernel unrolls whole (conv3d_rgb's 81 too)
    "conv3d_8ch_rolled": ("nn.Conv3d(8, 16, 3)", (1, 8, 4, 5, 4), "torch.relu(y)"),
    # more output channels than an outer-product tile's 16: two programs along them, the weight zero-padded
    # to 32 and the second tile's last 8 channels masked
    "conv2d_8ch_24out": ("nn.Conv2d(8, 24, 3, padding=1)", (2, 8, 5, 6), "y + 0.5"),
    # 16 channels or more per group, but not a multiple of 16: tl.dot, each step spanning taps
    "conv2d_24ch": ("nn.Conv2d(24, 16, 3, padding=1)", (1, 24, 5, 4), "y - 1.0"),
    # a multiple of 16 channels per group: every step reads one tap
    "conv2d_16ch_strided": ("nn.Conv2d(16, 16, 3, stride=2, padding=1)", (2, 16, 7, 7), "y"),
    "conv1d_long": ("nn.Conv1d(8, 16, 3)", (2, 8, 2100), "y"),   # tiles inside one image (>= 2048 positions)
    "conv1d_dilated": ("nn.Conv1d(16, 16, 3, dilation=2, padding=2)", (2, 16, 11), "torch.tanh(y)"),
    "conv2d_grouped": ("nn.Conv2d(32, 32, 3, groups=2, padding=1)", (1, 32, 5, 6), "y"),
    "conv2d_grouped_small": ("nn.Conv2d(8, 16, 3, groups=2, bias=False)", (2, 8, 6, 6), "y"),
    "conv2d_depthwise": ("nn.Conv2d(8, 8, 3, groups=8, padding=1)", (2, 8, 5, 5), "y"),
    # transposed: split by output phase
    "convT2d_stride2": ("nn.ConvTranspose2d(8, 16, 3, stride=2, padding=1, output_padding=1)",
                        (2, 8, 4, 5), "torch.sigmoid(y)"),
    "convT2d_stride2_k4": ("nn.ConvTranspose2d(16, 16, 4, stride=2, padding=1)", (1, 16, 4, 4), "y"),
    # a step per tap, and one phase's second tap past the 3-tap kernel: the step is masked whole
    "convT2d_16ch_stride2_k3": ("nn.ConvTranspose2d(16, 16, 3, stride=2, padding=1, output_padding=1)",
                                (1, 16, 3, 4), "y"),
    "convT3d_stride2": ("nn.ConvTranspose3d(4, 8, 3, stride=2, padding=1, output_padding=1)",
                        (1, 4, 3, 3, 4), "y"),
    "convT2d_stride3_dil2": ("nn.ConvTranspose2d(8, 8, 3, stride=3, dilation=2, padding=2)",
                             (1, 8, 3, 4), "y"),
    "convT2d_grouped": ("nn.ConvTranspose2d(16, 32, 3, stride=2, groups=2)", (1, 16, 3, 3), "y"),
    "convT1d_stride1": ("nn.ConvTranspose1d(8, 16, 3, padding=1)", (2, 8, 9), "y"),
    # stride 1, 16 channels or more, 3 or 5 taps along the last dim: Winograd variants (test_winograd.py)
    "conv2d_16ch_k3_winograd": ("nn.Conv2d(16, 16, 3, padding=1)", (2, 16, 5, 7), "y * 2.0"),
    "convT2d_16ch_k5_winograd": ("nn.ConvTranspose2d(16, 32, 5, padding=1)", (2, 16, 6, 7), "torch.tanh(y) + 1.0"),
    "conv3d_16ch_k3_winograd": ("nn.Conv3d(16, 16, 3)", (1, 16, 4, 5, 6), "y"),
    "conv1d_32ch_k5_winograd": ("nn.Conv1d(32, 16, 5, padding=2)", (2, 32, 9), "torch.relu(y)"),
    # shares a factor between dilation and stride: the direct kernel
    "convT2d_stride2_dil2": ("nn.ConvTranspose2d(8, 8, 3, stride=2, dilation=2)", (1, 8, 3, 3), "y"),
}


def _problem(tmp_path: Path, name: str) -> Path:
    layer, shape, epilogue = CASES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(f"""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = {layer}

            def forward(self, x):
                y = self.layer(x)
                return {epilogue}


        def get_inputs():
            return [torch.randn{shape}]


        def get_init_inputs():
            return []
        """))
    return path


def _check(path: Path, source: str, tmp_path: Path, variant: int) -> None:
    candidate_path = tmp_path / f"{path.stem}_v{variant}.py"
    candidate_path.write_text(source)
    module = import_file(candidate_path, prefix="conv_case")
    problem = load_problem(path)
    fp32_strict()
    torch.manual_seed(0)
    reference = problem.model_cls().to(DEVICE)
    torch.manual_seed(0)
    candidate = module.ModelNew().to(DEVICE)
    torch.manual_seed(1)
    (x,) = [t.to(DEVICE) for t in call_inputs(path, problem.module.get_inputs, "get_inputs")]
    with torch.no_grad():
        torch.testing.assert_close(candidate(x), reference(x), atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_convolution_matches_pytorch(name, tmp_path):
    path = _problem(tmp_path, name)
    for variant in range(variant_count(path, TARGET)):
        _check(path, generate_kernel(path, variant, TARGET).source, tmp_path, variant)


@pytest.mark.parametrize("name, template", [
    ("conv2d_rgb", "Outer-product"), ("conv2d_16ch_strided", "Implicit-GEMM"), ("conv2d_24ch", "Implicit-GEMM"),
    ("convT2d_stride2", "Implicit-GEMM"), ("conv2d_depthwise", "Direct"), ("convT2d_stride2_dil2", "Direct")])
def test_template_follows_the_geometry(name, template, tmp_path):
    source = generate_kernel(_problem(tmp_path, name), 0, TARGET).source
    assert f"# {template}" in source


def test_steps_stay_in_one_tap_only_when_channels_allow(tmp_path):
    per_tap = generate_kernel(_problem(tmp_path, "conv2d_16ch_strided"), 0, TARGET).source
    assert "t = k0 // C_in_g" in per_tap and "kk = k0 + tl.arange" not in per_tap
    for spanning in ("convT2d_stride2", "conv2d_24ch"):   # 8 and 24 channels
        assert "kk = k0 + tl.arange" in generate_kernel(_problem(tmp_path, spanning), 0, TARGET).source


def test_few_input_channels_use_exact_fp32_outer_products(tmp_path):
    path = _problem(tmp_path, "conv3d_rgb")
    generated = [generate_kernel(path, v, TARGET) for v in range(variant_count(path, TARGET))]
    assert all("tl.dot(" not in g.source and g.precision == "none" for g in generated)
    assert "part_t += b[:, None] * a[None, :]" in generated[0].source     # 81 steps: blocked sums


def test_outer_products_sum_each_pass_of_their_rolled_loops_apart(tmp_path):
    """Blocked summation: the unrolled steps of a pass go to `part`, added to `acc` once per pass. A single
    running sum over all steps misses fp64 by about 2.5 times as much (emit_conv._outer_product_lines)."""
    rolled = generate_kernel(_problem(tmp_path, "conv3d_8ch_rolled"), 0, TARGET).source
    unrolled = generate_kernel(_problem(tmp_path, "conv2d_rgb"), 0, TARGET).source    # 27 steps, one pass
    assert "            part_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)\n" in rolled    # inside k1's loop
    assert "part_t += b[:, None] * a[None, :]" in rolled and "\n            acc_t += part_t\n" in rolled
    assert "acc_t += b[:, None] * a[None, :]" in unrolled and "part" not in unrolled


def test_an_outer_product_over_many_steps_keeps_its_outer_tap_loops_rolled(tmp_path):
    """Unrolled whole, 216 steps took 40 s to compile per tile config. The outer tap loops stay loops and the
    inner ones and the channel loop are unrolled, so each iteration's body is long (8 x 3 steps here);
    rolling the inner loops instead left one step per iteration (level2/67's conv: 5.39 ms against 4.28)."""
    rolled = generate_kernel(_problem(tmp_path, "conv3d_8ch_rolled"), 0, TARGET).source
    unrolled = generate_kernel(_problem(tmp_path, "conv2d_rgb"), 0, TARGET).source    # 3 x 9 steps
    assert "for k0 in range(K0):" in rolled and "for k1 in range(K1):" in rolled
    assert "for k2 in tl.static_range(K2):" in rolled and "for c in tl.static_range(C_in_g):" in rolled
    assert "for k0 in tl.static_range(K0):" in unrolled and " in range(" not in unrolled


def test_tiles_stay_inside_an_image_when_images_are_large(tmp_path):
    large = generate_kernel(_problem(tmp_path, "conv1d_long"), 0, TARGET).source
    small = generate_kernel(_problem(tmp_path, "conv2d_rgb"), 0, TARGET).source
    assert "pos = (pid_m - nb * tiles) * BLOCK_M + tl.arange(0, BLOCK_M)" in large
    assert "rm = pid_m * BLOCK_M" in small and "tiles = " not in small


def test_transposed_convolution_walks_only_its_phase_taps(tmp_path):
    source = generate_kernel(_problem(tmp_path, "convT2d_stride2"), 0, TARGET).source
    assert "T0=2" in source and "T1=2" in source       # ceil(3 / 2) taps per dim, not 3
    assert "% STRIDE0 == 0" not in source               # no masking of taps off the phase


def test_transposed_taps_are_masked_only_where_a_phase_walks_past_the_kernel(tmp_path):
    overrun = generate_kernel(_problem(tmp_path, "convT2d_16ch_stride2_k3"), 0, TARGET).source
    exact = generate_kernel(_problem(tmp_path, "convT2d_stride2_k4"), 0, TARGET).source
    # constant along the step's lanes, so the loads stay vectorised; none at all when stride divides K
    assert "k_ok = tl.full([BLOCK_K], 1, tl.int1) & (tap0 < K0) & (tap1 < K1)" in overrun
    assert "k_ok" not in exact and "c < tl.where" not in exact


def _reads_of_transposed(d_in, k, s, p, dil, out_pad):
    """Every input coordinate the phase-split kernel reads for a real output row and tap, as it computes them."""
    p_out = (d_in - 1) * s - 2 * p + dil * (k - 1) + out_pad + 1
    inverse = pow(dil, -1, s) if s > 1 else 0
    for r in range(s):
        kf = ((r + p) * inverse) % s
        for q in range(-(-p_out // s)):
            if r + s * q >= p_out:
                continue
            base = q + (r + p - kf * dil) // s
            for t in range(-(-k // s)):
                if kf + s * t < k:
                    yield base - dil * t


@pytest.mark.parametrize("transposed", [False, True])
def test_input_border_holds_every_coordinate_a_tap_reads(transposed):
    from mkevolve.builtin.kernels.emit_conv import _input_border
    from mkevolve.builtin.kernels.ir import Param
    for d_in, k, s, p, dil, out_pad in [(7, 5, 1, 1, 1, 0), (5, 3, 2, 1, 1, 1), (4, 4, 2, 1, 1, 0), (4, 3, 3, 2, 2, 2),
                                        (6, 3, 2, 0, 1, 0), (5, 1, 1, 0, 1, 0), (9, 3, 1, 4, 3, 0), (3, 5, 2, 4, 1, 1)]:
        if not transposed and (out_pad or d_in + 2 * p < dil * (k - 1) + 1):
            continue
        if transposed and (out_pad >= max(s, dil) or math.gcd(s, dil) > 1):   # torch's rule; phases need gcd 1
            continue
        conv = Conv(shapes=((1, 8, 1),), w=Param(shapes=((8, 8, k),)), transposed=transposed, stride=(s,),
                    padding=(p,), dilation=(dil,), output_padding=(out_pad,), groups=(1,))
        (before, after), = _input_border(conv)
        if transposed:
            reads = list(_reads_of_transposed(d_in, k, s, p, dil, out_pad))
        else:
            reads = [o * s - p + t * dil for o in range((d_in + 2 * p - dil * (k - 1) - 1) // s + 1) for t in range(k)]
        assert -int(before) <= min(reads) and max(reads) <= d_in - 1 + int(after), (d_in, k, s, p, dil, out_pad)
        # and no wider than needed: the border's outermost coordinates are read
        assert min(reads) == -int(before) or int(before) == 0 or not transposed
        assert max(reads) == d_in - 1 + int(after) or int(after) == 0 or not transposed


def _conv(c_in: int, c_out: int, kernel: int = 3) -> Conv:
    from mkevolve.builtin.kernels.ir import Param
    weight = Param(shapes=((c_out, c_in, kernel, kernel),))
    return Conv(shapes=((1, c_out, 8, 8),), w=weight, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=(1,),
                output_padding=(0, 0))


def test_tiles_are_cut_to_the_convolution():
    tiles = (MatmulTile(128, 128, 32), MatmulTile(128, 64, 64), MatmulTile(64, 64, 64))
    narrow = conv_tiles(_conv(3, 16), tiles)       # K = 27, N = 16
    assert narrow == (MatmulTile(128, 16, 32), MatmulTile(64, 16, 32))   # the first two became one
    per_tap = conv_tiles(_conv(48, 64), tiles)      # 48 channels: a step must divide them
    assert {t.block_k for t in per_tap} == {16} and {t.block_n for t in per_tap} == {64}
    assert {t.block_k for t in conv_tiles(_conv(128, 64), tiles)} == {32, 64}
    outer = conv_tiles(_conv(3, 16), tiles, dot=False)   # no BLOCK_K: tiles differing only there are one
    # 64 sums a thread: 4 positions of 16 channels, one warp per 32 positions of the variant's tile
    assert [(t.block_m, t.block_n, t.warps) for t in outer] == [(512, 16, 4), (256, 16, 2)]
    # 64 output channels: still 16 a tile, not 64 channels of 1 position a thread (a weight row of 16 loads
    # for 64 FMAs; level2/67's kernel took 6.1 ms that way on an H100, 4.8 ms with 16 x 4)
    wide = conv_tiles(_conv(3, 64), tiles, dot=False)
    assert [(t.block_m, t.block_n, t.warps) for t in wide] == [(512, 16, 4), (256, 16, 2)]


UNET_UP = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1)

        def forward(self, x, skip):
            # the smallest output of this geometry is 9 x 9; the skip connection asks for 10 x 10
            return self.up(x, output_size=skip.shape) + skip


    def get_inputs():
        return [torch.randn(2, 8, 5, 5), torch.randn(2, 4, 10, 10)]


    def get_init_inputs():
        return []
    """)


def test_a_transposed_convolution_reaches_the_output_size_its_forward_asks_for(tmp_path):
    path = tmp_path / "unet_up.py"
    path.write_text(UNET_UP)
    kernel_path = tmp_path / "unet_up_kernel.py"
    kernel_path.write_text(generate_kernel(path, 0, TARGET).source)
    module = import_file(kernel_path, prefix="unet_up")
    problem = load_problem(path)
    torch.manual_seed(0)
    reference = problem.model_cls().to(DEVICE)
    torch.manual_seed(0)
    candidate = module.ModelNew().to(DEVICE)
    x, skip = (t.to(DEVICE) for t in problem.module.get_inputs())
    with torch.no_grad():
        torch.testing.assert_close(candidate(x, skip), reference(x, skip), atol=TOLERANCE, rtol=TOLERANCE)
