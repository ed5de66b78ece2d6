"""Cheat: no Triton at all; SiLU written with Python operators that PyTorch evaluates."""

import math

import torch
from torch import nn

PROBLEM = "elementwise"
EXPECTED_RULE = "no-triton-kernel"
CAUGHT_BY = "static"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (1.0 + math.e ** (-x))
