"""GroupNorm with 3 groups over 6 channels, then a scale."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, groups, channels):
        super().__init__()
        self.gn = nn.GroupNorm(groups, channels)
        nn.init.uniform_(self.gn.weight)
        nn.init.uniform_(self.gn.bias)

    def forward(self, x):
        return self.gn(x) * 1.5


def get_inputs():
    return [torch.randn(2, 6, 4, 5)]


def get_init_inputs():
    return [3, 6]
