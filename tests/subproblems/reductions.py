"""sum over a middle dim (keepdim), mean over the last dims, max over the first dim: three outputs."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        total = torch.sum(x, dim=1, keepdim=True)
        average = x.mean(dim=(-2, -1))
        peak = torch.max(x, dim=0)[0]
        return total, average, peak


def get_inputs():
    return [torch.randn(3, 10, 4, 7)]


def get_init_inputs():
    return []
