"""This worker's zygote for candidate processes (workers/zygote.py): its environment, started on first use,
or in the background as the worker starts.

Nothing here imports torch, so a GPU worker can start its zygote before its own imports
(`start_in_background`, the first of its preloads: executor.verifier_preload). The zygote's imports (torch,
torch._dynamo: 7 to 8 s on the H200) and its first standby child then overlap the worker's imports and the
command's, instead of beginning when the verifier's first job reaches the worker.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from mkevolve.verify import triton_warm
from mkevolve.workers import gpu_share, harden
from mkevolve.workers.pool import LOG_DIR_ENV
from mkevolve.workers.zygote import Zygote, ZygoteError

# Modules torch imports on first use of a dispatch mode (the runtime guard, the decomposition check's recording),
# of the profiler (every standby child) or of torch.compile (baselines): 4.7 s on the H200, once per process.
# The zygote imports them before it forks, so no candidate process pays; a worker imports them while it waits.
FIRST_USE_IMPORTS = ("torch._dynamo",)
_ZYGOTE_PRELOAD = (*FIRST_USE_IMPORTS, "mkevolve.verify.harness", "mkevolve.verify.triton_warm")
_STANDBY = "mkevolve.verify.harness:standby"

_zygote: Zygote | None = None
_zygote_lock = threading.Lock()  # one zygote per worker, started by whichever thread asks first
warming: list[threading.Thread] = []   # zygote starts in the background (tests wait for them)


def running_zygote() -> Zygote:
    """This worker's zygote: started on first use, replaced when it died."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive:
            _zygote = Zygote(_ZYGOTE_PRELOAD, _zygote_env(), zygote_log_path(), standby=_STANDBY)
        return _zygote


def forget_zygote() -> None:
    """The zygote failed a request: close it, so the next request starts a new one."""
    global _zygote
    with _zygote_lock:
        if _zygote is not None:
            _zygote.close()
        _zygote = None


def start_in_background() -> None:
    """Start this worker's zygote in a thread and return at once. A zygote that fails to start here is started
    again, and the failure reported, by the first candidate that needs it."""
    def start() -> None:
        try:
            running_zygote()
        except ZygoteError:
            pass  # reported by candidate_run.start_candidate, which tries again

    thread = threading.Thread(target=start, name="zygote-start", daemon=True)
    thread.start()
    warming.append(thread)


def zygote_log_path() -> Path:
    """Where this process's zygote writes its errors: in a worker, its pool's log folder, which the pool
    removes when it closes; elsewhere (a check run in-process) the temporary folder."""
    folder = os.environ.get(LOG_DIR_ENV) or tempfile.gettempdir()
    return Path(folder) / f"mkevolve-zygote-{os.getpid()}.log"


def _zygote_env() -> dict[str, str]:
    env = harden.candidate_env(os.environ, Path(tempfile.gettempdir()))
    for name in (gpu_share.LOCK_ENV, "PYTHONPATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    env[triton_warm.WARM_DIR_ENV] = str(warm_dir())
    return env


_warm: Path | None = None


def warm_dir() -> Path:
    """The warm Triton cache of this worker's candidate processes (chosen once per worker)."""
    global _warm
    if _warm is None:
        _warm = triton_warm.warm_dir()
    return _warm
