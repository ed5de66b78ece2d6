import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Gated linear units: a Conformer's convolution module (GLU over the channels of a pointwise conv) and
    nn.GLU over the last dim."""

    def __init__(self):
        super().__init__()
        self.pointwise = nn.Conv1d(4, 8, 1)
        self.glu = nn.GLU()

    def forward(self, x):
        return F.glu(self.pointwise(x), dim=1), self.glu(x)


def get_inputs():
    return [torch.randn(2, 4, 6)]


def get_init_inputs():
    return []
