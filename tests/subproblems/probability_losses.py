import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Cross entropy against class probabilities (distillation's soft targets), with class weights, label
    smoothing, and per sample."""

    def __init__(self, classes):
        super().__init__()
        self.register_buffer("class_weight", torch.rand(classes) + 0.5)

    def forward(self, scores, teacher):
        soft = teacher.softmax(dim=-1)
        weighted = F.cross_entropy(scores, soft, weight=self.class_weight, label_smoothing=0.1)
        return weighted, F.cross_entropy(scores, soft, reduction="none")


def get_inputs():
    return [torch.randn(12, 10) * 3, torch.randn(12, 10)]


def get_init_inputs():
    return [10]
