"""Conv1d with few input channels (direct kernel), InstanceNorm1d with affine, then tanh."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, kernel_size=3, stride=2, dilation=2, padding=2)
        self.norm = nn.InstanceNorm1d(8, affine=True)

    def forward(self, x):
        return torch.tanh(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(2, 4, 19)]


def get_init_inputs():
    return []
