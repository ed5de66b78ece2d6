"""AvgPool2d with padding, without counting the padding, then sigmoid."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=3, stride=2, padding=1, count_include_pad=False)

    def forward(self, x):
        return torch.sigmoid(self.pool(x))


def get_inputs():
    return [torch.randn(2, 3, 9, 8)]


def get_init_inputs():
    return []
