"""Conv2d, GroupNorm, Tanh, HardSwish, residual add with the convolution output, LogSumExp over channels."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self.tanh = nn.Tanh()
        self.hard_swish = nn.Hardswish()

    def forward(self, x):
        x_conv = self.conv(x)
        x_norm = self.group_norm(x_conv)
        x_act = self.hard_swish(self.tanh(x_norm))
        x_res = x_conv + x_act
        return torch.logsumexp(x_res, dim=1, keepdim=True)


batch_size = 16
in_channels = 3
out_channels = 16
height, width = 32, 32
kernel_size = 3
groups = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, groups]
