"""Where evaluation jobs run: local worker subprocesses, or Ray tasks across a cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Protocol

from mkevolve.workers.pool import (DEFAULT_PRELOAD, Job, JobFailure, JobOutcome, WorkerPool, prestart_pool,
                                   take_pool)


class Executor(Protocol):
    size: int
    # Its jobs run on this machine and share its reference and baseline caches, so work one job leaves in
    # them (Verifier.prepare) spares the next
    shares_caches: bool

    def run(self, job: Job) -> JobOutcome: ...

    def run_many(self, jobs: list[Job]) -> list[JobOutcome]: ...

    def refuse_new_jobs(self) -> None: ...

    def abort(self) -> None: ...   # interrupted: running jobs stop now where they can, none starts

    def close(self) -> None: ...


def visible_gpus() -> list[int]:
    """GPU indices this process may use, found without opening a CUDA context here."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [int(x) for x in listed.split(",") if x.strip().isdigit()]
    if shutil.which("nvidia-smi") is None:
        return []
    probe = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return []
    return [int(x) for x in probe.stdout.split() if x.isdigit()]


CPU_WORKERS_DEFAULT = 2

# On GPUs, a verifier worker starts its zygote first (no torch needed), then imports torch, then opens its CUDA
# context: started by prestart_executor before the command's own imports, the zygote's imports and first standby
# (about 10 s on the H200) no longer wait for the verifier's first job to reach the worker.
_GPU_VERIFIER_PRELOAD = ("mkevolve.verify.candidate_zygote:start_in_background", *DEFAULT_PRELOAD,
                         "mkevolve.verify.candidate_run:warm_worker_early")


def verifier_preload(gpus: list[int]) -> tuple[str, ...]:
    """What a local verifier pool's workers load as they start (pool.PRELOAD_ENV)."""
    return _GPU_VERIFIER_PRELOAD if gpus else DEFAULT_PRELOAD


def local_size(workers: int, gpus: list[int]) -> int:
    """A local pool's worker count: `workers`, else one per GPU, else CPU_WORKERS_DEFAULT."""
    return workers or len(gpus) or CPU_WORKERS_DEFAULT


class LocalExecutor:
    """`workers` worker subprocesses over the visible GPUs, or interpreter workers on a machine without one.

    0 workers means the default: one per GPU, or CPU_WORKERS_DEFAULT on CPU.
    """

    shares_caches = True

    def __init__(self, workers: int = 0):
        gpus = visible_gpus()
        # started ahead by prestart_executor, if it was
        self.pool = take_pool(local_size(workers, gpus), gpus, verifier_preload(gpus))
        self.size = self.pool.size

    def run(self, job: Job) -> JobOutcome:
        return self.pool.run(job)

    def run_many(self, jobs: list[Job]) -> list[JobOutcome]:
        return self.pool.run_many(jobs)

    def refuse_new_jobs(self) -> None:
        self.pool.refuse_new_jobs()

    def abort(self) -> None:
        self.pool.abort()

    def close(self) -> None:
        self.pool.close()


def _ray_job(job: Job) -> JobOutcome:
    """A Ray task: the job still runs in a sandboxed worker subprocess on the node's GPU."""
    with WorkerPool(size=1, gpus=visible_gpus()[:1]) as pool:
        return pool.run(job)


class RayExecutor:
    """Ray tasks with one GPU each; the cluster is the one `ray.init()` finds (RAY_ADDRESS)."""

    shares_caches = False    # a task lands on any node, with that node's caches

    def __init__(self):
        import ray

        if not ray.is_initialized():
            ray.init()
        gpus = int(ray.cluster_resources().get("GPU", 0))
        self._ray = ray
        self._task = ray.remote(num_gpus=1 if gpus else 0)(_ray_job)
        self._refusing = False
        self.size = max(1, gpus or int(ray.cluster_resources().get("CPU", 1)))

    def run(self, job: Job) -> JobOutcome:
        return self.run_many([job])[0]

    def run_many(self, jobs: list[Job]) -> list[JobOutcome]:
        if self._refusing:
            return [JobOutcome(failure=JobFailure.NOT_STARTED, reason="the run is closing") for _ in jobs]
        return self._ray.get([self._task.remote(job.to_send()) for job in jobs])

    def refuse_new_jobs(self) -> None:
        self._refusing = True

    def abort(self) -> None:
        """Tasks already sent run to their end on the cluster; no new one is sent."""
        self.refuse_new_jobs()

    def close(self) -> None:
        """The cluster outlives a run; nothing to release here."""


def prestart_executor(kind: str, workers: int) -> None:
    """Start the workers make_executor(kind, workers) will use, now (a local pool's; Ray's are the cluster's)."""
    if kind != "ray":
        gpus = visible_gpus()
        prestart_pool(local_size(workers, gpus), gpus, verifier_preload(gpus))


def make_executor(kind: str, workers: int) -> Executor:
    if kind == "ray":
        return RayExecutor()
    return LocalExecutor(workers)
