import torch
import torch.nn as nn


class Model(nn.Module):
    """Convolutions that pad their input by reflecting, replicating or wrapping it (padding_mode)."""

    def __init__(self):
        super().__init__()
        self.reflect = nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect")
        self.circular = nn.Conv1d(3, 2, 3, padding=2, dilation=2, padding_mode="circular")
        # "same" with an even kernel width: one column before, none after
        self.replicate = nn.Conv2d(3, 4, (3, 2), padding="same", padding_mode="replicate", bias=False)

    def forward(self, x, s):
        return self.reflect(x), self.circular(s), self.replicate(x)


def get_inputs():
    return [torch.randn(2, 3, 6, 7), torch.randn(2, 3, 9)]


def get_init_inputs():
    return []
