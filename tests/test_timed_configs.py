"""A subproblem with many instance shapes is checked at every shape and timed at the largest few: the speedup
compares the candidate and torch.compile over the same configs."""

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from mkevolve.problem import load_problem
from mkevolve.verify import correctness, reference
from mkevolve.verify.result import EvalResult, Status, Timing

MANY_SHAPES = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.scale = width

    def forward(self, x):
        return x * self.scale


def get_input_configs():
    # widths 3, 9, 5, 7, 1, 8: inputs of 2 x width floats
    return [{"get_init_inputs": (lambda w=w: [w]), "get_inputs": (lambda w=w: [torch.randn(2, w)])}
            for w in (3, 9, 5, 7, 1, 8)]


def get_inputs():
    return get_input_configs()[0]["get_inputs"]()


def get_init_inputs():
    return get_input_configs()[0]["get_init_inputs"]()
'''


def _references(tmp_path):
    path = tmp_path / "many_shapes.py"
    path.write_text(MANY_SHAPES)
    problem = load_problem(path)
    return [reference.reference_set(tmp_path / "cache", problem, i, 0, False, torch.device("cpu"))
            for i in range(len(problem.configs))]


def test_the_configs_with_the_largest_inputs_are_the_ones_timed(tmp_path):
    assert correctness.MAX_TIMED_CONFIGS == 4
    assert correctness._configs_to_time(_references(tmp_path), trials=3) == [1, 2, 3, 5]      # widths 9, 5, 7, 8


def test_a_few_configs_are_all_timed(tmp_path):
    references = _references(tmp_path)[:3]
    assert correctness._configs_to_time(references, trials=3) == [0, 1, 2]


def test_choosing_builds_each_reference_model_once_and_timing_adds_one_per_timed_config(tmp_path, monkeypatch):
    references = _references(tmp_path)
    built = []
    original = reference.ReferenceSet.build_model

    def counting(self):
        built.append(self.config_index)
        return original(self)

    monkeypatch.setattr(reference.ReferenceSet, "build_model", counting)
    timed = correctness._configs_to_time(references, trials=3)
    assert sorted(built) == list(range(6))
    for index, reference_set in enumerate(references):     # what _judge asks for next
        plan = correctness.plan_calls(3, index in timed, True, correctness.random.Random(index))
        reference_set.ensure(plan.set_names())
    assert sorted(built) == sorted(list(range(6)) + timed)


def test_the_speedup_covers_the_timed_configs_on_both_sides(tmp_path):
    references = _references(tmp_path)
    baselines = [Timing(*[ms] * 5, runs=100) for ms in (10.0, 30.0)]       # configs 1 and 3
    report = SimpleNamespace(times_ms=[[], [5.0] * 3, [], [10.0] * 3, [], []])     # configs 1 and 3 timed
    result = EvalResult(status=Status.OK)
    correctness._add_timing(references, report, result, [1, 3], baselines)
    assert result.speedup == (10.0 + 30.0) / (5.0 + 10.0)
    assert result.timed_configs == [1, 3]
    assert "over the 2 largest input configs" in result.summary()


def test_the_baseline_is_timed_before_the_candidate_starts(tmp_path, monkeypatch):
    """A candidate can let go of its GPU share, or launch from a thread while its harness times; a
    baseline timed beside it would be slowed and its speedup raised. So a timed job gets its subproblem's
    baseline before its candidate process starts, even when the candidate then fails."""
    order = []

    @contextmanager
    def in_use():
        yield

    fake_reference = SimpleNamespace(in_use=in_use, ensure=lambda names, inputs_only=(): order.append("reference"),
                                     mutated_buffers=lambda: [], written_inputs=lambda: [])
    monkeypatch.setattr(correctness, "device", lambda: torch.device("cuda"))
    monkeypatch.setattr(correctness, "reference_set", lambda *args: fake_reference)
    monkeypatch.setattr(correctness, "_configs_to_time", lambda references, trials: [0])
    monkeypatch.setattr(correctness, "_baseline", lambda *args: order.append("baseline") or Timing(*[1.0] * 5, runs=20))
    monkeypatch.setattr(correctness, "run_candidate_process",
                        lambda *args: order.append("candidate") or SimpleNamespace(phases={}))

    def verdict(*args):
        raise correctness.Rejected(Status.INCORRECT, "trial 0: output mismatch")

    monkeypatch.setattr(correctness, "_verdict", verdict)
    problem = SimpleNamespace(configs=[None])
    request = correctness.KernelEvalRequest(problem_path="p.py", solution_path="s.py", cache_dir=str(tmp_path))
    with pytest.raises(correctness.Rejected):
        correctness._judge(problem, request, correctness._Errors())
    assert order == ["reference", "baseline", "candidate"]
