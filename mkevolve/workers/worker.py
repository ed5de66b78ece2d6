"""The worker process: reads jobs from stdin, runs them, writes results; never the orchestrator."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback


def _protocol_streams():
    """Keep the real stdout for results; anything user code prints goes to stderr (the log)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return sys.stdin.buffer, out


def _cuda_context():
    """torch, where this worker has opened a CUDA context (a job used the GPU); else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch


def _cuda_healthy() -> bool:
    """After an illegal memory access the context is unusable: the worker must be replaced."""
    torch = _cuda_context()
    if torch is None:
        return True
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        return False
    return True


def _release_cached_gpu_memory() -> None:
    """Hand the blocks PyTorch's allocator keeps cached back to the GPU between jobs. Several runs may share a
    GPU, each with its workers and candidate processes (on an H200 shared by 4 full-size runs, one end-to-end
    check ran out of memory while three other processes held 19 to 38 GB). What the worker still references,
    such as the cached reference outputs, stays."""
    torch = _cuda_context()
    if torch is not None:
        torch.cuda.empty_cache()


def _resolve(spec: str):
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _preload(out, send_message) -> bool:
    """Import the pool's preloads, in order, then say ready (or why not): start-up stays out of the first job's
    time. A "module:function" preload is called too, with no arguments: work the worker starts in the
    background (it must return at once), such as its zygote."""
    from mkevolve.workers.pool import PRELOAD_ENV

    try:
        for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
            if ":" in name:
                _resolve(name)()
            else:
                importlib.import_module(name)
    except Exception:
        send_message(out, {"ready": False, "error": traceback.format_exc()})
        return False
    send_message(out, {"ready": True})
    return True


def _stop(signum, frame) -> None:
    """SIGTERM (pool.abort: the run was interrupted): the zygote and the candidate it runs are in sessions of
    their own, so this worker takes them down before it goes, rather than leave them running orphaned."""
    from mkevolve.workers.zygote import close_all_zygotes

    close_all_zygotes()
    os._exit(128 + signum)


def main() -> None:
    from mkevolve.workers.background import wait_for_imports
    from mkevolve.workers.gpu_share import job_on_gpu
    from mkevolve.workers.pool import receive_message, send_message

    signal.signal(signal.SIGTERM, _stop)
    stdin, out = _protocol_streams()
    if not _preload(out, send_message):
        return
    while True:
        try:
            job = receive_message(stdin.fileno())
        except EOFError:
            return
        reply = {"value": None, "error": None}
        wait_for_imports()   # a preload's or the last job's warm-up thread (workers/background.py)
        try:
            with job_on_gpu():
                reply["value"] = _resolve(job.fn)(**job.kwargs)
        except Exception:
            # Job functions turn expected failures into verdicts; what escapes is reported to the
            # caller with its traceback rather than lost.
            reply["error"] = traceback.format_exc()
        reply["healthy"] = _cuda_healthy()
        if reply["healthy"]:
            _release_cached_gpu_memory()
        send_message(out, reply)
        healthy = reply["healthy"]
        if not healthy:
            return


if __name__ == "__main__":
    main()
