"""fmod, remainder and %, vector norms of orders other than 1, 2 and inf, torch.diff and a cross product.
The divisors stay away from 0, so that no quotient is large enough for a GPU's division to round it across an
integer (where fmod's result would jump by the divisor)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        r = torch.fmod(x, y) + torch.remainder(x, -0.7) + x % 1.3
        n = torch.linalg.vector_norm(x, 3, dim=1, keepdim=True) + torch.linalg.vector_norm(x, 0, dim=1, keepdim=True)
        d = torch.diff(x, n=2, dim=1)
        c = torch.linalg.cross(x[:, :3], y[:, :3])
        return r * n, d, c


def get_inputs():
    y = torch.randn(8, 32)
    return [torch.randn(8, 32) * 5, torch.sign(y) * (y.abs() + 0.5)]


def get_init_inputs():
    return []
