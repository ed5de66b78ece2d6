"""Python control flow on a tensor shape: symbolic tracing fails, torch.export handles it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.fc = nn.Linear(features, features)

    def forward(self, x):
        if x.shape[0] > 1:
            x = x * 2.0
        return torch.tanh(self.fc(x))


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16]
