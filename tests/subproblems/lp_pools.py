"""Power-average pooling: nn.LPPool2d of order 2, and F.lp_pool1d of order 1.5 with ceil_mode on positive values
(its last window is partial: PyTorch scales the partial window's average by the full window's size)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.LPPool2d(2, 3, stride=2)

    def forward(self, x, y):
        return self.pool(x), F.lp_pool1d(y, 1.5, 3, stride=2, ceil_mode=True)


def get_inputs():
    return [torch.randn(2, 3, 9, 9), torch.randn(2, 3, 10).abs()]


def get_init_inputs():
    return []
