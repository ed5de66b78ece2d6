import math
import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.arange in forward: int64 numbers scaled into a timestep embedding's frequencies, float numbers,
    a gather's index, and an embedding's positions (a slice of its table, no kernel)."""

    def __init__(self, dim=32):
        super().__init__()
        self.dim = dim
        self.table = nn.Embedding(16, dim)

    def forward(self, t, x):
        half = self.dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)   # int64 arange
        args = t[:, None] * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        steps = torch.arange(0.5, 8.0, 0.25, device=t.device)                                  # float arange
        every_other = x[:, torch.arange(0, 8, 2, device=x.device)]                             # an index
        pos = self.table(torch.arange(0, x.shape[1], device=x.device))                         # positions
        return emb + pos[:4].sum(0), every_other * steps[:4], pos


def get_inputs():
    return [torch.rand(4) * 100, torch.randn(4, 8)]


def get_init_inputs():
    return []
