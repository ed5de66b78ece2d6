"""Speculative evaluation: a reply's kernel is checked once its code block has closed, while the model is
still writing the rest of the reply (its explanation, usually). SpecGen starts evaluations this way.

The reply that counts is the whole one: when it is in, the kernel it carries (`extract_code`: its last
block) is compared with the one checked early. The same code keeps the early verdict; other code (the
model wrote a second block) is checked again, and the early check was time spent for nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from mkevolve.llm.parse import code_blocks
from mkevolve.verify.result import EvalResult


def closed_code(text: str) -> str | None:
    """The last non-empty fenced block of a partial reply whose closing fence has ended its line; None if
    no block has. Only whole lines count: a trailing "```" may still become "```python", a new block."""
    complete = text[:text.rfind("\n") + 1]
    blocks = [block for block in code_blocks(complete) if block.strip()]
    return blocks[-1] if blocks else None


class SpeculativeCheck:
    """One reply's early check: started by the first closed block the stream shows, at most once."""

    def __init__(self, check: Callable[[str], EvalResult], pool: ThreadPoolExecutor):
        self._check = check
        self._pool = pool
        self._lock = threading.Lock()  # the stream's thread starts it, the candidate's thread reads it
        self._code: str | None = None
        self._future: Future[EvalResult] | None = None

    def on_text(self, text: str) -> None:
        """The reply so far (a TextSink): start the check when a code block has closed."""
        if self._future is not None:
            return
        code = closed_code(text)
        if code is None:
            return
        with self._lock:
            if self._future is None:
                self._code, self._future = code, self._pool.submit(self._check, code)

    def verdict_for(self, code: str) -> EvalResult | None:
        """The early verdict when the early check ran on exactly `code`, else None; waits for a check that
        is still running either way, so that no two checks of one candidate file overlap."""
        with self._lock:
            future, early = self._future, self._code
        if future is None:
            return None
        result = future.result()
        return result if early == code else None
