"""Workers started ahead of their pools' owners: WorkerPool.start, prestart_pool / take_pool, and what
`mkevolve run` starts before its own imports (workers/prestart.py)."""

import importlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mkevolve.cli import build_parser
from mkevolve.config import RunConfig
from mkevolve.llm.providers import BuiltinProvider
from mkevolve.workers import pool as pool_module
from mkevolve.workers.executor import CPU_WORKERS_DEFAULT, LocalExecutor, prestart_executor, verifier_preload
from mkevolve.workers.pool import Job, WorkerPool, close_prestarted, prestart_pool, take_pool
from mkevolve.workers.prestart import BUILTIN_AGENT_WORKERS, prestarted_workers

PRELOAD = ("tests.worker_preloads",)   # imports in SLOW_PRELOAD_S seconds, as torch does on a loaded machine


@pytest.fixture(autouse=True)
def _nothing_left_prestarted():
    yield
    close_prestarted()


def _pid_job() -> Job:
    return Job("tests.fault_jobs:pid", {}, 30)


def test_a_started_pool_runs_its_first_job_in_the_worker_it_started_without_waiting_for_its_imports(monkeypatch):
    """The imports overlap what the owner does meanwhile (here a 2 s sleep), so the first job finds the worker
    ready; a pool that was not started makes its first job wait for the whole 2 s."""
    monkeypatch.setenv("SLOW_PRELOAD_S", "2")
    with WorkerPool(size=1, preload=PRELOAD) as started, WorkerPool(size=1, preload=PRELOAD) as lazy:
        started.start()
        time.sleep(2.5)
        first_pid = started._workers[0].proc.pid
        outcome = started.run(_pid_job())
        cold = lazy.run(_pid_job())
    assert outcome.ok and outcome.value == first_pid
    assert outcome.worker_start_s < 1.0
    assert cold.ok and cold.worker_start_s >= 2.0


def test_a_preload_named_module_colon_function_is_called_before_the_worker_says_ready():
    with WorkerPool(size=1, preload=("tests.worker_preloads:mark_started",)) as pool:
        outcome = pool.run(Job("tests.worker_preloads:started_marks", {}, 30))
    assert outcome.ok and outcome.value == ["mark_started"]


def test_a_job_waits_for_the_imports_a_preload_left_running_in_the_background():
    """Two threads importing modules that import each other can leave one a partially initialised module."""
    with WorkerPool(size=1, preload=("tests.worker_preloads:import_slowly",)) as pool:
        outcome = pool.run(Job("tests.worker_preloads:started_marks", {}, 30))
    assert outcome.ok and outcome.value == ["imported"]


def test_a_gpu_verifier_worker_starts_its_zygote_before_importing_torch():
    """Its preloads are names a worker resolves: a renamed function would fail every GPU worker's start, which
    this machine (no GPU) would never see. The zygote's module must not import torch, or nothing is gained."""
    preload = verifier_preload([0])
    assert preload[0] == "mkevolve.verify.candidate_zygote:start_in_background" and "torch" in preload[1:]
    for name in preload:
        module, _, function = name.partition(":")
        assert not function or callable(getattr(importlib.import_module(module), function))
    assert verifier_preload([]) == pool_module.DEFAULT_PRELOAD
    probe = "import sys, mkevolve.verify.candidate_zygote; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1]).stdout.strip() == "False"


def test_a_started_worker_that_died_before_its_first_job_is_replaced():
    with WorkerPool(size=1, preload=()) as pool:
        pool.start()
        dead = pool._workers[0]
        dead.kill()
        outcome = pool.run(_pid_job())
    assert outcome.ok and outcome.value != dead.proc.pid


def test_a_prestarted_pool_goes_to_the_first_owner_of_the_same_pool_only():
    prestart_pool(1, preload=())
    other_size = take_pool(2, preload=())
    taken = take_pool(1, preload=())
    again = take_pool(1, preload=())
    try:
        assert taken._workers[0] is not None           # started by prestart_pool
        assert other_size._workers == {0: None, 1: None}
        assert again is not taken and again._workers[0] is None
    finally:
        for p in (other_size, taken, again):
            p.close()


def test_pools_no_owner_took_are_stopped():
    prestart_pool(1, preload=())
    ((left,),) = pool_module._prestarted.values()
    worker = left._workers[0]
    close_prestarted()
    assert not worker.alive and pool_module._prestarted == {}


def test_the_local_executor_and_the_builtin_agent_take_the_pools_started_for_them(monkeypatch):
    """On a CPU with one evaluation worker both pools are alike: each owner still gets one of the two."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")     # no GPU: a CPU pool of the requested size
    prestart_executor("local", 1)
    prestart_pool(BUILTIN_AGENT_WORKERS)
    started = {id(p) for waiting in pool_module._prestarted.values() for p in waiting}
    executor = LocalExecutor(1)
    checking_only = BuiltinProvider()                  # a provider made to check the configuration takes none
    checking_only.check()
    provider = BuiltinProvider()
    try:
        assert len(started) == 2 and {id(executor.pool), id(provider._pool())} == started
        assert checking_only._workers is None and not any(pool_module._prestarted.values())
    finally:
        executor.close()
        provider._pool().close()


def _started_by(monkeypatch, argv: list[str]) -> list[tuple]:
    started = []
    monkeypatch.setattr("mkevolve.workers.prestart.prestart_pool",
                        lambda size, gpus=None, preload=pool_module.DEFAULT_PRELOAD: started.append((size, gpus)))
    monkeypatch.setattr("mkevolve.workers.executor.prestart_pool",
                        lambda size, gpus=None, preload=pool_module.DEFAULT_PRELOAD: started.append((size, gpus)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with prestarted_workers(build_parser().parse_args(argv)):
        pass
    return started


def test_a_new_run_starts_the_verifiers_workers_and_the_builtin_agents_before_its_imports(monkeypatch):
    assert _started_by(monkeypatch, ["run", "p.py", "--workers", "3"]) == [(3, []), (BUILTIN_AGENT_WORKERS, None)]


def test_a_run_with_a_providers_model_starts_no_builtin_agents_worker(monkeypatch):
    assert _started_by(monkeypatch, ["run", "p.py", "--model", "replay:r.yaml"]) == [(CPU_WORKERS_DEFAULT, [])]


def test_a_run_on_ray_starts_no_local_workers(monkeypatch):
    monkeypatch.setattr("mkevolve.workers.prestart.config_from_args",
                        lambda args: RunConfig(executor="ray"))   # Ray need not be installed for this
    assert _started_by(monkeypatch, ["run", "p.py"]) == [(BUILTIN_AGENT_WORKERS, None)]


@pytest.mark.parametrize("argv", [["run", "--resume", "runs/x"], ["check", "p.py", "s.py"],
                                  ["run", "p.py", "--config", "missing.yaml"]])
def test_resumes_other_commands_and_bad_settings_start_nothing_here(monkeypatch, argv):
    assert _started_by(monkeypatch, argv) == []


def test_a_run_that_fails_on_bad_input_leaves_no_prestarted_worker_running(monkeypatch, tmp_path, capsys):
    from mkevolve.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    started = []
    real_start = WorkerPool.start

    def recording_start(pool):
        real_start(pool)
        started.extend(w for w in pool._workers.values() if w is not None)

    monkeypatch.setattr(WorkerPool, "start", recording_start)
    missing = tmp_path / "missing.py"
    assert main(["run", str(missing), "--out", str(tmp_path / "out"), "--workers", "1"]) == 2
    assert "missing.py" in capsys.readouterr().err
    assert len(started) == 2                                  # the verifier's worker and the builtin agent's
    assert not any(w.alive for w in started) and not any(pool_module._prestarted.values())
