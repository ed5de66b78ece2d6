"""Running a generated ModelNew beside its Model, as the builtin generator's tests do: built with the same seed,
fed the same seeded inputs under every input config, every output (nested tuples flattened) compared."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mkevolve.builtin.kernels import GeneratedKernel, generate_kernel
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


def run_both(path: Path, module, eval_mode: bool = False) -> list[tuple[object, object]]:
    """(expected, actual) per input config, Model and ModelNew built alike with the same seed and fed alike
    (fresh inputs for each, so a reference that mutates its input cannot change what the candidate sees)."""
    problem = load_problem(path)
    fp32_strict()  # on a GPU, cuDNN's convolutions would otherwise use TF32
    pairs = []
    for config in problem.configs:
        init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
        torch.manual_seed(0)
        reference = problem.model_cls(*init).to(DEVICE)
        torch.manual_seed(0)
        candidate = module.ModelNew(*init).to(DEVICE)
        if eval_mode:
            reference.eval()
            candidate.eval()
        with torch.no_grad():
            torch.manual_seed(1)
            expected = reference(*[t.to(DEVICE) for t in call_inputs(path, config.get_inputs, "get_inputs")])
            torch.manual_seed(1)
            actual = candidate(*[t.to(DEVICE) for t in call_inputs(path, config.get_inputs, "get_inputs")])
        pairs.append((expected, actual))
    return pairs


def assert_matches(path: Path, generated: GeneratedKernel, tmp_path: Path, eval_mode: bool = False) -> None:
    """Every output of `generated` under every input config within the verifier's tolerance (atol = rtol =
    1e-4) of the Model's, of the same shape and dtype."""
    module = import_generated(generated, tmp_path, f"{path.stem}_v{generated.variant}")
    for expected, actual in run_both(path, module, eval_mode):
        expected, actual = flat_outputs(expected), flat_outputs(actual)
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual):
            assert a.shape == e.shape and a.dtype == e.dtype
            torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)


def assert_variant_matches(path: Path, variant: int, tmp_path: Path, eval_mode: bool = False) -> GeneratedKernel:
    generated = generate_kernel(path, variant, TARGET)
    assert_matches(path, generated, tmp_path, eval_mode)
    return generated
