"""The guarded Swap at the end of a run: slow subkernels run their PyTorch code only when that does not
make the end-to-end result worse. Speedups cannot be measured on a CPU, so the verifier here reports
scripted speedups on top of its real verdicts (the composite with PyTorch alternatives is really checked)."""

import io
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.display import RunDisplay, RunView
from mkevolve.llm.client import make_client
from mkevolve.orchestrator import Orchestrator
from mkevolve.run_layout import BEST
from mkevolve.run_state import RunState, Step
from mkevolve.solution import ORIGIN_PYTORCH, Manifest, is_pytorch_alternative
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "gemm_chain.py"


class ScriptedSpeedVerifier(Verifier):
    """The real verifier, whose composite speedup is the scripted one (a CPU measures none)."""

    composite_speedup = 1.0

    def check_composite(self, problem_path, folder, pytorch=frozenset(), *, timed=True):
        result = super().check_composite(problem_path, folder, pytorch, timed=timed)
        self.swapped = set(pytorch)
        if result.passed:
            result.speedup = self.composite_speedup
        return result


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["run", str(PROBLEM), "--out", str(out), "--iterations", "1", "--budget", "3", "--trials", "2"]) == 0
    return next((out / PROBLEM.stem).iterdir())


def prepared(base_run: Path, tmp_path: Path, speedups: dict, e2e: float | None) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(base_run, run_dir)
    manifest = Manifest.read(run_dir / BEST)
    for name, entry in manifest.subkernels.items():
        entry.speedup = speedups.get(name)
    manifest.speedup = e2e
    manifest.write(run_dir / BEST)
    state = RunState.load(run_dir)
    state.step = Step.EVALUATED
    state.save(run_dir)
    return run_dir


def swap(run_dir: Path, composite_speedup: float, tau: float = 0.9) -> tuple[ScriptedSpeedVerifier, str]:
    config = replace(RunConfig(), swap=True, tau=tau, iterations=1, trials=2, workers=1)
    log = io.StringIO()
    display = RunDisplay(RunView(problem=PROBLEM.name, iterations=1), Console(file=log, width=200))
    with ScriptedSpeedVerifier(config) as verifier:
        verifier.composite_speedup = composite_speedup
        verifier.swapped = set()
        Orchestrator(PROBLEM, config, run_dir, RunState.load(run_dir), make_client(config), verifier,
                     display).run()
    return verifier, log.getvalue()


def names(base_run: Path) -> list[str]:
    return list(Manifest.read(base_run / BEST).subkernels)


@pytest.mark.slow
def test_slow_subkernel_is_swapped_when_end_to_end_does_not_get_worse(base_run, tmp_path):
    slow, *fast = names(base_run)
    run_dir = prepared(base_run, tmp_path, {slow: 0.5, **{n: 1.3 for n in fast}}, e2e=1.0)
    verifier, log = swap(run_dir, composite_speedup=1.1)
    assert verifier.swapped == {slow}
    manifest = Manifest.read(run_dir / BEST)
    assert manifest.subkernels[slow].origin == ORIGIN_PYTORCH and manifest.speedup == 1.1
    assert all(manifest.subkernels[n].origin == "builtin" for n in fast)
    assert is_pytorch_alternative((run_dir / BEST / "subkernel_implementations" / f"{slow}.py").read_text())
    assert "now run PyTorch" in log and RunState.load(run_dir).step is Step.FINISHED


@pytest.mark.slow
def test_swap_that_makes_things_worse_is_undone(base_run, tmp_path):
    slow, *fast = names(base_run)
    run_dir = prepared(base_run, tmp_path, {slow: 0.5, **{n: 1.3 for n in fast}}, e2e=1.0)
    before = (run_dir / BEST / "subkernel_implementations" / f"{slow}.py").read_text()
    verifier, log = swap(run_dir, composite_speedup=0.8)
    assert verifier.swapped == {slow} and "undone" in log
    assert (run_dir / BEST / "subkernel_implementations" / f"{slow}.py").read_text() == before
    assert Manifest.read(run_dir / BEST).subkernels[slow].origin == "builtin"


@pytest.mark.parametrize("speedups, fragment", [
    ("all_slow", "every subkernel is slower than tau"),
    ("all_fast", "every subkernel is at least 0.9"),
    ("unknown", "subkernel speedups are unknown"),
])
def test_swap_is_skipped_with_a_reason(base_run, tmp_path, speedups, fragment):
    all_names = names(base_run)
    values = {"all_slow": 0.5, "all_fast": 1.2, "unknown": None}[speedups]
    run_dir = prepared(base_run, tmp_path, {n: values for n in all_names}, e2e=1.0)
    verifier, log = swap(run_dir, composite_speedup=2.0)
    assert verifier.swapped == set() and f"swap skipped: {fragment}" in log
