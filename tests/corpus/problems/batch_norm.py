"""Batch norm over the channels of an (N, C, H, W) input: in training it also moves its running statistics."""

import torch
from torch import nn

BATCH, CHANNELS, HEIGHT, WIDTH = 4, 8, 5, 6


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH) * 2.0 + 0.5]


def get_init_inputs():
    return [CHANNELS]
