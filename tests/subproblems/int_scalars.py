"""Integer attributes on either side of a division, as level2/71's `x / self.divisor` with divisor = 2."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, divisor, numerator):
        super().__init__()
        self.divisor = divisor
        self.numerator = numerator

    def forward(self, x):
        return F.leaky_relu(x / self.divisor, 0.01) + self.numerator / (x.abs() + 1.0)


def get_inputs():
    return [torch.randn(4, 33)]


def get_init_inputs():
    return [2, 3]
