"""LogSoftmax over a middle dim of a 4-d tensor, scaled first."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_softmax = nn.LogSoftmax(dim=1)

    def forward(self, x):
        return self.log_softmax(x * 2.0)


def get_inputs():
    return [torch.randn(2, 6, 3, 5)]


def get_init_inputs():
    return []
