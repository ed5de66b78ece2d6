import torch
import torch.nn as nn


class Model(nn.Module):
    """torch.sort (both outputs, a middle dim, descending), argsort, msort and topk (largest and smallest):
    values and int64 positions, on rows with ties (whole numbers; a stable sort keeps equal values in order), and the
    positions used as gather indices."""

    def forward(self, x, rows):
        values, indices = torch.sort(x, dim=1, descending=True, stable=True)
        top = torch.topk(rows, 5)
        low = rows.topk(3, dim=1, largest=False)
        order = torch.argsort(rows, dim=-1, stable=True)
        return (values * 2.0, indices, top.values, top.indices, low.values + 1.0, low.indices, order,
                torch.msort(x), torch.gather(rows, 1, order[:, :4]))


def get_inputs():
    return [torch.randn(3, 40, 6).mul(2.0).round(), torch.randn(4, 300)]


def get_init_inputs():
    return []
