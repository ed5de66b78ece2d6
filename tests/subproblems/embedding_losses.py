import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Losses over embeddings and scores, as metric-learning and ranking code writes them: triplet margin
    (with swap), cosine embedding, margin ranking, hinge embedding, soft margin; the pairwise distance and
    cosine similarity they are built on (one row a zero vector, which their eps guards); logaddexp."""

    def __init__(self):
        super().__init__()
        self.triplet = nn.TripletMarginLoss(margin=0.5, swap=True)
        self.similarity = nn.CosineSimilarity(dim=1)
        self.distance = nn.PairwiseDistance(p=1.0, keepdim=True)

    def forward(self, anchor, positive, negative, signs):
        scores = anchor.sum(dim=1)
        return (self.triplet(anchor, positive, negative),
                F.triplet_margin_loss(anchor, positive, negative, p=1.0, reduction="none"),
                F.cosine_embedding_loss(anchor, positive, signs, margin=0.2),
                F.margin_ranking_loss(scores, negative.sum(dim=1), signs, margin=0.1, reduction="sum"),
                F.hinge_embedding_loss(scores, signs, margin=2.0), F.soft_margin_loss(scores, signs),
                self.similarity(anchor, positive), F.cosine_similarity(anchor, negative[:1], dim=-1),
                self.distance(anchor, negative), torch.logaddexp(anchor, positive))


def get_inputs():
    anchor = torch.randn(6, 16)
    anchor[2] = 0.0
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    return [anchor, torch.randn(6, 16), torch.randn(6, 16), signs]


def get_init_inputs():
    return []
