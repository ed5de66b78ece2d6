"""BusyClock: wall time during which at least one LLM call or evaluation job was in flight."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class BusyClock:
    """Overlapping calls from many threads count once, so `busy_s` is the union of their intervals."""

    def __init__(self):
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self._busy = 0.0

    @contextmanager
    def busy(self):
        with self._lock:
            if self._in_flight == 0:
                self._since = time.monotonic()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._busy += time.monotonic() - self._since

    @property
    def busy_s(self) -> float:
        with self._lock:
            extra = time.monotonic() - self._since if self._in_flight else 0.0
            return self._busy + extra
