"""scripts/bench_builtin.py's error against fp64: the candidate's and eager's, each against the reference
module run in fp64 on the same inputs."""

from __future__ import annotations

import torch
from script_loader import load_script

bench = load_script("bench_builtin")


def test_errors_are_measured_against_the_module_in_fp64():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh())
    x = torch.randn(16, 64)
    with torch.no_grad():
        expected = reference(x)
        exact = reference.double()(x.double()).float()   # the fp64 result, rounded once
    reference.float()
    candidate = exact.clone()
    candidate[3, 5] += 1e-3                                # one output off by a known amount
    eager_error, candidate_error = bench._errors_vs_fp64(reference, [x], expected, candidate)
    assert abs(candidate_error - 1e-3) < 1e-6
    assert 0 < eager_error < 1e-5                          # fp32 rounding, not the planted error
    assert reference[0].weight.dtype == torch.float32       # the module itself is left in fp32
