"""Batched matrix multiply."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(3, 9, 20), torch.randn(3, 20, 12)]


def get_init_inputs():
    return []
