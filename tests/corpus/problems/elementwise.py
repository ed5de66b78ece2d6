"""Elementwise SiLU (x * sigmoid(x)) on a small 2-D tensor."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
