"""Every supported activation on one input, combined so each one matters."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.0)
        self.elu = nn.ELU(alpha=0.7)
        self.leaky = nn.LeakyReLU(0.2)

    def forward(self, x):
        a = F.relu(x) + F.gelu(x) + torch.sigmoid(x) + torch.tanh(x) + F.silu(x)
        b = F.hardtanh(x, -0.5, 0.5) + self.leaky(x) + self.elu(x) + F.softplus(x, beta=2.0, threshold=5.0)
        c = F.mish(x) + F.hardswish(x) + torch.exp(x * 0.1) + torch.log(torch.abs(x) + 1.0) + x ** 2
        d = torch.pow(torch.abs(x), 0.5) + torch.clamp(x, max=0.3) + torch.min(x, torch.tensor(0.2))
        e = F.selu(x) + F.hardsigmoid(x) + F.logsigmoid(x) + F.softsign(x) + torch.rsqrt(x * x + 1.0)
        f = torch.where(x > 0, x / 3.0, 1.0 - x) + torch.maximum(x, -x * 0.5) + F.relu6(x * 4.0)
        return self.dropout(a - b + c * 0.5 + d - e + f)


def get_inputs():
    return [torch.randn(4, 50) * 3.0]


def get_init_inputs():
    return []
