"""events.jsonl: an append-only, thread-safe log of what a run did (LLM calls, tokens, verdicts)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path


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

    def of_kind(self, kind: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]
