"""A small batch through a wide layer, then GELU times a second input: few output tiles and a long K, so the
GEMM splits K over programs (in the split-K variant). K = 520 leaves the last chunk short."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x, y):
        return F.gelu(self.fc(x)) * y


def get_inputs():
    return [torch.randn(4, 520), torch.randn(4, 40)]


def get_init_inputs():
    return [520, 40]
