import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Regression and binary losses as training code writes them, functional and as modules: squared and
    absolute error, Huber and smooth L1 (errors on both sides of their thresholds), binary cross entropy on
    probabilities and on logits (weights, pos_weight), KL divergence (batchmean, log targets)."""

    def __init__(self, features):
        super().__init__()
        self.huber = nn.HuberLoss(delta=0.5, reduction="sum")
        self.logits = nn.BCEWithLogitsLoss(pos_weight=torch.rand(features) + 0.5)
        self.kl = nn.KLDivLoss(reduction="batchmean", log_target=True)

    def forward(self, x, y, p, labels):
        return (F.mse_loss(x, y), F.l1_loss(x, y, reduction="none"), F.smooth_l1_loss(x, y, beta=0.7),
                self.huber(x, y), F.binary_cross_entropy(p, labels, weight=y.abs()), self.logits(x, labels),
                F.kl_div(F.log_softmax(x, dim=1), p / p.sum(dim=1, keepdim=True), reduction="sum"),
                self.kl(F.log_softmax(x, dim=1), F.log_softmax(y, dim=1)))


def get_inputs():
    labels = (torch.rand(6, 8) > 0.5).float()
    labels[0, :3] = 0.3          # soft labels
    p = torch.rand(6, 8) * 0.98 + 0.01
    p[1, 0], p[1, 1] = 0.0, 1.0  # log(0) clamped at -100 on both sides
    return [torch.randn(6, 8), torch.randn(6, 8), p, labels]


def get_init_inputs():
    return [8]
