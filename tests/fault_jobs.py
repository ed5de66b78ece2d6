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
    from mkevolve.verify.candidate_run import zygote_log_path

    return str(zygote_log_path())
