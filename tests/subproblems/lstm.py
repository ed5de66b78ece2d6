"""An LSTM: recurrent, no template for it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def get_inputs():
    return [torch.randn(2, 5, 8)]


def get_init_inputs():
    return []
