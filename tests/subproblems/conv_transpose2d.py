"""ConvTranspose2d, stride 2, padding 1, output_padding 1, with bias."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.deconv(x)


def get_inputs():
    return [torch.randn(2, 8, 4, 5)]


def get_init_inputs():
    return [8, 8]
