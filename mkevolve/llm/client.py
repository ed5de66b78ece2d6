"""The LLM client: one entry point for every provider, with retries, a call pool, a cache and token counts."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mkevolve.busy import BusyClock
from mkevolve.config import RunConfig
from mkevolve.event_records import LLMCallEvent
from mkevolve.events import EventLog
from mkevolve.llm.cache import ResponseCache
from mkevolve.llm.providers import (LLMCallError, LLMConfigError, Provider, ProviderError, TransientLLMError,
                                    make_provider)
from mkevolve.llm.tokens import TokenLedger, TokenReport
from mkevolve.llm.types import LLMRequest, LLMResponse, Repertoire, TextSink

__all__ = ["LLMClient", "LLMConfigError", "ProviderError", "RetryPolicy", "make_client"]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, for rate limits and server errors only."""

    attempts: int = 4
    base_delay_s: float = 2.0
    max_delay_s: float = 60.0

    def delay_s(self, failed_attempts: int) -> float:
        # Jitter spreads out parallel calls that were all rate-limited at the same moment.
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (failed_attempts - 1))
        return random.uniform(ceiling / 2, ceiling)


class LLMClient:
    """Thread-safe: any number of threads may call `complete`; at most `parallel` calls are in flight."""

    def __init__(self, provider: Provider, *, timeout_s: float, parallel: int,
                 cache: ResponseCache | None = None, events: EventLog | None = None,
                 retry: RetryPolicy = RetryPolicy()):
        self.provider = provider
        self.timeout_s = timeout_s
        self.parallel = parallel
        self.cache = cache
        self.events = events
        self.retry = retry
        self.ledger = TokenLedger()
        self.provider_calls = 0  # attempts that reached the provider, retries included
        self.clock = BusyClock()  # shared with the verifier by a run, to measure its own overhead
        self._slots = threading.BoundedSemaphore(parallel)
        self._count_lock = threading.Lock()
        self._broken: ProviderError | None = None  # once the provider failed for good, no call is tried again

    def complete(self, request: LLMRequest, on_text: TextSink | None = None) -> LLMResponse:
        """The reply, or a response whose `error` says why there is none. Raises ProviderError only, when the
        provider can answer no call at all (unreachable, credentials refused, model unknown). `on_text` hears
        the reply as it streams in, where the provider streams (a cached reply arrives whole)."""
        start = time.monotonic()
        response = self.cache.get(request) if self.cache is not None else None
        attempts = 0
        if response is None:
            with self._slots, self.clock.busy():
                response, attempts = self._call_or_stop(request, on_text)
            if self.cache is not None:
                self.cache.put(request, response)
        self.ledger.record(request, response)
        self._emit_call(request, response, attempts, time.monotonic() - start)
        return response

    def complete_many(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        """Replies in the order of the requests; the shared slots bound how many run at once."""
        if len(requests) <= 1:
            return [self.complete(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(requests))) as pool:
            return list(pool.map(self.complete, requests))

    @property
    def in_call_order(self) -> bool:
        """Whether the provider's replies depend on the order of the calls (a replay file's do), so that
        callers must keep that order to get the same run."""
        return self.provider.in_call_order

    def repertoire(self, request: LLMRequest) -> Repertoire | None:
        """How many replies the provider has for the request's subject (None: no fixed limit); not a call,
        so it is neither counted nor cached. Raises LLMCallError when the provider cannot tell."""
        with self.clock.busy():
            return self.provider.repertoire(request, self.timeout_s)

    def tokens(self) -> TokenReport:
        return self.ledger.report()

    def emit_totals(self) -> TokenReport:
        """Write the run's token totals (per agent, per subproblem) to the events, and return them."""
        report = self.tokens()
        if self.events is not None:
            self.events.record(report.event(self.provider.name))
        return report

    def _call_or_stop(self, request: LLMRequest, on_text: TextSink | None) -> tuple[LLMResponse, int]:
        """Calls queued beside the one that found the provider broken (complete_many) fail at once with the
        same error instead of each waiting for its own connection error."""
        if self._broken is not None:
            raise self._broken
        try:
            return self._call_with_retries(request, on_text)
        except ProviderError as err:
            self._broken = err
            self._emit_provider_error(request, err)
            raise

    def _call_with_retries(self, request: LLMRequest, on_text: TextSink | None) -> tuple[LLMResponse, int]:
        last: TransientLLMError | None = None
        for attempt in range(1, self.retry.attempts + 1):
            with self._count_lock:
                self.provider_calls += 1
            try:
                return self.provider.call(request, self.timeout_s, on_text), attempt
            except TransientLLMError as err:
                last = err
                if attempt < self.retry.attempts:
                    time.sleep(self.retry.delay_s(attempt))
            except LLMCallError as err:
                return LLMResponse(text="", error=str(err)), attempt
        gave_up = LLMResponse(text="", error=f"{last} (gave up after {self.retry.attempts} attempts)")
        return gave_up, self.retry.attempts

    def _emit_provider_error(self, request: LLMRequest, err: ProviderError) -> None:
        if self.events is not None:
            self.events.emit("provider_error", model=self.provider.name, agent=request.agent,
                             subproblem=request.subproblem, sample=request.sample, failure=err.failure.name.lower(),
                             cause=err.cause)

    def _emit_call(self, request: LLMRequest, response: LLMResponse, attempts: int, wall_s: float) -> None:
        if self.events is None:
            return
        self.events.record(LLMCallEvent(
            model=self.provider.name, agent=request.agent, subproblem=request.subproblem, sample=request.sample,
            cached=response.cached, attempts=attempts, error=response.error, wall_s=round(wall_s, 3),
            prompt_tokens=response.usage.prompt, completion_tokens=response.usage.completion,
            reasoning_tokens=response.usage.reasoning))


def make_client(config: RunConfig, events: EventLog | None = None, cache_dir: str | Path | None = None,
                retry: RetryPolicy = RetryPolicy()) -> LLMClient:
    """Build the client for `config.model` and check it can work (model known, key present) right away."""
    provider = make_provider(config.model, config.api_base)
    provider.check()
    cache = ResponseCache(cache_dir, config.model) if cache_dir is not None and provider.cacheable else None
    return LLMClient(provider, timeout_s=config.llm_timeout, parallel=config.llm_parallel, cache=cache,
                     events=events, retry=retry)
