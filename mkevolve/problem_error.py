"""ProblemError on its own, so that the command line can catch it without importing torch (mkevolve.problem
does): `mkevolve run` starts its workers before its own imports (workers/prestart.py)."""

from __future__ import annotations

from pathlib import Path


class ProblemError(ValueError):
    """A problem (or solution) file that cannot be used, with the file and the reason in one line."""

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")
