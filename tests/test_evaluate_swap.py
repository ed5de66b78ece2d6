"""`mkevolve eval` and `mkevolve swap` on a real run's best/: hand-written, PyTorch, broken and candidate swaps."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.evaluate import (
    evaluate_solution,
    open_solution,
    print_evaluation,
    resolve_problem,
    solution_config,
)
from mkevolve.pack import pack_solution
from mkevolve.solution import is_pytorch_alternative
from mkevolve.swap import print_outcome, resolve_replacement, swap_subkernel
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "gemm_chain.py"

# A linear layer written by hand for the run's `linear` subproblem (x: [8, 64] -> [8, 16]).
HAND_LINEAR = '''"""A hand-written linear layer: one program per block of rows, the whole reduction in one tl.dot."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_rows(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
    w = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=(cols[None, :] < N) & (ks[:, None] < K), other=0.0)
    b = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    y = tl.dot(x, w, input_precision="ieee") + b[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=(rows[:, None] < M) & (cols[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = x.contiguous()
        m, k = x.shape
        n = self.linear.out_features
        out = torch.empty((m, n), device=x.device, dtype=torch.float32)
        _linear_rows[(triton.cdiv(m, 16),)](x, self.linear.weight, self.linear.bias, out, m, n, k, BLOCK_M=16,
                                             BLOCK_N=max(16, triton.next_power_of_2(n)),
                                             BLOCK_K=max(16, triton.next_power_of_2(k)))
        return out
'''
BROKEN_LINEAR = HAND_LINEAR.replace("+ b[None, :]", "- b[None, :]")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["run", str(PROBLEM), "--iterations", "1", "--budget", "4", "--decompose-attempts", "1",
                 "--trials", "2", "--out", str(out)]) == 0
    (run,) = (out / "gemm_chain").iterdir()
    assert {p.stem for p in (run / "best" / "subkernel_problems").glob("*.py")} >= {"linear", "linear_gelu"}
    return run


@pytest.fixture(scope="module")
def verifier():
    """One verifier (and its warm workers) for the tests that call the library directly."""
    with Verifier(RunConfig(trials=2)) as shared:
        yield shared


@pytest.fixture
def best(run_dir, tmp_path) -> Path:
    """A fresh copy of the whole run (candidates included), so each test may change its best/."""
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run" / "best"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def swap(best: Path, name: str, spec: str, verifier):
    solution = open_solution(best)
    return swap_subkernel(best, name, resolve_replacement(solution, name, spec), PROBLEM, verifier)


@pytest.mark.slow
def test_eval_command_on_a_copy_elsewhere_passes_with_unknown_speedups(run_dir, tmp_path, capsys):
    moved = tmp_path / "somewhere" / "my_solution"
    shutil.copytree(run_dir / "best", moved)
    capsys.readouterr()
    assert main(["eval", str(moved), "--json", "--trials", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["device"] == "cpu"
    assert report["failing_locally"] == [] and report["end_to_end"]["status"] == "ok"
    assert {s["name"] for s in report["subkernels"]} == {"linear_gelu", "linear_relu_add", "linear"}
    for row in report["subkernels"]:
        assert row["kind"] == "triton" and row["status"] == "ok" and not row["edited"]
        assert row["max_abs_err"] < 1e-4
        assert row["error_vs_fp64"] <= 16 * row["eager_error_vs_fp64"]    # measured on any device
        assert row["speedup"] is None and row["share"] is None and row["contribution"] is None


def test_problem_moved_away_needs_the_problem_flag(run_dir, tmp_path, capsys):
    moved = tmp_path / "moved"
    shutil.copytree(run_dir / "best", moved)
    manifest = yaml.safe_load((moved / "manifest.yaml").read_text())
    manifest["problem"] = str(tmp_path / "gone.py")
    (moved / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    assert main(["eval", str(moved)]) == 2
    assert "--problem" in capsys.readouterr().err
    assert resolve_problem(open_solution(moved), str(PROBLEM)) == PROBLEM


def test_a_solution_is_checked_in_the_mode_its_manifest_records(run_dir, tmp_path):
    """A run records the module mode its checks ran in; eval and swap check in that mode unless told otherwise,
    and a packed file's header says it."""
    assert yaml.safe_load((run_dir / "best" / "manifest.yaml").read_text())["mode"] == "train"
    moved = tmp_path / "verified_in_eval"
    shutil.copytree(run_dir / "best", moved)
    manifest = yaml.safe_load((moved / "manifest.yaml").read_text())
    (moved / "manifest.yaml").write_text(yaml.safe_dump({**manifest, "mode": "eval"}))

    def mode_for(flag: bool | None) -> bool:
        args = argparse.Namespace(solution_dir=str(moved), config=None, eval_mode=flag)
        return solution_config(args)[0].eval_mode

    assert mode_for(None) is True
    assert mode_for(False) is False       # --no-eval: as asked
    assert "Verified in eval mode (module.eval()); the other mode is not verified." in pack_solution(moved).source


@pytest.mark.slow
def test_eval_names_the_subkernel_a_person_broke_by_hand(best, verifier, capsys):
    (best / "subkernel_implementations" / "linear.py").write_text(BROKEN_LINEAR)
    evaluation = evaluate_solution(best, PROBLEM, verifier)
    assert not evaluation.passed and evaluation.failing_locally == ["linear"]
    assert evaluation.subkernel("linear").status == "incorrect" and evaluation.subkernel("linear").edited
    capsys.readouterr()
    print_evaluation(evaluation)
    out = capsys.readouterr().out
    assert "failing locally: linear" in out
    assert "linear: incorrect: " in out and "edited since the manifest was written" in out
    assert "unknown" in out and "no GPU" in out


@pytest.mark.slow
def test_eval_says_when_every_subkernel_passes_but_end_to_end_fails(best, verifier):
    top = best / "decomposed_solution.py"
    source = top.read_text()
    assert "self.linear(y1)" in source, "the builtin decomposition of gemm_chain changed; update this edit"
    top.write_text(source.replace("self.linear(y1)", "self.linear(y0)"))
    evaluation = evaluate_solution(best, PROBLEM, verifier)
    assert not evaluation.passed and evaluation.failing_locally == []
    assert evaluation.diagnosis.startswith("every subkernel passes locally, but end to end fails")


@pytest.mark.slow
def test_swap_a_hand_written_file(best, tmp_path, verifier, capsys):
    old = (best / "subkernel_implementations" / "linear.py").read_text()
    mine = tmp_path / "my_linear.py"
    mine.write_text(HAND_LINEAR)
    outcome = swap(best, "linear", str(mine), verifier)
    assert outcome.accepted and outcome.local.passed and outcome.before.passed and outcome.after.passed
    capsys.readouterr()
    print_outcome(outcome, best)
    out = capsys.readouterr().out
    assert "swapped linear" in out and "end to end: ok, speedup unknown (no GPU) -> ok" in out
    assert (best / "subkernel_implementations" / "linear.py").read_text() == HAND_LINEAR
    (backup,) = (best / "backups").iterdir()
    assert backup == outcome.backup and backup.read_text() == old
    entry = yaml.safe_load((best / "manifest.yaml").read_text())["subkernels"]["linear"]
    assert entry["origin"] == "hand" and entry["candidate"] is None and entry["precision"] == "ieee"
    assert entry["sha256"] == hashlib.sha256(HAND_LINEAR.encode()).hexdigest()
    # the swapped-in kernel's own accuracy, and the solution's end to end, measured against fp64
    assert entry["error_vs_fp64"] <= 16 * entry["eager_error_vs_fp64"]
    manifest = yaml.safe_load((best / "manifest.yaml").read_text())
    assert manifest["error_vs_fp64"] == outcome.after.error_vs_fp64 is not None


@pytest.mark.slow
def test_swap_pytorch_then_eval_reports_it_as_pytorch(best, verifier):
    outcome = swap(best, "linear", "pytorch", verifier)
    assert outcome.accepted and outcome.local is None
    assert is_pytorch_alternative((best / "subkernel_implementations" / "linear.py").read_text())
    assert yaml.safe_load((best / "manifest.yaml").read_text())["subkernels"]["linear"]["origin"] == "pytorch"
    evaluation = evaluate_solution(best, PROBLEM, verifier)
    assert evaluation.passed
    linear = evaluation.subkernel("linear")
    assert linear.kind.value == "pytorch" and linear.passed_locally and not linear.edited


@pytest.mark.slow
def test_swap_command_refuses_a_broken_file_and_changes_nothing(best, tmp_path, capsys):
    before = snapshot(best)
    broken = tmp_path / "broken_linear.py"
    broken.write_text(BROKEN_LINEAR)
    capsys.readouterr()
    assert main(["swap", str(best), "linear", str(broken), "--trials", "2"]) == 1
    out = capsys.readouterr().out
    assert "swap of linear refused" in out and "incorrect" in out and "nothing changed" in out
    assert snapshot(best) == before


@pytest.mark.slow
def test_swap_a_saved_candidate_of_the_run(best, verifier):
    candidates = sorted((best.parent / "iterations").glob("iter_*/candidates/linear_gelu/c0001.py"))
    assert candidates, "the run should have tried a second linear_gelu candidate"
    assert swap(best, "linear_gelu", "c0001", verifier).accepted
    assert (best / "subkernel_implementations" / "linear_gelu.py").read_text() == candidates[-1].read_text()
    entry = yaml.safe_load((best / "manifest.yaml").read_text())["subkernels"]["linear_gelu"]
    assert entry["candidate"] == "c0001" and entry["origin"] == "builtin"


def test_bad_input_is_one_line_and_exit_2(best, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(best, bare)
    (bare / "manifest.yaml").unlink()
    assert main(["eval", str(bare)]) == 2
    assert main(["swap", str(best), "no_such_kernel", "pytorch"]) == 2
    assert main(["swap", str(best), "linear", "c0099"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3
    assert str(bare) in errors[0] and "--problem" in errors[0]
    assert "no subkernel 'no_such_kernel'" in errors[1] and "no candidate c0099" in errors[2]
