"""Linear layer, LayerNorm, GELU, then scaling by a constant."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.layer_norm = nn.LayerNorm(out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.gemm(x)
        x = self.layer_norm(x)
        x = F.gelu(x)
        return x * self.scaling_factor


batch_size = 64
in_features = 256
out_features = 256
scaling_factor = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scaling_factor]
