"""Decompose, Split, Fuse and TotalFuse: the builtin agent on the example problems, and recorded model replies
(through the replay provider) for the parsing, retry and fallback paths."""

import json
from pathlib import Path

import pytest
import yaml

from mkevolve.agents.decompose import decompose
from mkevolve.agents.fuse import fuse, total_fuse
from mkevolve.agents.split import split
from mkevolve.builtin.decomposer import trace_problem
from mkevolve.cli import main
from mkevolve.codebase import Decomposition
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import make_client
from mkevolve.llm.parse import extract_files
from mkevolve.workers.pool import WorkerPool

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "problems"
FIXTURES = Path(__file__).parent / "fixtures"
PROBLEM = FIXTURES / "decompositions" / "problem.py"
UNTRACEABLE = FIXTURES / "decompositions" / "untraceable.py"
REPLAY = FIXTURES / "replay"
EXAMPLES = sorted(p for p in PROBLEMS.glob("*.py"))


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2) as workers:
        yield workers


def _config(**values) -> RunConfig:
    return RunConfig(**{"trials": 2, "timeout": 120.0, **values})


def _replay(tmp_path: Path, entries: list[dict], **values):
    """A replay client over recorded replies (.md files), and the config that names it."""
    rows = [{"reply_file": str(REPLAY / entry.pop("reply")), **entry} for entry in entries]
    path = tmp_path / "replies.yaml"
    path.write_text(yaml.safe_dump({"replies": rows}))
    config = _config(model=f"replay:{path}", **values)
    return config, make_client(config)


def _attempts(events: EventLog) -> list[dict]:
    return events.of_kind("decomposition_attempt")


def test_there_are_at_least_ten_example_problems():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("problem", EXAMPLES, ids=[p.stem for p in EXAMPLES])
@pytest.mark.slow
def test_builtin_decomposes_each_example_into_checked_subproblems(problem, pool):
    config = _config(decompose_attempts=1, retries=0)
    decomposition, report = decompose(problem, config, make_client(config), pool)
    assert report.passed, report.reasons()
    assert not decomposition.fallback
    # one anchor and the elementwise chain after it stay one kernel; everything else is cut
    assert len(decomposition.subproblems) >= (1 if problem.stem in ONE_KERNEL_EXAMPLES else 2)
    assert decomposition.total_instances == sum(len(v) for v in report.instances.values())


ONE_KERNEL_EXAMPLES = {"conv_relu_bias"}


@pytest.mark.slow
def test_builtin_keeps_an_anchor_and_its_elementwise_epilogue_together(tmp_path, pool):
    """Conv2d + ReLU + bias is one kernel with a fused epilogue; with a reduction after it the module is cut."""
    config = _config(decompose_attempts=1, retries=0)
    together, _ = decompose(PROBLEMS / "conv_relu_bias.py", config, make_client(config), pool)
    assert len(together.subproblems) == 1
    with_reduction = tmp_path / "conv_relu_sum.py"
    with_reduction.write_text((PROBLEMS / "conv_relu_bias.py").read_text().replace(
        "return x + self.bias", "return (x + self.bias).sum(dim=1)"))
    assert ".sum(dim=1)" in with_reduction.read_text()
    cut, _ = decompose(with_reduction, config, make_client(config), pool)
    assert len(cut.subproblems) == 2


DROPOUT_BETWEEN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        x = torch.min(self.norm(x), torch.tensor(0.5, device=x.device))
        return self.dropout(x) * 2.0


def get_inputs():
    return [torch.randn(2, 4, 3, 3)]


def get_init_inputs():
    return [P]
'''


@pytest.mark.parametrize("p, eval_mode, groups", [(0.25, False, 3), (0.0, False, 1), (0.25, True, 1)])
def test_a_dropout_that_draws_is_a_subproblem_of_its_own(tmp_path, p, eval_mode, groups):
    """A training-mode dropout draws its mask from torch's random stream, which no kernel can reproduce: it is
    cut out, so the norm before it and the scaling after it still get kernels. A dropout that draws nothing
    (p = 0, or eval mode) stays in its group. The norm's group gets a builtin kernel either way."""
    from mkevolve.builtin.decomposer import decomposition_files
    from mkevolve.builtin.kernels.generate import analyse

    problem = tmp_path / "norm_dropout.py"
    problem.write_text(DROPOUT_BETWEEN.replace("[P]", f"[{p}]"))
    files = decomposition_files(problem, eval_mode)
    subproblems = sorted(name for name in files if name.startswith("subkernel_problems/"))
    assert len(subproblems) == groups
    if groups == 3:
        assert "subkernel_problems/dropout.py" in subproblems
        norm = next(name for name in subproblems if "groupnorm" in name)
        (tmp_path / "norm.py").write_text(files[norm])
        assert "train" in analyse(tmp_path / "norm.py").plans     # a kernel in training mode too


def test_builtin_traces_with_fx_and_falls_back_to_export_on_run_time_shapes():
    assert trace_problem(PROBLEMS / "gemm_chain.py").tracer == "fx"
    # int(c // head_dim) needs a concrete width: symbolic tracing fails, torch.export with real shapes works.
    assert trace_problem(PROBLEMS / "heads_export.py").tracer == "export"


def test_builtin_writes_one_file_per_repeated_pattern(pool):
    config = _config(decompose_attempts=1, retries=0)
    decomposition, _ = decompose(PROBLEMS / "repeated_mlp.py", config, make_client(config), pool)
    block = decomposition.subproblem("linear_relu")
    assert block.instances == 4
    assert "def get_input_configs():" in block.source
    assert [c.attribute for c in block.configs] == [f"linear_relu_{i}" for i in range(4)]


def test_builtin_falls_back_to_the_whole_module_when_it_cannot_trace(pool):
    config = _config(decompose_attempts=2, retries=1)
    events = EventLog()
    decomposition, report = decompose(UNTRACEABLE, config, make_client(config, events), pool, events)
    assert decomposition.fallback and report.passed
    assert decomposition.names == ["untraceable"]
    reasons = [r for a in _attempts(events) for r in a["reasons"]]
    assert reasons and all("cannot decompose this module" in r for r in reasons)
    assert events.of_kind("decomposition_result")[-1]["outcome"] == "fallback"


def test_builtin_split_fuse_and_total_fuse(pool):
    config = _config(decompose_attempts=1, retries=0)
    client = make_client(config)
    problem = PROBLEMS / "gemm_chain.py"
    decomposition, _ = decompose(problem, config, client, pool)
    assert decomposition.names == ["linear_gelu", "linear_relu_add", "linear"]

    halves = split(problem, decomposition, ["linear_gelu"], config, client, pool)
    assert "linear_gelu" not in halves.names and "gelu" in halves.names
    assert halves.total_instances == decomposition.total_instances + 1

    unchanged = split(problem, decomposition, ["linear"], config, client, pool)  # one op: no cut point
    assert unchanged is decomposition

    merged = fuse(problem, halves, config, client, pool)
    assert merged.total_instances == halves.total_instances - 1

    whole = total_fuse(problem, merged, config, client, pool)
    assert whole.fallback and whole.names == ["gemm_chain"] and whole.total_instances == 1


def test_a_failed_attempt_is_retried_with_its_reason_in_the_prompt(tmp_path, pool):
    config, client = _replay(tmp_path, [
        {"reply": "unparsable.md", "agent": "decompose"},
        # Matches only a prompt that quotes why the first reply was rejected.
        {"reply": "good.md", "agent": "decompose", "prompt_contains": "reply format: the reply has no"},
    ], decompose_attempts=1, retries=1)
    events = EventLog()
    decomposition, report = decompose(PROBLEM, config, client, pool, events)
    assert report.passed and not decomposition.fallback
    assert decomposition.names == ["linear_relu", "scale"]
    assert decomposition.subproblem("linear_relu").instances == 2
    first, second = _attempts(events)
    assert not first["passed"] and first["reasons"][0].startswith("reply format:")
    assert second["passed"] and second["round"] == 1


def test_when_every_attempt_fails_decompose_falls_back_and_says_why(tmp_path, pool):
    bad = ["wrong_rng_order.md", "math_in_top_level.md", "missing_input_configs.md"]
    entries = [{"reply": name, "agent": "decompose"} for name in bad]
    entries += [{"reply": name, "agent": "decompose", "prompt_contains": "Why your earlier attempts were rejected"}
                for name in bad]
    config, client = _replay(tmp_path, entries, decompose_attempts=3, retries=1)
    events = EventLog()
    decomposition, report = decompose(PROBLEM, config, client, pool, events)
    assert decomposition.fallback and report.passed
    assert decomposition.names == ["problem"]
    attempts = _attempts(events)
    assert len(attempts) == 6 and not any(a["passed"] for a in attempts)
    reasons = " ".join(r for a in attempts for r in a["reasons"])
    expected = ("equivalence: trial 0: the output differs", "purity: line",
                "init_coverage: linear_relu is instantiated 2 times")
    for words in expected:
        assert words in reasons


def test_a_repeated_reply_reuses_its_verdict(tmp_path, pool):
    config, client = _replay(tmp_path, [{"reply": "wrong_rng_order.md"}, {"reply": "wrong_rng_order.md"}],
                             decompose_attempts=1, retries=1)
    events = EventLog()
    decompose(PROBLEM, config, client, pool, events)
    first, second = _attempts(events)
    assert first["reasons"] == second["reasons"]
    assert first["check_s"] == second["check_s"]  # the same report: checked once


def test_each_rounds_first_new_reply_of_sound_structure_is_speculated_on_before_its_check(tmp_path, pool):
    """speculate (the run prepares the reply's subproblems) gets, per round, the first reply that passes the
    structure check and was not checked before, while no verdict is in yet; a reply without a loader is not
    run at all before its checks, and a reply seen in an earlier round is not given again."""
    no_loader = tmp_path / "no_loader.md"
    no_loader.write_text((REPLAY / "good.md").read_text().replace("def load_subproblem", "def not_the_loader"))
    config, client = _replay(tmp_path, [{"reply": str(no_loader)}, {"reply": "wrong_rng_order.md"},
                                        {"reply": "wrong_rng_order.md"}, {"reply": "good.md"}],
                             decompose_attempts=2, retries=1)
    events = EventLog()
    speculated = []

    def speculate(decomposition: Decomposition) -> None:
        speculated.append((decomposition.files(), len(_attempts(events))))

    decomposition, report = decompose(PROBLEM, config, client, pool, events, speculate=speculate)
    assert report.passed and [a["passed"] for a in _attempts(events)] == [False, False, False, True]
    rng_order = Decomposition.from_files(extract_files((REPLAY / "wrong_rng_order.md").read_text()))
    assert speculated == [(rng_order.files(), 0), (decomposition.files(), 2)]


def test_replayed_split_replaces_the_failing_subproblem(tmp_path, pool):
    previous = Decomposition.read(FIXTURES / "decompositions" / "good")
    config, client = _replay(tmp_path, [{"reply": "split_linear_relu.md", "agent": "split"}])
    result = split(PROBLEM, previous, ["linear_relu"], config, client, pool)
    assert result.names == ["linear", "relu", "scale"]
    assert result.subproblem("scale").source == previous.subproblem("scale").source
    assert result.subproblem("relu").instances == 2


def test_the_split_prompt_quotes_why_no_kernel_passed(tmp_path, pool):
    """The replayed reply answers only a prompt that carries the failed candidates' verdicts."""
    previous = Decomposition.read(FIXTURES / "decompositions" / "good")
    why = {"linear_relu": ["c0002: incorrect: output mismatch: max abs error 0.5"]}
    config, client = _replay(tmp_path, [{"reply": "split_linear_relu.md", "agent": "split",
                                         "prompt_contains": "linear_relu:\n- c0002: incorrect: output mismatch"}])
    assert split(PROBLEM, previous, ["linear_relu"], config, client, pool, why=why).names == ["linear", "relu",
                                                                                           "scale"]
    unanswered, _ = _replay(tmp_path, [{"reply": "split_linear_relu.md", "agent": "split",
                                        "prompt_contains": "## Why no kernel passed"}], retries=0)
    assert split(PROBLEM, previous, ["linear_relu"], unanswered, make_client(unanswered), pool) is previous


def test_a_split_that_fails_every_round_returns_the_previous_decomposition(tmp_path, pool):
    previous = Decomposition.read(FIXTURES / "decompositions" / "good")
    config, client = _replay(tmp_path, [{"reply": "unparsable.md"}, {"reply": "good.md"}], retries=1)
    events = EventLog()
    result = split(PROBLEM, previous, ["linear_relu"], config, client, pool, events)
    assert result is previous
    second = _attempts(events)[1]
    assert "linear_relu is still there" in second["reasons"][0]  # it passed the checks but split nothing


def test_replayed_fuse_and_total_fuse(tmp_path, pool):
    previous = Decomposition.read(FIXTURES / "decompositions" / "good")
    config, client = _replay(tmp_path, [{"reply": "fuse_tail.md", "agent": "fuse"},
                                        {"reply": "total_fuse.md", "agent": "total_fuse"},
                                        {"reply": "unparsable.md", "agent": "total_fuse"}], retries=0)
    fused = fuse(PROBLEM, previous, config, client, pool)
    assert fused.names == ["linear_relu", "linear_relu_scale"] and fused.total_instances == 2
    whole = total_fuse(PROBLEM, fused, config, client, pool)
    assert whole.names == ["whole"] and not whole.fallback
    fallback = total_fuse(PROBLEM, fused, config, client, pool)  # the reply is unusable: wrap the original
    assert fallback.fallback and fallback.names == ["problem"]


@pytest.mark.slow
def test_cli_decompose_prints_json_and_exits_by_outcome(tmp_path, capsys):
    code = main(["decompose", str(PROBLEMS / "gemm_scale_batchnorm.py"), "--out", str(tmp_path), "--json",
                 "--workers", "1", "--trials", "2"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["fallback"] is False
    assert [(s["name"], s["instances"]) for s in summary["subproblems"]] == [("linear_mul", 1), ("batchnorm1d", 1)]
    assert all(c["passed"] for c in summary["checks"]) and len(summary["checks"]) == 6
    out = tmp_path / "gemm_scale_batchnorm" / "decomposition"  # --out is the parent: OUT/<problem>/decomposition
    assert summary["dir"] == str(out) and Decomposition.read(out).names == ["linear_mul", "batchnorm1d"]

    code = main(["decompose", str(UNTRACEABLE), "--out", str(tmp_path / "u"), "--workers", "1", "--trials", "1"])
    assert code == 1
    assert "fallback" in capsys.readouterr().out

    assert main(["decompose", str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
