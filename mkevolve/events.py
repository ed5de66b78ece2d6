"""events.jsonl: an append-only, thread-safe log of what a run did (LLM calls, tokens, verdicts)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from mkevolve.event_records import EventRecord


def process_age_s() -> float | None:
    """Seconds since this process started (interpreter start and imports included), from Linux's /proc; None
    where that cannot be read."""
    try:
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return round(time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, IndexError, ValueError, AttributeError):     # no /proc, no CLOCK_BOOTTIME
        return None


class EventLog:
    """Each event is one JSON line with a kind and a timestamp; path None keeps events in memory."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self.events: list[dict] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, **fields) -> None:
        event = {"t": round(time.time(), 3), "kind": kind, **fields}
        line = json.dumps(event, default=str)
        with self._lock:
            self.events.append(event)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")

    def record(self, record: EventRecord) -> None:
        """Emit a kind that is read back: its record's fields are the event's keys."""
        self.emit(record.KIND, **record.to_json())

    def of_kind(self, kind: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]


def read_event_lines(path: Path) -> list[dict]:
    """The events of an events.jsonl, as written; a line cut short by a crash or a kill is skipped."""
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


class EventFilesError(ValueError):
    """A path given for events.jsonl files that names none; the message names the path."""


def find_event_files(paths: list[Path]) -> list[Path]:
    """An events.jsonl file as given; a folder is searched for every events.jsonl below it."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.rglob("events.jsonl"))
            if not found:
                raise EventFilesError(f"{path}: no events.jsonl in this folder or below it")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise EventFilesError(f"{path}: no such file or folder")
    return files
