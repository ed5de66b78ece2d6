import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Max pooling with return_indices=True and the MaxUnpool that puts values back where the maxima were, as a
    SegNet decoder does: a 2d pool of overlapping windows (kernel 3, stride 2, padding 1) unpooled to the input's
    own size (odd heights: output_size differs from the default size by one), a 1d pool with padding, dilation and
    ceil_mode, and a 3d one. The int64 indices are returned too. Whole numbers make ties (the first position wins);
    two input configs of different sizes make the launchers find the unpooled sizes at run time."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(3, stride=2, padding=1, return_indices=True)
        self.unpool = nn.MaxUnpool2d(3, stride=2, padding=1)
        self.unpool3d = nn.MaxUnpool3d(2)

    def forward(self, x, y, z):
        values, indices = self.pool(x)
        up = self.unpool(torch.relu(values) * 2.0, indices, output_size=x.size())
        line, at = F.max_pool1d(y, 3, stride=2, padding=1, dilation=2, ceil_mode=True, return_indices=True)
        back = F.max_unpool1d(line, at, 3, stride=2, padding=1, output_size=y.shape[-1:])
        cube, where = F.max_pool3d(z, 2, return_indices=True)
        return up, indices, back, at, self.unpool3d(cube + 1.0, where), where


def _whole(*shape):
    return torch.randn(*shape).mul(2.0).round()


def get_input_configs():
    return [
        {"get_init_inputs": lambda: [], "get_inputs": lambda: [_whole(2, 3, 9, 8), _whole(2, 4, 10),
                                                               _whole(1, 2, 4, 6, 4)]},
        {"get_init_inputs": lambda: [], "get_inputs": lambda: [_whole(1, 3, 7, 6), _whole(1, 4, 14),
                                                               _whole(2, 2, 2, 4, 6)]},
    ]


def get_inputs():
    return get_input_configs()[0]["get_inputs"]()


def get_init_inputs():
    return []
