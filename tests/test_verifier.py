"""The whole verifier through worker subprocesses: honest kernels pass, each fault costs one verdict and
leaves the pool working, and `check` exits as documented. Every cheat of the corpus is judged in
test_isolation.py, in one batch."""

import ast
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.verify.result import Status
from mkevolve.verify.verifier import Verifier
from mkevolve.workers.pool import JobOutcome

CORPUS = Path(__file__).resolve().parent / "corpus"
ON_GPU = torch.cuda.is_available()
FAULTS = CORPUS / "faults"


def constant(path: Path, name: str) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no {name}")


def problem_of(path: Path) -> Path:
    return CORPUS / "problems" / f"{constant(path, 'PROBLEM')}.py"


@pytest.fixture(scope="module")
def verifier():
    with Verifier(RunConfig(workers=2, timeout=60.0, trials=3)) as v:
        yield v


@pytest.mark.slow
def test_honest_kernels_pass(verifier):
    honest = sorted((CORPUS / "honest").glob("*.py"))
    results = verifier.check_kernels([(problem_of(p), p) for p in honest])
    for path, result in zip(honest, results):
        assert result.status is Status.OK, f"{path.name}: {result.reason}"
        assert result.launches >= 1
        assert (result.speedup is not None) == ON_GPU  # without a GPU the speed is unknown, never invented
        assert result.max_abs_err is not None and result.max_abs_err <= 1e-4
        # the process's start and end around the harness, measured from the worker
        assert {"candidate.spawn", "candidate.exit"} <= set(result.phases)
        assert result.phases["candidate.spawn"] + result.phases["candidate.exit"] <= result.phases["candidate"]


@pytest.mark.parametrize("name, status, fragment", [
    ("wrong_math", Status.INCORRECT, "mismatch"),
    ("syntax_error", Status.COMPILE_ERROR, "syntax error at line"),
    ("compile_error", Status.COMPILE_ERROR, "UNDEFINED_SCALE"),
    ("runtime_error", Status.RUNTIME_ERROR, "only supports square inputs"),
    ("exit", Status.CRASHED, "exit code 3"),
    ("segfault", Status.CRASHED, "SIGSEGV"),
])
@pytest.mark.slow
def test_fault_costs_one_verdict(verifier, name, status, fragment):
    result = verifier.check_kernel(FAULTS / "problem.py", FAULTS / f"{name}.py")
    assert result.status is status and fragment in result.reason
    assert verifier.check_kernel(FAULTS / "problem.py", FAULTS / "honest.py").passed


@pytest.mark.slow
def test_hang_times_out_and_the_pool_keeps_working():
    with Verifier(RunConfig(workers=1, timeout=8.0, trials=1)) as v:
        assert v.check_kernel(FAULTS / "problem.py", FAULTS / "hang.py").status is Status.TIMEOUT
        assert v.check_kernel(FAULTS / "problem.py", FAULTS / "honest.py").passed


@pytest.mark.slow
def test_wrong_math_reports_errors_and_first_failed_trial(verifier):
    result = verifier.check_kernel(FAULTS / "problem.py", FAULTS / "wrong_math.py")
    assert result.failed_trial == 0 and result.max_abs_err > 1e-4
    assert result.tolerance_used > 1  # the share of atol + rtol*|ref| the worst element used, kept by the worker
    assert result.line is None or result.line > 0


def test_bad_problem_is_its_own_verdict(verifier, tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text((FAULTS / "problem.py").read_text().replace("return []\n", "return 3\n"))
    result = verifier.check_kernel(problem, FAULTS / "honest.py")
    assert result.status is Status.BAD_PROBLEM and "get_init_inputs() must return a list" in result.reason


@pytest.mark.slow
def test_check_command_exit_codes_and_json(capsys):
    assert main(["check", str(FAULTS / "problem.py"), str(FAULTS / "honest.py"), "--json", "--trials", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "ok" and (data["speedup"] is not None) == ON_GPU and "reason" in data
    assert main(["check", str(FAULTS / "problem.py"), str(FAULTS / "wrong_math.py"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "incorrect"


def test_check_command_bad_input_exits_2(capsys, tmp_path):
    assert main(["check", str(tmp_path / "missing.py"), str(FAULTS / "honest.py")]) == 2
    err = capsys.readouterr().err
    assert "missing.py: no such file" in err and len(err.strip().splitlines()) == 1
    assert main(["check", str(FAULTS / "problem.py"), str(tmp_path)]) == 2
    assert main(["check", str(FAULTS / "problem.py")]) == 2  # usage


@pytest.mark.slow
def test_check_command_human_output(capsys):
    assert main(["check", str(FAULTS / "problem.py"), str(FAULTS / "honest.py"), "--trials", "1"]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and ("torch.compile" in out if ON_GPU else "unknown (no GPU" in out)


class _RecordingExecutor:
    """Answers every job as the pool does once its start-by time has passed, and keeps the jobs."""

    size = 1
    shares_caches = True

    def __init__(self):
        self.jobs = []

    def run_many(self, jobs):
        from mkevolve.workers.pool import JobFailure, JobOutcome

        self.jobs += jobs
        return [JobOutcome(failure=JobFailure.NOT_STARTED, reason="start-by passed") for _ in jobs]

    def refuse_new_jobs(self):
        pass

    def close(self):
        pass


def test_candidate_checks_past_the_time_budget_are_not_started_but_end_to_end_checks_are(tmp_path):
    import time

    from mkevolve.codebase import KERNELS_DIR, SOLUTION_FILE
    from mkevolve.verify.result import CANDIDATE_NOT_STARTED
    from mkevolve.verify.verifier import RUNNING_CHECK_GRACE_S

    honest = sorted((CORPUS / "honest").glob("*.py"))[0]
    with Verifier(RunConfig(workers=1)) as verifier:
        verifier.executor.close()
        verifier.executor = recorder = _RecordingExecutor()
        verifier.candidates_start_by = time.time() + 60
        (result,) = verifier.check_kernels([(problem_of(honest), honest)])
        folder = tmp_path / "best"
        (folder / KERNELS_DIR).mkdir(parents=True)
        (folder / SOLUTION_FILE).write_text("class ModelNew:\n    pass\n")
        verifier.check_composite(problem_of(honest), folder)
    candidate_job, composite_job = recorder.jobs
    assert candidate_job.start_by == verifier.candidates_start_by and composite_job.start_by is None
    assert candidate_job.end_by == verifier.candidates_start_by + RUNNING_CHECK_GRACE_S
    assert composite_job.end_by is None       # the end-to-end check that makes best/ is never stopped
    # no verdict on the candidate: NOT_RUN, which a resumed run checks again
    assert result.status is Status.NOT_RUN and result.reason.startswith(CANDIDATE_NOT_STARTED)
    assert "time budget" in result.reason


DICT_PROBLEM = '''import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return {"activated": torch.relu(x), "scaled": x * 2.0}


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
'''

DICT_SOLUTION = '''import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def relu_scale_kernel(x_ptr, relu_ptr, scaled_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(relu_ptr + offsets, tl.maximum(x, 0.0), mask=mask)
    tl.store(scaled_ptr + offsets, x * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        activated, scaled = torch.empty_like(x), torch.empty_like(x)
        relu_scale_kernel[(triton.cdiv(x.numel(), 256),)](x, activated, scaled, x.numel(), BLOCK=256)
        return {"activated": RESULT_0, "scaled": RESULT_1}
'''


@pytest.mark.slow
def test_a_model_that_returns_a_dict_is_checked_by_its_values(tmp_path):
    """The reference's dict is flattened by its values; a ModelNew returning the same dict was rejected as a
    'tensor-subclass' cheat until the candidate's side flattened it the same way."""
    problem = tmp_path / "dict_problem.py"
    problem.write_text(DICT_PROBLEM)
    honest, swapped = tmp_path / "honest.py", tmp_path / "swapped.py"
    honest.write_text(DICT_SOLUTION.replace("RESULT_0", "activated").replace("RESULT_1", "scaled"))
    swapped.write_text(DICT_SOLUTION.replace("RESULT_0", "scaled").replace("RESULT_1", "activated"))
    with Verifier(RunConfig(workers=2, timeout=120.0, trials=2)) as verifier:
        ok, wrong = verifier.check_kernels([(problem, honest), (problem, swapped)], timed=False)
    assert ok.status is Status.OK, ok.reason
    assert wrong.status is Status.INCORRECT and "output 0 mismatch" in wrong.reason


def test_a_prepare_job_fills_the_reference_cache_before_any_check(tmp_path):
    """prepare_problem computes every input set a check reads, with the reference's outputs, into the cache
    that the checks then read; a problem that does not load is not an error here, only a reason."""
    from dataclasses import replace

    from mkevolve.problem import load_problem
    from mkevolve.verify.correctness import KernelEvalRequest, prepare_problem
    from mkevolve.verify.reference import reference_set

    problem_path = CORPUS / "problems" / "elementwise.py"
    request = KernelEvalRequest(problem_path=str(problem_path), solution_path=str(problem_path), trials=3,
                                cache_dir=str(tmp_path))
    prepared = prepare_problem(request)
    assert prepared.error == "" and prepared.phases["reference"] > 0
    reference = reference_set(tmp_path, load_problem(problem_path), 0, 0, False, torch.device("cpu"))
    assert all(reference.outputs_file(f"trial{i}").exists() for i in range(3))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no model here')\n")
    failed = prepare_problem(replace(request, problem_path=str(broken)))
    assert "no model here" in failed.error


class _PreparingExecutor(_RecordingExecutor):
    """Answers a prepare job as a worker would, after `ready` is set."""

    def __init__(self):
        super().__init__()
        self.ready = threading.Event()

    def run_many(self, jobs):
        from mkevolve.verify.correctness import Preparation

        self.ready.wait(30)
        self.jobs += jobs
        return [JobOutcome(value=Preparation({"reference": 1.5, "baseline": 4.0}), wall_s=5.5) for _ in jobs]


def test_problems_are_prepared_in_the_background_behind_every_check_and_only_on_a_gpu(tmp_path):
    from mkevolve.events import EventLog
    from mkevolve.verify.verifier import PREPARE_PRIORITY

    events = EventLog()
    verifier = Verifier(RunConfig(workers=2), events)
    verifier.executor.close()
    verifier.executor = executor = _PreparingExecutor()
    verifier._device_name = "cpu"
    verifier.prepare([tmp_path / "a.py"])
    verifier._device_name = "NVIDIA H200"
    executor.shares_caches = False           # jobs on other machines (Ray): nothing to leave in our caches
    verifier.prepare([tmp_path / "ray.py"])
    executor.shares_caches = True
    started = time.monotonic()
    verifier.prepare([tmp_path / "b.py", tmp_path / "c.py"])
    assert time.monotonic() - started < 5 and executor.jobs == []     # returned before any job ran
    executor.ready.set()
    verifier.close()                                                  # waits for the jobs sent
    assert [job.kwargs["request"].problem_path for job in executor.jobs] == [
        str((tmp_path / name).resolve()) for name in ("b.py", "c.py")]
    assert {job.priority for job in executor.jobs} == {PREPARE_PRIORITY}
    assert all(job.fn == "mkevolve.verify.correctness:prepare_problem" for job in executor.jobs)
    prepared = events.of_kind("prepared")
    assert [e["problem"] for e in prepared] == [str(tmp_path / "b.py"), str(tmp_path / "c.py")]
    assert prepared[0]["phases"] == {"reference": 1.5, "baseline": 4.0} and prepared[0]["error"] == ""


def test_sources_prepared_ahead_are_not_prepared_again_where_the_run_writes_them(tmp_path):
    """prepare_sources writes text to a scratch folder and prepares it there; the caches are keyed by source,
    so the same source at its run path later is not sent again, while a new one is. close() removes the
    scratch folder."""
    verifier = Verifier(RunConfig(workers=2))
    verifier.executor.close()
    verifier.executor = executor = _PreparingExecutor()
    executor.ready.set()
    verifier._device_name = "NVIDIA H200"
    verifier.prepare_sources({"subkernel_problems/a.py": "A = 1\n", "subkernel_problems/b.py": "B = 2\n"})
    ahead = verifier._ahead_dir
    assert {p.name: p.read_text() for p in ahead.rglob("*.py")} == {"a.py": "A = 1\n", "b.py": "B = 2\n"}
    later = tmp_path / "iteration_0" / "subkernel_problems"
    later.mkdir(parents=True)
    (later / "a.py").write_text("A = 1\n")
    (later / "c.py").write_text("C = 3\n")
    verifier.prepare([later / "a.py", later / "c.py"])
    verifier.close()
    sent = sorted(Path(job.kwargs["request"].problem_path) for job in executor.jobs)
    assert [p.name for p in sent] == ["a.py", "b.py", "c.py"]
    assert sent[0].is_relative_to(ahead.resolve()) and sent[2] == (later / "c.py").resolve()
    assert not ahead.exists()


def test_a_prepare_in_its_grace_period_sends_nothing_once_the_run_closes(tmp_path):
    """prepare(grace_s=...) waits before it asks for a worker, so that checks sent at the same moment go first;
    a run that closes meanwhile neither waits for the grace period nor sends the jobs."""
    verifier = Verifier(RunConfig(workers=2))
    verifier.executor.close()
    verifier.executor = executor = _PreparingExecutor()
    executor.ready.set()
    verifier._device_name = "NVIDIA H200"
    verifier.prepare([tmp_path / "a.py"], grace_s=60.0)
    started = time.monotonic()
    verifier.close()
    assert time.monotonic() - started < 5 and executor.jobs == []


def test_the_harness_clock_only_profiles_and_is_clamped_to_the_process():
    from mkevolve.verify.candidate_run import CandidateReport, _clock

    def report(clock):
        return CandidateReport([], None, [], 1, [], [], {}, clock=clock)

    honest = report((101.0, 104.5))
    honest.add_process_phases(called_at=100.0, ended_at=105.0)
    assert honest.phases == {"spawn": 1.0, "exit": 0.5}
    forged = report((-1e9, 1e9))     # a candidate's code could change the values: they stay within the process
    forged.add_process_phases(called_at=100.0, ended_at=105.0)
    assert forged.phases == {"spawn": 0.0, "exit": 0.0}
    absent = report(None)
    absent.add_process_phases(called_at=100.0, ended_at=105.0)
    assert absent.phases == {}
    assert _clock([1.0, 2.0]) == (1.0, 2.0)
    assert _clock(["1", 2.0]) is None and _clock([1.0]) is None and _clock({"a": 1}) is None


def test_a_check_stopped_after_the_time_budget_has_no_verdict_and_says_why():
    from mkevolve.verify.result import not_started_cause
    from mkevolve.verify.verifier import RUNNING_CHECK_GRACE_S, _to_result
    from mkevolve.workers.pool import JobFailure, JobOutcome

    result = _to_result(JobOutcome(failure=JobFailure.STOPPED, reason="still running", wall_s=70.0))
    assert result.status is Status.NOT_RUN and result.wall_s == 70.0
    assert not_started_cause(result.reason).startswith(
        f"its check was still running {RUNNING_CHECK_GRACE_S:g} s after the run's time budget was spent")


def test_a_standby_still_preparing_when_the_request_came_is_late_by_the_rest_of_its_preparation():
    from mkevolve.verify.candidate_run import CandidateReport

    def phases(standby_clock):
        report = CandidateReport([], None, [], 1, [], [], {}, clock=(104.0, 110.0), standby_clock=standby_clock)
        report.add_process_phases(called_at=100.0, ended_at=111.0)
        return report.phases

    assert phases((97.0, 103.5)) == {"spawn": 4.0, "exit": 1.0, "spawn.late": 3.5, "spawn.prepare": 6.5}
    assert phases((90.0, 95.0))["spawn.late"] == 0.0             # prepared before the request: not late
    assert "spawn.late" not in phases((90.0, 106.0))              # prepared after the harness began: forged
    assert "spawn.late" not in phases((-1e9, 95.0))               # began implausibly early
    assert "spawn.late" not in phases(None)                       # no standby (a CPU, or no zygote)


def test_the_reference_determinism_check_runs_once_per_machine(tmp_path, monkeypatch):
    """Another worker (a fresh process: nothing remembered in memory) finds the mark the first one left in the
    reference cache and does not build and run the model twice again; another seed is checked anew."""
    from dataclasses import replace

    from mkevolve.verify import correctness

    problem_path = CORPUS / "problems" / "elementwise.py"
    request = correctness.KernelEvalRequest(problem_path=str(problem_path), solution_path=str(problem_path),
                                            trials=2, cache_dir=str(tmp_path))
    checked = []
    original = correctness.check_reference
    monkeypatch.setattr(correctness, "check_reference", lambda *a, **k: checked.append(a) or original(*a, **k))
    monkeypatch.setattr(correctness, "_checked_references", set())
    correctness._load_checked_problem(request)
    monkeypatch.setattr(correctness, "_checked_references", set())      # as in another worker process
    correctness._load_checked_problem(request)
    assert len(checked) == 1 and any((tmp_path / "deterministic").iterdir())
    monkeypatch.setattr(correctness, "_checked_references", set())
    correctness._load_checked_problem(replace(request, seed=7))
    assert len(checked) == 2
