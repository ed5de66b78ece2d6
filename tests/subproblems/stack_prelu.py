import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """torch.stack along the first, a middle and the last dim; PReLU with one slope per channel, with one
    slope, and as F.prelu."""

    def __init__(self):
        super().__init__()
        self.per_channel = nn.PReLU(3, init=0.1)
        self.shared = nn.PReLU()

    def forward(self, x, y):
        stacked = torch.stack([x, y, x * y]), torch.stack((x, y), dim=2), torch.stack([x, y], dim=-1)
        return (*stacked, self.per_channel(x), self.shared(y), F.prelu(x, self.per_channel.weight * 2.0))


def get_inputs():
    return [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)]


def get_init_inputs():
    return []
