"""A mask computed in forward from a registered buffer (minGPT's causal attention: `att.masked_fill(self.bias
[:, :, :T, :T] == 0, -inf)`) is traced as operations on the buffer, so the builtin generator fuses it into
the score kernel instead of declining a constant baked in at trace time (KernelBench level3/50)."""

from __future__ import annotations

from pathlib import Path

import torch

from mkevolve.builtin.kernels import generate_kernel, variant_count
from mkevolve.problem import call_inputs, import_file, load_problem

from builtin_matching import DEVICE, TARGET

SCORES = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, max_seqlen):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen))

    def forward(self, q, k):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return F.relu(att)


def get_inputs():
    return [torch.randn(2, 2, 16, 16), torch.randn(2, 2, 16, 16)]


def get_init_inputs():
    return [16]
'''


def test_a_causal_mask_from_a_buffer_gets_a_correct_kernel(tmp_path: Path):
    problem_path = tmp_path / "scores.py"
    problem_path.write_text(SCORES)
    problem = load_problem(problem_path)
    (config,) = problem.configs
    init = call_inputs(problem_path, config.get_init_inputs, "get_init_inputs")
    inputs = [t.to(DEVICE) for t in call_inputs(problem_path, config.get_inputs, "get_inputs")]
    expected = problem.model_cls(*init).to(DEVICE)(*inputs)
    assert variant_count(problem_path, TARGET) >= 1
    generated = generate_kernel(problem_path, 0, TARGET)
    solution = tmp_path / "solution.py"
    solution.write_text(generated.source)
    actual = import_file(solution, prefix="generated").ModelNew(*init).to(DEVICE)(*inputs)
    assert "_tensor_constant" not in generated.source
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    assert bool((actual[..., 0, 1:] == 0).all())  # above the diagonal: -inf, then relu
