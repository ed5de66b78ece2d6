"""A fork server for candidate processes: one fresh process per candidate without paying for imports.

Importing torch and triton takes over a second (1.4 s on a 2-core CPU); a process forked from one that
already imported them skips that. The zygote is trusted: it imports only installed packages and this package, never a
candidate's file, and never opens a CUDA context (a forked child could not use it). Each child runs
one candidate in its own session and exits; nothing of it comes back into the zygote.

The next children are forked before they are needed: while one candidate runs, the next processes already
prepare what does not depend on their candidate (`standby`, e.g. a CUDA context and a started profiler,
about 5 s on an H200, up to 10 s while four workers' children prepare at once), and then wait for their
request. `STANDBY_CHILDREN` of them wait at any time, so a request that follows another at once finds one
prepared. At start the second is forked only once the first has prepared (or after `FIRST_STANDBY_WAIT_S`):
four workers' first children already contend for the GPU's driver, and the first request needs the first.

Protocol on the zygote's stdin/stdout, one JSON object per line:
    parent -> zygote   {"entry": "module:function", "payload": "<text>", "log": "<path>"}
    zygote -> parent   {"pid": N}, then {"exited": N, "status": <waitpid status>}
Before the first request, each preloaded module's `zygote_warmup()`, if it has one, runs once. In the
child, `entry(payload, state)` gets what `standby()` returned (None without a standby function).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

_POLL_S = 0.05
STANDBY_CHILDREN = 2  # one more only replaces the one a request took; two leave one prepared meanwhile
FIRST_STANDBY_WAIT_S = 60.0  # a first child slower than this to prepare no longer holds back the second
_EXIT_CODE_UNCAUGHT = 70  # the entry function raised: a fault of the harness, reported as a crash


@dataclass(frozen=True)
class ChildExit:
    """How a candidate process ended, as seen from outside it."""

    code: int | None             # exit code; None when a signal ended it
    signal: int | None = None
    timed_out: bool = False
    memory_exceeded: bool = False
    peak_rss_mb: float = 0.0
    wall_s: float = 0.0

    def describe(self) -> str:
        if self.timed_out:
            return "no result within the time limit; candidate process killed"
        if self.memory_exceeded:
            return f"candidate process used more host memory than allowed ({self.peak_rss_mb:.0f} MB); killed"
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"candidate process killed by {name}"
        return f"candidate process ended with exit code {self.code}"


class ZygoteError(RuntimeError):
    """The zygote itself failed (died, or answered off-protocol); the pool replaces it."""


_zygotes: weakref.WeakSet = weakref.WeakSet()   # this process's zygotes, for close_all_zygotes


class Zygote:
    """The parent's handle on one zygote process; runs one child at a time."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str], log_path: Path,
                 standby: str | None = None):
        self._child: int | None = None   # the running child's pid (its own session)
        self._log = open(log_path, "ab")
        standby_args = ["--standby", standby] if standby else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mkevolve.workers.zygote", *standby_args, *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            start_new_session=True,
        )
        self._buffer = b""
        _zygotes.add(self)
        if self._read_line(time.monotonic() + 300) != {"ready": True}:
            raise ZygoteError("the zygote did not start")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, entry: str, payload: str, log: Path, timeout: float, memory_limit_mb: float) -> ChildExit:
        """Fork a child that calls `entry(payload)`; wait for it within `timeout` and the memory limit."""
        start = time.monotonic()
        self._send({"entry": entry, "payload": payload, "log": str(log)})
        pid = self._read_line(start + 60).get("pid")
        if not isinstance(pid, int):
            raise ZygoteError("the zygote did not report a child")
        self._child = pid
        timed_out, over_memory, peak = self._watch(pid, start + timeout, memory_limit_mb)
        status = self._read_line(time.monotonic() + 60).get("status")
        _kill_group(pid)  # anything the child left in its session goes with it
        self._child = None
        if not isinstance(status, int):
            raise ZygoteError("the zygote did not report the child's exit")
        code = os.waitstatus_to_exitcode(status)
        return ChildExit(code=code if code >= 0 else None, signal=-code if code < 0 else None,
                         timed_out=timed_out, memory_exceeded=over_memory, peak_rss_mb=peak,
                         wall_s=time.monotonic() - start)

    def _watch(self, pid: int, deadline: float, memory_limit_mb: float) -> tuple[bool, bool, float]:
        """Wait for the exit line; kill the child's session past the deadline or the memory limit."""
        peak = 0.0
        while not self._line_ready(_POLL_S):
            peak = max(peak, _rss_mb(pid))
            if time.monotonic() > deadline:
                _kill_group(pid)
                return True, False, peak
            if peak > memory_limit_mb:
                _kill_group(pid)
                return False, True, peak
        return False, False, peak

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ZygoteError("the zygote is gone") from None

    def _line_ready(self, wait: float) -> bool:
        if b"\n" in self._buffer:
            return True
        fd = self.proc.stdout.fileno()
        if select.select([fd], [], [], wait)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ZygoteError("the zygote is gone")
            self._buffer += chunk
        return b"\n" in self._buffer

    def _read_line(self, deadline: float) -> dict:
        while not self._line_ready(max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise ZygoteError("the zygote stopped answering")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        """Stop the zygote with its waiting children and the running child, whose session is its own."""
        if self._child is not None:
            _kill_group(self._child)
        if self.alive:
            _kill_group(self.proc.pid)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self._log):
            stream.close()


def close_all_zygotes() -> None:
    """Stop every zygote this process started, and their children (a worker told to stop: pool.abort)."""
    for zygote in list(_zygotes):
        zygote.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty


def _rss_mb(pid: int) -> float:
    """Resident memory of one process in MB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return 0.0


# ---- the zygote process --------------------------------------------------------------------------------


def _resolve(spec: str):
    module_name, _, function = spec.partition(":")
    return getattr(importlib.import_module(module_name), function)


def _fork_standby(standby: str | None, waiting: deque[tuple[int, int]],
                  prepared_fd: int | None = None) -> tuple[int, int]:
    """Fork the next child now; it prepares (`standby()`) while the current one runs, then waits for its
    request on a pipe only the zygote writes. Until then it stays in the zygote's process group, so closing
    the zygote takes it along. It closes its copies of the other waiting children's pipes: a child reads its
    request up to end of file, which no pipe reaches while another process still holds its write end.
    With `prepared_fd`, it writes a byte there once prepared."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write_fd)
        for _, other_fd in waiting:
            os.close(other_fd)
        _child(read_fd, standby, prepared_fd)
    os.close(read_fd)
    return pid, write_fd


def _child(read_fd: int, standby: str | None, prepared_fd: int | None) -> None:
    """In the forked child: prepare, wait for the request, then run it in a session of its own, with no
    channel back to the zygote and its output in its own log."""
    null_fd = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # the zygote's protocol pipes are not the child's to touch
        os.dup2(null_fd, fd)
    code = _EXIT_CODE_UNCAUGHT
    try:
        state = _resolve(standby)() if standby else None
        if prepared_fd is not None:
            os.write(prepared_fd, b".")
            os.close(prepared_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            message = pipe.read()
        if not message:  # the zygote closed without a request for this child
            os._exit(0)
        request = json.loads(message)
        os.setsid()
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        code = int(_resolve(request["entry"])(request["payload"], state))
    except BaseException:  # noqa: BLE001 - the child must always end through os._exit
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _first_children(standby: str | None) -> deque[tuple[int, int]]:
    """The children waiting at start, as (pid, write end of its request pipe), oldest first: the first one
    forked alone, the others once it has prepared, died (end of file) or taken `FIRST_STANDBY_WAIT_S`."""
    waiting: deque[tuple[int, int]] = deque()
    prepared_read, prepared_write = os.pipe()
    waiting.append(_fork_standby(standby, waiting, prepared_write))
    os.close(prepared_write)
    select.select([prepared_read], [], [], FIRST_STANDBY_WAIT_S)
    os.close(prepared_read)
    while len(waiting) < STANDBY_CHILDREN:
        waiting.append(_fork_standby(standby, waiting))
    return waiting


def main(args: list[str]) -> None:
    standby = None
    if args[:1] == ["--standby"]:
        standby, args = args[1], args[2:]
    for name in args:
        module = importlib.import_module(name)
        # A preloaded module may prepare once what every child would otherwise build again; it must
        # not open a CUDA context (a forked child could not use it).
        warmup = getattr(module, "zygote_warmup", None)
        if callable(warmup):
            warmup()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    waiting = _first_children(standby)
    stdout.write(b'{"ready": true}\n')
    stdout.flush()
    for line in stdin:
        pid, fd = waiting.popleft()
        os.write(fd, line)
        os.close(fd)
        stdout.write(json.dumps({"pid": pid}).encode() + b"\n")
        stdout.flush()
        waiting.append(_fork_standby(standby, waiting))
        _, status = os.waitpid(pid, 0)
        stdout.write(json.dumps({"exited": pid, "status": status}).encode() + b"\n")
        stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
