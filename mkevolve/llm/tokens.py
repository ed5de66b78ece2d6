"""Token accounting: usage added up per agent, per subproblem and per run, thread-safe."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

from mkevolve.event_records import LLMTokensEvent, TokenCount
from mkevolve.llm.types import LLMRequest, LLMResponse, TokenUsage

# Requests that belong to no subproblem (decomposition agents) are counted under this key.
WHOLE_PROBLEM = "-"
# A rule of thumb for BPE tokenizers on English and code; used only where a provider reports no counts.
CHARS_PER_TOKEN = 4


def estimate_usage(prompt: str, reply: str) -> TokenUsage:
    """Token counts guessed from the text, for a provider that reports none (the exchange folder): a rough
    figure keeps per-agent totals comparable, where 0 would say the calls cost nothing. No reasoning count."""
    return TokenUsage(prompt=_estimate(prompt), completion=_estimate(reply))


def _estimate(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)  # rounded up: any text is at least one token


@dataclass
class TokenReport:
    """A snapshot of the ledger; `calls` are paid calls, `cached_calls` were answered from the cache."""

    total: TokenUsage = field(default_factory=TokenUsage)
    by_agent: dict[str, TokenUsage] = field(default_factory=dict)
    by_subproblem: dict[str, TokenUsage] = field(default_factory=dict)
    calls: int = 0
    cached_calls: int = 0
    failed_calls: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def event(self, model: str) -> LLMTokensEvent:
        """The llm_tokens event of these totals."""
        return LLMTokensEvent(model=model, total=_token_count(self.total),
                              by_agent={k: _token_count(v) for k, v in self.by_agent.items()},
                              by_subproblem={k: _token_count(v) for k, v in self.by_subproblem.items()},
                              calls=self.calls, cached_calls=self.cached_calls, failed_calls=self.failed_calls)

    @classmethod
    def from_dict(cls, data: dict) -> "TokenReport":
        return cls(
            total=TokenUsage(**data["total"]),
            by_agent={k: TokenUsage(**v) for k, v in data["by_agent"].items()},
            by_subproblem={k: TokenUsage(**v) for k, v in data["by_subproblem"].items()},
            calls=data["calls"], cached_calls=data["cached_calls"], failed_calls=data["failed_calls"],
        )


def _token_count(usage: TokenUsage) -> TokenCount:
    return TokenCount(prompt=usage.prompt, completion=usage.completion, reasoning=usage.reasoning)


class TokenLedger:
    """Adds each response's usage to the run total and to its agent's and subproblem's totals.

    A cached response cost nothing this time, so it is counted as a cache hit, not as spent tokens.
    """

    def __init__(self) -> None:
        self._report = TokenReport()
        self._lock = threading.Lock()

    def record(self, request: LLMRequest, response: LLMResponse) -> None:
        with self._lock:
            report = self._report
            if response.cached:
                report.cached_calls += 1
                return
            report.calls += 1
            if response.error is not None:
                report.failed_calls += 1
            subproblem = request.subproblem or WHOLE_PROBLEM
            report.total = report.total + response.usage
            report.by_agent[request.agent] = report.by_agent.get(request.agent, TokenUsage()) + response.usage
            report.by_subproblem[subproblem] = (report.by_subproblem.get(subproblem, TokenUsage())
                                                + response.usage)

    def report(self) -> TokenReport:
        with self._lock:
            return TokenReport.from_dict(self._report.to_dict())
