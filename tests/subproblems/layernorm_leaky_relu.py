"""LayerNorm over the last dim, leaky_relu with a non-default slope (keyword), then a scale: one row kernel."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, scale):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.scale = scale

    def forward(self, x):
        x = self.norm(x)
        x = torch.nn.functional.leaky_relu(x, negative_slope=0.2)
        return x * self.scale


def get_inputs():
    return [torch.randn(4, 6, 32)]


def get_init_inputs():
    return [32, 1.5]
