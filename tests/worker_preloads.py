"""Modules a test worker imports before it says it is ready (see MKEVOLVE_WORKER_PRELOAD)."""

import os
import time

# A slow start, as importing torch on a loaded machine is: SLOW_PRELOAD_S seconds at import.
time.sleep(float(os.environ.get("SLOW_PRELOAD_S", "0")))
if os.environ.get("BROKEN_PRELOAD"):
    raise ImportError("this preload is broken on purpose")

started: list[str] = []   # the preload functions this worker called, in order


def mark_started() -> None:
    """A "module:function" preload: called once this module is imported."""
    started.append("mark_started")


def import_slowly() -> None:
    """A "module:function" preload whose imports go on in the background for a second."""
    from mkevolve.workers.background import import_in_background

    def imports() -> None:
        time.sleep(1.0)
        started.append("imported")

    import_in_background("slow-imports", imports)


def started_marks() -> list[str]:
    """A job: what the preloads left."""
    return list(started)
