"""The run end to end with the builtin agent: a verified best/, resume after interruption at every
checkpoint and after a hard kill, a clear error for a corrupted state.json, and the guarded Swap."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.orchestrator import Orchestrator
from mkevolve.run_layout import BEST
from mkevolve.run_state import RunState, Step
from mkevolve.solution import Manifest
from mkevolve.verify.result import EvalResult, Status, Timing
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "gemm_chain.py"
RUN_ARGS = ["--iterations", "2", "--budget", "3", "--workers", "2", "--trials", "2"]


def run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in (out / PROBLEM.stem).iterdir() if p.is_dir())


def fingerprint(run_dir: Path) -> dict:
    """What must be identical between an interrupted-and-resumed run and an uninterrupted one."""
    manifest = Manifest.read(run_dir / BEST)
    state = RunState.load(run_dir)
    return {
        "solution": (run_dir / BEST / "decomposed_solution.py").read_text(),
        "kernels": {n: (e.candidate, e.sha256) for n, e in manifest.subkernels.items()},
        "status": manifest.status, "iteration": manifest.iteration,
        "history": [(r.index, r.refinement, r.subproblems, r.budget, r.e2e_status) for r in state.history],
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["run", str(PROBLEM), "--out", str(out)] + RUN_ARGS) == 0
    return run_dirs(out)[0]


def test_builtin_run_leaves_the_documented_layout(finished_run):
    for name in ("config.yaml", "state.json", "events.jsonl", "iterations/iter_00/decomposed_problem.py",
                 "iterations/iter_01/decomposed_solution.py", "best/decomposed_solution.py",
                 "best/manifest.yaml"):
        assert (finished_run / name).exists(), name
    state = RunState.load(finished_run)
    assert state.step is Step.FINISHED and state.iteration == 2 and len(state.history) == 2
    candidates = list((finished_run / "iterations" / "iter_01" / "candidates").rglob("c*.json"))
    assert candidates and all("parent" in json.loads(c.read_text()) for c in candidates)
    events = [json.loads(line) for line in (finished_run / "events.jsonl").read_text().splitlines()]
    assert {"decomposition", "budget", "iteration", "checkpoint", "verdict"} <= {e["kind"] for e in events}
    # The run's own span: its process's startup first, its closing (workers stopped, report written) last.
    assert events[0]["kind"] == "run_started" and events[0]["startup_s"] > 0
    assert events[-1]["kind"] == "run_finished" and events[-1]["closing_s"] >= 0


def test_the_manifest_records_each_kernel_s_error_against_fp64_beside_eager_s(finished_run):
    """What a user reads to trust the numbers: per subkernel and end to end, the largest error against the
    problem run in fp64, next to eager fp32's on the same inputs (verify.correctness's measured precision)."""
    manifest = Manifest.read(finished_run / BEST)
    measured = [manifest] + [e for e in manifest.subkernels.values() if e.status.value == "ok"]
    for entry in measured:
        assert entry.error_vs_fp64 is not None and entry.eager_error_vs_fp64 is not None
        assert entry.error_vs_fp64 <= 16 * max(entry.eager_error_vs_fp64, 1e-8)


def test_a_single_subkernel_takes_its_time_from_the_end_to_end_check():
    orchestrator = Orchestrator.__new__(Orchestrator)
    orchestrator.verifier = SimpleNamespace(run_jobs=lambda jobs: pytest.fail("a profiling process was started"))
    one = SimpleNamespace(names=["linear_relu"])
    timed = EvalResult(status=Status.OK, runtime=Timing(2.5, 2.4, 2.4, 2.6, 2.7, 20))
    assert orchestrator._profile(Path("."), one, timed) == {"linear_relu": 2.5}
    assert orchestrator._profile(Path("."), one, EvalResult(status=Status.OK)) == {}     # not timed (no GPU)


def test_no_profile_is_started_once_the_time_budget_is_spent():
    orchestrator = Orchestrator.__new__(Orchestrator)
    orchestrator.verifier = SimpleNamespace(run_jobs=lambda jobs: pytest.fail("a profiling process was started"))
    orchestrator.deadline, orchestrator.events = time.monotonic() - 1.0, EventLog()
    timed = EvalResult(status=Status.OK, runtime=Timing(2.5, 2.4, 2.4, 2.6, 2.7, 20))
    assert orchestrator._profile(Path("."), SimpleNamespace(names=["conv", "bn"]), timed) == {}
    assert [e["kind"] for e in orchestrator.events.events] == ["profile_skipped"]


@pytest.mark.parametrize("workers, sent", [(2, True), (1, False)])
def test_a_replys_subproblems_are_prepared_while_it_is_checked_when_a_worker_is_to_spare(workers, sent):
    """The decompose agent's speculate hook: every subproblem file of the reply goes to prepare_sources, by
    its relative path; with one worker, which the decomposition's check needs, nothing is sent."""
    from mkevolve.codebase import Decomposition, SubproblemSpec

    calls = []
    orchestrator = Orchestrator.__new__(Orchestrator)
    orchestrator.verifier = SimpleNamespace(executor=SimpleNamespace(size=workers),
                                            prepare_sources=lambda files, grace_s: calls.append(files))
    reply = Decomposition("top", [SubproblemSpec("gemm_relu", "G = 1\n"), SubproblemSpec("scale", "S = 2\n")])
    orchestrator._prepare_subproblems_ahead(reply)
    expected = [{"subkernel_problems/gemm_relu.py": "G = 1\n", "subkernel_problems/scale.py": "S = 2\n"}]
    assert calls == (expected if sent else [])


def test_manifest_describes_every_subkernel(finished_run):
    manifest = Manifest.read(finished_run / BEST)
    on_gpu = torch.cuda.is_available()
    assert manifest.status == "ok" and (manifest.speedup is not None) == on_gpu
    assert (manifest.device == "cpu") != on_gpu
    assert len(manifest.subkernels) >= 2
    for name, entry in manifest.subkernels.items():
        assert entry.origin == "builtin" and len(entry.sha256) == 64
        assert entry.precision in ({"ieee", "tf32x3"} if on_gpu else {"ieee"})
        assert (finished_run / BEST / "subkernel_implementations" / f"{name}.py").is_file()


@pytest.mark.slow
def test_best_is_verified_and_self_contained(finished_run, tmp_path):
    moved = tmp_path / "elsewhere" / "copy_of_best"
    shutil.copytree(finished_run / BEST, moved)
    with Verifier(RunConfig(workers=1, trials=2)) as verifier:
        result = verifier.check_composite(PROBLEM, moved)
    assert result.passed, result.reason
    assert result.launches >= len(Manifest.read(moved).subkernels)


def test_budget_calls_add_up_per_iteration(finished_run):
    """Every call of the budget is given, except to subproblems whose kernel passes where nothing is timed
    (refine needs timings): when all of them have one, the iteration gives none."""
    events = [json.loads(line) for line in (finished_run / "events.jsonl").read_text().splitlines()]
    skipped = {e["iteration"]: set(e["subproblems"]) for e in events if e["kind"] == "refine_skipped"}
    assert (not skipped) == torch.cuda.is_available()
    for record in RunState.load(finished_run).history:
        settled = skipped.get(record.index, set())
        assert all(record.budget[n] == 0 for n in settled)
        assert sum(record.budget.values()) == (0 if settled == set(record.subproblems) else 3)


class Interrupt(KeyboardInterrupt):
    """Raised from a checkpoint, exactly as Ctrl-C arriving right after it."""


@pytest.mark.slow
def test_resume_after_interrupt_at_every_phase_matches(tmp_path, monkeypatch, finished_run):
    """Stop at the first checkpoint of every phase (mid-evolution included), resume, compare."""
    reference = fingerprint(finished_run)
    out = tmp_path / "runs"
    real_save = RunState.save
    for stop_at in range(1, 20):
        phases: list[tuple] = []

        def save(self, run_dir, stop_at=stop_at, phases=phases):
            real_save(self, run_dir)
            phase = (self.iteration, self.step.value, bool(self.evolved))
            if phase not in phases:
                phases.append(phase)
                if len(phases) == stop_at:
                    raise Interrupt

        monkeypatch.setattr(RunState, "save", save)
        code = main(["run", str(PROBLEM), "--out", str(out)] + RUN_ARGS)
        monkeypatch.setattr(RunState, "save", real_save)
        run_dir = run_dirs(out)[-1]
        if code == 0:  # the run finished before the stop point: every phase has been tried
            assert stop_at > 8
            break
        assert code == 130
        assert main(["run", "--resume", str(run_dir)]) == 0
        assert fingerprint(run_dir) == reference, f"resume after phase {phases[-1]} differs"
        shutil.rmtree(run_dir)
    else:
        pytest.fail("the run never finished")


@pytest.mark.slow
def test_resume_after_hard_kill(tmp_path, finished_run):
    out = tmp_path / "runs"
    command = [sys.executable, "-m", "mkevolve", "run", str(PROBLEM), "--out", str(out)] + RUN_ARGS
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    for line in proc.stdout:
        if "evolving" in line and "iteration 1" in line:
            break
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_dir = run_dirs(out)[-1]
    assert RunState.load(run_dir).step is not Step.FINISHED
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert fingerprint(run_dir) == fingerprint(finished_run)


@pytest.mark.slow
def test_resume_with_more_iterations_extends_a_finished_run(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    assert main(["run", "--resume", str(run_dir), "--iterations", "3"]) == 0
    state = RunState.load(run_dir)
    assert state.step is Step.FINISHED and [r.index for r in state.history] == [1, 2, 3]
    assert "iterations: 3" in (run_dir / "config.yaml").read_text()


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "corrupted state"),
    (json.dumps({"version": 99}), "state version 99"),
    (json.dumps({"version": 1, "problem": "p.py"}), "corrupted state"),
])
def test_corrupted_state_is_a_clear_error(tmp_path, capsys, content, fragment):
    (tmp_path / "state.json").write_text(content)
    assert main(["run", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "state.json" in err and len(err.splitlines()) == 1


def test_resume_of_a_folder_without_state(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "no state.json here" in capsys.readouterr().err


def test_bad_problem_exits_2_before_any_run(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n")
    assert main(["run", str(bad), "--out", str(tmp_path / "runs")]) == 2
    assert "defines no class named Model" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_subproblems_evolve_at_the_same_time(finished_run):
    """Each subproblem's search (its first call to its beam's verdict) overlaps another's: they are
    independent, so one waits for its checks while another's run."""
    events = [json.loads(line) for line in (finished_run / "events.jsonl").read_text().splitlines()]
    first_beam = next(i for i, e in enumerate(events) if e["kind"] == "beam")
    spans = {}
    for event in events[:first_beam + 1]:
        name = event.get("subproblem")
        if event["kind"] == "llm_call" and name and name != "None":
            spans.setdefault(name, [event["t"], None])
        if event["kind"] == "beam":
            spans[name][1] = event["t"]
    started = [span[0] for span in spans.values()]
    ended_first = spans[events[first_beam]["subproblem"]][1]
    assert len(spans) >= 2 and sorted(started)[1] < ended_first
