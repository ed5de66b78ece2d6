import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """nn.EmbeddingBag over bags of equal size (a 2-d input): mean, sum with per-sample weights, and max
    (F.embedding_bag), the bags then used in an elementwise sum."""

    def __init__(self):
        super().__init__()
        self.mean_bag = nn.EmbeddingBag(20, 8)
        self.sum_bag = nn.EmbeddingBag(20, 8, mode="sum")

    def forward(self, index, weights):
        maxed = F.embedding_bag(index, self.mean_bag.weight, mode="max")
        return self.mean_bag(index) + self.sum_bag(index, per_sample_weights=weights) * 0.5, maxed


def get_inputs():
    return [torch.randint(0, 20, (6, 5)), torch.rand(6, 5)]


def get_init_inputs():
    return []
