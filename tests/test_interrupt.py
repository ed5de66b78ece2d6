"""Ctrl-C or SIGTERM stops a run in seconds: the workers stop their zygotes and candidates, running and waiting
jobs end INTERRUPTED (their candidates get no verdict), searches ask for nothing more, and the subproblem a search
was on is searched again when the run resumes."""

import json
import os
import signal
import threading
import time

import pytest

from mkevolve.orchestrator import interrupted_by_signals
from mkevolve.verify.result import Status
from mkevolve.verify.verifier import _to_result
from mkevolve.workers.pool import Job, JobFailure, WorkerPool


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"   # a zombie has stopped running
    except FileNotFoundError:
        return True


def _wait_for(condition, seconds: float = 30.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_abort_ends_running_and_waiting_jobs_at_once_and_stops_the_workers_zygote_and_candidate(tmp_path):
    report = tmp_path / "pids.json"
    with WorkerPool(size=1, preload=()) as pool:
        outcomes = {}
        running = threading.Thread(target=lambda: outcomes.update(
            running=pool.run(Job("tests.fault_jobs:hang_in_a_zygote_child", {"report_path": str(report)}, 600))))
        running.start()
        assert _wait_for(report.exists), "the job never started its zygote's child"
        waiting = threading.Thread(target=lambda: outcomes.update(waiting=pool.run(Job("tests.fault_jobs:pid"))))
        waiting.start()
        pids = json.loads(report.read_text())
        started = time.monotonic()
        pool.abort()
        running.join(30)
        waiting.join(30)
        took = time.monotonic() - started
    assert outcomes["running"].failure is JobFailure.INTERRUPTED
    assert outcomes["waiting"].failure is JobFailure.INTERRUPTED
    assert took < 10
    assert _wait_for(lambda: _gone(pids["child"]) and _gone(pids["zygote"]), 10)


def test_an_interrupted_check_is_no_verdict_on_its_candidate():
    from mkevolve.workers.pool import JobOutcome

    result = _to_result(JobOutcome(failure=JobFailure.INTERRUPTED, reason="the run was interrupted"))
    assert result.status is Status.NOT_RUN and "interrupted" in result.reason


class _AbortRecorder:
    def __init__(self, calls: list):
        self.calls = calls

    def abort(self):
        self.calls.append("abort")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_in_a_run_interrupts_it_first_then_raises_keyboard_interrupt(signum):
    calls = []
    interrupted = threading.Event()
    before = signal.getsignal(signum)
    with pytest.raises(KeyboardInterrupt):
        with interrupted_by_signals(_AbortRecorder(calls), interrupted):
            os.kill(os.getpid(), signum)
            time.sleep(5)     # the handler runs here, in the main thread
    assert calls == ["abort"] and interrupted.is_set()
    assert signal.getsignal(signum) is before


def test_an_interrupted_search_asks_for_nothing(tmp_path):
    from mkevolve.agents.evolve import evolve_kernel
    from mkevolve.config import RunConfig
    from mkevolve.search.beam import Beam

    interrupted = threading.Event()
    interrupted.set()
    beam = Beam(width=2)
    # No client and no verifier: any call to either would fail the test.
    evolved = evolve_kernel("sub", tmp_path / "sub.py", beam, 8, None, None, RunConfig(), tmp_path,
                            interrupted=interrupted)
    assert evolved.next_seq == beam.next_seq and evolved.members == []


def test_solve_wires_a_signal_to_its_search_and_its_verifier(monkeypatch, tmp_path):
    """`mkevolve solve` has the same loop as `run`: a signal must stop its search and abort its checks."""
    import contextlib

    from mkevolve import solve as solve_module
    from mkevolve.config import RunConfig
    from mkevolve.search.beam import Beam

    seen = {}

    class FakeVerifier:
        def __init__(self, config, events):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def abort(self):
            seen["aborted"] = True

    @contextlib.contextmanager
    def signal_arrives(verifier, interrupted):
        interrupted.set()     # as the handler does, before the search returns
        verifier.abort()
        yield

    def search(problem_path, config, out_dir, verifier, client, interrupted=None):
        seen["interrupted"] = interrupted is not None and interrupted.is_set()
        return Beam(width=1)

    monkeypatch.setattr(solve_module, "Verifier", FakeVerifier)
    monkeypatch.setattr(solve_module, "interrupted_by_signals", signal_arrives)
    monkeypatch.setattr(solve_module, "_search", search)
    monkeypatch.setattr(solve_module, "_write_outputs", lambda outcome: None)
    problem = tmp_path / "p.py"
    problem.write_text("x = 1\n")
    solve_module.solve(problem, RunConfig(), tmp_path / "out", client=type("C", (), {"emit_totals": lambda s: None})())
    assert seen == {"aborted": True, "interrupted": True}
