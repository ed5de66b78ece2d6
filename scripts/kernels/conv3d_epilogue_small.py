"""A small copy of KernelBench level 2 problem 7 (Conv3d, ReLU, LeakyReLU, GELU, sigmoid, bias): its conv has
8 input channels and a 3x3x3 kernel, as at full size. scripts/conv_compile_time.py times its kernel's compile."""

import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = torch.nn.functional.leaky_relu(x, negative_slope=0.01)
        x = torch.nn.functional.gelu(x)
        x = torch.sigmoid(x)
        x = x + self.bias
        return x

def get_inputs():
    return [torch.rand(2, 8, 6, 8, 8)]

def get_init_inputs():
    return [8, 32, 3, (32, 1, 1, 1)]
