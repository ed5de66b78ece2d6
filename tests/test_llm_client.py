"""The LLM client: providers, retries, the call pool, the response cache, token counts, start-up checks."""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from pathlib import Path

import jinja2
import pytest

from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.cache import ResponseCache, request_key
from mkevolve.llm.client import LLMClient, LLMConfigError, RetryPolicy, make_client
from mkevolve.llm.providers import (ExchangeProvider, ProviderError, ProviderFailure, ReplayProvider,
                                    TransientLLMError)
from mkevolve.llm.tokens import TokenLedger
from mkevolve.llm.types import LLMRequest, LLMResponse, TokenUsage
from mkevolve.prompts import render

FAST = RetryPolicy(attempts=3, base_delay_s=0.0)


def replay_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "replay.yaml"
    path.write_text(body)
    return path


def replay_client(tmp_path: Path, body: str, **kwargs) -> LLMClient:
    config = RunConfig(model=f"replay:{replay_file(tmp_path, body)}", **kwargs)
    return make_client(config, EventLog(), retry=FAST)


def test_replay_hands_each_reply_to_the_first_matching_request(tmp_path):
    client = replay_client(tmp_path, """
replies:
  - {agent: refine, reply: "refined", usage: {prompt: 10, completion: 5}}
  - {agent: generate, subproblem: b, reply: "for b"}
  - {agent: generate, prompt_contains: "please", reply: "polite"}
  - {agent: generate, reply: "anything"}
""")

    def ask(agent: str, subproblem: str, prompt: str = "p") -> LLMResponse:
        return client.complete(LLMRequest(agent, prompt, subproblem))

    assert ask("generate", "a", "please go").text == "polite"
    assert ask("generate", "b").text == "for b"
    assert ask("refine", "a").text == "refined"
    assert ask("generate", "a").text == "anything"
    exhausted = ask("generate", "a")
    assert exhausted.error is not None and "no unused reply" in exhausted.error and exhausted.text == ""


def test_transient_failures_are_retried_and_permanent_ones_are_not(tmp_path):
    client = replay_client(tmp_path, """
replies:
  - {sample: 0, fail: rate_limit}
  - {sample: 0, fail: server_error}
  - {sample: 0, reply: "third time"}
  - {sample: 1, fail: bad_request}
  - {sample: 1, reply: "never reached"}
""")
    ok = client.complete(LLMRequest("generate", "p", sample=0))
    assert ok.text == "third time" and ok.error is None
    failed = client.complete(LLMRequest("generate", "p", sample=1))
    assert "bad request" in failed.error and client.provider_calls == 4
    attempts = [e["attempts"] for e in client.events.of_kind("llm_call")]
    assert attempts == [3, 1]


def test_retries_stop_after_the_policy_attempts(tmp_path):
    client = replay_client(tmp_path, "replies:\n" + "  - {fail: server_error}\n" * 4)
    response = client.complete(LLMRequest("generate", "p"))
    assert "gave up after 3 attempts" in response.error and client.provider_calls == 3
    assert client.tokens().failed_calls == 1


def test_a_call_slower_than_the_timeout_fails_as_a_timeout(tmp_path):
    client = replay_client(tmp_path, "replies:\n  - {delay_s: 5, reply: late}\n", llm_timeout=0.05)
    client.retry = RetryPolicy(attempts=1)
    started = time.monotonic()
    response = client.complete(LLMRequest("generate", "p"))
    assert time.monotonic() - started < 2
    assert "0.05 s call timeout" in response.error


def test_backoff_grows_and_is_capped():
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=5.0)
    assert 0.5 <= policy.delay_s(1) <= 1.0
    assert 2.0 <= policy.delay_s(3) <= 4.0
    assert 2.5 <= policy.delay_s(10) <= 5.0


class _CountingProvider:
    """Answers with the prompt after a short sleep, and records how many calls overlapped."""

    name = "counting"
    cacheable = True
    in_call_order = False

    def __init__(self):
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def check(self):
        return None

    def call(self, request, timeout, on_text=None):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)
        with self.lock:
            self.active -= 1
        return LLMResponse(text=request.prompt.upper(), usage=TokenUsage(len(request.prompt), 1))


def test_complete_many_keeps_order_and_bounds_calls_in_flight():
    provider = _CountingProvider()
    client = LLMClient(provider, timeout_s=10, parallel=2)
    prompts = [f"prompt {i}" for i in range(7)]
    responses = client.complete_many([LLMRequest("generate", p, "s") for p in prompts])
    assert [r.text for r in responses] == [p.upper() for p in prompts]
    assert provider.peak == 2


def test_the_pool_bound_holds_across_concurrent_callers():
    provider = _CountingProvider()
    client = LLMClient(provider, timeout_s=10, parallel=3)
    threads = [threading.Thread(target=client.complete_many,
                                args=([LLMRequest("generate", f"{t}-{i}", str(t)) for i in range(4)],))
               for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert provider.peak == 3 and client.tokens().calls == 12


def test_token_ledger_adds_up_per_agent_subproblem_and_run():
    ledger = TokenLedger()
    calls = [("generate", "a", TokenUsage(100, 20, 5), False, None),
             ("refine", "a", TokenUsage(50, 10, 0), False, None),
             ("generate", "b", TokenUsage(70, 30, 1), False, None),
             ("decompose", None, TokenUsage(400, 90, 9), False, None),
             ("generate", "a", TokenUsage(100, 20, 5), True, None),
             ("debug", "b", TokenUsage(), False, "timed out")]
    for agent, subproblem, usage, cached, error in calls:
        ledger.record(LLMRequest(agent, "p", subproblem), LLMResponse("t", usage, cached=cached, error=error))
    report = ledger.report()
    assert report.total == TokenUsage(620, 150, 15)
    assert report.by_agent == {"generate": TokenUsage(170, 50, 6), "refine": TokenUsage(50, 10, 0),
                               "decompose": TokenUsage(400, 90, 9), "debug": TokenUsage()}
    assert report.by_subproblem == {"a": TokenUsage(150, 30, 5), "b": TokenUsage(70, 30, 1),
                                    "-": TokenUsage(400, 90, 9)}
    assert sum(u.total for u in report.by_subproblem.values()) == report.total.total
    assert (report.calls, report.cached_calls, report.failed_calls) == (5, 1, 1)


def test_totals_are_written_to_the_events(tmp_path):
    client = replay_client(tmp_path, "replies: [{reply: x, usage: {prompt: 3, completion: 4, reasoning: 2}}]")
    client.complete(LLMRequest("generate", "p", "s"))
    report = client.emit_totals()
    event = client.events.of_kind("llm_tokens")[0]
    assert event["total"] == {"prompt": 3, "completion": 4, "reasoning": 2}
    assert report.total == TokenUsage(3, 4, 2)
    assert event["by_subproblem"]["s"]["completion"] == 4
    call = client.events.of_kind("llm_call")[0]
    assert (call["agent"], call["subproblem"], call["reasoning_tokens"]) == ("generate", "s", 2)
    assert call["cached"] is False


def test_the_cache_answers_an_identical_request_and_nothing_else(tmp_path):
    body = "replies:\n  - {reply: one, usage: {prompt: 5, completion: 5}}\n  - {reply: two}\n"
    config = RunConfig(model=f"replay:{replay_file(tmp_path, body)}")
    first = make_client(config, cache_dir=tmp_path / "cache")
    assert first.complete(LLMRequest("generate", "p", "s")).text == "one"
    again = make_client(config, cache_dir=tmp_path / "cache")
    cached = again.complete(LLMRequest("generate", "p", "s"))
    assert (cached.text, cached.cached, cached.usage.prompt) == ("one", True, 5)
    assert again.provider_calls == 0 and again.tokens().calls == 0 and again.tokens().cached_calls == 1
    assert again.complete(LLMRequest("generate", "p", "s", sample=1)).text == "one"  # a new sample: a call
    assert again.provider_calls == 1


def test_the_cache_key_covers_model_agent_subproblem_sample_and_prompt():
    base = LLMRequest("generate", "p", "s", sample=0)
    variants = [LLMRequest("debug", "p", "s"), LLMRequest("generate", "p", "t"),
                LLMRequest("generate", "p", "s", sample=1), LLMRequest("generate", "q", "s")]
    keys = {request_key("m", base), request_key("other", base)} | {request_key("m", r) for r in variants}
    assert len(keys) == 6 and request_key("m", base) == request_key("m", LLMRequest("generate", "p", "s"))


def test_failed_calls_are_not_cached(tmp_path):
    cache = ResponseCache(tmp_path, "m")
    request = LLMRequest("generate", "p")
    cache.put(request, LLMResponse("", error="timed out"))
    assert cache.get(request) is None
    cache.put(request, LLMResponse("fine"))
    assert cache.get(request).text == "fine"


class _Task:
    def builtin_reply(self) -> str:
        return "```python\nx = 1\n```"


def test_builtin_answers_from_the_task_and_needs_one(tmp_path, monkeypatch):
    # the task is answered in a worker subprocess, which must be able to import this module
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))
    client = make_client(RunConfig(model="builtin"), cache_dir=tmp_path / "cache")
    assert client.complete(LLMRequest("generate", "p", task=_Task())).text == "```python\nx = 1\n```"
    with pytest.raises(ValueError, match="carries no task"):
        client.complete(LLMRequest("split", "p"))
    assert client.cache is None


class _PidTask:
    def builtin_reply(self) -> str:
        return str(os.getpid())


class _FailingTask:
    def builtin_reply(self) -> str:
        raise RuntimeError("no template for scatter")


def test_builtin_answers_in_a_worker_and_reports_its_failures(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))
    client = make_client(RunConfig(model="builtin"), retry=RetryPolicy(attempts=1, base_delay_s=0.0))
    assert client.complete(LLMRequest("generate", "p", task=_PidTask())).text != str(os.getpid())
    failed = client.complete(LLMRequest("generate", "p", task=_FailingTask()))
    assert failed.error.startswith("builtin agent:") and "no template for scatter" in failed.error


def _answer_when_asked(root: Path, reply: str, stop: threading.Event) -> None:
    while not stop.is_set():
        for request in (root / "requests").glob("*.md"):
            target = root / "responses" / request.name
            if not target.exists():
                target.write_text(reply.format(prompt=request.read_text()))
        time.sleep(0.01)


def test_exchange_writes_each_prompt_and_reads_the_reply(tmp_path):
    root = tmp_path / "exchange"
    client = make_client(RunConfig(model=f"exchange:{root}", llm_timeout=10))
    client.provider.poll_s = 0.02
    stop = threading.Event()
    answerer = threading.Thread(target=_answer_when_asked, args=(root, "echo: {prompt}", stop))
    answerer.start()
    try:
        first = client.complete(LLMRequest("generate", "write a kernel", "relu/0"))
        second = client.complete(LLMRequest("refine", "make it fast", "relu/0"))
    finally:
        stop.set()
        answerer.join()
    assert first.text == "echo: write a kernel" and second.text == "echo: make it fast"
    assert (root / "requests" / "0000-generate-relu_0.md").read_text() == "write a kernel"
    assert (root / "responses" / "0001-refine-relu_0.md").exists()
    assert "responses/<id>.md" in (root / "README.md").read_text()
    resumed = ExchangeProvider(root)
    assert resumed._new_id(LLMRequest("debug", "p")) == "0002-debug"


def test_exchange_without_a_reply_fails_after_the_timeout(tmp_path):
    root = tmp_path / "exchange"
    client = make_client(RunConfig(model=f"exchange:{root}", llm_timeout=0.1))
    client.provider.poll_s = 0.02
    response = client.complete(LLMRequest("generate", "p", "s"))
    assert response.error == f"no reply at {root / 'responses' / '0000-generate-s.md'} within 0.1 s"
    assert client.provider_calls == 1  # waiting again would only extend the wait


@pytest.mark.parametrize("body, message", [
    ("replies: 3", "expected a mapping with a 'replies' list"),
    ("replies:\n  - {reply: x, fail: sometimes}\n", "'fail' must be one of"),
    ("replies:\n  - {reply_file: missing.md}\n", "missing.md does not exist"),
    ("replies:\n  - {reply: x, colour: red}\n", "unknown key(s) colour"),
])
def test_a_bad_replay_file_fails_at_start_in_one_line(tmp_path, body, message):
    config = RunConfig(model=f"replay:{replay_file(tmp_path, body)}")
    with pytest.raises(LLMConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        make_client(config)
    assert "\n" not in str(info.value)


def test_a_missing_replay_file_fails_at_start(tmp_path):
    with pytest.raises(LLMConfigError, match="does not exist"):
        make_client(RunConfig(model=f"replay:{tmp_path / 'nothing.yaml'}"))


def test_replayed_failures_raise_typed_errors(tmp_path):
    provider = ReplayProvider(replay_file(tmp_path, "replies:\n  - {fail: rate_limit}\n"))
    provider.check()
    with pytest.raises(TransientLLMError, match="rate limited"):
        provider.call(LLMRequest("generate", "p"), timeout=1)


@pytest.mark.filterwarnings("ignore::UserWarning")  # raised inside litellm's own imports
@pytest.mark.slow
def test_a_litellm_model_without_its_key_or_provider_fails_at_start(monkeypatch):
    if importlib.util.find_spec("litellm") is None:  # not imported here: the provider sets it up first
        pytest.skip("litellm is not installed")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("MKEVOLVE_API_KEY", raising=False)
    with pytest.raises(LLMConfigError) as missing_key:
        make_client(RunConfig(model="anthropic/claude-opus-4-5"))
    assert "needs ANTHROPIC_API_KEY" in str(missing_key.value) and "\n" not in str(missing_key.value)
    with pytest.raises(LLMConfigError, match="unknown to litellm"):
        make_client(RunConfig(model="no-such-model-anywhere"))
    monkeypatch.setenv("MKEVOLVE_API_KEY", "sk-test")
    monkeypatch.setenv("MKEVOLVE_API_BASE", "http://127.0.0.1:9")
    provider = make_client(RunConfig(model="anthropic/claude-opus-4-5")).provider
    assert (provider.api_key, provider.api_base) == ("sk-test", "http://127.0.0.1:9")
    configured = make_client(RunConfig(model="anthropic/claude-opus-4-5", api_base="http://127.0.0.1:8"))
    assert configured.provider.api_base == "http://127.0.0.1:8"


def test_prompts_refuse_a_missing_variable():
    with pytest.raises(jinja2.UndefinedError, match="problem_source"):
        render("generate.j2", subproblem="s", shapes=[], device="cpu", on_gpu=False)


@pytest.mark.filterwarnings("ignore::UserWarning")  # raised inside litellm's own imports
def test_litellm_replies_usage_and_errors_are_mapped(monkeypatch):
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm is not installed")
    monkeypatch.setenv("MKEVOLVE_API_KEY", "sk-test")
    client = make_client(RunConfig(model="anthropic/claude-opus-4-5", llm_timeout=7), retry=FAST)
    import litellm

    errors = litellm.exceptions
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
             "completion_tokens_details": {"reasoning_tokens": 3}}
    outcomes = [errors.RateLimitError(message="slow down", llm_provider="anthropic", model="m"),
                litellm.ModelResponse(choices=[{"message": {"role": "assistant", "content": "a kernel"}}],
                                      usage=usage),
                errors.BadRequestError(message="prompt too long", llm_provider="anthropic", model="m")]
    seen = []

    def fake_completion(**kwargs):
        seen.append(kwargs)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(litellm, "completion", fake_completion)
    reply = client.complete(LLMRequest("generate", "the prompt", "s"))
    assert (reply.text, reply.usage) == ("a kernel", TokenUsage(10, 5, 3))
    assert seen[0]["messages"] == [{"role": "user", "content": "the prompt"}]
    assert (seen[0]["timeout"], seen[0]["api_key"], seen[0]["num_retries"]) == (7, "sk-test", 0)
    refused = client.complete(LLMRequest("generate", "again", "s"))
    assert refused.error == "BadRequestError: litellm.BadRequestError: prompt too long"  # this call's failure only
    assert client.provider_calls == 3


def _litellm_error(name: str):
    import litellm

    errors = litellm.exceptions
    if name in ("refused", "unknown_host"):
        # As litellm raises it for an openai endpoint that cannot be reached: a 500 whose cause is httpx's.
        import httpx

        err = errors.InternalServerError(message="OpenAIException - Connection error.", llm_provider="openai",
                                         model="m")
        cause = "[Errno 111] Connection refused" if name == "refused" else "[Errno -2] Name or service not known"
        err.__cause__ = httpx.ConnectError(cause)
        return err
    if name == "APIConnectionError":  # litellm's class for whatever it could not map
        return errors.APIConnectionError(message="could not parse the reply", llm_provider="openai", model="m")
    if name == "Timeout":
        return errors.Timeout(message="no reply", model="m", llm_provider="openai")
    if name == "PermissionDeniedError":
        import httpx

        response = httpx.Response(403, request=httpx.Request("POST", "http://127.0.0.1:9"))
        return errors.PermissionDeniedError(message="forbidden", llm_provider="openai", model="m", response=response)
    return getattr(errors, name)(message=f"{name} from the server", llm_provider="openai", model="m")


@pytest.mark.filterwarnings("ignore::UserWarning")  # raised inside litellm's own imports
@pytest.mark.parametrize("error, failure", [
    ("refused", ProviderFailure.CONNECTION),
    ("unknown_host", ProviderFailure.CONNECTION),
    ("AuthenticationError", ProviderFailure.AUTHENTICATION),
    ("PermissionDeniedError", ProviderFailure.AUTHENTICATION),
    ("NotFoundError", ProviderFailure.MODEL_NOT_FOUND),
])
def test_a_provider_that_can_answer_no_call_stops_at_the_first_one(monkeypatch, error, failure):
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm is not installed")
    monkeypatch.setenv("MKEVOLVE_API_KEY", "sk-test")
    events = EventLog()
    # One call at a time, so that the queued ones come after the first failure for certain.
    config = RunConfig(model="openai/gpt-4o", api_base="http://127.0.0.1:9", llm_parallel=1)
    client = make_client(config, events, retry=FAST)
    import litellm

    calls = []
    monkeypatch.setattr(litellm, "completion", lambda **kwargs: calls.append(kwargs) or _raise(_litellm_error(error)))
    with pytest.raises(ProviderError) as info:
        client.complete_many([LLMRequest("generate", "p", "s", sample=i) for i in range(3)])
    message = str(info.value)
    assert info.value.failure is failure and message.startswith(f"openai/gpt-4o: {failure.value} (")
    assert "\n" not in message
    if failure is ProviderFailure.CONNECTION:  # the cause under litellm's class is what the user needs
        assert "at http://127.0.0.1:9: ConnectError: [Errno" in message
    else:
        assert error in message
    with pytest.raises(ProviderError):  # a later call is not tried: the provider is known to be broken
        client.complete(LLMRequest("generate", "later", "s"))
    assert len(calls) == 1 and client.provider_calls == 1  # no retry, and the queued calls never went out
    (event,) = events.of_kind("provider_error")
    assert (event["model"], event["failure"]) == ("openai/gpt-4o", failure.name.lower())


@pytest.mark.filterwarnings("ignore::UserWarning")  # raised inside litellm's own imports
def test_timeouts_and_rate_limits_stay_retried(monkeypatch):
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm is not installed")
    monkeypatch.setenv("MKEVOLVE_API_KEY", "sk-test")
    client = make_client(RunConfig(model="openai/gpt-4o"), retry=FAST)
    import litellm

    failures = [_litellm_error("Timeout"), _litellm_error("RateLimitError"), _litellm_error("APIConnectionError"),
                _litellm_error("InternalServerError"), _litellm_error("InternalServerError"),
                _litellm_error("InternalServerError")]
    monkeypatch.setattr(litellm, "completion", lambda **kwargs: _raise(failures.pop(0)))
    response = client.complete(LLMRequest("generate", "p", "s"))
    assert "gave up after 3 attempts" in response.error and "APIConnectionError" in response.error
    second = client.complete(LLMRequest("generate", "p", "t"))  # a plain 500 is the server's, not the network's
    assert "InternalServerError" in second.error and client.provider_calls == 6 and not failures


@pytest.mark.filterwarnings("ignore::UserWarning")  # raised inside litellm's own imports
def test_an_endpoint_that_refuses_connections_stops_at_the_first_call(monkeypatch):
    """The real litellm against a closed local port (no network needed): the first call raises."""
    if importlib.util.find_spec("litellm") is None:
        pytest.skip("litellm is not installed")
    monkeypatch.setenv("MKEVOLVE_API_KEY", "sk-test")
    client = make_client(RunConfig(model="openai/gpt-4o", api_base="http://127.0.0.1:9", llm_timeout=20), retry=FAST)
    expected = r"^openai/gpt-4o: cannot connect to the provider \(at http://127.0.0.1:9: "
    with pytest.raises(ProviderError, match=expected):
        client.complete(LLMRequest("generate", "p", "s"))
    assert client.provider_calls == 1


def _raise(err: Exception):
    raise err


@pytest.mark.parametrize("fail, failure", [("connection_error", ProviderFailure.CONNECTION),
                                           ("authentication_error", ProviderFailure.AUTHENTICATION),
                                           ("model_not_found", ProviderFailure.MODEL_NOT_FOUND)])
def test_replay_can_play_a_provider_that_answers_nothing(tmp_path, fail, failure):
    client = replay_client(tmp_path, f"replies:\n  - {{fail: {fail}}}\n  - {{reply: never}}\n")
    with pytest.raises(ProviderError) as info:
        client.complete(LLMRequest("generate", "p"))
    assert info.value.failure is failure and info.value.provider.startswith("replay:")
    assert client.provider.remaining == 1 and client.provider_calls == 1


def test_a_debug_prompt_quotes_the_line_the_verdict_points_at_and_states_the_versions():
    import triton

    from mkevolve.verify.result import EvalResult, Status

    code = "\n".join(f"line_{n} = {n}" for n in range(1, 21))
    verdict = EvalResult(status=Status.COMPILE_ERROR, reason="CompilationError at line 12", line=12)
    prompt = render("debug.j2", subproblem="s", problem_source="x = 1", shapes=[], device="cpu", on_gpu=False,
                    code=code, verdict=verdict)
    assert "> 12 | line_12 = 12" in prompt and "   9 | line_9 = 9" in prompt and "8 | line_8" not in prompt
    assert f"Triton {triton.__version__}" in prompt


def test_a_debug_prompt_for_a_kernel_the_checker_never_ran_does_not_blame_its_code():
    from mkevolve.verify.result import CANDIDATE_NOT_STARTED, EvalResult, Status

    verdict = EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: the zygote is gone")
    prompt = render("debug.j2", subproblem="s", problem_source="x = 1", shapes=[], device="cpu", on_gpu=False,
                    code="x = 1", verdict=verdict)
    assert "says nothing about its code" in prompt and "died" not in prompt and "the zygote is gone" in prompt
