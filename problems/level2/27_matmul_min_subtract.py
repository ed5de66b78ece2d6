"""Linear layer, elementwise minimum with a constant tensor, then subtraction of that constant."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features, constant):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.constant = nn.Parameter(torch.tensor(constant))

    def forward(self, x):
        x = self.linear(x)
        x = torch.min(x, torch.tensor(0.5))
        return x - self.constant


batch_size = 64
in_features = 256
out_features = 128
constant = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, constant]
