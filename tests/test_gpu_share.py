"""The GPU lock that lets several workers share one GPU: shared holds coexist, timed runs wait for them
and go first. flock locks belong to an open file, so two GpuShare objects conflict like two processes."""

import threading
import time

import pytest

from mkevolve.workers.executor import LocalExecutor
from mkevolve.workers.gpu_share import LOCK_ENV, GpuShare
from mkevolve.workers.pool import Job, JobOutcome, WorkerPool, worker_env


def _in_thread(work) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def body():
        work()
        done.set()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, done


def _enter(lock) -> None:
    """Takes a lock and keeps it until the test's locks are closed."""
    lock.__enter__()


def test_shared_holds_coexist(tmp_path):
    a, b = GpuShare(str(tmp_path / "gpu0")), GpuShare(str(tmp_path / "gpu0"))

    def both_shared():
        with b.shared():
            pass

    with a.shared():
        _, done = _in_thread(both_shared)
        assert done.wait(5), "a second shared hold blocked behind the first"


def test_timed_runs_wait_for_shared_work(tmp_path):
    a, b = GpuShare(str(tmp_path / "gpu0")), GpuShare(str(tmp_path / "gpu0"))

    def timed():
        with b.alone():
            pass

    with a.shared():
        _, done = _in_thread(timed)
        assert not done.wait(0.3), "alone() entered while another job held the GPU"
    assert done.wait(5)


def test_a_waiting_timer_goes_before_new_jobs(tmp_path):
    path = str(tmp_path / "gpu0")
    holder, timer, newcomer = GpuShare(path), GpuShare(path), GpuShare(path)
    order: list[str] = []

    def timed():
        with timer.alone():
            order.append("timer")

    def job():
        with newcomer.shared():
            order.append("job")

    with holder.shared():
        _, timer_done = _in_thread(timed)
        time.sleep(0.2)  # the timer now waits at the gate
        _, job_done = _in_thread(job)
        time.sleep(0.2)
        assert order == []
    assert timer_done.wait(5) and job_done.wait(5)
    assert order == ["timer", "job"]


def test_alone_inside_a_job_gives_up_the_shared_hold_and_takes_it_back(tmp_path):
    path = str(tmp_path / "gpu0")
    worker, other = GpuShare(path), GpuShare(path)
    with worker.shared():
        with worker.alone():
            _, done = _in_thread(lambda: _enter(other.shared()))
            assert not done.wait(0.3), "a job started while the GPU was held alone"
        assert done.wait(5)
        _, timer_done = _in_thread(lambda: _enter(other.alone()))
        assert not timer_done.wait(0.3), "the shared hold was not taken back after alone()"


@pytest.fixture
def candidate_process(tmp_path, monkeypatch):
    """This process as a candidate process on GPU lock `path`: its share held for its life, Triton's compile
    hooks set (and put back after the test)."""
    from triton import knobs

    from mkevolve.workers import gpu_share

    path = str(tmp_path / "gpu0")
    monkeypatch.setenv(LOCK_ENV, path)
    monkeypatch.setattr(gpu_share, "_shares", {})
    monkeypatch.setattr(gpu_share, "_process_hold", [])
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    gpu_share.hold_for_process_life()
    gpu_share.lend_while_triton_compiles()
    return path, knobs.runtime


def test_a_candidate_process_holds_its_share_for_its_life(candidate_process):
    """The hold is kept after the call that takes it returns: a timer elsewhere waits for it."""
    from mkevolve.workers import gpu_share

    path, _ = candidate_process
    timer = GpuShare(path).alone()
    _, timed = _in_thread(timer.__enter__)
    assert not timed.wait(0.3), "alone() entered while a candidate process held the GPU"
    gpu_share._process_hold[0].__exit__(None, None, None)
    assert timed.wait(5)
    timer.__exit__(None, None, None)


def test_a_triton_compile_lends_the_shared_hold_and_takes_it_back(candidate_process):
    """In a candidate process Triton's compile hooks give up the job's shared hold: a timer elsewhere
    need not wait for the compile (CPU work); after it, the job waits for the timer before going on."""
    path, hooks = candidate_process
    assert hooks.jit_cache_hook(key="k", repr="kernel") is False       # compile as usual
    timer = GpuShare(path).alone()
    _, timed = _in_thread(timer.__enter__)
    assert timed.wait(5), "a timer waited for a job that was compiling"
    _, resumed = _in_thread(lambda: hooks.jit_post_compile_hook(key="k", repr="kernel"))
    assert not resumed.wait(0.3), "the job went back to the GPU while another job held it alone"
    timer.__exit__(None, None, None)
    assert resumed.wait(5)


def test_a_compile_that_raised_leaves_no_hold_given_up(candidate_process):
    from mkevolve.workers import gpu_share

    path, hooks = candidate_process
    hooks.jit_cache_hook(key="k", repr="kernel")   # the compile then raises: no after-compile hook
    gpu_share.resume_after_compiles()
    timer = GpuShare(path).alone()
    _, timed = _in_thread(timer.__enter__)
    assert not timed.wait(0.3), "the job's shared hold was not taken back"


def test_gpu_workers_get_a_lock_per_gpu_and_cpu_workers_none():
    assert worker_env(None).get(LOCK_ENV) is None
    assert worker_env(0)[LOCK_ENV] != worker_env(1)[LOCK_ENV]


def test_slots_are_dealt_over_the_gpus_in_turn():
    pool = WorkerPool(size=5, gpus=[0, 1])
    assert [pool.device_of(s) for s in range(5)] == [0, 1, 0, 1, 0]
    assert WorkerPool(size=2).device_of(1) is None


def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_waiting_jobs_get_the_free_worker_by_priority_then_arrival(monkeypatch):
    """One worker, busy: jobs of priority 3, 1, 2 and 1 queue up behind it (a check's priority is how many of
    its beam step's candidates still lack a verdict); the worker then takes the two 1s in arrival order,
    the 2, the 3."""
    pool = WorkerPool(size=1)
    started, release = [], threading.Event()

    class Worker:
        def run(self, job):
            started.append(job.kwargs["name"])
            if job.kwargs["name"] == "first":
                release.wait(10)
            return JobOutcome()

    monkeypatch.setattr(pool, "_healthy_worker", lambda slot: (Worker(), 0.0))
    threads = []
    for count, (name, priority) in enumerate([("first", 0), ("c", 3), ("a1", 1), ("b", 2), ("a2", 1)]):
        thread = threading.Thread(target=pool.run, args=(Job("jobs:any", {"name": name}, priority=priority),))
        thread.start()
        threads.append(thread)
        _until(lambda: started == ["first"] if count == 0 else len(pool._slots._waiting) == count)
    release.set()
    for thread in threads:
        thread.join(10)
    assert started == ["first", "a1", "a2", "b", "c"]


def test_a_closing_pool_ends_waiting_jobs_at_once_and_lets_the_running_one_finish(monkeypatch):
    """refuse_new_jobs() before close(): a job waiting for the busy worker (a prepare job behind a check)
    comes back NOT_STARTED without waiting, and so does one sent later; the running job completes."""
    from mkevolve.workers.pool import JobFailure

    pool = WorkerPool(size=1)
    started, release, outcomes = [], threading.Event(), {}

    class Worker:
        def run(self, job):
            started.append(job.kwargs["name"])
            release.wait(10)
            return JobOutcome(value=job.kwargs["name"])

    monkeypatch.setattr(pool, "_healthy_worker", lambda slot: (Worker(), 0.0))

    def send(name):
        outcomes[name] = pool.run(Job("jobs:any", {"name": name}, priority=1 << 30))

    running = threading.Thread(target=send, args=("running",))
    running.start()
    _until(lambda: started == ["running"])
    waiting = threading.Thread(target=send, args=("waiting",))
    waiting.start()
    _until(lambda: len(pool._slots._waiting) == 1)
    pool.refuse_new_jobs()
    waiting.join(5)
    assert not waiting.is_alive() and outcomes["waiting"].failure is JobFailure.NOT_STARTED
    assert pool.run(Job("jobs:any", {"name": "later"})).failure is JobFailure.NOT_STARTED
    release.set()
    running.join(5)
    assert outcomes["running"].value == "running" and started == ["running"]


def test_a_closed_pool_leaves_no_log_folder_behind():
    pool = WorkerPool(size=1)
    assert pool.run(Job("os:getpid", {}, 60)).value > 0
    log_dir = pool._log_dir
    assert log_dir is not None and log_dir.is_dir()
    pool.close()
    assert not log_dir.exists()
    pool.close()  # twice is harmless


def test_worker_count_defaults(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert LocalExecutor(0).size == 2
    assert LocalExecutor(3).size == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert LocalExecutor(0).size == 2
    assert LocalExecutor(6).size == 6


def _measure_baseline_in_a_job(lock_path: str, cache_dir: str, delay_s: float) -> None:
    """A worker's job that needs torch.compile's time: measured once, under the key's lock, and timed alone."""
    import os
    from pathlib import Path

    os.environ[LOCK_ENV] = lock_path
    from mkevolve.verify.result import Timing
    from mkevolve.verify.timing import cached_baseline
    from mkevolve.workers.gpu_share import gpu_alone, job_on_gpu

    def measure() -> Timing:
        time.sleep(0.5)  # compiling, with the GPU shared: the other job reaches the key's lock meanwhile
        with gpu_alone():
            return Timing(median_ms=1.0, p10_ms=1.0, p20_ms=1.0, p80_ms=1.0, p90_ms=1.0, runs=1)

    with job_on_gpu():
        time.sleep(delay_s)
        cached_baseline(Path(cache_dir), "key", measure)


def test_jobs_waiting_for_one_baseline_let_its_timing_have_the_gpu(tmp_path):
    """Two workers ask for the same uncached baseline: the second waits for the first's result, and must not
    keep its shared hold meanwhile, or the first's timed runs (alone) and the second wait for each other."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    jobs = [spawn.Process(target=_measure_baseline_in_a_job, args=(str(tmp_path / "gpu0"), str(tmp_path), delay))
            for delay in (0.0, 0.2)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(timeout=30)
    stuck = [job for job in jobs if job.is_alive()]
    for job in stuck:
        job.kill()
    assert not stuck, "the two jobs deadlocked on the baseline's lock and the GPU lock"
    assert [job.exitcode for job in jobs] == [0, 0]


def test_a_worker_hands_its_cached_gpu_memory_back_between_jobs(monkeypatch):
    """Runs sharing a GPU: an idle worker keeps no cached blocks another run's check could use."""
    import torch

    from mkevolve.workers import worker

    released = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: released.append(True))
    worker._release_cached_gpu_memory()
    assert released == [True]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)    # no CUDA context: nothing to release
    worker._release_cached_gpu_memory()
    assert released == [True]


def test_the_baseline_s_inductor_compile_lets_a_timer_have_the_gpu(tmp_path, monkeypatch):
    """A worker holding its GPU shared (as around every job) lends it while Inductor compiles the baseline, so
    another process's timer runs meanwhile; the worker holds the GPU again once the compile returns."""
    import torch
    import torch._inductor.compile_fx

    from mkevolve.verify.correctness import inductor_with_the_gpu_lent
    from mkevolve.workers import gpu_share

    path = str(tmp_path / "gpu0")
    monkeypatch.setenv(LOCK_ENV, path)
    monkeypatch.setattr(gpu_share, "_shares", {})
    timer = GpuShare(path)
    timed_during_compile = []

    def timed():
        with timer.alone():
            pass

    def compile_fx(graph, example_inputs):   # stands in for Inductor's compile: CPU work only
        _, done = _in_thread(timed)
        timed_during_compile.append(done.wait(5))
        return graph.forward

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", compile_fx)
    graph = torch.fx.symbolic_trace(torch.nn.ReLU())
    with gpu_share.job_on_gpu():
        compiled = inductor_with_the_gpu_lent(graph, [torch.ones(2)])
        _, after = _in_thread(timed)
        assert not after.wait(0.3), "the worker did not take its hold back after the compile"
    assert after.wait(5)
    assert timed_during_compile == [True] and compiled == graph.forward


def test_an_alone_hold_inside_another_keeps_the_gpu_until_the_outer_one_ends(tmp_path):
    """Code that times alone may run where its process holds the GPU alone already (a worker around a
    candidate's last try): the inner block must not unlock the outer hold (flock locks belong to the open
    file, not to the block)."""
    share, other = GpuShare(str(tmp_path / "gpu0")), GpuShare(str(tmp_path / "gpu0"))
    with share.alone():
        assert share.held_alone
        with share.alone():
            pass
        _, entered = _in_thread(lambda: other.shared().__enter__())
        assert not entered.wait(0.3), "the inner alone() let another job onto the GPU"
    assert not share.held_alone
    assert entered.wait(5)


def test_a_candidate_process_whose_worker_holds_the_gpu_alone_takes_no_hold(tmp_path, monkeypatch):
    """Its worker waits for it with the GPU held alone: a hold of its own would wait for the worker forever."""
    from mkevolve.workers import gpu_share

    path = str(tmp_path / "gpu0")
    monkeypatch.setenv(LOCK_ENV, path)
    monkeypatch.setattr(gpu_share, "_shares", {})
    monkeypatch.setattr(gpu_share, "_process_hold", [])
    worker = GpuShare(path)
    with worker.alone():
        gpu_share.give_up_locks()
        _, done = _in_thread(lambda: (gpu_share.hold_for_process_life(), gpu_share.gpu_alone().__enter__()))
        assert done.wait(5), "the candidate process waited for its own worker's hold"
        assert not gpu_share.held_alone()


def test_a_process_holding_the_gpu_alone_gives_it_up_while_it_waits_for_another(tmp_path, monkeypatch):
    """A check's last try holds the GPU alone; when it waits for a lock another job holds (a baseline being
    timed, a reference set being written), that job may need the GPU before it lets go: the wait gives the
    hold up, and takes it back alone once the other has let go of the GPU."""
    from mkevolve.workers import gpu_share

    path = str(tmp_path / "gpu0")
    monkeypatch.setenv(LOCK_ENV, path)
    monkeypatch.setattr(gpu_share, "_shares", {})
    other, key = GpuShare(path), tmp_path / "baseline.lock"
    holder_has_key, holder_done = threading.Event(), threading.Event()

    def holder():          # holds the key's lock, then needs the GPU before it lets go
        with open(key, "a") as lock:
            gpu_share.fcntl.flock(lock, gpu_share.fcntl.LOCK_EX)
            holder_has_key.set()
            with other.shared():
                time.sleep(0.2)
        holder_done.set()

    with gpu_share.gpu_alone():
        _in_thread(holder)
        assert holder_has_key.wait(5)
        with open(key, "a") as lock:
            _, locked = _in_thread(lambda: gpu_share.lock_file(lock))
            assert locked.wait(5), "the wait for the key's lock kept the GPU from the job holding it"
        assert holder_done.wait(5) and gpu_share.held_alone()
        _, entered = _in_thread(lambda: other.shared().__enter__())
        assert not entered.wait(0.3), "the hold was not taken back alone after the wait"
