"""The records that pass between agents and the LLM client: requests, responses, token usage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

# Told of a reply as it streams in: the whole text so far, each time it grows.
TextSink = Callable[[str], None]


class BuiltinTask(Protocol):
    """A typed description of what an agent asks for, so the offline agent can act without a prompt."""

    def builtin_reply(self) -> str:
        """The reply the builtin offline agent gives, in the same format a model must use."""


@dataclass(frozen=True)
class Repertoire:
    """What an agent with a fixed set of answers (the builtin) has for one request's subject, known before
    any call: how many distinct replies, and in its own words why there are none (left)."""

    replies: int
    reason: str = ""   # when `replies` is 0: why it cannot write this; else what it says once all are used


@runtime_checkable
class LimitedTask(BuiltinTask, Protocol):
    """A task whose builtin answers are finite and can be counted without answering."""

    def builtin_repertoire(self) -> Repertoire:
        """How many replies builtin_reply has for this subject, and why there are no (more)."""


@dataclass(frozen=True)
class LLMRequest:
    agent: str                      # decompose | split | fuse | total_fuse | generate | debug | refine
    prompt: str                     # the rendered jinja2 template
    subproblem: str | None = None   # for token accounting per subproblem
    task: BuiltinTask | None = None
    sample: int = 0                 # distinguishes parallel samples of the same prompt (cache key)


@dataclass
class TokenUsage:
    prompt: int = 0
    completion: int = 0
    reasoning: int = 0

    def __add__(self, other: "TokenUsage") -> "TokenUsage":
        return TokenUsage(self.prompt + other.prompt, self.completion + other.completion,
                          self.reasoning + other.reasoning)

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass
class LLMResponse:
    text: str
    usage: TokenUsage = field(default_factory=TokenUsage)
    cached: bool = False
    error: str | None = None        # set when the call failed for good (timeout, retries spent)
