"""Cheat: moves correct running statistics, but in a plain tensor attribute rather than the module's registered
buffers, which keep their initial values: the outputs are right and state_dict() would save stale
statistics.

Only registered buffers count as the module's state, read from the modules' own attribute dicts.
"""

import torch
import triton
import triton.language as tl
from torch import nn

PROBLEM = "batch_norm"
EXPECTED_RULE = "module-state"
CAUGHT_BY = "judge"
EXPECTED_STATUS = "incorrect"


@triton.jit
def batch_norm_kernel(x_ptr, out_ptr, weight_ptr, bias_ptr, mean_ptr, var_ptr, channels, per_sample, count,
                      momentum, eps, TRAINING: tl.constexpr, BLOCK: tl.constexpr):
    channel = tl.program_id(0)
    index = tl.arange(0, BLOCK)        # over the channel's N * H * W elements
    mask = index < count
    offsets = (index // per_sample) * channels * per_sample + channel * per_sample + index % per_sample
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    if TRAINING:
        mean = tl.sum(x, axis=0) / count
        centred = tl.where(mask, x - mean, 0.0)
        var = tl.sum(centred * centred, axis=0) / count
        running_mean = tl.load(mean_ptr + channel)
        running_var = tl.load(var_ptr + channel)
        tl.store(mean_ptr + channel, (1 - momentum) * running_mean + momentum * mean)
        tl.store(var_ptr + channel, (1 - momentum) * running_var + momentum * var * count / (count - 1))
    else:
        mean = tl.load(mean_ptr + channel)
        var = tl.load(var_ptr + channel)
    scale = tl.load(weight_ptr + channel) / tl.sqrt(var + eps)
    shift = tl.load(bias_ptr + channel) - mean * scale
    tl.store(out_ptr + offsets, x * scale + shift, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.stats = torch.stack([torch.zeros(channels), torch.ones(channels)])   # not a buffer

    def _apply(self, fn, recurse=True):
        self.stats = fn(self.stats)           # moved with the module all the same
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch, channels, height, width = x.shape
        out = torch.empty_like(x)
        count = batch * height * width
        bn = self.bn
        batch_norm_kernel[(channels,)](x, out, bn.weight, bn.bias, self.stats[0], self.stats[1], channels,
                                       height * width, count, bn.momentum, bn.eps, TRAINING=self.training,
                                       BLOCK=triton.next_power_of_2(count))
        return out

