import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A classifier's losses as training code writes them: class-index targets, some of them ignore_index;
    class weights and label smoothing; every reduction; scores with classes along dim 1 of a 3-d tensor, and
    one sample's scores alone."""

    def __init__(self, classes):
        super().__init__()
        self.weighted = nn.CrossEntropyLoss(weight=torch.rand(classes) + 0.5, label_smoothing=0.1,
                                            reduction="sum")
        self.smoothed = nn.CrossEntropyLoss(label_smoothing=0.2)

    def forward(self, scores, target, tokens, token_target):
        plain = F.cross_entropy(scores, target)
        per_token = F.nll_loss(F.log_softmax(tokens, dim=1), token_target, ignore_index=2, reduction="none")
        one = F.cross_entropy(scores[1], target[1], weight=self.weighted.weight)
        return plain, self.weighted(scores, target), self.smoothed(scores, target), per_token, one


def get_inputs():
    target = torch.randint(0, 10, (12,))
    target[::4] = -100
    return [torch.randn(12, 10) * 3, target, torch.randn(3, 10, 5), torch.randint(0, 10, (3, 5))]


def get_init_inputs():
    return [10]
