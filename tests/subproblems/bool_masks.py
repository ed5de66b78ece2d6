import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Bool masks passed to forward: a masked fill and a where, a mean over the kept positions, and an
    attention whose keys are masked by padding (SDPA's bool attn_mask: True takes part; a query with no key
    left gets 0, as SDPA gives it, where softmax would give NaN)."""

    def forward(self, x, q, keep):
        masked = x.masked_fill(~keep, 0.0) + torch.where(keep, x, -x)
        mean = (x * keep).sum(-1) / keep.float().sum(-1).clamp_min(1.0)
        attended = F.scaled_dot_product_attention(q, q, q, attn_mask=keep[:, None, None, :])
        return masked, mean, attended


def get_inputs():
    keep = torch.rand(2, 8) > 0.3
    keep[0, 0], keep[1] = True, False      # the second sequence keeps no key at all
    return [torch.randn(2, 8), torch.randn(2, 3, 8, 4), keep]


def get_init_inputs():
    return []
