"""Threads that import modules while a worker waits, and the wait every job does for them.

A worker warms what its next job will need in the background: a GPU worker imports torch._dynamo as it starts
(candidate_run.warm_worker_early), the builtin agent's worker traces a tiny model on the meta device after its
first reply. A job must not import beside such a thread: when two threads import modules that import each
other (torch._dynamo's and torch._inductor's), Python hands one of them a partially initialised module, and its
`from ... import name` fails ("cannot import name 'IndentedBuffer'", a GPU worker's first job on an H100). The
thread had a head start, and the job would have imported the same modules, so the job waits for it.
"""

from __future__ import annotations

import threading

_importing: list[threading.Thread] = []
_lock = threading.Lock()


def import_in_background(name: str, target) -> None:
    """Run `target` (which imports) in a daemon thread named `name`; the worker's next job waits for it."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        _importing.append(thread)
    thread.start()


def wait_for_imports() -> None:
    """Block until every thread started by import_in_background has ended (at once when none runs)."""
    with _lock:
        threads, _importing[:] = list(_importing), []
    for thread in threads:
        thread.join()
