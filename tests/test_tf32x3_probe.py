"""scripts/tf32x3_probe.py measures the convolution it names: its kernel, on one image, is PyTorch's
ConvTranspose2d (the modes a CPU can run; the split modes are PTX and need a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from script_loader import load_script

probe = load_script("tf32x3_probe")
ON_GPU = torch.cuda.is_available() and __import__("os").environ.get("TRITON_INTERPRET") != "1"


@pytest.mark.parametrize("mode", ["ieee", "tf32x3"] + (["split2", "split1"] if ON_GPU else []))
def test_probe_kernel_is_the_transposed_convolution(mode):
    device = "cuda" if ON_GPU else "cpu"
    torch.manual_seed(0)
    x = torch.rand(1, probe.C_IN, probe.SIZE, probe.SIZE, device=device)
    w = torch.randn(probe.C_IN, probe.C_OUT, probe.K, probe.K, device=device) * 0.05
    out = probe.convolve(x, w, mode, probe.parse_tile("64x64x32x4x2"))
    expected = F.conv_transpose2d(x.double(), w.double(), padding=probe.PAD)
    assert out.shape == expected.shape == (1, probe.C_OUT, probe.OUT_SIZE, probe.OUT_SIZE)
    assert probe.max_error(out, expected) < 1e-5
