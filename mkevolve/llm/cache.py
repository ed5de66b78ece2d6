"""The on-disk response cache: one JSON file per answered request, keyed by a hash of the full request."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from mkevolve.fsutil import write_atomic
from mkevolve.llm.types import LLMRequest, LLMResponse, TokenUsage


class CacheEntryError(ValueError):
    """A cache file that exists but cannot be read back; the message names the file."""


@dataclass(frozen=True)
class CacheEntry:
    key: str
    model: str
    agent: str
    subproblem: str | None
    sample: int
    text: str
    usage: TokenUsage


def request_key(model: str, request: LLMRequest) -> str:
    """Everything that shapes the reply: the model, the agent, the subproblem, the sample and the prompt.

    The task object is left out on purpose: the rendered prompt already says everything it carries.
    """
    identity = {"model": model, "agent": request.agent, "subproblem": request.subproblem,
                "sample": request.sample, "prompt": request.prompt}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


class ResponseCache:
    """Successful replies only, so that a failed call is tried again when the run resumes."""

    def __init__(self, root: str | Path, model: str):
        self.root = Path(root)
        self.model = model

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, request: LLMRequest) -> LLMResponse | None:
        path = self._path(request_key(self.model, request))
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            entry = CacheEntry(**{**data, "usage": TokenUsage(**data["usage"])})
        except (json.JSONDecodeError, TypeError, KeyError) as err:
            reason = f"{path}: unreadable cache entry ({err}); delete it to call again"
            raise CacheEntryError(reason) from None
        return LLMResponse(text=entry.text, usage=entry.usage, cached=True)

    def put(self, request: LLMRequest, response: LLMResponse) -> None:
        if response.error is not None:
            return
        key = request_key(self.model, request)
        entry = CacheEntry(key=key, model=self.model, agent=request.agent, subproblem=request.subproblem,
                           sample=request.sample, text=response.text, usage=response.usage)
        write_atomic(self._path(key), json.dumps(asdict(entry), indent=1))
