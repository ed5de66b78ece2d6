"""Decomposition checks: hand-made decompositions that each break one check, and the purity rules."""

from pathlib import Path

import pytest

from mkevolve.agents.evolve import input_shapes_job
from mkevolve.codebase import Decomposition
from mkevolve.config import RunConfig
from mkevolve.verify.decomposition.orchestration import check_decomposition, report_from_outcome
from mkevolve.verify.decomposition.results import (
    CHECKS,
    EQUIVALENCE,
    FORWARD_COVERAGE,
    INIT_COVERAGE,
    PURITY,
    STANDALONE,
    STRUCTURE,
)
from mkevolve.verify.decomposition.static import top_level_violations
from mkevolve.verify.decomposition.worker import run_checks
from mkevolve.workers.pool import JobFailure, JobOutcome, WorkerPool

FIXTURES = Path(__file__).parent / "fixtures" / "decompositions"
PROBLEM = FIXTURES / "problem.py"


def _checks(folder: str):
    return run_checks(str(PROBLEM.resolve()), str((FIXTURES / folder).resolve()), seed=0, trials=2)


def test_the_good_decomposition_passes_every_check_and_reports_its_instances():
    report = _checks("good")
    assert report.passed, report.reasons()
    assert [c.name for c in report.checks] == list(CHECKS)
    assert [c.attribute for c in report.instances["linear_relu"]] == ["block1", "block2"]
    assert report.instances["linear_relu"][0].init_args == "in_features=8, out_features=8"
    assert report.instances["scale"][0].inputs == ("x=float32[2, 8]",)


def test_the_report_says_how_each_subproblem_file_is_called_as_the_first_prompt_shows_it():
    report = _checks("good")
    folder = FIXTURES / "good" / "subkernel_problems"
    assert report.inputs == {name: input_shapes_job(str(folder / f"{name}.py")) for name in ("linear_relu", "scale")}
    assert report.inputs["linear_relu"] == ["config 0: forward(float32[2, 8]), constructed with (8, 8)",
                                            "config 1: forward(float32[2, 8]), constructed with (8, 8)"]
    decomposition = Decomposition.read(FIXTURES / "good").with_configs(report.instances, report.inputs)
    assert decomposition.subproblem("scale").input_shapes == report.inputs["scale"]


def test_the_report_says_where_the_checks_time_went():
    report = _checks("good")
    parts = {"equivalence.build", "equivalence.trials"}   # within "equivalence"
    assert set(report.phases) == {"load", "standalone", "import", "equivalence", "coverage"} | parts
    assert all(seconds >= 0 for seconds in report.phases.values())
    assert sum(v for k, v in report.phases.items() if k not in parts) <= report.wall_s
    assert sum(report.phases[k] for k in parts) <= report.phases["equivalence"]
    assert report.to_dict()["phases"].keys() == report.phases.keys()


@pytest.mark.parametrize("folder, check, reason", [
    ("missing_file", STRUCTURE, 'loads "scale" but there is no subkernel_problems/scale.py'),
    ("math_in_top_level", PURITY, "`torch.relu(self.block1(x))` in forward"),
    ("module_list", PURITY, "nn.ModuleList"),
    ("parameter_in_top_level", PURITY, "nn.Parameter"),
    ("standalone_broken", STANDALONE, "scale: config 0: forward raised ValueError: expects non-negative"),
    ("wrong_rng_order", EQUIVALENCE, "build the subproblem modules in the order the original creates"),
    ("shape_not_covered", FORWARD_COVERAGE, "is called with x=float32[2, 8], but its inputs offer only x="),
    ("init_not_covered", INIT_COVERAGE, "get_input_configs()[1] (in_features=8, out_features=16"),
    ("missing_input_configs", INIT_COVERAGE, "instantiated 2 times, so it must define get_input_configs()"),
])
def test_each_broken_decomposition_fails_its_check_with_a_reason(folder, check, reason):
    report = _checks(folder)
    assert not report.passed
    failed = {c.name: c.reason for c in report.failures()}
    assert reason in failed[check]
    ran = {name for name, text in failed.items() if not text.startswith("not run")}
    assert ran == {check}, failed  # one check broken at a time


def test_purity_names_both_the_source_line_and_the_op_that_ran():
    reason = _checks("math_in_top_level").verdict(PURITY).reason
    assert "line 33" in reason and "aten.relu outside every subproblem module" in reason


def test_module_list_is_caught_at_run_time_too():
    reason = _checks("module_list").verdict(PURITY).reason
    assert "child module 'blocks' is a torch.nn.modules.container.ModuleList" in reason


def _violations(forward_body: str, init_body: str = "self.a = A(4)") -> list[str]:
    source = f'''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

def load_subproblem(name):
    pass

A = load_subproblem("a")

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        {init_body}

    def forward(self, x, y):
        {forward_body}
'''
    return top_level_violations(source)


@pytest.mark.parametrize("body", [
    "return self.a(x).view(x.size(0), -1)",
    "b, c = x.shape[0], x.shape[1] * 2\n        return self.a(x.reshape(b, c // 2, -1)).flatten(1)",
    "h = self.a(x)\n        for i in range(len(h.shape)):\n            h = h.transpose(0, 1)\n        return h",
    "first, second = self.a(x).chunk(2, dim=1)\n        return self.a(second), torch.flatten(first, 1)",
    "return self.a(x)[:, 0] if x.dim() > 2 else self.a(y).T",
])
def test_calls_views_and_shape_arithmetic_are_pure(body):
    assert _violations(body) == []


@pytest.mark.parametrize("body, words", [
    ("return self.a(x) + y", "does math on tensors"),
    ("return -self.a(x)", "does math on tensors"),
    ("h = self.a(x)\n        h *= 2\n        return h", "does math on tensors"),
    ("return torch.relu(self.a(x))", "`torch.relu(self.a(x))`"),
    ("return F.gelu(x)", "`F.gelu(x)`"),
    ("return self.a(x).sum(dim=1)", "`self.a(x).sum(dim=1)`"),
    ("return self.a.forward(x)", "`self.a.forward(x)`"),
    ("return self.a(x) > 0", "compares tensors"),
])
def test_math_and_other_calls_in_forward_are_violations(body, words):
    violations = _violations(body)
    assert violations and any(words in v for v in violations), violations


@pytest.mark.parametrize("init_body, words", [
    ("self.act = nn.ReLU()", "`nn.ReLU()`"),
    ("self.blocks = nn.Sequential(A(4), A(4))", "nn.Sequential"),
    ("self.w = nn.Parameter(torch.ones(n))", "nn.Parameter"),
    ("self.register_buffer('m', torch.zeros(n))", "register_buffer"),
    ("self.b = load_subproblem('a')(n)", "bind every subproblem class at module level"),
])
def test_building_anything_but_subproblems_in_init_is_a_violation(init_body, words):
    violations = _violations("return self.a(x)", init_body)
    assert any(words in v for v in violations), violations


def test_sizes_computed_in_init_are_allowed():
    assert _violations("return self.a(x)", "hidden = max(n * 4, 8)\n        self.a = A(hidden // 2)") == []


REINIT = "self.a = A(4)\n        for m in self.modules():\n            {body}"


@pytest.mark.parametrize("body", [
    "if isinstance(m, nn.Conv2d):\n                nn.init.kaiming_normal_(m.weight, mode='fan_out')\n"
    "                if m.bias is not None:\n                    nn.init.zeros_(m.bias)",
    "if isinstance(m, nn.Linear):\n                nn.init.uniform_(m.weight, -1 / math.sqrt(m.weight.size(1)), 1)",
    "if isinstance(m, nn.Conv2d):\n                torch.nn.init.normal_(m.weight, 0, nn.init.calculate_gain('relu'))",
])
def test_a_loop_that_re_initialises_what_the_top_level_built_is_pure(body):
    """MobileNetV2's own init loop, run after the subproblems are built: it only sets their weights."""
    assert _violations("return self.a(x)", REINIT.format(body=body)) == []


@pytest.mark.parametrize("init_body, words", [
    # Each writes or runs something besides a torch.nn.init function on an item.
    (REINIT.format(body="m.weight.data.copy_(torch.ones(4))"), "`m.weight.data.copy_(torch.ones(4))` does more"),
    (REINIT.format(body="nn.init.constant_(m.weight, torch.randn(1).item())"), "`torch.randn(1)` does more"),
    (REINIT.format(body="nn.init.zeros_(m(torch.ones(4)))"), "`m(torch.ones(4))` does more"),
    (REINIT.format(body="self.cache = m"), "`self.cache = m` does more"),
    (REINIT.format(body="m.reset_parameters()"), "`m.reset_parameters()` does more"),
    # The loop only over what the module holds, and nowhere but in the loop's header.
    ("self.a = A(4)\n        layers = list(self.modules())", "`self.modules()`"),
    ("self.a = A(4)\n        for m in self.modules(remove_duplicate=False):\n            pass", "no arguments"),
])
def test_anything_more_in_a_re_initialising_loop_is_a_violation(init_body, words):
    violations = _violations("return self.a(x)", init_body)
    assert any(words in v for v in violations), violations


def test_a_second_class_in_the_top_level_is_a_violation():
    source = "import torch.nn as nn\nclass Helper(nn.Module):\n    pass\nclass Model(nn.Module):\n    pass\n"
    assert any("defines class Helper" in v for v in top_level_violations(source))


def test_checks_run_in_a_worker_and_a_dead_worker_is_a_failed_check():
    config = RunConfig(trials=1, timeout=120)
    with WorkerPool(1) as pool:
        report = check_decomposition(PROBLEM, Decomposition.read(FIXTURES / "good"), pool, config)
    assert report.passed, report.reasons()
    assert report.wall_s > 0
    timed_out = report_from_outcome(JobOutcome(failure=JobFailure.TIMEOUT, reason="no result within 1 s"))
    assert not timed_out.passed
    assert timed_out.reasons() == ["equivalence: the checks did not finish: no result within 1 s"]


STATEFUL_SUBPROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.scale * self.calls


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return [8]
'''


def test_a_subproblem_whose_second_call_differs_fails_standalone(tmp_path):
    """Built once and called twice on the same inputs, as the verifier's reference is: a forward that keeps
    state between calls cannot be the reference of a kernel."""
    from mkevolve.problem import load_problem
    from mkevolve.verify.decomposition.worker import _Run

    path = tmp_path / "stateful.py"
    path.write_text(STATEFUL_SUBPROBLEM)
    run = _Run(PROBLEM, tmp_path, seed=0, trials=2, eval_mode=False)
    reason = run._run_standalone(load_problem(path))
    assert reason is not None and "two calls on the same inputs differ" in reason
    path.write_text(STATEFUL_SUBPROBLEM.replace("self.calls += 1", "pass"))
    assert run._run_standalone(load_problem(path)) is None


DROPOUT_SUBPROBLEM = STATEFUL_SUBPROBLEM.replace("self.calls += 1", "pass").replace(
    "return x * self.scale * self.calls", "return torch.nn.functional.dropout(x * self.scale, p=0.2, training=True)")


def test_a_subproblem_that_draws_passes_standalone_with_its_state_still_checked(tmp_path):
    """A training dropout is a subproblem of its own, kept as PyTorch code: each call starts from the same seed,
    so it draws the same mask twice. Unseeded it failed, and the problem lost its whole decomposition."""
    from mkevolve.problem import load_problem
    from mkevolve.verify.decomposition.worker import _Run

    path = tmp_path / "dropout.py"
    path.write_text(DROPOUT_SUBPROBLEM)
    run = _Run(PROBLEM, tmp_path, seed=0, trials=2, eval_mode=False)
    assert run._run_standalone(load_problem(path)) is None
    stateful = DROPOUT_SUBPROBLEM.replace("def forward(self, x):",
                                          "def forward(self, x):\n        self.scale.data += 1")
    path.write_text(stateful)
    reason = run._run_standalone(load_problem(path))
    assert reason is not None and "two calls on the same inputs differ" in reason


CONV_NORM_DROPOUT = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3)
        self.norm = nn.GroupNorm(4, 8)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x):
        return self.dropout(torch.clamp(self.norm(self.conv(x)), min=0.0, max=1.0))


def get_inputs():
    return [torch.rand(2, 3, 5, 6, 6)]


def get_init_inputs():
    return []
'''


def test_a_training_dropout_is_split_off_and_the_decomposition_passes(tmp_path):
    """level2/83's form: the convolution and the norm get subproblems of their own (and so kernels) beside the
    dropout, which stays PyTorch code."""
    import json
    import subprocess
    import sys

    problem = tmp_path / "conv_norm_dropout.py"
    problem.write_text(CONV_NORM_DROPOUT)
    done = subprocess.run([sys.executable, "-m", "mkevolve", "decompose", str(problem), "--out", str(tmp_path / "d"),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert not result["fallback"] and all(check["passed"] for check in result["checks"])
    assert any(s["name"] == "dropout" for s in result["subproblems"]) and len(result["subproblems"]) >= 2
