"""Entry functions for the zygote tests: each runs in a forked child and misbehaves in one way."""

import json
import os
import signal
import time

_MARKER = None


def describe_self(out_path: str) -> int:
    global _MARKER
    seen = {"pid": os.getpid(), "sid": os.getsid(0), "marker_before": _MARKER}
    _MARKER = "set by a child"
    with open(out_path, "w") as out:
        json.dump(seen, out)
    return 0


def hang(_: str) -> int:
    while True:
        time.sleep(1)


def exit_with(code: str) -> int:
    value = int(code)
    if value < 0:
        os.kill(os.getpid(), -value)
    return value


def hog_memory(_: str) -> int:
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))
        time.sleep(0.05)


def raise_error(_: str) -> int:
    raise ValueError("on purpose")
