"""Sharing one GPU among worker processes: untimed work runs side by side, timed runs have the GPU alone.

Compiling and checking a kernel keeps the CPU busy and leaves the GPU mostly idle, so several workers
per GPU finish a search sooner; but a kernel timed while another worker's kernel runs would be timed
wrong. Every job therefore holds its GPU's lock shared, and a timed section trades that for the lock
held alone. The locks are flock(2) files named after the physical GPU, so workers of different runs on
one machine take turns too. A gate file gives timing priority: once a timer waits at the gate, no job
starts new GPU work until the timed runs are done, so a steady stream of jobs cannot starve it. A job
lends its hold while it does long CPU work: a worker while its candidate process runs (that process holds
its own), Inductor compiles a baseline, reference sets are written or a candidate's outputs read back; a
candidate process while Triton compiles a kernel. A check or candidate that ran out of the GPU memory other
jobs held gets its last try with the GPU alone, a candidate process then taking no hold of its own; every wait
for another job's lock gives up whatever hold the waiter has (`lock_file`), so that job can finish its GPU work.

The lock keeps honest jobs apart; it cannot hold a hostile one. A candidate process holds its share
itself, and its code can let go of it (closing the lock's descriptor is not an audited operation) or keep
launching kernels from a thread of its own while its harness waits for the GPU alone. Either way it can
slow another job's timed runs, never its own. It cannot slow its own subproblem's torch.compile baseline
either, which would raise its speedup: every job gets that baseline before its candidate process starts,
the first measuring it under the baseline's lock (verify/correctness.py), so no candidate of a subproblem
runs while its baseline is timed. The figures of record are timed again in a fresh process
(`mkevolve eval`, scripts/kernelbench.py).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, ContextManager, Iterator

LOCK_ENV = "MKEVOLVE_GPU_LOCK"


def lock_path(device_index: int) -> str:
    """Where the lock files of physical GPU `device_index` live (one folder per machine)."""
    return str(Path(tempfile.gettempdir()) / "mkevolve-gpu-locks" / f"gpu{device_index}")


class GpuShare:
    """A reader/writer lock across processes: `shared()` for a job, `alone()` for timed runs."""

    def __init__(self, path: str):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._gate = os.open(f"{path}.gate", os.O_RDONLY | os.O_CREAT, 0o666)
        self._gpu = os.open(f"{path}.gpu", os.O_RDONLY | os.O_CREAT, 0o666)
        self._holding_shared = False
        self._lent_to_cpu_work = False      # given up by lend(), taken back by resume()
        self._alone = False                 # inside alone(): a nested alone() holds nothing more

    @contextmanager
    def shared(self) -> Iterator[None]:
        self._take_shared()
        try:
            yield
        finally:
            self._drop()

    @contextmanager
    def alone(self) -> Iterator[None]:
        """Nothing else runs on this GPU inside; a shared hold of this process is given up meanwhile. Inside
        another alone() of this process it holds the GPU already, and an unlock on the way out would end the
        outer hold early (flock locks are per open file, not per block)."""
        if self._alone:
            yield
            return
        with self.lent():
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._gpu, fcntl.LOCK_EX)
                self._alone = True
                try:
                    yield
                finally:
                    self._alone = False
                    fcntl.flock(self._gpu, fcntl.LOCK_UN)
            finally:
                fcntl.flock(self._gate, fcntl.LOCK_UN)

    @property
    def held_alone(self) -> bool:
        return self._alone

    @contextmanager
    def yielded(self) -> Iterator[None]:
        """Every hold of this process given up inside, alone included, and taken back after (alone through
        the gate again): around a wait for another process, which may need the GPU before it lets go."""
        if not self._alone:
            with self.lent():
                yield
            return
        self._alone = False
        fcntl.flock(self._gpu, fcntl.LOCK_UN)
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            fcntl.flock(self._gpu, fcntl.LOCK_EX)
            self._alone = True

    @contextmanager
    def lent(self) -> Iterator[None]:
        """This process's shared hold is given up inside, for a child process that uses the GPU meanwhile."""
        resume_shared = self._holding_shared
        if resume_shared:
            self._drop()
        try:
            yield
        finally:
            if resume_shared:
                self._take_shared()

    def lend(self) -> None:
        """Give up the shared hold until `resume()`, around CPU work that uses no GPU (a Triton compile).
        Two calls rather than a block: Triton calls one before its compile and the other after it."""
        if self._holding_shared:
            self._drop()
            self._lent_to_cpu_work = True

    def resume(self) -> None:
        """Take back a hold `lend()` gave up, through the gate: after any timed section that waits there."""
        if self._lent_to_cpu_work:
            self._lent_to_cpu_work = False
            self._take_shared()

    def _take_shared(self) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._gpu, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._holding_shared = True

    def _drop(self) -> None:
        fcntl.flock(self._gpu, fcntl.LOCK_UN)
        self._holding_shared = False


_shares: dict[str, GpuShare] = {}


def _process_share() -> GpuShare | None:
    """This worker's GPU lock; None where it was started without one (CPU, or outside a worker)."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        return None
    if path not in _shares:
        _shares[path] = GpuShare(path)
    return _shares[path]


def job_on_gpu() -> ContextManager:
    """Held by a worker around each job."""
    share = _process_share()
    return share.shared() if share else nullcontext()


_process_hold: list[ContextManager] = []


def hold_for_process_life() -> None:
    """A candidate process's shared hold, from here until it exits. The hold's context is kept here: one
    entered and dropped (`job_on_gpu().__enter__()` alone) is collected at once, and its generator's
    `finally` gives the hold up again."""
    hold = job_on_gpu()
    hold.__enter__()
    _process_hold.append(hold)


def gpu_alone() -> ContextManager:
    """Held around timed runs, and by a worker around a candidate process's last try after others' memory
    ran out (verify/candidate_run.py)."""
    share = _process_share()
    return share.alone() if share else nullcontext()


def held_alone() -> bool:
    """Whether this process holds its GPU alone now: a candidate process it starts must then take no hold of
    its own, which would wait for this one forever (`give_up_locks`)."""
    share = _process_share()
    return share is not None and share.held_alone


def give_up_locks() -> None:
    """In a candidate process whose worker holds the GPU alone for it: no hold of its own from here on (every
    hold and lend of this module becomes nothing), so it neither waits for its worker nor lets another job in."""
    os.environ.pop(LOCK_ENV, None)
    _shares.clear()


def lend_while_triton_compiles() -> None:
    """In a candidate process: its shared hold is given up while Triton compiles a kernel, CPU work of
    seconds (tens for a file of many kernels) in which a job waiting to time alone would otherwise wait
    for it. Inside a timed section there is no shared hold to give up, and nothing changes. A Triton
    without these hooks compiles with the hold kept."""
    share = _process_share()
    if share is None:
        return
    from triton import knobs

    runtime = knobs.runtime
    if not (hasattr(runtime, "jit_cache_hook") and hasattr(runtime, "jit_post_compile_hook")):
        return

    def before_compile(**_) -> bool:
        share.lend()
        return False     # False: compile as usual

    def after_compile(**_) -> None:
        share.resume()

    runtime.jit_cache_hook = before_compile
    runtime.jit_post_compile_hook = after_compile


def resume_after_compiles() -> None:
    """Take back a hold given up for a compile that raised (its after-compile hook never ran)."""
    share = _process_share()
    if share is not None:
        share.resume()


def gpu_lent() -> ContextManager:
    """Held by a trusted worker while a candidate process it started works on the same GPU. A hold alone is
    kept: that candidate takes none of its own (`held_alone`)."""
    share = _process_share()
    return share.lent() if share else nullcontext()


def gpu_yielded() -> ContextManager:
    """Held while this process waits for another one, its GPU hold given up whatever it is (`yielded`)."""
    share = _process_share()
    return share.yielded() if share else nullcontext()


def lock_file(lock: IO) -> None:
    """Take an exclusive flock on `lock` (kept until the file closes), with this process's GPU hold given up
    while it waits. The holder may need the GPU alone before it lets go (a baseline is timed under its
    key's lock): a waiter that kept its hold would wait for it forever, and it for the waiter."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)    # free: no hold to give up
        return
    except BlockingIOError:
        pass
    with gpu_yielded():
        fcntl.flock(lock, fcntl.LOCK_EX)
