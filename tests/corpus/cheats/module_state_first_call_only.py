"""Cheat: moves the running statistics on the first call only, which a check of the state after the first
call would pass; every later call skips the update.

The state is also compared after the last call, against the same calls replayed on the reference.
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
                      momentum, eps, TRAINING: tl.constexpr, UPDATE: tl.constexpr, BLOCK: tl.constexpr):
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
        if UPDATE:
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
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        self.calls += 1
        batch, channels, height, width = x.shape
        out = torch.empty_like(x)
        count = batch * height * width
        bn = self.bn
        batch_norm_kernel[(channels,)](x, out, bn.weight, bn.bias, bn.running_mean, bn.running_var, channels,
                                       height * width, count, bn.momentum, bn.eps, TRAINING=self.training,
                                       UPDATE=self.calls == 1,
                                       BLOCK=triton.next_power_of_2(count))
        return out

