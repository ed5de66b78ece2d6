"""Linear layer with Kaiming-normal weights, a learned bias, Hardtanh, then GELU."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        nn.init.kaiming_normal_(self.gemm.weight)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.02)

    def forward(self, x):
        x = self.gemm(x) + self.bias
        x = F.hardtanh(x, min_val=-1.0, max_val=1.0)
        return F.gelu(x)


batch_size = 64
in_features = 256
out_features = 256
bias_shape = (out_features,)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, bias_shape]
