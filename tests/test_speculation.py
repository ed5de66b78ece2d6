"""Speculative evaluation: a kernel is checked once its reply's code block has closed, while the model still
writes the rest; the whole reply decides which code counts (replay provider with streamed replies)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fixtures.replay_kernels.fakes import PROBLEM, ClockedVerifier

from mkevolve.agents.evolve import evolve_kernel
from mkevolve.agents.speculation import closed_code
from mkevolve.config import RunConfig
from mkevolve.llm.client import make_client
from mkevolve.llm.types import LLMRequest, TokenUsage
from mkevolve.search.beam import Beam

FIXTURES = PROBLEM.parent
EXPLANATION = "".join(f"Line {i} of what the model says after its code.\n" for i in range(80))


def _streamed_run(tmp_path: Path, reply: str, stream_s: float = 2.0):
    (tmp_path / "reply.md").write_text(reply)
    script = tmp_path / "stream.yaml"
    script.write_text(f"replies:\n  - {{agent: generate, sample: 0, stream_s: {stream_s}, reply_file: reply.md}}\n")
    config = RunConfig(model=f"replay:{script}", beam_width=1, search="parallel")
    verifier = ClockedVerifier()
    beam = evolve_kernel("relu_shift", PROBLEM, Beam(width=1), 1, verifier, make_client(config), config,
                         tmp_path / "candidates")
    verifier.finished = time.monotonic() - verifier.start  # the whole reply was in before this
    return beam, verifier


def test_only_a_block_whose_closing_fence_ended_its_line_counts():
    code = "```python\nx = 1\n"
    assert closed_code(code) is None
    assert closed_code(code + "```") is None          # may still become ```python, a new block
    assert closed_code(code + "```\n") == "x = 1\n"
    assert closed_code(code + "```\ntext\n```python\ny = 2\n```\n") == "y = 2\n"


def test_a_kernel_is_checked_while_its_reply_is_still_streaming(tmp_path):
    """The code closes at about a quarter of a reply that streams for 2 s: its check starts more than a
    second before the reply ends, and that one check is the candidate's verdict."""
    reply = (FIXTURES / "refined.md").read_text() + EXPLANATION
    beam, verifier = _streamed_run(tmp_path, reply)
    assert verifier.checked == ["refined"]
    assert verifier.began["refined"] < verifier.finished - 1.0
    assert beam.members[0].result.speedup == 2.0 and "# fixture: refined" in beam.members[0].source


def test_a_later_block_is_checked_again_and_decides(tmp_path):
    """The model sketches a kernel, then answers with another: the early check was of the sketch, so the
    final code is checked too, and its verdict is the candidate's."""
    reply = (FIXTURES / "broken.md").read_text() + EXPLANATION + (FIXTURES / "refined.md").read_text()
    beam, verifier = _streamed_run(tmp_path, reply)
    assert verifier.checked == ["broken", "refined"]
    member = beam.members[0]
    assert "# fixture: refined" in member.source and member.result.speedup == 2.0
    saved = (tmp_path / "candidates" / "relu_shift" / f"{member.id}.py").read_text()
    assert "# fixture: refined" in saved


@pytest.mark.filterwarnings("ignore::UserWarning")  # raised inside litellm's own imports
def test_a_litellm_reply_streams_to_the_sink_with_its_usage(monkeypatch):
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm is not installed")
    monkeypatch.setenv("MKEVOLVE_API_KEY", "sk-test")
    client = make_client(RunConfig(model="anthropic/claude-opus-4-5"))
    import litellm

    def chunk(text, usage=None):
        choices = [SimpleNamespace(delta=SimpleNamespace(content=text))] if text is not None else []
        return SimpleNamespace(choices=choices, usage=usage)

    usage = SimpleNamespace(prompt_tokens=7, completion_tokens=3, completion_tokens_details=None)
    seen = []
    monkeypatch.setattr(litellm, "completion", lambda **kwargs: seen.append(kwargs) or iter(
        [chunk("a "), chunk("kernel"), chunk(None, usage)]))
    heard = []
    reply = client.complete(LLMRequest("generate", "p", "s"), on_text=heard.append)
    assert heard == ["a ", "a kernel"] and reply.text == "a kernel"
    assert reply.usage == TokenUsage(7, 3, 0) and seen[0]["stream"] is True
