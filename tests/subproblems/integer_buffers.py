import torch
import torch.nn as nn


class Model(nn.Module):
    """Integer buffers read as indices, as transformer code registers them: BERT's position ids (a slice of
    an arange buffer) into an embedding; a relative position bias table read through a buffer of indices
    (`table[index]`, some of them negative: counted from the end); columns picked by an integer input."""

    def __init__(self, vocab, dim, positions, window):
        super().__init__()
        self.words = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(positions, dim)
        self.register_buffer("position_ids", torch.arange(positions).expand((1, -1)), persistent=False)
        self.table = nn.Parameter(torch.randn(2 * window - 1, 3))
        relative = torch.arange(window)[:, None] - torch.arange(window)[None, :]
        self.register_buffer("relative_index", relative)      # -(window - 1) .. window - 1

    def forward(self, ids, columns, scores):
        length = ids.size(1)
        tokens = self.words(ids) + self.positions(self.position_ids[:, :length])
        bias = self.table[self.relative_index.view(-1)].view(self.relative_index.shape[0], -1, 3)
        return tokens, scores + bias.permute(2, 0, 1), scores[:, columns]


def get_inputs():
    return [torch.randint(0, 30, (2, 7)), torch.tensor([[0, 3], [2, 2]]), torch.randn(3, 5, 5)]


def get_init_inputs():
    return [30, 8, 10, 5]
