"""Pointwise chain with per-channel parameters broadcast over (N, C, H, W)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels, scale):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(channels, 1, 1))
        self.bias = nn.Parameter(torch.randn(channels, 1, 1))
        self.scale = scale

    def forward(self, x):
        y = x * self.weight + self.bias
        y = F.gelu(y, approximate="tanh") * self.scale
        y = torch.clamp(y, min=-0.4, max=1.5)
        return torch.sigmoid(y) - 0.5 * torch.tanh(x)


def get_inputs():
    return [torch.randn(2, 4, 5, 6)]


def get_init_inputs():
    return [4, 0.75]


def get_input_configs():
    return [
        {"get_init_inputs": lambda: [4, 0.75], "get_inputs": lambda: [torch.randn(2, 4, 5, 6)]},
        {"get_init_inputs": lambda: [3, 1.25], "get_inputs": lambda: [torch.randn(1, 3, 7, 2)]},
    ]
