"""A candidate that runs out of GPU memory other processes hold is run again, not judged: the harness tells
that case from a candidate past its own share (harness.failure_kind), and run_candidate_process pauses and
tries again (candidate_run.GPU_MEMORY_TRIES)."""

import pytest
import torch

from mkevolve.verify import candidate_run, harness
from mkevolve.verify.candidate_run import CandidateReport, parse_report
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, Rejected, Status

MIB = 1 << 20
OOM = ("CUDA out of memory. Tried to allocate 452.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which "
       "428.75 MiB is free. Process 899 has 13.03 GiB memory in use.")


@pytest.mark.parametrize("reserved_mib, share_mib, taken", [
    (100, 1024, True),      # 100 + 452 MiB fit its share: the others held the GPU
    (600, 1024, False),     # 600 + 452 MiB would pass its share: the candidate's own doing
])
def test_an_allocation_within_the_process_share_means_the_memory_was_taken(reserved_mib, share_mib, taken):
    assert harness.within_share(OOM, reserved_mib * MIB, share_mib * MIB) is taken


def test_an_out_of_memory_message_without_a_size_is_the_candidates_own():
    assert not harness.within_share("CUDA out of memory.", 0, 1e12)
    assert harness.failure_kind(ValueError("no"), "runtime") == "runtime"


def _report(kind: str) -> dict:
    return {"denials": [], "error": {"kind": kind, "message": OOM, "line": None}, "violations": [],
            "launches": 0, "activities": [], "times_ms": [], "outputs": {}, "skipped": [], "changed_inputs": []}


def test_the_report_says_so_and_the_verdict_would_still_be_a_runtime_error():
    taken, own = parse_report(_report(harness.GPU_MEMORY_TAKEN)), parse_report(_report("runtime"))
    assert taken.gpu_memory_taken and taken.error.status is Status.RUNTIME_ERROR
    assert not own.gpu_memory_taken and own.error.status is Status.RUNTIME_ERROR


def _fake_runs(monkeypatch, taken: list[bool]) -> list[int]:
    """run_candidate_process's single runs replaced: each writes a report, taken or not as listed."""
    calls = []

    def run_once(request, references, plans, scratch, device):
        calls.append(1)
        (scratch / harness.REPORT_FILE).write_text("{}")
        return parse_report(_report(harness.GPU_MEMORY_TAKEN if taken[len(calls) - 1] else "runtime"))

    monkeypatch.setattr(candidate_run, "_run_once", run_once)
    monkeypatch.setattr(candidate_run.time, "sleep", lambda seconds: None)
    return calls


def test_a_candidate_whose_memory_was_taken_runs_again_after_pauses(monkeypatch, tmp_path):
    calls = _fake_runs(monkeypatch, [True, True, False])
    report: CandidateReport = candidate_run.run_candidate_process(None, [], [], tmp_path, torch.device("cpu"))
    assert len(calls) == 3 and not report.gpu_memory_taken
    # the pauses, and the last try's wait for the GPU alone (none here: no other job holds it)
    assert report.phases["gpu_memory_wait"] == pytest.approx(3 * candidate_run.GPU_MEMORY_PAUSE_S, abs=1.0)


def test_after_the_last_try_the_candidate_has_no_verdict(monkeypatch, tmp_path):
    calls = _fake_runs(monkeypatch, [True] * candidate_run.GPU_MEMORY_TRIES)
    with pytest.raises(Rejected) as stopped:
        candidate_run.run_candidate_process(None, [], [], tmp_path, torch.device("cpu"))
    assert len(calls) == candidate_run.GPU_MEMORY_TRIES
    assert stopped.value.status is Status.NOT_RUN and stopped.value.reason.startswith(CANDIDATE_NOT_STARTED)
    assert "held by other processes" in stopped.value.reason


def _process_holds(monkeypatch, reserved_mib: int, share_mib: int) -> None:
    """The harness's process holds `reserved_mib` of a `share_mib` share of the GPU's memory."""
    monkeypatch.setattr(harness, "_memory_share_bytes", share_mib * MIB)
    monkeypatch.setattr(harness, "_memory_reserved", lambda: reserved_mib * MIB)


def _inputs_run_out_of_memory(monkeypatch, reserved_mib: int, share_mib: int) -> None:
    """The harness's copy of the inputs to the GPU fails with the OOM message above, the process holding
    `reserved_mib` of a `share_mib` share."""
    def load_config(config, device):
        raise torch.cuda.OutOfMemoryError(OOM)

    monkeypatch.setattr(harness, "load_config", load_config)
    _process_holds(monkeypatch, reserved_mib, share_mib)


def _request(folder: str, key: str, device: str) -> harness.CandidateRequest:
    return harness.CandidateRequest(solution=f"{folder}/solution.py", candidate_dir=folder, scratch=folder, key=key,
                                    device=device, eval_mode=False, construct_seed=0,
                                    configs=[harness.ConfigRun("i.bin")])


def _failed_load(monkeypatch, reserved_mib: int, share_mib: int) -> harness.CandidateFailure:
    _inputs_run_out_of_memory(monkeypatch, reserved_mib, share_mib)
    request = _request(".", "", "cuda")
    with pytest.raises(harness.CandidateFailure) as failed:
        harness.load_inputs(request)
    return failed.value


def test_inputs_that_do_not_load_are_tried_again_or_get_no_verdict(monkeypatch):
    """On an H100 shared by three runs, two candidates of one crashed while their harness copied the inputs to
    the GPU, before any of their code ran (exit code 70, no report)."""
    taken = _failed_load(monkeypatch, reserved_mib=100, share_mib=1024)
    assert taken.kind == harness.GPU_MEMORY_TAKEN and "loading the inputs" in taken.message
    too_big = _failed_load(monkeypatch, reserved_mib=900, share_mib=1024)
    assert too_big.kind == harness.SETUP_FAILED
    verdict = parse_report(_report(harness.SETUP_FAILED)).error
    assert verdict.status is Status.NOT_RUN and verdict.reason.startswith(CANDIDATE_NOT_STARTED)


def test_the_harness_reports_inputs_that_did_not_load_and_runs_no_candidate_code(monkeypatch, tmp_path):
    """The whole harness entry, in this process: its signed report parses, and the candidate file (which would
    fail loudly if imported) is never read."""
    import secrets

    from mkevolve.verify.candidate_run import read_signed_report

    _inputs_run_out_of_memory(monkeypatch, reserved_mib=100, share_mib=1024)
    (tmp_path / "solution.py").write_text("raise SystemExit('the candidate was imported')\n")
    key = secrets.token_bytes(32)
    request = _request(str(tmp_path), key.hex(), "cpu")
    assert harness.run_candidate(request.to_json()) == 0
    report = parse_report(read_signed_report(tmp_path, key))
    assert report.gpu_memory_taken and "loading the inputs ran out of GPU memory" in report.error.reason


SOLUTION = """import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x + 1
"""


def _harness_runs_out_of_memory(monkeypatch, tmp_path, reserved_mib: int, where: str) -> CandidateReport:
    """The whole harness entry, in a forked process (it confines the process it runs in), with its own GPU work
    failing as the GPU's memory runs out `where` (its setup, or its copy of a call's arguments), the process
    holding `reserved_mib` of a 1 GiB share."""
    import multiprocessing
    import secrets

    from mkevolve.verify.candidate_run import read_signed_report

    def out_of_memory(*args):
        raise torch.cuda.OutOfMemoryError(OOM)

    monkeypatch.setattr(harness, "load_config", lambda config, device: ([], {"i.bin": [torch.ones(3)]}))
    if where == "setup":
        monkeypatch.setattr(harness.autotune_memory, "use_choices", out_of_memory)
    else:
        monkeypatch.setattr(harness, "_shifted_copies", out_of_memory)
    _process_holds(monkeypatch, reserved_mib, share_mib=1024)
    scratch = tmp_path / f"reserved_{reserved_mib}"
    scratch.mkdir()
    (scratch / "solution.py").write_text(SOLUTION)
    key = secrets.token_bytes(32)
    request = _request(str(scratch), key.hex(), "cpu")
    request.triton_cache = str(tmp_path / "triton")
    request.configs[0].calls = [harness.Call("i.bin", save="out")]
    child = multiprocessing.get_context("fork").Process(target=harness.run_candidate, args=(request.to_json(),))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    return parse_report(read_signed_report(scratch, key))


@pytest.mark.parametrize("where", ["setup", "copies"])
def test_the_harness_running_out_of_memory_reports_it_and_is_tried_again(monkeypatch, tmp_path, where):
    """Before, the error left the harness unreported: the process ended with code 70 and the candidate was
    judged crashed, though other runs held the GPU's memory."""
    taken = _harness_runs_out_of_memory(monkeypatch, tmp_path, reserved_mib=100, where=where)
    assert taken.gpu_memory_taken and "the harness ran out of GPU memory" in taken.error.reason
    own = _harness_runs_out_of_memory(monkeypatch, tmp_path, reserved_mib=900, where=where)   # its own hoard
    assert not own.gpu_memory_taken and own.error.status is Status.RUNTIME_ERROR


def _check_running_out(monkeypatch, failures: int):
    """evaluate_kernel with its single check failing `failures` times as the GPU's memory runs out."""
    from mkevolve.verify import correctness
    from mkevolve.verify.result import EvalResult

    calls = []

    def evaluate_once(request, errors):
        calls.append(1)
        if len(calls) <= failures:
            raise torch.cuda.OutOfMemoryError(OOM)
        return EvalResult(status=Status.OK)

    monkeypatch.setattr(correctness, "_evaluate_once", evaluate_once)
    monkeypatch.setattr(candidate_run.time, "sleep", lambda seconds: None)
    request = correctness.KernelEvalRequest(problem_path="p.py", solution_path="s.py")
    return correctness.evaluate_kernel(request), calls


def test_a_check_that_runs_out_of_gpu_memory_itself_runs_again_then_has_no_verdict(monkeypatch):
    """The trusted side's own GPU work (references, comparisons) ran out of memory others held: before, the job
    raised and the candidate was judged crashed."""
    result, calls = _check_running_out(monkeypatch, failures=candidate_run.GPU_MEMORY_TRIES - 1)
    assert result.status is Status.OK and len(calls) == candidate_run.GPU_MEMORY_TRIES
    result, calls = _check_running_out(monkeypatch, failures=candidate_run.GPU_MEMORY_TRIES)
    assert result.status is Status.NOT_RUN and result.reason.startswith(CANDIDATE_NOT_STARTED)
    assert "ran out of GPU memory" in result.reason and len(calls) == candidate_run.GPU_MEMORY_TRIES


def test_the_last_try_has_the_gpu_alone_and_its_candidate_takes_no_hold(monkeypatch, tmp_path):
    """Others' memory ran out twice: the third try waits until every other job has let go of the GPU, and the
    candidate process it starts is told so (it would otherwise wait for its own worker's hold)."""
    from mkevolve.workers import gpu_share

    monkeypatch.setenv(gpu_share.LOCK_ENV, str(tmp_path / "gpu0"))
    monkeypatch.setattr(gpu_share, "_shares", {})
    alone = []

    def run_once(request, references, plans, scratch, device):
        alone.append(gpu_share.held_alone())
        (scratch / harness.REPORT_FILE).write_text("{}")
        return parse_report(_report(harness.GPU_MEMORY_TAKEN if len(alone) < 3 else "runtime"))

    monkeypatch.setattr(candidate_run, "_run_once", run_once)
    monkeypatch.setattr(candidate_run.time, "sleep", lambda seconds: None)
    candidate_run.run_candidate_process(None, [], [], tmp_path, torch.device("cpu"))
    assert alone == [False, False, True] and not gpu_share.held_alone()


def test_a_candidate_started_while_its_worker_holds_the_gpu_alone_is_told_so(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from mkevolve.workers import gpu_share

    monkeypatch.setenv(gpu_share.LOCK_ENV, str(tmp_path / "gpu0"))
    monkeypatch.setattr(gpu_share, "_shares", {})
    told = []

    def start(entry, candidate, scratch, timeout_s, memory_limit_mb):
        told.append(harness.CandidateRequest.from_json(candidate.to_json()).gpu_held_alone)
        return SimpleNamespace(timed_out=False, memory_exceeded=False, code=1, describe=lambda: "exit 1")

    monkeypatch.setattr(candidate_run, "start_candidate", start)
    for name in ("problem.py", "solution.py"):
        (tmp_path / name).write_text("import torch\n")
    request = SimpleNamespace(solution_path=str(tmp_path / "solution.py"), problem_path=str(tmp_path / "problem.py"),
                              eval_mode=False, seed=0, trusted_files=[], timeout_s=10.0, memory_limit_gb=1.0)
    for hold in (gpu_share.gpu_alone(), gpu_share.job_on_gpu()):
        with hold, pytest.raises(Rejected):     # no report: the fake process wrote none
            candidate_run._run_once(request, [], [], tmp_path, torch.device("cpu"))
    assert told == [True, False]


def test_a_check_runs_again_without_what_it_kept_and_its_last_try_has_the_gpu_alone(monkeypatch, tmp_path):
    from mkevolve.verify import correctness, reference
    from mkevolve.verify.result import EvalResult
    from mkevolve.workers import gpu_share

    monkeypatch.setenv(gpu_share.LOCK_ENV, str(tmp_path / "gpu0"))
    monkeypatch.setattr(gpu_share, "_shares", {})
    reference._expected[("kept", 0, 0, "cpu")] = [torch.zeros(4)]
    reference._expected_bytes[("kept", 0, 0, "cpu")] = 16
    alone = []

    def evaluate_once(request, errors):
        alone.append(gpu_share.held_alone())
        if len(alone) < candidate_run.GPU_MEMORY_TRIES:
            assert len(alone) > 1 or reference._expected     # the first try finds what was kept
            raise torch.cuda.OutOfMemoryError(OOM)
        assert not reference._expected, "the last try ran with the previous tries' kept references"
        return EvalResult(status=Status.OK)

    monkeypatch.setattr(correctness, "_evaluate_once", evaluate_once)
    monkeypatch.setattr(candidate_run.time, "sleep", lambda seconds: None)
    request = correctness.KernelEvalRequest(problem_path="p.py", solution_path="s.py")
    assert correctness.evaluate_kernel(request).status is Status.OK
    assert alone == [False, False, True] and not gpu_share.held_alone()
