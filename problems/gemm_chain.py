"""Three Linear layers with GELU and ReLU between them, and a residual add around the last two."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out_features)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        r = torch.relu(self.fc2(h)) + h
        return self.fc3(r)


batch_size = 8
in_features = 32
hidden = 64
out_features = 16


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden, out_features]
