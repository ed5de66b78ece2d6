import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.unfold (im2col) with padding, dilation and stride, its blocks used as a GEMM's operand (a convolution
    written by hand), and nn.Unfold on an unbatched [C, H, W] input."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 3 * 3 * 3) * 0.2)
        self.blocks = nn.Unfold(kernel_size=(2, 3), stride=(2, 1))

    def forward(self, x):
        columns = F.unfold(x, kernel_size=3, dilation=(1, 2), padding=1, stride=2)
        conv = columns.transpose(1, 2) @ self.weight.t()
        return conv * 2.0, self.blocks(x[0]) + 1.0


def get_inputs():
    return [torch.randn(2, 3, 9, 11)]


def get_init_inputs():
    return []
