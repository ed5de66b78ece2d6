"""nn.Fold (col2im): no template for it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fold = nn.Fold(output_size=(4, 4), kernel_size=2)

    def forward(self, x):
        return self.fold(x)


def get_inputs():
    return [torch.randn(2, 12, 9)]


def get_init_inputs():
    return []
