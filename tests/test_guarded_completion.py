"""Guarded completion: a subproblem without an accepted kernel keeps its own PyTorch code, so a run still
ends with a verified best/ and says it is partial.

The problem (fixtures/guarded/logcumsumexp_tail.py) is logcumsumexp(relu(linear(x)), dim=1). The builtin
decomposer cuts it into linear and relu_logcumsumexp; the builtin generator has no kernel for logcumsumexp. Two
iterations,
--refine-every 2:
  1  linear gets its kernel; relu_logcumsumexp is declined before any call; its PyTorch code stands in: best/,
     partial 1 of 2
  2  Split of the failing relu_logcumsumexp into relu and logcumsumexp; relu gets its kernel, logcumsumexp is
     declined: best/, partial 2 of 3

Then: --swap on that partial best/, the ranking that puts a solution entirely in Triton first, a partial
composite that fails end to end and falls back to fewer Triton kernels (replayed replies), and a problem
with no kernel at all.
"""

import io
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest
from rich.console import Console

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.display import RunDisplay, RunView
from mkevolve.evaluate import SubkernelKind, evaluate_solution
from mkevolve.llm.client import make_client
from mkevolve.orchestrator import Orchestrator, solution_rank
from mkevolve.run_layout import BEST
from mkevolve.run_state import IterationRecord, RunState, Step
from mkevolve.solution import ORIGIN_PYTORCH, Manifest, is_pytorch_alternative
from mkevolve.verify.verifier import Verifier

PROBLEM = Path(__file__).resolve().parent / "fixtures" / "guarded" / "logcumsumexp_tail.py"
DECLINE = "the builtin generator has no kernel for: torch.logcumsumexp"


class Run(NamedTuple):
    dir: Path
    code: int
    stdout: str


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("runs")
    capture = pytest.MonkeyPatch()  # capsys is per test; the run is made once for the module
    buffer = io.StringIO()
    capture.setattr(sys, "stdout", buffer)
    try:
        code = main(["run", str(PROBLEM), "--out", str(out), "--iterations", "2", "--refine-every", "2",
                     "--budget", "4", "--workers", "2", "--trials", "2"])
    finally:
        capture.undo()
    (run_dir,) = (out / PROBLEM.stem).iterdir()
    return Run(run_dir, code, buffer.getvalue())


def events(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in rows if e["kind"] == kind]


def test_a_run_with_an_unwritable_subproblem_ends_with_a_partial_best(partial_run):
    assert partial_run.code == 0
    manifest = Manifest.read(partial_run.dir / BEST)
    assert list(manifest.subkernels) == ["linear", "relu", "logcumsumexp"]
    scan = manifest.subkernels["logcumsumexp"]
    assert (scan.origin, scan.status, scan.candidate, scan.reason) == (ORIGIN_PYTORCH, "pytorch", None, DECLINE)
    assert all(manifest.subkernels[n].origin == "builtin" for n in ("linear", "relu"))
    implementations = partial_run.dir / BEST / "subkernel_implementations"
    assert is_pytorch_alternative((implementations / "logcumsumexp.py").read_text())
    assert manifest.coverage.pytorch == ["logcumsumexp"] and manifest.status == "ok"


def test_the_summary_says_partial_last(partial_run):
    lines = [line.strip() for line in partial_run.stdout.splitlines() if line.strip()]
    assert lines[-1] == "partial: 2 of 3 in Triton (logcumsumexp runs PyTorch code)"
    assert f"logcumsumexp: PyTorch code: {DECLINE}" in lines
    report = (partial_run.dir / "report.html").read_text()
    assert "partial: 2 of 3 in Triton" in report
    assert f"logcumsumexp runs its subproblem&#39;s PyTorch code, not a Triton kernel: {DECLINE}." in report


@pytest.mark.slow
def test_partial_best_verifies_again_and_eval_says_what_runs_pytorch(partial_run):
    with Verifier(RunConfig(workers=1, trials=2)) as verifier:
        undeclared = verifier.check_composite(PROBLEM, partial_run.dir / BEST)
        evaluation = evaluate_solution(partial_run.dir / BEST, PROBLEM, verifier)
    assert not undeclared.passed and "logcumsumexp" in undeclared.reason  # the PyTorch file is trusted only if declared
    assert evaluation.passed, evaluation.diagnosis
    assert evaluation.coverage.line() == "partial: 2 of 3 in Triton (logcumsumexp runs PyTorch code)"
    logcumsumexp = evaluation.subkernel("logcumsumexp")
    assert logcumsumexp.kind is SubkernelKind.PYTORCH and logcumsumexp.reason == DECLINE
    assert [evaluation.subkernel(n).status for n in ("linear", "relu")] == ["ok", "ok"]


def test_every_iteration_composes_and_the_failing_subproblem_is_split(partial_run):
    history = RunState.load(partial_run.dir).history
    assert [(r.refinement, r.subproblems, r.pytorch, r.e2e_status, r.kept) for r in history] == [
        ("none", ["linear", "relu_logcumsumexp"], ["relu_logcumsumexp"], "ok", True),
        ("split", ["linear", "relu", "logcumsumexp"], ["logcumsumexp"], "ok", True),
    ]
    assert history[0].subkernels["relu_logcumsumexp"].reason == DECLINE
    splits = [e["subproblem"] for e in events(partial_run.dir, "llm_call") if e["agent"] == "split"]
    assert splits == ["relu_logcumsumexp"]


def test_a_declined_subproblem_costs_no_call(partial_run):
    kernel_calls = [e["subproblem"] for e in events(partial_run.dir, "llm_call")
                    if e["agent"] in ("generate", "debug", "refine")]
    assert "relu_logcumsumexp" not in kernel_calls and "logcumsumexp" not in kernel_calls
    assert {"linear", "relu"} <= set(kernel_calls)
    declined = {e["subproblem"]: (e["calls"], e["exhausted"]) for e in events(partial_run.dir, "beam")
                if e["exhausted"]}
    assert declined == {"relu_logcumsumexp": (0, DECLINE), "logcumsumexp": (0, DECLINE)}
    assert not (partial_run.dir / "iterations" / "iter_01" / "candidates" / "relu_logcumsumexp").exists()


def _record(index: int, speedup: float | None, pytorch: list[str], status: str = "ok") -> IterationRecord:
    return IterationRecord(index=index, refinement="none", subproblems=["a", "b"], budget={}, subkernels={},
                           e2e_status=status, e2e_speedup=speedup, pytorch=pytorch)


def test_a_solution_entirely_in_triton_outranks_a_faster_partial_one():
    complete, partial = _record(2, 0.5, []), _record(1, 2.0, ["b"])
    assert solution_rank(complete) > solution_rank(partial)
    assert solution_rank(_record(2, None, [])) > solution_rank(_record(1, None, ["b"]))  # CPU: no speeds
    assert solution_rank(_record(3, 3.0, ["b"])) > solution_rank(partial)
    assert solution_rank(_record(4, None, [], status="incorrect")) is None


class SpeedVerifier(Verifier):
    """The real verifier with a scripted end-to-end speedup (a CPU measures none); records what it trusted."""

    def check_composite(self, problem_path, folder, pytorch=frozenset(), *, timed=True):
        result = super().check_composite(problem_path, folder, pytorch, timed=timed)
        self.declared = set(pytorch)
        result.speedup = 1.2 if result.passed else None
        return result


@pytest.mark.slow
def test_swap_of_a_partial_best_considers_only_its_triton_subkernels(partial_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(partial_run.dir, run_dir)
    manifest = Manifest.read(run_dir / BEST)
    manifest.subkernels["linear"].speedup, manifest.subkernels["relu"].speedup, manifest.speedup = 0.5, 1.3, 1.0
    manifest.write(run_dir / BEST)
    state = RunState.load(run_dir)
    state.step = Step.EVALUATED
    state.save(run_dir)
    config = replace(RunConfig(), swap=True, tau=0.9, iterations=2, trials=2, workers=1)
    display = RunDisplay(RunView(problem=PROBLEM.name, iterations=2), Console(file=io.StringIO(), width=200))
    with SpeedVerifier(config) as verifier:
        Orchestrator(PROBLEM, config, run_dir, RunState.load(run_dir), make_client(config), verifier, display).run()
    assert verifier.declared == {"linear", "logcumsumexp"}  # the PyTorch code already there stays declared
    swapped = Manifest.read(run_dir / BEST)
    assert swapped.coverage.pytorch == ["linear", "logcumsumexp"] and swapped.speedup == 1.2
    assert swapped.subkernels["logcumsumexp"].reason == DECLINE and "below tau" in swapped.subkernels["linear"].reason


@pytest.mark.slow
def test_a_composite_that_fails_end_to_end_falls_back_to_pytorch_until_it_passes(tmp_path, capsys):
    """Guarded integration: halve has no kernel; scale's and squash's pass locally, and the composite fails
    (squash is wrong beyond its own inputs). Keeping the first half of them by speedup (scale; no speedups on
    a CPU, so the decomposition's order) passes: a verified partial best/ with squash reverted."""
    replay_run = PROBLEM.parent.parent / "replay_run"
    script = PROBLEM.parent / "partial_composite_fails.yaml"
    code = main(["run", str(replay_run / "sharp_sigmoid.py"), "--out", str(tmp_path), "--model", f"replay:{script}",
                 "--iterations", "1", "--budget", "3", "--beam-width", "1", "--decompose-attempts", "1",
                 "--retries", "0", "--workers", "2", "--trials", "5"])
    out = capsys.readouterr().out
    (run_dir,) = (tmp_path / "sharp_sigmoid").iterdir()
    (record,) = RunState.load(run_dir).history
    assert "every Triton subkernel passes locally but the composite fails end to end: incorrect" in out
    assert code == 0 and (run_dir / BEST).exists() and record.e2e_status == "ok" and record.kept
    manifest = Manifest.read(run_dir / BEST)
    assert set(record.pytorch) == {"halve", "squash"} and set(manifest.coverage.pytorch) == {"halve", "squash"}
    assert "reverted to its PyTorch code" in record.subkernels["squash"].reason
    assert record.subkernels["squash"].candidate is None and record.subkernels["scale"].candidate is not None
    assert "guarded fallback with Triton for scale: ok" in out
    assert RunState.load(run_dir).needs_total_fuse  # the next iteration would TotalFuse, as without PyTorch


@pytest.mark.slow
def test_a_run_with_no_kernel_at_all_still_ends_with_a_verified_pytorch_best(tmp_path, capsys):
    problem = tmp_path / "scan_only.py"
    problem.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                       "    def forward(self, x):\n        return torch.logcumsumexp(x, dim=1)\n\n\n"
                       "def get_inputs():\n    return [torch.randn(4, 8)]\n\n\n"
                       "def get_init_inputs():\n    return []\n")
    code = main(["run", str(problem), "--out", str(tmp_path / "runs"), "--iterations", "1", "--budget", "2",
                 "--workers", "1", "--trials", "2"])
    out = capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs" / "scan_only").iterdir()
    # Every subkernel is declared PyTorch: the composite launches no Triton kernel and is still verified.
    assert code == 0 and (run_dir / BEST).exists()
    manifest = Manifest.read(run_dir / BEST)
    assert [e.origin for e in manifest.subkernels.values()] == [ORIGIN_PYTORCH]
    assert "partial: 0 of 1 in Triton (logcumsumexp runs PyTorch code)" in out
    assert DECLINE in out
    assert {e["agent"] for e in events(run_dir, "llm_call")} == {"decompose"}  # no kernel request

@pytest.mark.slow
def test_a_spent_time_budget_stops_the_run_with_a_verified_best(tmp_path, capsys):
    """--time-budget: spent before the first search (decomposing takes longer), so no kernel request is made,
    no second iteration starts, and the iteration's composite still ends verified, every subproblem as PyTorch."""
    gemm_chain = Path(__file__).resolve().parents[1] / "problems" / "gemm_chain.py"
    code = main(["run", str(gemm_chain), "--out", str(tmp_path / "runs"), "--iterations", "3", "--budget", "3",
                 "--workers", "1", "--trials", "2", "--time-budget", "0.001"])
    out = capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs" / "gemm_chain").iterdir()
    state = RunState.load(run_dir)
    assert code == 0 and state.step is Step.FINISHED and state.iteration == 1
    assert state.stop == "the time budget of 0.001 s is spent"
    assert "the time budget of 0.001 s is spent: searches asked for no further batch" in out
    assert {e["agent"] for e in events(run_dir, "llm_call")} == {"decompose"}  # no kernel request
    manifest = Manifest.read(run_dir / BEST)
    assert manifest.status == "ok" and {e.origin for e in manifest.subkernels.values()} == {ORIGIN_PYTORCH}


def test_a_search_past_its_deadline_asks_for_nothing(tmp_path):
    from mkevolve.agents.evolve import evolve_kernel
    from mkevolve.search.beam import Beam

    beam = Beam(width=2)
    # No agent is made: the verifier and the client would fail at their first use.
    evolved = evolve_kernel("linear", PROBLEM, beam, 4, verifier=None, client=None, config=RunConfig(),
                            candidates_dir=tmp_path, deadline=0.0)
    assert evolved is not beam and evolved.members == [] and evolved.next_seq == beam.next_seq
