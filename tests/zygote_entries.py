"""Entry functions for the zygote tests: each runs in a forked child and misbehaves in one way."""

import json
import os
import time

_MARKER = None


def describe_self(out_path: str, state=None) -> int:
    global _MARKER
    seen = {"pid": os.getpid(), "sid": os.getsid(0), "marker_before": _MARKER}
    _MARKER = "set by a child"
    with open(out_path, "w") as out:
        json.dump(seen, out)
    return 0


def hang(_: str, state=None) -> int:
    while True:
        time.sleep(1)


def exit_with(code: str, state=None) -> int:
    value = int(code)
    if value < 0:
        os.kill(os.getpid(), -value)
    return value


def hog_memory(_: str, state=None) -> int:
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))
        time.sleep(0.05)


def raise_error(_: str, state=None) -> int:
    raise ValueError("on purpose")


def prepare() -> dict:
    """A standby function: runs in the child before its request exists."""
    return {"prepared_pid": os.getpid(), "prepared_sid": os.getsid(0), "at": time.time()}


def report_state(out_path: str, state=None) -> int:
    with open(out_path, "w") as out:
        json.dump({"state": state, "pid": os.getpid(), "sid": os.getsid(0), "at": time.time()}, out)
    return 0


def report_modules(request: str, state=None) -> int:
    """`request`: JSON {"out": path, "modules": [...]}; writes which of the modules the child already has."""
    import sys

    asked = json.loads(request)
    with open(asked["out"], "w") as out:
        json.dump({name: name in sys.modules for name in asked["modules"]}, out)
    return 0
