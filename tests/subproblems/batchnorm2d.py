"""BatchNorm2d: batch statistics in training mode, running statistics in eval mode."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        nn.init.uniform_(self.bn.weight)
        nn.init.uniform_(self.bn.bias)
        self.bn.running_mean.uniform_(-1.0, 1.0)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(3, 4, 5, 6) * 2.0 + 0.5]


def get_init_inputs():
    return [4]
