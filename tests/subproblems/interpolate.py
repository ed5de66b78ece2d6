import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F.interpolate and nn.Upsample in the forms decoders write: nearest and nearest-exact by a factor or to
    a size, bilinear with and without align_corners, trilinear, linear on a sequence, a fractional factor,
    area (an adaptive average pool), and nn.Upsample built inside forward."""

    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.up_corners = nn.UpsamplingBilinear2d(size=(7, 9))

    def forward(self, x, v, s):
        return (F.interpolate(x, scale_factor=2), F.interpolate(x, size=(7, 5), mode="nearest-exact"),
                self.up(x), self.up_corners(x), F.interpolate(x, scale_factor=1.7, mode="bilinear"),
                F.interpolate(v, size=(3, 5, 4), mode="trilinear", align_corners=True),
                F.interpolate(s, scale_factor=0.5, mode="linear", recompute_scale_factor=True),
                F.interpolate(x, size=(3, 11)), F.interpolate(x, scale_factor=0.5, mode="area"),
                # built in forward, an nn.Upsample is traced to aten.upsample_*
                nn.Upsample(scale_factor=(1, 2, 2))(v),
                nn.Upsample(size=(7, 9), mode="bilinear", align_corners=True)(x),
                nn.Upsample(scale_factor=1.5, mode="bilinear")(x),
                # aten's own form may give both: the size makes the shape, the factors the coordinates
                torch.ops.aten.upsample_bilinear2d.default(x, [7, 9], False, 1.5, 1.5))


def get_inputs():
    return [torch.randn(2, 3, 5, 6), torch.randn(1, 2, 2, 3, 4), torch.randn(2, 3, 9)]


def get_init_inputs():
    return []
