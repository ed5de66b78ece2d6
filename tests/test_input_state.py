"""What a forward leaves in its arguments: a reference that writes into one (`x.mul_(2)`) is matched only by a
kernel that leaves the same values there, and a kernel may not write into an argument the reference leaves
alone (a model's next layer may read it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mkevolve.config import RunConfig
from mkevolve.problem import load_problem
from mkevolve.verify.cheating import Rule
from mkevolve.verify.decomposition.results import EQUIVALENCE
from mkevolve.verify.decomposition.worker import run_checks
from mkevolve.verify.reference import reference_set
from mkevolve.verify.result import Status
from mkevolve.verify.verifier import Verifier
from mkevolve.workers import wire

CORPUS = Path(__file__).resolve().parent / "corpus"
ELEMENTWISE = CORPUS / "problems" / "elementwise.py"
SCRATCH_CHEAT = CORPUS / "cheats" / "input_state_scratch_in_argument.py"
LATE_SCRATCH_CHEAT = CORPUS / "cheats" / "input_state_scratch_after_first_call.py"

# x.mul_(2) in place, then a fresh 2x + 1: the argument after the call holds 2x.
WRITES_PROBLEM = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, bias):
        x.mul_(2.0)
        return x + bias


def get_inputs():
    return [torch.randn(16, 32), 1.0]


def get_init_inputs():
    return []
'''

KERNEL = '''import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def double_add_kernel(x_ptr, out_ptr, bias, n_elements, WRITE_BACK: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    doubled = tl.load(x_ptr + offsets, mask=mask, other=0.0) * 2.0
    if WRITE_BACK:
        tl.store(x_ptr + offsets, doubled, mask=mask)
    tl.store(out_ptr + offsets, doubled + bias, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, bias):
        out = torch.empty_like(x)
        n_elements = x.numel()
        double_add_kernel[(triton.cdiv(n_elements, 256),)](x, out, bias, n_elements, WRITE_BACK=WRITE, BLOCK=256)
        return out


WRITE = {write}
'''


@pytest.fixture
def writes_problem(tmp_path) -> Path:
    path = tmp_path / "writes_argument.py"
    path.write_text(WRITES_PROBLEM)
    return path


def test_the_reference_records_the_arguments_it_writes_into_and_keeps_them_after_its_outputs(tmp_path,
                                                                                           writes_problem):
    reference = reference_set(tmp_path / "cache", load_problem(writes_problem), 0, 0, False, torch.device("cpu"))
    reference.ensure(["trial0", "trial1"])
    assert reference.written_inputs() == [0]
    for name in ("trial0", "trial1"):
        x, bias = wire.read_values(reference.inputs_file(name))
        output, x_after = reference.expected(name)
        torch.testing.assert_close(x_after, 2 * x)
        torch.testing.assert_close(output, 2 * x + bias)


def test_a_reference_that_leaves_its_arguments_records_none(tmp_path):
    reference = reference_set(tmp_path, load_problem(ELEMENTWISE), 0, 0, False, torch.device("cpu"))
    reference.ensure(["trial0"])
    assert reference.written_inputs() == []
    assert len(reference.expected("trial0")) == 1


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("input_state")
    problem = folder / "writes_argument.py"
    problem.write_text(WRITES_PROBLEM)
    writes, leaves = folder / "writes_back.py", folder / "leaves_alone.py"
    writes.write_text(KERNEL.format(write=True))
    leaves.write_text(KERNEL.format(write=False))
    with Verifier(RunConfig(workers=2, timeout=120.0, trials=2)) as verifier:
        results = verifier.check_kernels([(problem, writes), (problem, leaves), (ELEMENTWISE, SCRATCH_CHEAT),
                                          (ELEMENTWISE, LATE_SCRATCH_CHEAT)], timed=False)
    return dict(zip(["writes", "leaves", "scratch", "late scratch"], results))


@pytest.mark.slow
def test_a_kernel_that_writes_into_the_argument_as_the_reference_does_passes(verdicts):
    assert verdicts["writes"].status is Status.OK, verdicts["writes"].reason


@pytest.mark.slow
def test_a_kernel_that_leaves_alone_an_argument_the_reference_writes_into_is_incorrect(verdicts):
    result = verdicts["leaves"]
    assert result.status is Status.INCORRECT, result.reason
    assert "argument 0 after the call (Model's forward writes into it) mismatch" in result.reason


@pytest.mark.slow
@pytest.mark.parametrize("cheat", ["scratch", "late scratch"])
def test_a_kernel_that_writes_into_an_argument_the_reference_leaves_is_incorrect(verdicts, cheat):
    """From its first call, or only from its second: later checked calls' arguments are compared too."""
    result = verdicts[cheat]
    assert result.status is Status.INCORRECT, result.reason
    assert result.rule == Rule.INPUT_STATE.value
    assert result.reason.startswith("[input-state] forward wrote into its argument 0, which Model's forward")


# ---- the decomposition's equivalence check -------------------------------------------------------------------

ORIGINAL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        x.mul_(self.scale)
        return x + 1.0


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return [8]
'''

TOP_LEVEL = '''import torch
import torch.nn as nn


def load_subproblem(name):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent / "subkernel_problems" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{__name__}__{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Model


ScaleAdd = load_subproblem("scale_add")


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale_add = ScaleAdd(dim)

    def forward(self, x):
        return self.scale_add(x)


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return [8]
'''


@pytest.mark.parametrize("in_place, passes", [(True, True), (False, False)])
def test_a_decomposition_must_leave_in_the_arguments_what_the_original_does(tmp_path, in_place, passes):
    original = tmp_path / "problem.py"
    original.write_text(ORIGINAL)
    folder = tmp_path / "decomposition"
    (folder / "subkernel_problems").mkdir(parents=True)
    (folder / "decomposed_problem.py").write_text(TOP_LEVEL)
    body = "x.mul_(self.scale)\n        return x + 1.0" if in_place else "return x * self.scale + 1.0"
    (folder / "subkernel_problems" / "scale_add.py").write_text(ORIGINAL.replace(
        "x.mul_(self.scale)\n        return x + 1.0", body))
    report = run_checks(str(original), str(folder), seed=0, trials=2)
    (equivalence,) = [check for check in report.checks if check.name == EQUIVALENCE]
    assert equivalence.passed is passes, equivalence.reason
    if not passes:
        assert "the argument after the call differs" in equivalence.reason
