"""A stack of identical Linear + ReLU blocks (a ModuleList), then a Linear head."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, depth, classes):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(dim, dim) for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


batch_size = 8
dim = 32
depth = 4
classes = 10


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, depth, classes]
