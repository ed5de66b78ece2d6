"""The events that are read back (by report.html and scripts/eval_profile.py), one frozen dataclass per kind.

The emitter builds the record and EventLog.record writes its fields as the event's keys; the reader parses the
event back into the same record. So writer and reader share one list of fields, and a field renamed on one side
is renamed on the other. Every field has a default because a log written by an older version lacks the fields
added since, and such run folders must still render; a field of the wrong type, though, is an EventFieldError.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints


class EventFieldError(ValueError):
    """An event whose field holds a value of the wrong type: the log is damaged or was written by a bug."""

    def __init__(self, kind: str, field_name: str, expected: str, value: Any):
        self.kind = kind
        self.field_name = field_name
        super().__init__(f"{kind} event: field {field_name!r} should be {expected}, "
                         f"got {type(value).__name__} {_excerpt(value)}")


def _excerpt(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


Record = TypeVar("Record", bound="EventRecord")


@dataclass(frozen=True)
class EventRecord:
    """One event of kind KIND; its fields are the event's keys (besides "kind" and the timestamp "t")."""

    KIND: ClassVar[str] = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls: type[Record], event: dict) -> Record:
        """Missing keys take the field's default (an older log); unknown keys are ignored (a newer one)."""
        return _build(cls, event, cls.KIND, "")


# ---- the record types ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LLMCallEvent(EventRecord):
    """One request to the model, answered by it or by the cache."""

    KIND: ClassVar[str] = "llm_call"
    model: str = ""
    agent: str = ""
    subproblem: str | None = None
    sample: int = 0
    cached: bool = False
    attempts: int = 1
    error: str | None = None
    wall_s: float | None = None         # None: written before calls were timed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class TokenCount:
    # The event's copy of llm.types.TokenUsage: events sit in the base layer and cannot import the llm package.
    prompt: int = 0
    completion: int = 0
    reasoning: int = 0


@dataclass(frozen=True)
class LLMTokensEvent(EventRecord):
    """A client's token totals at the end of its run (a resumed or ported run has one per client)."""

    KIND: ClassVar[str] = "llm_tokens"
    model: str = ""
    total: TokenCount = TokenCount()
    by_agent: dict[str, TokenCount] = field(default_factory=dict)
    by_subproblem: dict[str, TokenCount] = field(default_factory=dict)
    calls: int = 0
    cached_calls: int = 0
    failed_calls: int = 0


@dataclass(frozen=True)
class _CandidateFields(EventRecord):
    """What the evolve agent logs of one candidate; two kinds share these fields."""

    subproblem: str = ""
    id: str = ""
    parent: str | None = None
    prompt_kind: str = ""
    status: str = ""
    reason: str = ""                    # cut to its first 300 characters by the emitter
    speedup: float | None = None
    accepted: bool | None = None
    tokens: int = 0
    cached: bool = False


@dataclass(frozen=True)
class CandidateEvent(_CandidateFields):
    """A new candidate and its verdict."""

    KIND: ClassVar[str] = "candidate"


@dataclass(frozen=True)
class FinalCheckEvent(_CandidateFields):
    """A beam member after the final acceptance check; written, not read back (parse_events skips it)."""

    KIND: ClassVar[str] = "final_check"


@dataclass(frozen=True)
class VerdictEvent(EventRecord):
    """One verdict of the verifier, with the evaluation's profile."""

    KIND: ClassVar[str] = "verdict"
    problem: str = ""
    solution: str = ""
    status: str = ""
    reason: str = ""
    speedup: float | None = None
    wall_s: float | None = None                 # None (with phases): written before evaluations were profiled
    phases: dict[str, float] | None = None      # seconds per phase, "candidate.build" inside "candidate"
    composite: bool = False                     # the end-to-end check of a composed solution

    @property
    def profiled(self) -> bool:
        return self.wall_s is not None and self.phases is not None


@dataclass(frozen=True)
class EndToEndAheadEvent(EventRecord):
    """An end-to-end check run while the searches went on (end_to_end_ahead.py): started, its verdict used as
    the iteration's, or an error in one whose verdict was never used."""

    KIND: ClassVar[str] = "end_to_end_ahead"
    STARTED: ClassVar[str] = "started"
    USED: ClassVar[str] = "used"
    ERROR: ClassVar[str] = "error"
    iteration: int = 0
    check: int = 0                              # 1 for the iteration's first check ahead
    state: str = ""
    candidates: dict[str, str] | None = None    # subproblem -> candidate id (when started)
    reason: str = ""                            # the error (when state is "error")


@dataclass(frozen=True)
class PortMatch:
    """A subproblem of the ported variant and what became of it."""

    variant: str = ""
    status: str = ""
    solution: str | None = None         # the solution's subproblem it matched, if any
    reason: str = ""


@dataclass(frozen=True)
class PortReuse:
    """A variant's subproblem that reuses the solution's kernel as it is."""

    variant: str = ""
    solution: str | None = None


@dataclass(frozen=True)
class PortEvent(EventRecord):
    """A port of a solution to a variant of its problem."""

    KIND: ClassVar[str] = "port"
    solution: str = ""
    variant: str = ""
    subproblems: tuple[PortMatch, ...] = ()
    reused: tuple[PortReuse, ...] = ()
    evolved: tuple[str, ...] = ()
    decompose_calls: int = 0


@dataclass(frozen=True)
class SwapEvent(EventRecord):
    """A --swap trial of slow subkernels for their PyTorch code, kept when end to end did not get worse."""

    KIND: ClassVar[str] = "swap"
    subkernels: tuple[str, ...] = ()
    status: str = ""
    speedup: float | None = None
    previous: float | None = None
    kept: bool = False


@dataclass(frozen=True)
class SwapSkippedEvent(EventRecord):
    """A --swap that was not tried; shares the kind "swap" and is told apart by its one key."""

    KIND: ClassVar[str] = "swap"
    skipped: str = ""


# ---- parsing a log -------------------------------------------------------------------------------------

_READ_KINDS: dict[str, type[EventRecord]] = {
    cls.KIND: cls for cls in (LLMCallEvent, LLMTokensEvent, CandidateEvent, VerdictEvent, EndToEndAheadEvent,
                              PortEvent, SwapEvent)}


def record_type(event: dict) -> type[EventRecord] | None:
    """The record an event parses into; None for a kind nothing reads back."""
    kind = event.get("kind")
    if kind == SwapEvent.KIND and "skipped" in event:
        return SwapSkippedEvent
    return _READ_KINDS.get(kind) if isinstance(kind, str) else None


def parse_events(events: Iterable[dict]) -> list[EventRecord]:
    """The events of the kinds that are read back, as records, in log order; other kinds are skipped.
    Raises EventFieldError on a field of the wrong type."""
    records = []
    for event in events:
        cls = record_type(event)
        if cls is not None:
            records.append(cls.from_json(event))
    return records


def of_type(records: Iterable[EventRecord], cls: type[Record]) -> list[Record]:
    return [r for r in records if isinstance(r, cls)]


# ---- checking types: each value against its field's annotation -----------------------------------------

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _build(cls: type, data: dict, kind: str, prefix: str):
    hints = _hints(cls)
    values = {f.name: _convert(data[f.name], hints[f.name], kind, prefix + f.name)
              for f in fields(cls) if f.name in data}
    return cls(**values)


def _convert(value: Any, hint: Any, kind: str, name: str) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return _convert_optional(value, hint, kind, name)
    if origin is tuple:
        return tuple(_convert(v, get_args(hint)[0], kind, f"{name}[{i}]")
                     for i, v in enumerate(_expect(value, list, "a list", kind, name)))
    if origin is dict:
        return {k: _convert(v, get_args(hint)[1], kind, f"{name}.{k}")
                for k, v in _expect(value, dict, "an object", kind, name).items()}
    if is_dataclass(hint):
        return _build(hint, _expect(value, dict, "an object", kind, name), kind, name + ".")
    return _convert_scalar(value, hint, kind, name)


def _convert_optional(value: Any, hint: Any, kind: str, name: str) -> Any:
    # Only `X | None` is used: None stands for "not known" (an old log, or no measurement).
    (inner,) = [a for a in get_args(hint) if a is not types.NoneType]
    return None if value is None else _convert(value, inner, kind, name)


def _convert_scalar(value: Any, hint: type, kind: str, name: str) -> Any:
    # bool is an int to Python, but `true` where a count belongs is a damaged log, not a count of 1.
    if isinstance(value, bool) and hint is not bool:
        raise EventFieldError(kind, name, _NAMES[hint], value)
    if hint is float and isinstance(value, int):
        return float(value)             # JSON writes 10.0 back as 10
    return _expect(value, hint, _NAMES[hint], kind, name)


def _expect(value: Any, python_type: type, expected: str, kind: str, name: str) -> Any:
    if not isinstance(value, python_type):
        raise EventFieldError(kind, name, expected, value)
    return value
