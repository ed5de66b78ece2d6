import torch
import torch.nn as nn


class Model(nn.Module):
    """One convolution subproblem of a network whose layers differ in padding (a 3x3 padded layer and an
    unpadded 1x1 one, as in a ResNet or MobileNet block): one kernel serves both, its input border decided
    at run time."""

    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_input_configs():
    return [
        {"get_init_inputs": lambda: [16, 16, 3, 1], "get_inputs": lambda: [torch.randn(2, 16, 6, 5)]},
        {"get_init_inputs": lambda: [16, 32, 1, 0], "get_inputs": lambda: [torch.randn(2, 16, 4, 4)]},
    ]


def get_inputs():
    return get_input_configs()[0]["get_inputs"]()


def get_init_inputs():
    return get_input_configs()[0]["get_init_inputs"]()
