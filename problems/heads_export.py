"""Attention whose head count comes from the input width at run time (symbolic tracing cannot follow it)."""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, head_dim):
        super().__init__()
        self.head_dim = head_dim
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        heads = int(c // self.head_dim)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.reshape(b, t, heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, t, heads, self.head_dim).transpose(1, 2)
        attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


batch_size = 2
seq_len = 8
dim = 32
head_dim = 8


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, head_dim]
