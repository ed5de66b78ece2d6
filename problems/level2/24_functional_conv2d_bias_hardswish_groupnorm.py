"""A convolution written with F.conv2d on raw parameters, bias, HardSwish, then functional GroupNorm."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.num_groups = num_groups
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size) * 0.1)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x):
        x = F.conv2d(x, self.weight, padding=1)
        x = x + self.bias.view(1, -1, 1, 1)
        x = F.hardswish(x)
        return F.group_norm(x, self.num_groups)


batch_size = 16
in_channels = 3
out_channels = 16
height, width = 32, 32
kernel_size = 3
num_groups = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
