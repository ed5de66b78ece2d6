"""Conv3d (implicit GEMM) followed by MaxPool3d."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv3d(channels, channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool3d(kernel_size=2)

    def forward(self, x):
        return self.pool(self.conv(x))


def get_inputs():
    return [torch.randn(1, 8, 4, 5, 6)]


def get_init_inputs():
    return [8]
