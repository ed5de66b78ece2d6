"""Replies through the exchange folder carry token estimates (the folder reports no counts of its own)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from mkevolve.config import RunConfig
from mkevolve.llm.client import make_client
from mkevolve.llm.tokens import estimate_usage
from mkevolve.llm.types import LLMRequest, TokenUsage

REPLY = "### FILE: kernel.py\n```python\n# a kernel\n```\n"


def _answer_when_asked(root: Path, stop: threading.Event) -> None:
    """Plays the model: answers every request file with REPLY."""
    while not stop.is_set():
        for request in (root / "requests").glob("*.md"):
            target = root / "responses" / request.name
            if not target.exists():
                target.write_text(REPLY)
        time.sleep(0.01)


def test_an_estimate_is_a_quarter_of_the_characters_rounded_up():
    assert estimate_usage("x" * 400, "y" * 9) == TokenUsage(prompt=100, completion=3)
    assert estimate_usage("", "") == TokenUsage()


def test_exchange_replies_get_estimated_token_counts_in_the_run_totals(tmp_path):
    root = tmp_path / "exchange"
    client = make_client(RunConfig(model=f"exchange:{root}", llm_timeout=10))
    client.provider.poll_s = 0.02
    stop = threading.Event()
    answerer = threading.Thread(target=_answer_when_asked, args=(root, stop))
    answerer.start()
    prompt = "write a kernel for relu " * 20
    try:
        reply = client.complete(LLMRequest("generate", prompt, "relu/0"))
    finally:
        stop.set()
        answerer.join()
    assert reply.text == REPLY
    assert reply.usage == TokenUsage(prompt=-(-len(prompt) // 4), completion=-(-len(REPLY) // 4))
    totals = client.tokens()
    assert totals.total == reply.usage and totals.total.total > 0
    assert totals.by_agent["generate"] == reply.usage
