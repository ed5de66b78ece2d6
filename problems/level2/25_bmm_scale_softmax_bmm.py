"""Batched matmul of two inputs, scaling, softmax, and a second batched matmul with a third input."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v):
        scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
        weights = torch.softmax(scores, dim=-1)
        return torch.bmm(weights, v)


batch_size = 16
seq_len = 64
head_dim = 32
scale = 0.125


def get_inputs():
    return [torch.randn(batch_size, seq_len, head_dim), torch.randn(batch_size, seq_len, head_dim),
            torch.randn(batch_size, seq_len, head_dim)]


def get_init_inputs():
    return [scale]
