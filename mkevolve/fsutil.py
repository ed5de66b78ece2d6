"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path

_UMASK_LINE = re.compile(r"^Umask:\s*([0-7]+)\s*$", re.MULTILINE)
_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read per call so that a umask set after import is honoured.

    Linux states it in /proc/self/status, which reads it without changing it: no thread can create a
    file under a wrong umask meanwhile. Elsewhere the only way is to set it and put it back at once;
    the lock keeps our own writers from reading the transient value, though another thread's open() may
    create a file under it."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # no /proc (macOS, some sandboxes): fall back to setting and restoring it
        status = ""
    match = _UMASK_LINE.search(status)
    if match:
        return int(match.group(1), 8)
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` via a temporary file in the same folder, then rename it into place.

    mkstemp creates the temporary file with mode 0600; it is widened to what a plain open() would
    give (0666 & ~umask), so the files a run leaves are readable as the user's umask says."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
