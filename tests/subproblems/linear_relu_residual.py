"""Linear -> ReLU -> scale -> residual add, under two input configs (different batch and width)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, scale):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale + x


def get_inputs():
    return [torch.randn(2, 7, 24)]


def get_init_inputs():
    return [24, 0.5]


def get_input_configs():
    return [
        {"get_init_inputs": lambda: [24, 0.5], "get_inputs": lambda: [torch.randn(2, 7, 24)]},
        {"get_init_inputs": lambda: [40, 2.0], "get_inputs": lambda: [torch.randn(3, 5, 40)]},
    ]
