"""Running a generated ModelNew beside its Model, as the builtin generator's tests do: built with the same seed,
fed the same seeded inputs under every input config, every output (nested tuples flattened) compared."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mkevolve.builtin.kernels import GeneratedKernel
from mkevolve.problem import call_inputs, import_file, load_problem
from mkevolve.verify.correctness import fp32_strict

ON_GPU = os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
TARGET = "cuda" if ON_GPU else "cpu"
DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def import_generated(generated: GeneratedKernel, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(generated.source)
    return import_file(path, prefix="generated")


def flat_outputs(result) -> list[torch.Tensor]:
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in flat_outputs(item)]
    return [result]


def assert_matches(path: Path, generated: GeneratedKernel, tmp_path: Path, eval_mode: bool = False) -> None:
    """Model and ModelNew built with the same seed, run on the same seeded inputs under every config; each
    output within the verifier's tolerance (atol = rtol = 1e-4), of the same shape and dtype."""
    module = import_generated(generated, tmp_path, f"{path.stem}_v{generated.variant}")
    problem = load_problem(path)
    fp32_strict()  # on a GPU, cuDNN's convolutions would otherwise use TF32
    for config in problem.configs:
        init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
        torch.manual_seed(0)
        reference = problem.model_cls(*init).to(DEVICE)
        torch.manual_seed(0)
        candidate = module.ModelNew(*init).to(DEVICE)
        if eval_mode:
            reference.eval()
            candidate.eval()
        torch.manual_seed(1)
        inputs = [t.to(DEVICE) for t in call_inputs(problem.path, config.get_inputs, "get_inputs")]
        with torch.no_grad():
            expected, actual = flat_outputs(reference(*inputs)), flat_outputs(candidate(*inputs))
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual):
            assert a.shape == e.shape and a.dtype == e.dtype
            torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)
