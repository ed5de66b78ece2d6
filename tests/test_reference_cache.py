"""The reference cache stays within its disk: folders no check is using go first, least recently used, busy
ones stay, and a set that cannot fit stops the check with a clear reason instead of filling the disk
(full-size problems write gigabytes per input set)."""

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from mkevolve.verify import reference
from mkevolve.verify.correctness import KernelEvalRequest, evaluate_kernel
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, Status

CORPUS = Path(__file__).parent / "corpus"
GIB = 1 << 30


def make_folder(references: Path, name: str, age_s: float) -> Path:
    folder = references / name
    folder.mkdir(parents=True)
    (folder / "trial0.ref.mkv").write_bytes(b"x")
    used = folder / ".used"
    used.touch()
    past = time.time() - age_s
    os.utime(used, (past, past))
    return folder


@pytest.fixture
def disk(monkeypatch):
    """A pretend disk: free space is `base` plus a GiB for every folder evicted so far."""
    state = {"base": 0, "evicted": []}
    real_evict = reference._evict

    def evict(folder):
        real_evict(folder)
        if not folder.exists():
            state["evicted"].append(folder.name)

    monkeypatch.setattr(reference, "_evict", evict)
    monkeypatch.setattr(reference, "_free_bytes", lambda folder: state["base"] + len(state["evicted"]) * GIB)
    return state


def test_make_room_evicts_least_recently_used_folders_first(tmp_path, disk):
    old = make_folder(tmp_path, "old", 30)
    make_folder(tmp_path, "older", 40)
    current = make_folder(tmp_path, "current", 90)                   # the one being written
    disk["base"] = reference.DISK_RESERVE_BYTES
    reference.make_room(current, GIB, "p.py set trial0")         # one eviction is enough
    assert disk["evicted"] == ["older"]
    assert old.exists() and current.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "old"]   # nothing left of the evicted one


def test_make_room_keeps_a_folder_whose_sets_are_being_computed(tmp_path, disk):
    busy = make_folder(tmp_path, "busy", 20)
    idle = make_folder(tmp_path, "idle", 10)
    disk["base"] = reference.DISK_RESERVE_BYTES
    with open(busy / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                           # another process computing its sets
        reference.make_room(tmp_path / "new", GIB, "p.py set trial0")
    assert busy.exists() and not idle.exists()


def test_a_folder_a_check_is_using_is_never_evicted_however_old(tmp_path, disk, monkeypatch):
    from mkevolve.problem import load_problem

    monkeypatch.setattr(reference, "SPACE_WAIT_S", 0.0)

    problem = load_problem(CORPUS / "problems" / "elementwise.py")
    used = reference.reference_set(tmp_path, problem, 0, 0, False, torch.device("cpu"))
    with used.in_use():
        disk["base"] = 100 * GIB
        used.ensure(["trial0"])
        os.utime(used.folder / ".used", (0, 0))                     # the least recently used of all
        make_folder(tmp_path / "references", "idle", 10)
        disk["base"] = reference.DISK_RESERVE_BYTES
        with pytest.raises(reference.ReferenceSpaceError):
            reference.make_room(tmp_path / "references" / "new", 2 * GIB, "p.py set trial0")
        assert disk["evicted"] == ["idle"] and used.expected("trial0")   # its files are all still there
    reference.make_room(tmp_path / "references" / "new", 2 * GIB, "p.py set trial0")   # released: it may go
    assert disk["evicted"] == ["idle", used.folder.name]


def test_a_set_that_does_not_fit_waits_for_another_check_to_let_go(tmp_path, disk, monkeypatch):
    """Every other folder is held by a running check: the set waits, and goes in once that check ends and
    its folder can go, instead of failing a run that a few minutes would have served."""
    monkeypatch.setattr(reference, "_SPACE_POLL_S", 0.05)
    held = make_folder(tmp_path, "held", 10)
    readers = open(held / ".readers", "a")
    fcntl.flock(readers, fcntl.LOCK_SH)                         # a check using it
    threading.Timer(0.5, readers.close).start()                 # ... which ends half a second later
    disk["base"] = reference.DISK_RESERVE_BYTES
    started = time.monotonic()
    reference.make_room(tmp_path / "new", GIB, "p.py set trial0")
    assert disk["evicted"] == ["held"] and time.monotonic() - started >= 0.4


def test_a_check_arriving_after_an_eviction_makes_the_folder_again(tmp_path):
    from mkevolve.problem import load_problem

    problem = load_problem(CORPUS / "problems" / "elementwise.py")
    first = reference.reference_set(tmp_path, problem, 0, 0, False, torch.device("cpu"))
    with first.in_use():
        first.ensure(["trial0"])
    reference._evict(first.folder)
    assert not first.folder.exists()
    with first.in_use():                                            # the same key, as the next check builds it
        first.ensure(["trial0"])
        assert first.outputs_file("trial0").exists()


def test_a_set_that_cannot_fit_is_a_clear_error_and_idle_folders_go_first(tmp_path, disk):
    idle = make_folder(tmp_path, "idle", 5)
    with pytest.raises(reference.ReferenceSpaceError) as raised:
        reference.make_room(tmp_path / "new", 3 * GIB, "fire.py set time1")
    message = str(raised.value)
    assert "3.0 GiB needed for fire.py set time1" in message and "MKEVOLVE_CACHE" in message
    assert not idle.exists()


def test_no_room_for_references_is_an_unrun_check_not_a_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "_free_bytes", lambda folder: 0)
    request = KernelEvalRequest(problem_path=str(CORPUS / "problems" / "elementwise.py"),
                                solution_path=str(CORPUS / "honest" / "elementwise.py"),
                                trials=1, timed=False, cache_dir=str(tmp_path))
    result = evaluate_kernel(request)
    assert result.status is Status.NOT_RUN
    assert result.reason.startswith(CANDIDATE_NOT_STARTED) and "reference cache" in result.reason


# ---- outputs too large to keep are computed again ----------------------------------------------------------


def _evaluate(problem: str, solution: Path, cache: Path):
    return evaluate_kernel(KernelEvalRequest(problem_path=str(problem), solution_path=str(solution), trials=2,
                                             timed=False, cache_dir=str(cache)))


def test_large_outputs_are_not_kept_and_checks_still_decide(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "RECOMPUTED_OUTPUT_BYTES", 0)       # every output counts as large
    honest = _evaluate(CORPUS / "problems" / "elementwise.py", CORPUS / "honest" / "elementwise.py", tmp_path)
    assert honest.status is Status.OK, honest.reason
    folders = [f for f in (tmp_path / "references").iterdir() if f.is_dir()]
    assert len(folders) == 1
    assert not list(folders[0].glob("*.ref.mkv")) and list(folders[0].glob("*.ref.recompute"))
    assert list(folders[0].glob("*.in.mkv"))                           # the candidate still reads its inputs
    wrong = _evaluate(CORPUS / "faults" / "problem.py", CORPUS / "faults" / "wrong_math.py", tmp_path)
    assert wrong.status is Status.INCORRECT and wrong.failed_trial == 0


def test_recomputed_outputs_equal_the_kept_ones(tmp_path, monkeypatch):
    from mkevolve.problem import load_problem

    problem = load_problem(CORPUS / "problems" / "elementwise.py")
    kept = reference.reference_set(tmp_path / "kept", problem, 0, 0, False, torch.device("cpu"))
    kept.ensure(["trial0"])
    monkeypatch.setattr(reference, "RECOMPUTED_OUTPUT_BYTES", 0)
    again = reference.reference_set(tmp_path / "again", problem, 0, 0, False, torch.device("cpu"))
    (tmp_path / "again" / "references" / "salt").write_bytes((tmp_path / "kept" / "references" / "salt").read_bytes())
    again.ensure(["trial0"])
    assert again.recompute_mark("trial0").exists() and not again.outputs_file("trial0").exists()
    expected, recomputed = kept.expected("trial0"), again.expected("trial0")
    assert len(expected) == len(recomputed) and all(torch.equal(a, b) for a, b in zip(expected, recomputed))


def test_sets_computed_together_are_those_drawn_and_run_one_by_one(tmp_path, monkeypatch):
    """ensure() draws each next set's inputs while the set before is written (on a thread of its own); what
    lands on disk is what each set's seed gives: its inputs from get_inputs, its outputs from the Model."""
    from mkevolve.problem import load_problem, make_inputs

    problem = load_problem(CORPUS / "problems" / "elementwise.py")
    references = reference.reference_set(tmp_path, problem, 0, 0, False, torch.device("cpu"))
    writing = threading.Event()
    drawn_while_writing = []
    real_write, real_draw = reference._write_atomic_values, reference.ReferenceSet._draw

    def slow_write(path, values):
        writing.set()
        time.sleep(0.2)
        real_write(path, values)
        writing.clear()

    def draw(self, name, config):
        drawn_while_writing.append(writing.wait(0.5))    # a write in flight starts within the half second
        return real_draw(self, name, config)

    monkeypatch.setattr(reference, "_write_atomic_values", slow_write)
    monkeypatch.setattr(reference.ReferenceSet, "_draw", draw)
    names = ["trial0", "trial1", "time0"]
    references.ensure(names)
    assert drawn_while_writing == [False, True, True]
    model = references.build_model()
    for name in names:
        inputs = make_inputs(problem.path, problem.configs[0], references._input_seed(name), torch.device("cpu"))
        stored = reference.wire.read_values(references.inputs_file(name))
        assert all(torch.equal(a, b) for a, b in zip(inputs, stored))
        with torch.no_grad():
            assert torch.equal(model(*inputs), references.expected(name)[0])



def test_a_set_whose_outputs_are_gone_is_computed_again_when_read(tmp_path):
    """A check never crashes on a set file that went missing: everything in the cache can be computed again."""
    from mkevolve.problem import load_problem

    problem = load_problem(CORPUS / "problems" / "elementwise.py")
    references = reference.reference_set(tmp_path, problem, 0, 0, False, torch.device("cpu"))
    references.ensure(["trial0", "trial1"])
    kept = [t.clone() for t in references.expected("trial1")]
    references.outputs_file("trial1").unlink()
    again = references.expected("trial1")
    assert references.outputs_file("trial1").exists()
    assert all(torch.equal(a, b) for a, b in zip(kept, again))


def test_sets_timed_calls_take_keep_their_inputs_alone_and_shifted_outputs_are_the_model_s(tmp_path):
    """Timed and late calls take their sets shifted (harness.Call.shift): the sets' own outputs would never be
    read, so they are neither computed nor written; a shifted call's are the Model on the shifted inputs."""
    from mkevolve.problem import load_problem, shifted_values

    problem = load_problem(CORPUS / "problems" / "gemm_epilogue.py")
    references = reference.reference_set(tmp_path, problem, 0, 0, False, torch.device("cpu"))
    references.ensure(["trial0", "time0"], inputs_only=["time0"])
    assert references.inputs_file("time0").exists() and not references.outputs_file("time0").exists()
    assert references.outputs_file("trial0").exists()
    inputs = reference.wire.read_values(references.inputs_file("time0"))
    shifted = shifted_values(inputs, 37)
    assert not torch.equal(shifted[0], inputs[0]) and torch.equal(shifted[0].flatten()[0], inputs[0].flatten()[37])
    with torch.no_grad():
        assert torch.equal(references.build_model()(*shifted), references.expected("time0", shift=37)[0])
        assert torch.equal(references.build_model()(*inputs), references.expected("time0")[0])   # if ever read
