import torch
import torch.nn as nn


class Model(nn.Module):
    """Grouped-query attention's heads repeated (repeat_interleave along dim 1, and along the last dim), an outer
    product, and baddbmm with and without its scale factors."""

    def forward(self, kv, a, b, x):
        return (kv.repeat_interleave(3, dim=1), torch.repeat_interleave(x, 2, dim=-1), torch.outer(x[0], x[1]),
                torch.baddbmm(a, a, b.transpose(1, 2)), torch.baddbmm(a, a, b, beta=0.5, alpha=2.0))


def get_inputs():
    return [torch.randn(2, 2, 4, 3), torch.randn(2, 5, 5), torch.randn(2, 5, 5), torch.randn(3, 6)]


def get_init_inputs():
    return []
