"""Worker subprocesses that run untrusted evaluation jobs under a hard time limit."""

from __future__ import annotations

import itertools
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Protocol

from mkevolve.workers.gpu_share import LOCK_ENV, lock_path

_HEADER = struct.Struct("!Q")
# Modules a worker imports before it says it is ready (comma-separated, in its environment): their import
# (torch: seconds, more on a loaded machine) is start-up, not part of the first job's time limit.
PRELOAD_ENV = "MKEVOLVE_WORKER_PRELOAD"
DEFAULT_PRELOAD = ("torch",)
STARTUP_TIMEOUT_S = 300.0   # a worker that has not said it is ready by then is killed
# The pool's log folder, in each worker's environment: what a worker starts logs there too, and goes with it.
LOG_DIR_ENV = "MKEVOLVE_WORKER_LOG_DIR"


class QueuePlace(Protocol):
    """A job's place in the queue for a worker that changes while it waits: a check can wait minutes behind
    full-size jobs, and meanwhile its beam step gets a passing kernel or another of its checks starts."""

    def rank(self) -> int:
        """Smaller goes first; read each time a worker comes free."""

    def started(self) -> None:
        """Told when one of the jobs that hold this place gets a worker."""


Priority = int | QueuePlace


def priority_now(priority: Priority) -> int:
    return priority if isinstance(priority, int) else priority.rank()


class JobFailure(str, Enum):
    """Why a worker gave no value; the values are the verifier's status names for the same events, but for
    NOT_STARTED: the job waited for a worker past its `start_by` and never ran; WITHDRAWN: it was withdrawn
    while it waited (`Job.withdrawn`) and never ran; STOPPED: it was still running at its `end_by`, and its
    worker was killed; and INTERRUPTED: the run was interrupted (abort()) before the job ended."""

    TIMEOUT = "timeout"
    CRASHED = "crashed"
    NOT_STARTED = "not_started"
    WITHDRAWN = "withdrawn"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Job:
    """A call of `fn` ("package.module:function") with picklable keyword arguments, in a worker."""

    fn: str
    kwargs: dict = field(default_factory=dict)
    timeout: float = 300.0
    start_by: float | None = None   # time.time() after which a job still waiting for a worker is not run
    end_by: float | None = None     # time.time() at which a job still running is stopped (its worker killed)
    # Among jobs waiting for a worker, smaller runs first (equal: first come). A candidate check carries its
    # beam step (a QueuePlace, asked each time a worker comes free), whose rank puts subproblems without a
    # passing kernel first and then the step nearest its end, so its search goes on to its next step (and
    # LLM calls) sooner.
    priority: Priority = 0
    # Set while the job still waits for a worker: it is not run (WITHDRAWN) when its turn comes. An end-to-end
    # check run ahead whose composition a better kernel has replaced gives its place up this way.
    withdrawn: threading.Event | None = None

    def to_send(self) -> Job:
        """This job as it goes to another process: a live priority reads this run's search state, which stays
        here, so it travels as the number it is now; whether it was withdrawn was read before it was sent."""
        return replace(self, priority=priority_now(self.priority), withdrawn=None)


@dataclass
class JobOutcome:
    """What came back: the function's value, or why the worker gave none (timeout, crashed)."""

    value: object = None
    failure: JobFailure | None = None
    reason: str = ""
    wall_s: float = 0.0
    worker_start_s: float = 0.0  # seconds from starting a fresh worker for this job to its ready message

    @property
    def ok(self) -> bool:
        return self.failure is None


def send_message(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """Read n bytes from fd; None on EOF; TimeoutError past the deadline."""
    chunks, remaining = [], n
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive_message(fd: int, deadline: float | None = None):
    header = read_exact(fd, _HEADER.size, deadline)
    if header is None:
        raise EOFError
    body = read_exact(fd, _HEADER.unpack(header)[0], deadline)
    if body is None:
        raise EOFError
    return pickle.loads(body)


class WorkerStartError(Exception):
    """A worker that did not say it was ready: it died while importing, or took too long."""


class Worker:
    """One subprocess in its own process group; replaced after a timeout or a crash."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", dir=log_dir, delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mkevolve.workers.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            env=env, start_new_session=True,
        )
        self.ready = False

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Block until the worker has imported its preloads and said so (at once when it has); raises
        WorkerStartError (and kills it) when it dies first or takes longer than `timeout` seconds."""
        if self.ready:
            return
        try:
            message = receive_message(self.proc.stdout.fileno(), time.monotonic() + timeout)
        except TimeoutError:
            self.kill()
            raise WorkerStartError(f"not ready within {timeout:g} s") from None
        except EOFError:
            code = self.proc.wait()
            tail = self._log_tail()
            self.kill()
            raise WorkerStartError(f"it died while starting ({_describe_exit(code)}){tail}") from None
        if not message.get("ready"):
            self.kill()
            last = (message.get("error") or "").strip().splitlines()[-1:] or ["no reason given"]
            raise WorkerStartError(f"its preload failed: {last[0]}")
        self.ready = True

    def run(self, job: Job) -> JobOutcome:
        start = time.monotonic()
        limit = job.timeout
        stopped_by_end = job.end_by is not None and job.end_by - time.time() < limit
        if stopped_by_end:
            limit = max(0.0, job.end_by - time.time())
        try:
            send_message(self.proc.stdin, job.to_send())
            reply = receive_message(self.proc.stdout.fileno(), start + limit)
        except TimeoutError:
            self.kill()
            if stopped_by_end:
                return JobOutcome(failure=JobFailure.STOPPED, wall_s=time.monotonic() - start,
                                  reason=f"still running at its end-by time, after {limit:.0f} s; worker killed")
            return JobOutcome(failure=JobFailure.TIMEOUT, wall_s=time.monotonic() - start,
                              reason=f"no result within the {job.timeout:g} s time limit; worker killed")
        except (EOFError, BrokenPipeError):
            code = self.proc.wait()
            return JobOutcome(failure=JobFailure.CRASHED, wall_s=time.monotonic() - start,
                              reason=f"worker died ({_describe_exit(code)}){self._log_tail()}")
        if not reply["healthy"]:
            self.kill()
        wall_s = time.monotonic() - start
        if reply["error"]:
            last = reply["error"].strip().splitlines()[-1]
            return JobOutcome(failure=JobFailure.CRASHED, reason=f"evaluation raised {last}", wall_s=wall_s)
        return JobOutcome(value=reply["value"], wall_s=wall_s)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the worker's process group, leaving its pipes to whoever reads them (kill() closes
        them, which a thread still reading would trip over)."""
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass  # already gone

    def kill(self) -> None:
        """Stop the worker's whole process group and release its pipes and log; safe to repeat."""
        if self.proc.stdin.closed:
            return
        if self.alive:
            self.signal_group(signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()
        self.log.close()
        os.unlink(self.log.name)

    def _log_tail(self) -> str:
        self.log.flush()
        return log_tail(Path(self.log.name))


def log_tail(path: Path, limit: int = 600) -> str:
    """": <the last 4 non-empty lines of a process's log>", for a reason that says why it died; "" if none."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-4:])[-limit:]
    return f": {tail}" if tail else ""


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


SHARERS_ENV = "MKEVOLVE_GPU_SHARERS"  # how many workers share this worker's GPU


def worker_env(device_index: int | None, sharers: int = 1) -> dict[str, str]:
    """A worker's environment: one GPU (and how many workers share it), or the Triton interpreter on CPU."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if device_index is None:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(device_index)
        env[LOCK_ENV] = lock_path(device_index)
        env[SHARERS_ENV] = str(sharers)
        env.pop("TRITON_INTERPRET", None)
    return env


class _Slots:
    """Free worker slots, handed to waiting jobs by priority (smaller first), then in order of arrival. The
    priorities are read when a slot is handed out, not when a job starts to wait; the job it goes to is chosen
    then, under the lock, so no two waiters can each find the other first while a slot stays free."""

    def __init__(self, slots: range):
        self._free = list(slots)
        self._waiting: dict[int, Priority] = {}          # arrival number -> that job's priority
        self._granted: dict[int, int] = {}               # arrival number -> the slot handed to it
        self._arrivals = itertools.count()
        self._changed = threading.Condition()
        self._refusing = False

    def take(self, priority: Priority) -> int | None:
        """A free slot, when this job's turn comes; None once refuse() was called."""
        with self._changed:
            arrival = next(self._arrivals)
            self._waiting[arrival] = priority
            self._hand_out()
            while not self._refusing and arrival not in self._granted:
                self._changed.wait()
            self._waiting.pop(arrival, None)
            slot = self._granted.pop(arrival, None)
            if self._refusing:
                if slot is not None:
                    self._free.append(slot)
                return None
            return slot

    def give_back(self, slot: int) -> None:
        with self._changed:
            self._free.append(slot)
            self._hand_out()

    def _hand_out(self) -> None:
        """Free slots to the first in line, the longest free slot first, as a queue would (lock held)."""
        while self._free and self._waiting:
            first = min(self._waiting, key=lambda arrival: (priority_now(self._waiting[arrival]), arrival))
            priority = self._waiting.pop(first)
            self._granted[first] = self._free.pop(0)
            if not isinstance(priority, int):
                priority.started()      # before the next choice, which may rank its place differently
        self._changed.notify_all()

    def refuse(self) -> None:
        with self._changed:
            self._refusing = True
            self._changed.notify_all()


class WorkerPool:
    """A fixed number of worker slots; a job takes a free slot, its worker starts on first use.

    With GPUs, slots are dealt out over them in turn; several slots on one GPU share it (gpu_share.py).
    """

    def __init__(self, size: int, gpus: list[int] | None = None, preload: tuple[str, ...] = DEFAULT_PRELOAD):
        self.gpus = gpus or []
        self.size = max(1, size)
        self.preload = preload
        self._log_dir: Path | None = None  # made when the first worker starts, removed by close()
        self._slots = _Slots(range(self.size))
        self._workers: dict[int, Worker | None] = {slot: None for slot in range(self.size)}
        self._lock = threading.Lock()
        self._aborted = False   # abort(): running jobs end INTERRUPTED, no new job starts

    def run(self, job: Job) -> JobOutcome:
        slot = self._slots.take(job.priority)
        if slot is None and self._aborted:
            return JobOutcome(failure=JobFailure.INTERRUPTED, reason="the run was interrupted")
        if slot is None:
            return JobOutcome(failure=JobFailure.NOT_STARTED, reason="the worker pool is closing")
        try:
            if job.start_by is not None and time.time() >= job.start_by:
                return JobOutcome(failure=JobFailure.NOT_STARTED,
                                  reason="its start-by time passed while it waited for a worker")
            if job.withdrawn is not None and job.withdrawn.is_set():
                return JobOutcome(failure=JobFailure.WITHDRAWN, reason="withdrawn while it waited for a worker")
            try:
                worker, start_s = self._healthy_worker(slot)
            except WorkerStartError as err:
                return JobOutcome(failure=JobFailure.CRASHED, reason=f"worker did not start: {err}")
            outcome = worker.run(job)
            outcome.worker_start_s = start_s
            if self._aborted:   # its worker was stopped under it, or it finished as the run stopped: no verdict
                return JobOutcome(failure=JobFailure.INTERRUPTED, wall_s=outcome.wall_s,
                                  reason="the run was interrupted; its worker was stopped")
            return outcome
        finally:
            self._slots.give_back(slot)

    def run_many(self, jobs: list[Job]) -> list[JobOutcome]:
        if len(jobs) <= 1:
            return [self.run(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=self.size) as pool:
            return list(pool.map(self.run, jobs))

    def start(self) -> None:
        """Start every slot's worker process now, without waiting for any: their imports (torch, 2.7 s on the
        H200) then overlap whatever the caller does before its first job."""
        for slot in range(self.size):
            self._started_worker(slot)

    def _healthy_worker(self, slot: int) -> tuple[Worker, float]:
        """The slot's worker, ready for a job (started or replaced first where it is not running), and the
        seconds waited for it."""
        worker = self._started_worker(slot)
        if worker.ready:
            return worker, 0.0
        start = time.monotonic()
        worker.wait_ready()
        return worker, time.monotonic() - start

    def _started_worker(self, slot: int) -> Worker:
        with self._lock:
            worker = self._workers[slot]
            if worker is not None and worker.alive:
                return worker
            if worker is not None:
                worker.kill()
            if self._log_dir is None:
                self._log_dir = Path(tempfile.mkdtemp(prefix="mkevolve-workers-"))
            device = self.device_of(slot)
            sharers = sum(1 for other in range(self.size) if self.device_of(other) == device)
            env = {**worker_env(device, sharers), PRELOAD_ENV: ",".join(self.preload),
                   LOG_DIR_ENV: str(self._log_dir)}
            self._workers[slot] = Worker(env, self._log_dir)
            return self._workers[slot]

    def device_of(self, slot: int) -> int | None:
        return self.gpus[slot % len(self.gpus)] if self.gpus else None

    def refuse_new_jobs(self) -> None:
        """Jobs waiting for a worker, and any submitted later, end NOT_STARTED; running jobs go on. Before
        close(), so that no job waiting in another thread starts a worker after close() stopped them all."""
        self._slots.refuse()

    def abort(self) -> None:
        """The run is interrupted: no job starts from now on, and every worker stops at once rather than after
        its job (SIGTERM: it stops its zygote and candidate first), so the threads waiting on them return (their
        jobs end INTERRUPTED). close() still follows, and kills what did not stop."""
        self._aborted = True
        self.refuse_new_jobs()
        with self._lock:
            workers = [w for w in self._workers.values() if w is not None]
        for worker in workers:
            worker.signal_group(signal.SIGTERM)

    def close(self) -> None:
        """Stop every worker and remove the pool's log folder (each worker's kill removed its own log)."""
        for slot, worker in self._workers.items():
            if worker is not None:
                worker.kill()
                self._workers[slot] = None
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)  # a log a worker still held open goes with it
            self._log_dir = None

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- pools started ahead of their owners (workers/prestart.py) ----------------------------------------------

_prestarted: dict[tuple, list[WorkerPool]] = {}   # by (size, GPUs, preloads): pools of one key are alike
_prestarted_lock = threading.Lock()


def _pool_key(size: int, gpus: list[int] | None, preload: tuple[str, ...]) -> tuple:
    return max(1, size), tuple(gpus or ()), tuple(preload)


def prestart_pool(size: int, gpus: list[int] | None = None, preload: tuple[str, ...] = DEFAULT_PRELOAD) -> None:
    """Start a pool's workers now, for the owner that later asks take_pool for a pool like it."""
    pool = WorkerPool(size, gpus, preload)
    pool.start()
    with _prestarted_lock:
        _prestarted.setdefault(_pool_key(size, gpus, preload), []).append(pool)


def take_pool(size: int, gpus: list[int] | None = None, preload: tuple[str, ...] = DEFAULT_PRELOAD) -> WorkerPool:
    """A pool prestart_pool started with these arguments, the caller's to close from now on; else a new one."""
    with _prestarted_lock:
        waiting = _prestarted.get(_pool_key(size, gpus, preload))
        pool = waiting.pop(0) if waiting else None
    return pool or WorkerPool(size, gpus, preload)


def close_prestarted() -> None:
    """Stop the prestarted pools no owner took (the command ended before it needed them)."""
    with _prestarted_lock:
        pools = [pool for waiting in _prestarted.values() for pool in waiting]
        _prestarted.clear()
    for pool in pools:
        pool.close()
