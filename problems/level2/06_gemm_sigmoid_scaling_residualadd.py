"""Linear layer, sigmoid, scaling, and a residual add of the linear output."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, scaling_factor):
        super().__init__()
        self.gemm = nn.Linear(input_size, hidden_size)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.gemm(x)
        original = x
        x = torch.sigmoid(x)
        x = x * self.scaling_factor
        return x + original


batch_size = 64
input_size = 256
hidden_size = 128
scaling_factor = 2.0


def get_inputs():
    return [torch.randn(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, scaling_factor]
