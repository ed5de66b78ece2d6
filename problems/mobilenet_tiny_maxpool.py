"""The MaxPool variant of mobilenet_tiny.py: the same network with adaptive max pooling before the head."""

import torch
import torch.nn as nn


class InvertedResidual(nn.Module):
    def __init__(self, in_channels, out_channels, stride, expand):
        super().__init__()
        hidden = in_channels * expand
        self.use_residual = stride == 1 and in_channels == out_channels
        self.expand = nn.Sequential(nn.Conv2d(in_channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                                    nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(hidden, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels))

    def forward(self, x):
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.use_residual else y


class Model(nn.Module):
    def __init__(self, num_classes, width):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6())
        self.blocks = nn.Sequential(
            InvertedResidual(width, width, 1, 2),
            InvertedResidual(width, 2 * width, 2, 2),
            InvertedResidual(2 * width, 2 * width, 1, 2),
        )
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        x = self.pool(x).flatten(1)
        return self.classifier(x)


batch_size = 2
num_classes = 10
width = 8


def get_inputs():
    return [torch.randn(batch_size, 3, 32, 32)]


def get_init_inputs():
    return [num_classes, width]
