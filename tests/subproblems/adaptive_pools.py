"""Adaptive average and max pooling to sizes that do not divide the input."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.avg = nn.AdaptiveAvgPool2d((3, 2))
        self.max = nn.AdaptiveMaxPool2d((2, 3))

    def forward(self, x):
        return self.avg(x), self.max(x)


def get_inputs():
    return [torch.randn(2, 3, 7, 5)]


def get_init_inputs():
    return []
