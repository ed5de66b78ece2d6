"""LayerNorm over the last two dims with elementwise affine."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        nn.init.uniform_(self.ln.weight)
        nn.init.uniform_(self.ln.bias)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(3, 4, 6, 5) * 3.0 + 1.0]


def get_init_inputs():
    return [(6, 5)]
