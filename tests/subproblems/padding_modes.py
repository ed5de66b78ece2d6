import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Every padding mode F.pad and the nn.*Pad* layers have, a fill value, a crop (a negative pad) and a pad
    of a channel dim."""

    def __init__(self):
        super().__init__()
        self.reflect = nn.ReflectionPad2d((1, 2, 0, 1))
        self.replicate = nn.ReplicationPad3d(1)
        self.zero = nn.ZeroPad2d((0, 1, 2, 0))

    def forward(self, x, v):
        return (self.reflect(x), F.pad(x, (2, -1), value=-1.5), self.replicate(v), self.zero(x),
                F.pad(x[:, 0], (1, 2), mode="circular"), F.pad(x, (0, 0, 0, 0, 1, 1), value=float("-inf")))


def get_inputs():
    return [torch.randn(2, 3, 5, 6), torch.randn(1, 2, 3, 4, 5)]


def get_init_inputs():
    return []
