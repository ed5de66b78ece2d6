"""Job functions for the sandbox tests: each misbehaves in one way inside a worker."""

import ctypes
import os
import time


def pid() -> int:
    return os.getpid()


def hang() -> None:
    while True:
        time.sleep(0.05)


def exit_now() -> None:
    os._exit(3)


def segfault() -> None:
    ctypes.string_at(0)


def raise_error() -> None:
    raise ValueError("broken on purpose")


def print_and_return(value: int) -> int:
    print("chatter on stdout must not corrupt the protocol")
    return value * 2


def interpreter_flag() -> str:
    return os.environ.get("TRITON_INTERPRET", "")


def zygote_log() -> str:
    from mkevolve.verify.candidate_zygote import zygote_log_path

    return str(zygote_log_path())


def hang_in_a_zygote_child(report_path: str) -> None:
    """Start a zygote whose child hangs, write both pids to `report_path`, then wait on the child."""
    import json
    import sys
    from pathlib import Path

    from mkevolve.workers.zygote import Zygote

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    zygote = Zygote(("tests.zygote_entries",), env=env, log_path=Path(report_path + ".log"))
    original_watch = zygote._watch

    def watch(pid, deadline, limit):
        Path(report_path).write_text(json.dumps({"zygote": zygote.proc.pid, "child": pid}))
        return original_watch(pid, deadline, limit)

    zygote._watch = watch
    zygote.run("tests.zygote_entries:hang", "", Path(report_path + ".child.log"), 600, 4096)
