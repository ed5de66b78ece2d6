"""Where replies come from: the builtin offline agent, a replay file, an exchange folder, or litellm."""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol

import yaml

from mkevolve.config import BUILTIN_MODEL, ConfigError
from mkevolve.fsutil import write_atomic
from mkevolve.llm.tokens import estimate_usage
from mkevolve.llm.types import (BuiltinTask, LimitedTask, LLMRequest, LLMResponse, Repertoire, TextSink,
                                TokenUsage)
from mkevolve.prompts import render
from mkevolve.text import first_line
from mkevolve.workers.pool import Job, WorkerPool, take_pool
from mkevolve.workers.prestart import BUILTIN_AGENT_WORKERS

# A key that overrides the provider's own variable (ANTHROPIC_API_KEY, OPENAI_API_KEY, ...), and an API
# base used when the config names none.
API_KEY_ENV = "MKEVOLVE_API_KEY"
API_BASE_ENV = "MKEVOLVE_API_BASE"


class LLMConfigError(ConfigError):
    """A model that cannot be used at all (unknown, no key, bad replay file): reported before the run."""


class LLMCallError(Exception):
    """One call failed for good; the message says why and becomes the failed candidate's reason."""


class TransientLLMError(LLMCallError):
    """A call that may succeed when tried again: rate limit, server error, timeout."""


class ProviderFailure(str, Enum):
    """Why a provider can answer no call at all."""

    CONNECTION = "cannot connect to the provider"
    AUTHENTICATION = "the provider refused the credentials"
    MODEL_NOT_FOUND = "the provider does not know the model"


class ProviderError(LLMConfigError):
    """The provider can answer no call (endpoint unreachable, credentials refused, model unknown).

    Not an LLMCallError: every further call would fail the same way, and filing each as a failed candidate
    would spend the whole run on nothing. It stops the command (exit 2) at its first occurrence instead."""

    def __init__(self, provider: str, failure: ProviderFailure, cause: str, note: str = ""):
        self.provider, self.failure, self.cause, self.note = provider, failure, cause, note
        super().__init__(f"{provider}: {failure.value} ({cause})" + (f"; {note}" if note else ""))

    def with_note(self, note: str) -> "ProviderError":
        """The same error with what the command did about it (e.g. how to resume the run) after the cause."""
        return ProviderError(self.provider, self.failure, self.cause, note)


class Provider(Protocol):
    name: str
    cacheable: bool  # whether replies are worth keeping on disk (they cost time or money)
    in_call_order: bool  # whether a reply depends on the order of the calls (then callers keep that order)

    def check(self) -> None:
        """Raise LLMConfigError when the provider cannot work at all."""

    def call(self, request: LLMRequest, timeout: float, on_text: TextSink | None = None) -> LLMResponse:
        """One attempt; raise TransientLLMError or LLMCallError on failure. A provider that streams calls
        `on_text` with the reply so far as it grows; the others return the whole reply only."""

    def repertoire(self, request: LLMRequest, timeout: float) -> Repertoire | None:
        """What the provider can answer for the request's subject, asked before any call; None where there
        is no fixed limit (a model can always be asked again)."""


class BuiltinProvider:
    """The deterministic offline agent: the task object carried by the request answers it.

    Answering imports and traces problem and subproblem files, which a model may have written (a run
    resumed with another model, say), so it happens in a worker subprocess like every evaluation.
    """

    name = BUILTIN_MODEL
    cacheable = False  # free, and its reply depends on the task object, which the cache key leaves out
    in_call_order = False

    def __init__(self):
        self._workers: WorkerPool | None = None   # taken on the first call: a provider made only to check
        self._workers_lock = threading.Lock()      # the configuration leaves a prestarted pool to the run's

    def check(self) -> None:
        return None

    def _pool(self) -> WorkerPool:
        """The agent's one worker, without a GPU (tracing runs on the CPU): the pool the command started ahead
        (workers/prestart.py), or a new one."""
        with self._workers_lock:
            if self._workers is None:
                self._workers = take_pool(BUILTIN_AGENT_WORKERS)
                weakref.finalize(self, self._workers.close)
            return self._workers

    def call(self, request: LLMRequest, timeout: float, on_text: TextSink | None = None) -> LLMResponse:
        if request.task is None:
            raise ValueError(f"builtin provider: the '{request.agent}' request carries no task to answer")
        outcome = self._pool().run(Job("mkevolve.llm.providers:answer_task", {"task": request.task}, timeout))
        if not outcome.ok:
            raise LLMCallError(f"builtin agent: {outcome.reason}")
        return LLMResponse(text=outcome.value)

    def repertoire(self, request: LLMRequest, timeout: float) -> Repertoire | None:
        """The task's count of builtin answers, found in the worker like the answers themselves."""
        if not isinstance(request.task, LimitedTask):
            return None
        outcome = self._pool().run(Job("mkevolve.llm.providers:task_repertoire", {"task": request.task}, timeout))
        if not outcome.ok:
            raise LLMCallError(f"builtin agent: {outcome.reason}")
        return outcome.value


def answer_task(task: BuiltinTask) -> str:
    """Worker job: the builtin agent's reply to one task; after it, while the run checks the reply, this worker
    warms what its first kernel reply needs."""
    from mkevolve.builtin.kernels.trace import warm_up_in_background

    reply = task.builtin_reply()
    warm_up_in_background()
    return reply


def task_repertoire(task: LimitedTask) -> Repertoire:
    """Worker job: how many replies the builtin agent has for one task's subject."""
    return task.builtin_repertoire()


_FAILURES = {
    "rate_limit": (TransientLLMError, "rate limited (429)"),
    "server_error": (TransientLLMError, "server error (500)"),
    "timeout": (TransientLLMError, "timed out"),
    "bad_request": (LLMCallError, "bad request (400)"),
}
# Replayed failures of the provider itself, which stop the run as the real ones do.
_PROVIDER_FAILURES = {
    "connection_error": (ProviderFailure.CONNECTION, "connection refused"),
    "authentication_error": (ProviderFailure.AUTHENTICATION, "invalid API key (401)"),
    "model_not_found": (ProviderFailure.MODEL_NOT_FOUND, "model not found (404)"),
}


@dataclass
class ReplayEntry:
    """One recorded reply; the filters that are set must all match the request that takes it."""

    reply: str = ""
    agent: str | None = None
    subproblem: str | None = None
    sample: int | None = None
    prompt_contains: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    fail: str | None = None
    delay_s: float = 0.0
    stream_s: float = 0.0  # after delay_s, the reply arrives line by line over this many seconds

    def matches(self, request: LLMRequest) -> bool:
        return ((self.agent is None or self.agent == request.agent)
                and (self.subproblem is None or self.subproblem == request.subproblem)
                and (self.sample is None or self.sample == request.sample)
                and (self.prompt_contains is None or self.prompt_contains in request.prompt))


_ENTRY_KEYS = {"reply", "reply_file", "agent", "subproblem", "sample", "prompt_contains", "usage", "fail",
               "delay_s", "stream_s"}


def load_replay(path: Path) -> list[ReplayEntry]:
    """Parse a replay file (YAML, `replies:` list); reply_file paths are relative to the file."""
    if not path.is_file():
        raise LLMConfigError(f"replay file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise LLMConfigError(f"replay file {path}: not valid YAML ({err.__class__.__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("replies"), list):
        raise LLMConfigError(f"replay file {path}: expected a mapping with a 'replies' list")
    return [_replay_entry(path, i, raw) for i, raw in enumerate(data["replies"])]


def _replay_entry(path: Path, index: int, raw) -> ReplayEntry:
    where = f"replay file {path}, replies[{index}]"
    if not isinstance(raw, dict):
        raise LLMConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise LLMConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    values = dict(raw)
    if "reply_file" in values:
        reply_path = path.parent / values.pop("reply_file")
        if not reply_path.is_file():
            raise LLMConfigError(f"{where}: reply_file {reply_path} does not exist")
        values["reply"] = reply_path.read_text(encoding="utf-8")
    if not isinstance(values.get("reply", ""), str):
        raise LLMConfigError(f"{where}: 'reply' must be text")
    if values.get("fail") is not None and values["fail"] not in (_FAILURES | _PROVIDER_FAILURES):
        raise LLMConfigError(f"{where}: 'fail' must be one of {', '.join(_FAILURES | _PROVIDER_FAILURES)}")
    if "usage" in values:
        try:
            values["usage"] = TokenUsage(**values["usage"])
        except TypeError:
            raise LLMConfigError(f"{where}: 'usage' takes prompt, completion and reasoning counts") from None
    return ReplayEntry(**values)


class ReplayProvider:
    """Recorded replies, each used once, handed to the first request (in call order) that matches it.

    The file is YAML with one key, `replies`, a list of entries. Each entry has the reply, as `reply` (text)
    or `reply_file` (a path relative to the file), and optionally: the filters `agent`, `subproblem`,
    `sample` (an evolve request's sample is its candidate's number) and `prompt_contains`; `usage`
    (`prompt`, `completion`, `reasoning` token counts); `fail` (rate_limit, server_error or timeout, which
    the client retries; bad_request, which it does not; connection_error, authentication_error or
    model_not_found, which stop the run as a ProviderError); `delay_s` (a delay longer than the call timeout
    fails as a timeout); `stream_s` (the reply then streams in line by line over that many seconds, as a
    model writes it). A request that no unused entry matches fails for good, naming its agent and sample.
    """

    cacheable = True
    in_call_order = True  # an entry goes to the first request that matches it

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"replay:{self.path}"
        self._entries: list[ReplayEntry] | None = None
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def check(self) -> None:
        self._entries = load_replay(self.path)

    @property
    def remaining(self) -> int:
        return len(self._entries or []) - len(self._used)

    def _take(self, request: LLMRequest) -> ReplayEntry:
        if self._entries is None:
            self.check()
        with self._lock:
            for index, entry in enumerate(self._entries):
                if index not in self._used and entry.matches(request):
                    self._used.add(index)
                    return entry
        raise LLMCallError(f"replay file {self.path} has no unused reply for agent={request.agent}, "
                           f"subproblem={request.subproblem}, sample={request.sample}")

    def call(self, request: LLMRequest, timeout: float, on_text: TextSink | None = None) -> LLMResponse:
        entry = self._take(request)
        if entry.delay_s + entry.stream_s > timeout:
            time.sleep(timeout)
            raise TransientLLMError(f"no reply within the {timeout:g} s call timeout")
        time.sleep(entry.delay_s)
        if entry.fail in _PROVIDER_FAILURES:
            failure, cause = _PROVIDER_FAILURES[entry.fail]
            raise ProviderError(self.name, failure, f"replayed failure: {cause}")
        if entry.fail is not None:
            error, message = _FAILURES[entry.fail]
            raise error(f"replayed failure: {message}")
        if entry.stream_s > 0:
            _stream_lines(entry.reply, entry.stream_s, on_text)
        return LLMResponse(text=entry.reply, usage=entry.usage)

    def repertoire(self, request: LLMRequest, timeout: float) -> Repertoire | None:
        return None  # a model (or a person) can always be asked again


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _stream_lines(text: str, seconds: float, on_text: TextSink | None) -> None:
    """Hand out `text` a line at a time, evenly over `seconds`, each time as the whole text so far."""
    lines = text.splitlines(keepends=True) or [""]
    for count in range(1, len(lines) + 1):
        time.sleep(seconds / len(lines))
        if on_text is not None:
            on_text("".join(lines[:count]))


class ExchangeProvider:
    """A folder through which a person (or an agent with no API) plays the model.

    Each request becomes `requests/<id>.md`; the reply is read from `responses/<id>.md` once that file
    exists and has stopped changing. Both folders are kept, so every exchange stays on record. Nothing
    reports token counts here, so each reply's usage is an estimate from the length of prompt and reply.
    """

    cacheable = True
    in_call_order = False

    def __init__(self, root: str | Path, poll_s: float = 0.5):
        self.root = Path(root)
        self.name = f"exchange:{self.root}"
        self.poll_s = poll_s
        self._next: int | None = None
        self._lock = threading.Lock()

    def check(self) -> None:
        try:
            (self.root / "requests").mkdir(parents=True, exist_ok=True)
            (self.root / "responses").mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise LLMConfigError(f"exchange folder {self.root} cannot be created ({err.strerror})") from None
        readme = self.root / "README.md"
        if not readme.exists():
            write_atomic(readme, render("exchange_readme.j2", root=self.root))

    def _new_id(self, request: LLMRequest) -> str:
        with self._lock:
            if self._next is None:
                names = [p.name for p in (self.root / "requests").glob("*.md")]
                numbers = [int(name[:4]) for name in names if name[:4].isdigit()]
                self._next = max(numbers, default=-1) + 1
            number, self._next = self._next, self._next + 1
        label = "-".join(part for part in (request.agent, request.subproblem) if part)
        return f"{number:04d}-{_UNSAFE.sub('_', label)}"

    def call(self, request: LLMRequest, timeout: float, on_text: TextSink | None = None) -> LLMResponse:
        exchange_id = self._new_id(request)
        reply_path = self.root / "responses" / f"{exchange_id}.md"
        # The request file is the prompt alone, exactly as a model would get it; README.md explains.
        write_atomic(self.root / "requests" / f"{exchange_id}.md", request.prompt)
        text = self._wait_for(reply_path, timeout)
        return LLMResponse(text=text, usage=estimate_usage(request.prompt, text))

    def repertoire(self, request: LLMRequest, timeout: float) -> Repertoire | None:
        return None  # a model (or a person) can always be asked again

    def _wait_for(self, reply_path: Path, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        last_seen: tuple[int, int] | None = None
        while True:
            if reply_path.exists():
                stat = reply_path.stat()
                seen = (stat.st_size, stat.st_mtime_ns)
                if seen == last_seen and stat.st_size > 0:
                    return reply_path.read_text(encoding="utf-8")
                last_seen = seen
            if time.monotonic() >= deadline:
                # Waiting again would only extend the same wait, so this failure is final.
                raise LLMCallError(f"no reply at {reply_path} within {timeout:g} s")
            time.sleep(self.poll_s)


class LiteLLMProvider:
    """Any provider's model through litellm; imported only here, so offline runs need no litellm."""

    cacheable = True
    in_call_order = False

    def __init__(self, model: str, api_base: str | None = None):
        self.model = model
        self.name = model
        self.api_base = api_base or os.environ.get(API_BASE_ENV) or None
        self.api_key = os.environ.get(API_KEY_ENV) or None

    @staticmethod
    def _litellm():
        # The cost map ships with the package; fetching it would stall with no network.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm
        except ImportError:
            raise LLMConfigError("litellm is not installed (pip install litellm); "
                                 "use --model builtin to run offline") from None
        litellm.suppress_debug_info = True
        return litellm

    def check(self) -> None:
        litellm = self._litellm()
        try:
            _, provider, _, _ = litellm.get_llm_provider(self.model, api_base=self.api_base)
        except litellm.exceptions.BadRequestError:
            raise LLMConfigError(f"model '{self.model}' is unknown to litellm: name it with its provider, "
                                 "e.g. 'anthropic/claude-opus-4-5' or 'openai/gpt-4o'") from None
        env = litellm.validate_environment(self.model, api_key=self.api_key, api_base=self.api_base)
        if not env["keys_in_environment"]:
            missing = " and ".join(env["missing_keys"]) or "an API key"
            raise LLMConfigError(f"model '{self.model}' ({provider}) needs {missing} in the environment "
                                 f"(or {API_KEY_ENV})")

    def call(self, request: LLMRequest, timeout: float, on_text: TextSink | None = None) -> LLMResponse:
        litellm = self._litellm()
        import openai  # installed with litellm

        arguments = dict(model=self.model, messages=[{"role": "user", "content": request.prompt}],
                         api_base=self.api_base, api_key=self.api_key, timeout=timeout, num_retries=0)
        try:
            if on_text is not None:
                return _streamed(litellm.completion(**arguments, stream=True,
                                                    stream_options={"include_usage": True}), on_text)
            reply = litellm.completion(**arguments)
        except openai.OpenAIError as err:  # litellm's exception classes all derive from it
            raise self._classify(err, litellm.exceptions) from err
        return LLMResponse(text=reply.choices[0].message.content or "", usage=_usage(reply.usage))

    def _classify(self, err: Exception, errors) -> Exception:
        """What a failed call means: ProviderError when no call can succeed, TransientLLMError when another
        try may, LLMCallError when only this call failed."""
        unreachable = _connect_failure(err)
        if unreachable is not None:
            # Found by cause, not by class: litellm files a refused connection to some providers (openai) under
            # InternalServerError, and uses APIConnectionError for any exception it could not map.
            where = f"at {self.api_base}: " if self.api_base else ""
            return ProviderError(self.name, ProviderFailure.CONNECTION,
                                 f"{where}{type(unreachable).__name__}: {first_line(str(unreachable), limit=300)}")
        said = f"{type(err).__name__}: {first_line(str(err), limit=300)}"
        if isinstance(err, (errors.AuthenticationError, errors.PermissionDeniedError)):
            return ProviderError(self.name, ProviderFailure.AUTHENTICATION, said)
        if isinstance(err, errors.NotFoundError):
            return ProviderError(self.name, ProviderFailure.MODEL_NOT_FOUND, said)
        transient = (errors.Timeout, errors.RateLimitError, errors.InternalServerError,
                     errors.ServiceUnavailableError, errors.BadGatewayError, errors.APIConnectionError)
        return TransientLLMError(said) if isinstance(err, transient) else LLMCallError(said)

    def repertoire(self, request: LLMRequest, timeout: float) -> Repertoire | None:
        return None  # a model (or a person) can always be asked again


def _connect_failure(err: BaseException) -> BaseException | None:
    """The exception in err's chain saying the endpoint could not be reached at all (refused, unknown host, no
    such scheme), or None. A timeout, or a connection lost mid-reply, is not one: another try may work."""
    import socket

    import httpx  # installed with litellm

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, (httpx.ConnectError, httpx.UnsupportedProtocol, ConnectionRefusedError,
                                socket.gaierror)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _streamed(chunks, on_text: TextSink) -> LLMResponse:
    """A streamed reply, `on_text` told of every piece; the usage comes with the last chunk."""
    text, usage = "", None
    for chunk in chunks:
        usage = getattr(chunk, "usage", None) or usage
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            text += piece
            on_text(text)
    return LLMResponse(text=text, usage=_usage(usage))


def _usage(usage) -> TokenUsage:
    if usage is None:
        return TokenUsage()
    details = getattr(usage, "completion_tokens_details", None)
    reasoning = getattr(details, "reasoning_tokens", None) if details is not None else None
    return TokenUsage(prompt=usage.prompt_tokens or 0, completion=usage.completion_tokens or 0,
                      reasoning=reasoning or 0)


def make_provider(model: str, api_base: str | None = None) -> Provider:
    """'builtin', 'replay:FILE', 'exchange:DIR', or a litellm model string."""
    if model == BUILTIN_MODEL:
        return BuiltinProvider()
    if model.startswith("replay:"):
        return ReplayProvider(model.removeprefix("replay:"))
    if model.startswith("exchange:"):
        return ExchangeProvider(model.removeprefix("exchange:"))
    return LiteLLMProvider(model, api_base)
