"""Two convolution blocks (Conv2d, BatchNorm2d, ReLU, MaxPool2d), then global average pooling."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.pool(torch.relu(self.bn2(self.conv2(x))))
        return x.mean(dim=(2, 3))


batch_size = 4
in_channels = 3
channels = 8
size = 16


def get_inputs():
    return [torch.randn(batch_size, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, channels]
