"""Autotune choices remembered across candidate processes: what a report may add to the store, and what a
remembered choice does to the next process (mkevolve/verify/autotune_memory.py)."""

import json
import os
from pathlib import Path

import pytest
import torch
import triton
from triton.runtime.autotuner import Autotuner

from mkevolve.config import RunConfig
from mkevolve.problem import import_file
from mkevolve.verify import autotune_memory, triton_warm
from mkevolve.verify.candidate_run import parse_report
from mkevolve.verify.result import Status
from mkevolve.verify.verifier import Verifier

ID_A, ID_B = "a" * 64, "b" * 64


def _report(**fields) -> dict:
    body = {"denials": [], "error": None, "violations": [], "launches": 1, "activities": [], "times_ms": [],
            "outputs": {}, "skipped": [], "changed_inputs": []}
    return body | fields


@pytest.mark.parametrize("reported, kept", [
    ([[ID_A, 2], [ID_B, 0]], {ID_A: 2, ID_B: 0}),
    ([[ID_A.upper(), 1], ["a" * 63, 1], [ID_B, -1], [ID_B, True], [ID_B, 1.0], [ID_B, 10 ** 6]], {}),
    ([[ID_A, 1, 2], ID_A, {"id": ID_A}], {}),         # not [id, index] pairs
    ({ID_A: 1}, {}),                                  # not a list
    (None, {}),
])
def test_only_hash_and_index_pairs_are_kept_from_a_report(reported, kept):
    assert parse_report(_report(autotune_choices=reported)).autotune_choices == kept


def test_one_report_adds_at_most_max_reported_choices():
    many = [[f"{n:064x}", 0] for n in range(2 * autotune_memory.MAX_REPORTED)]
    assert len(autotune_memory.valid_choices(many)) == autotune_memory.MAX_REPORTED


def test_learn_puts_new_choices_first_and_keeps_the_store_bounded(tmp_path, monkeypatch):
    autotune_memory.learn({ID_A: 1}, tmp_path)
    autotune_memory.learn({ID_B: 0, ID_A: 2}, tmp_path)
    assert list(autotune_memory.read_choices(tmp_path).items()) == [(ID_B, 0), (ID_A, 2)]
    monkeypatch.setattr(autotune_memory, "MAX_CHOICES", 3)
    autotune_memory.learn({f"{n:064x}": 0 for n in range(5)}, tmp_path)
    assert len(autotune_memory.read_choices(tmp_path)) == 3


def test_a_damaged_store_reads_as_empty_or_as_its_valid_part(tmp_path):
    (tmp_path / triton_warm.CHOICES_FILE).write_text("[[")
    assert autotune_memory.read_choices(tmp_path) == {}
    (tmp_path / triton_warm.CHOICES_FILE).write_text(json.dumps([[ID_A, 1], ["../x", 1], 3]))
    assert autotune_memory.read_choices(tmp_path) == {ID_A: 1}


def test_the_store_is_not_copied_into_a_candidates_cache(tmp_path, monkeypatch):
    warm = tmp_path / "warm"
    warm.mkdir()
    autotune_memory.learn({ID_A: 1}, warm)
    monkeypatch.setenv(triton_warm.WARM_DIR_ENV, str(warm))
    triton_warm.copy_warm_cache(tmp_path / "own")
    assert not (tmp_path / "own" / triton_warm.CHOICES_FILE).exists()


PROBLEM = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1.0


def get_inputs():
    return [torch.randn(1000)]


def get_init_inputs():
    return []
'''

SOLUTION = '''import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64, "EXTRA": 0}), triton.Config({"BLOCK": 128, "EXTRA": 0}),
                          triton.Config({"BLOCK": 64, "EXTRA": 1})], key=["n"])
@triton.jit
def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EXTRA: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0 + EXTRA, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        add_one[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        return y
'''


# ---- the candidate side, in this process ----------------------------------------------------------------


def _add_kernel(folder: Path):
    """SOLUTION's autotuned kernel, from a fresh import: three configs, the third computing x + 2, so which
    config ran shows in the output."""
    path = folder / "solution.py"
    path.write_text(SOLUTION)
    return import_file(path, prefix="autotuned").add_one


def _call(kernel, n: int) -> torch.Tensor:
    x = torch.zeros(n)
    y = torch.empty_like(x)
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return y


@pytest.fixture
def restored_autotuner(monkeypatch):
    """use_choices wraps Autotuner's methods for the whole process: put them back after the test."""
    monkeypatch.setattr(Autotuner, "run", Autotuner.run)
    monkeypatch.setattr(Autotuner, "prune_configs", Autotuner.prune_configs)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="equal benchmark times: the interpreter's")
def test_a_choice_made_is_listed_and_a_known_one_is_used_alone(restored_autotuner, tmp_path):
    from mkevolve.workers.interpreter import make_autotune_interpretable

    make_autotune_interpretable()
    made = autotune_memory.use_choices({}, "cpu")
    assert torch.equal(_call(_add_kernel(tmp_path), 100), torch.ones(100))     # equal times: the first config wins
    assert len(made) == 1 and made[0][1] == 0
    chosen = made[0][0]

    kernel = _add_kernel(tmp_path)
    autotune_memory.use_choices({chosen: 2}, "cpu")       # wraps again, as a fresh process would have
    assert torch.equal(_call(kernel, 100), torch.full((100,), 2.0))   # the remembered config alone ran
    assert kernel.best_config is kernel.configs[2]
    assert torch.equal(_call(kernel, 300), torch.ones(300))           # another size: another choice


# ---- through the verifier's processes ----------------------------------------------------------------------


def _files(tmp_path: Path, monkeypatch, solution_text: str) -> tuple[Path, Path, Path]:
    """The problem, the solution and where the workers' store will be (their warm folder, under TMPDIR)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    problem, solution = tmp_path / "problem.py", tmp_path / "solution" / "solution.py"
    problem.write_text(PROBLEM)
    solution.parent.mkdir()
    solution.write_text(solution_text)
    return problem, solution, tmp_path / f"mkevolve-triton-warm-{os.getuid()}" / triton_warm.CHOICES_FILE


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="equal benchmark times: the interpreter's")
def test_a_passing_candidate_teaches_its_choice_and_a_forged_one_only_fails_a_check(tmp_path, monkeypatch):
    problem, solution, store = _files(tmp_path, monkeypatch, SOLUTION)
    with Verifier(RunConfig(workers=1, trials=2, timeout=300.0)) as verifier:
        first = verifier.check_kernel(problem, solution)
        assert first.passed, first.reason
        learned = json.loads(store.read_text())
        assert len(learned) == 1 and learned[0][1] == 0          # the interpreter keeps the first config
        store.write_text(json.dumps([[learned[0][0], 2]]))        # a forged choice: the wrong config
        forged = verifier.check_kernel(problem, solution)
        assert forged.status is Status.INCORRECT and "output mismatch" in forged.reason
        store.write_text(json.dumps([[learned[0][0], 1]]))
        assert verifier.check_kernel(problem, solution).passed
    assert json.loads(store.read_text()) == [[learned[0][0], 1]]     # a known choice is not learned again


@pytest.mark.gpu
def test_on_a_gpu_the_choice_learned_is_the_one_the_next_process_finds(tmp_path, monkeypatch):
    """Triton's cache key names the kernel on a GPU: were it not the same in every process, the second check
    would tune again and teach a second entry."""
    correct = SOLUTION.replace('{"BLOCK": 64, "EXTRA": 1}', '{"BLOCK": 256, "EXTRA": 0}')   # every config right
    problem, solution, store = _files(tmp_path, monkeypatch, correct)
    with Verifier(RunConfig(workers=1, trials=2, timeout=600.0)) as verifier:
        assert verifier.check_kernel(problem, solution).passed
        learned = json.loads(store.read_text())
        assert len(learned) == 1
        other = (learned[0][1] + 1) % 3
        store.write_text(json.dumps([[learned[0][0], other]]))
        assert verifier.check_kernel(problem, solution).passed
    assert json.loads(store.read_text()) == [[learned[0][0], other]]
