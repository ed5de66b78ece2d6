"""The exit status of every `mkevolve` command: each number means the same thing whichever command ran."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0             # what was asked for exists and passed: a kernel accepted, a solution verified
    FAILED = 1         # the command ran, but its result did not pass (or a decomposition fell back)
    BAD_INPUT = 2      # a problem, solution, flag or config that cannot be used; argparse uses 2 too
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a process SIGINT stopped
