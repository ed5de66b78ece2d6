import torch
import torch.nn as nn


class Model(nn.Module):
    """Copies that reorder: flip, roll (a shifted-window block's, and a negative shift), repeat with a new
    leading dim, pixel shuffle and unshuffle (a super-resolution head and its inverse)."""

    def __init__(self):
        super().__init__()
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):
        return (torch.flip(x, dims=[1, 3]), torch.roll(x, shifts=(-1, 2), dims=(2, 3)), x.flip(-1),
                torch.roll(x, 7, 3), x.repeat(2, 1, 2, 1, 3), self.shuffle(x.repeat(1, 4, 1, 1)),
                torch.pixel_unshuffle(x, 2))


def get_inputs():
    return [torch.randn(2, 3, 4, 6)]


def get_init_inputs():
    return []
