"""The worker sandbox: hangs, exits, segfaults and exceptions each cost one job, never the pool."""

import threading
import time
from pathlib import Path

import pytest

from mkevolve.agents.evolve import StepProgress
from mkevolve.workers.pool import JobFailure
from mkevolve.workers.pool import Job, WorkerPool, _Slots


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(size=1) as p:
        yield p


def job(name, timeout=60.0, **kwargs):
    return Job(f"tests.fault_jobs:{name}", kwargs, timeout)


def test_worker_is_reused_while_healthy(pool):
    first = pool.run(job("pid"))
    second = pool.run(job("pid"))
    assert first.ok and second.ok and first.value == second.value
    assert second.worker_start_s == 0.0


def test_a_job_with_a_live_priority_runs_in_a_worker(pool):
    """A live priority (a beam step, with its lock) stays in this process; the job still travels."""
    step = StepProgress(3)
    outcome = pool.run(Job("tests.fault_jobs:print_and_return", {"value": 2}, 60.0, priority=step))
    assert outcome.ok and outcome.value == 4 and step.checks_started == 1


def test_stdout_chatter_does_not_break_protocol(pool):
    outcome = pool.run(job("print_and_return", value=21))
    assert outcome.ok and outcome.value == 42


def test_cpu_workers_use_the_triton_interpreter(pool):
    assert pool.run(job("interpreter_flag")).value == "1"


@pytest.mark.slow
def test_hang_times_out_and_pool_recovers(pool):
    before = pool.run(job("pid")).value
    outcome = pool.run(job("hang", timeout=2.0))
    assert outcome.failure is JobFailure.TIMEOUT and "2 s time limit" in outcome.reason
    after = pool.run(job("pid"))
    assert after.ok and after.value != before and after.worker_start_s > 0


@pytest.mark.parametrize("name, fragment", [("exit_now", "exit code 3"), ("segfault", "SIGSEGV")])
def test_crash_costs_one_job(pool, name, fragment):
    outcome = pool.run(job(name))
    assert outcome.failure is JobFailure.CRASHED and fragment in outcome.reason
    assert pool.run(job("pid")).ok


def test_exception_is_reported_with_its_message(pool):
    outcome = pool.run(job("raise_error"))
    assert outcome.failure is JobFailure.CRASHED and "ValueError: broken on purpose" in outcome.reason
    assert pool.run(job("pid")).ok


def test_run_many_uses_every_slot():
    with WorkerPool(size=2) as two:
        outcomes = two.run_many([job("pid"), job("pid"), job("pid"), job("pid")])
    assert all(o.ok for o in outcomes)
    assert len({o.value for o in outcomes}) == 2


def test_start_up_is_measured_to_the_ready_message_and_kept_out_of_the_job_time_limit(monkeypatch):
    """A worker whose imports take 2 s still runs a job with a 1.5 s limit: the limit starts once it is ready."""
    monkeypatch.setenv("SLOW_PRELOAD_S", "2")
    with WorkerPool(size=1, preload=("tests.worker_preloads",)) as slow:
        outcome = slow.run(job("pid", timeout=1.5))
    assert outcome.ok, outcome.reason
    assert outcome.worker_start_s >= 2.0 and outcome.wall_s < 1.5


def test_a_worker_whose_preload_fails_costs_one_job_with_the_reason(monkeypatch):
    monkeypatch.setenv("BROKEN_PRELOAD", "1")
    with WorkerPool(size=1, preload=("tests.worker_preloads",)) as broken:
        outcome = broken.run(job("pid"))
    assert outcome.failure is JobFailure.CRASHED
    assert outcome.reason == ("worker did not start: its preload failed: "
                              "ImportError: this preload is broken on purpose")


def test_a_job_whose_start_by_time_has_passed_never_starts_a_worker():
    import time

    with WorkerPool(size=1) as fresh:
        outcome = fresh.run(Job("tests.fault_jobs:pid", start_by=time.time() - 1))
        assert outcome.failure is JobFailure.NOT_STARTED and "start-by" in outcome.reason
        assert fresh._workers[0] is None   # no worker process was started for it


def test_a_withdrawn_job_is_not_run_when_its_turn_comes_and_its_event_stays_on_this_side():
    import pickle
    import threading

    withdrawn = threading.Event()
    withdrawn.set()
    with WorkerPool(size=1) as fresh:
        outcome = fresh.run(Job("tests.fault_jobs:pid", withdrawn=withdrawn))
        assert outcome.failure is JobFailure.WITHDRAWN and "withdrawn" in outcome.reason
        assert fresh._workers[0] is None   # no worker process was started for it
        assert fresh.run(Job("tests.fault_jobs:pid", withdrawn=threading.Event())).ok   # not set: it runs
    assert pickle.loads(pickle.dumps(Job("tests.fault_jobs:pid", withdrawn=withdrawn).to_send())).withdrawn is None


def test_a_job_still_running_at_its_end_by_time_is_stopped_and_the_next_job_gets_a_fresh_worker():
    import time

    with WorkerPool(size=1) as pool:
        first_pid = pool.run(job("pid")).value
        started = time.monotonic()
        outcome = pool.run(Job("tests.fault_jobs:hang", timeout=60.0, end_by=time.time() + 1.0))
        assert outcome.failure is JobFailure.STOPPED and "end-by" in outcome.reason
        assert time.monotonic() - started < 30           # stopped at its end-by time, not at its 60 s limit
        assert pool.run(job("pid")).value not in (None, first_pid)   # a new worker, which works


def test_a_workers_zygote_logs_in_the_pools_log_folder_and_goes_with_it():
    """A zygote's error log is named for its worker and kept in the pool's log folder, so closing the pool
    leaves no file behind in the temporary folder."""
    pool = WorkerPool(1)
    outcome = pool.run(job("zygote_log"))
    log = Path(outcome.value)
    assert log.parent == pool._log_dir and log.name.startswith("mkevolve-zygote-")
    pool.close()
    assert not log.parent.exists()


def _served(slots, checks):
    """Each check (a name and its StepProgress) waits for `slots`' one slot, in this order, while a long job
    holds it; then the long job ends. The names in the order the slot went to them."""
    busy = slots.take(0)
    order = []

    def check(name, step):
        slot = slots.take(step)
        order.append(name)
        slots.give_back(slot)

    threads = [threading.Thread(target=check, args=check_args) for check_args in checks]
    for waiting, thread in enumerate(threads, start=1):
        thread.start()
        while len(slots._waiting) < waiting:        # in line in this order
            time.sleep(0.01)
    return busy, threads, order


def _finish(slots, busy, threads):
    slots.give_back(busy)
    for thread in threads:
        thread.join(timeout=10)


def test_a_check_that_waited_while_its_subproblems_first_kernel_passed_falls_behind():
    """The priority a check had when it began to wait is stale once its step is covered."""
    slots = _Slots(range(1))
    norm, conv = StepProgress(3), StepProgress(4)
    busy, threads, order = _served(slots, [("norm", norm), ("conv", conv)])
    norm.covered = True                           # its first kernel passed on another worker meanwhile
    _finish(slots, busy, threads)
    assert order == ["conv", "norm"]


def test_subproblems_without_a_passing_kernel_take_turns_for_workers():
    """The step with the fewest candidates left does not take every free worker while another subproblem
    without a passing kernel has had no check at all."""
    slots = _Slots(range(1))
    norm, conv = StepProgress(3), StepProgress(4)
    busy, threads, order = _served(slots, [("norm", norm), ("norm", norm), ("conv", conv)])
    _finish(slots, busy, threads)
    assert order == ["norm", "conv", "norm"]
    assert (norm.checks_started, conv.checks_started) == (2, 1)
