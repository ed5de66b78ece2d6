"""The worker sandbox: hangs, exits, segfaults and exceptions each cost one job, never the pool."""

import pytest

from mkevolve.workers.pool import JobFailure
from mkevolve.workers.pool import Job, WorkerPool


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


def test_stdout_chatter_does_not_break_protocol(pool):
    outcome = pool.run(job("print_and_return", value=21))
    assert outcome.ok and outcome.value == 42


def test_cpu_workers_use_the_triton_interpreter(pool):
    assert pool.run(job("interpreter_flag")).value == "1"


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
