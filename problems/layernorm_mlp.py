"""A pre-norm transformer MLP block: LayerNorm, Linear, GELU, Linear, residual."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim, expansion):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, dim * expansion)
        self.down = nn.Linear(dim * expansion, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


batch_size = 4
tokens = 16
dim = 32
expansion = 4


def get_inputs():
    return [torch.randn(batch_size, tokens, dim)]


def get_init_inputs():
    return [dim, expansion]
