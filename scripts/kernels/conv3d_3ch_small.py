"""A small copy of the convolution of KernelBench level 2 problems 23, 79 and 83: 3 input channels, a 3x3x3
kernel, as at full size. scripts/conv_compile_time.py times its kernel's compile."""

import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 24, 3)

    def forward(self, x):
        return torch.nn.functional.mish(self.conv(x) - 0.7)

def get_inputs():
    return [torch.rand(2, 3, 6, 8, 8)]

def get_init_inputs():
    return []
