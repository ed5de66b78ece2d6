"""Multi-head self-attention: QKV projections, scaled softmax, output projection, residual and LayerNorm."""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, c = x.size()
        h = self.heads
        q = self.q(x).view(b, t, h, c // h).transpose(1, 2)
        k = self.k(x).view(b, t, h, c // h).transpose(1, 2)
        v = self.v(x).view(b, t, h, c // h).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
        weights = torch.softmax(scores, dim=-1)
        y = (weights @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.norm(self.out(y) + x)


batch_size = 2
seq_len = 8
dim = 32
heads = 4


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, heads]
