"""The records the verifier hands back: verdict, errors, timings, speedup."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    INCORRECT = "incorrect"
    CHEATING = "cheating"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    BAD_PROBLEM = "bad_problem"
    # No verdict on the kernel: its check never ran it (the run's time budget was spent before a worker was
    # free, the check was stopped after the budget, or the candidate process could not be started). The
    # reason opens with CANDIDATE_NOT_STARTED; a resumed run checks the kernel again.
    NOT_RUN = "not_run"


@dataclass(frozen=True)
class Timing:
    """Milliseconds per forward call over `runs` timed calls."""

    median_ms: float
    p10_ms: float
    p20_ms: float
    p80_ms: float
    p90_ms: float
    runs: int


@contextmanager
def timed_phase(phases: dict[str, float], name: str) -> Iterator[None]:
    """Adds the seconds the block takes to `phases[name]` (a phase entered twice adds up), raised or not."""
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - start


# The reason's opening words when the verifier could not start a candidate process at all: the check did
# not run. Readers of verdicts (the run's summary, the report) match on it.
CANDIDATE_NOT_STARTED = "the candidate process could not be run"


def not_started_cause(reason: str) -> str | None:
    """The cause in a reason that says the candidate process never started (so nothing was checked);
    None for any other reason."""
    if not reason.startswith(CANDIDATE_NOT_STARTED):
        return None
    return reason.removeprefix(CANDIDATE_NOT_STARTED).lstrip(": ") or "no cause given"


@dataclass
class EvalResult:
    status: Status
    reason: str = ""
    rule: str | None = None          # cheating rule id, when status is CHEATING
    line: int | None = None          # source line the reason points at, when known
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    # The worst |out - ref| / (atol + rtol*|ref|) over every output and trial: what the verdict used.
    # Below 1 passes; unlike max_rel_err it does not explode where the reference is near zero.
    tolerance_used: float | None = None
    atol: float | None = None        # the tolerance the outputs were compared with
    rtol: float | None = None
    failed_trial: int | None = None  # first trial (0-based) whose outputs did not match
    # The last trial's largest error against the reference run in fp64 (of the input config nearest the precision
    # rule's limit), and eager fp32's on the same inputs; None where it is not measured (no fp64 form of the
    # reference). The first is taken at reference.FP64_SAMPLED_POSITIONS secret positions per output where the
    # outputs pass reference.FP64_REFERENCE_BYTES in fp64.
    error_vs_fp64: float | None = None
    eager_error_vs_fp64: float | None = None
    trials: int = 0
    launches: int | None = None      # Triton launches seen during one forward
    precision: str | None = None     # dot precision the source states ("ieee", "tf32x3", ...)
    runtime: Timing | None = None
    baseline: Timing | None = None   # torch.compile of the reference, same worker, same inputs
    speedup: float | None = None     # baseline / runtime; None where it cannot be measured
    # Input configs the timing covers, where it is not all of them (correctness covers every one).
    timed_configs: list[int] | None = None
    wall_s: float = 0.0              # seconds the evaluation took, worker start included
    phases: dict[str, float] = field(default_factory=dict)  # verifier overhead by phase, seconds
    peak_rss_mb: float | None = None # host memory the candidate process held at most, sampled every 50 ms
    authority: str | None = None     # "gpu": what ran on the GPU was read; "cpu": static and dispatcher rules only
    # Every violation found, each {"rule", "line", "message"}; `reason` names only the first.
    violations: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status is Status.OK

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "EvalResult":
        data = dict(data)
        data["status"] = Status(data["status"])
        for key in ("runtime", "baseline"):
            if data.get(key) is not None:
                data[key] = Timing(**data[key])
        return cls(**data)

    def summary(self) -> str:
        speed = "speedup unknown" if self.speedup is None else f"speedup {self.speedup:.2f}x"
        if self.speedup is not None and self.timed_configs:
            speed += f" over the {len(self.timed_configs)} largest input configs"
        text = f"{self.status.value}: {self.reason}" if self.reason else self.status.value
        return f"{text} ({speed})"


class JudgeRuling(str, Enum):
    """What the optional LLM judge said of a kernel every hard check accepted."""

    PASS = "pass"
    REJECT = "reject"
    NONE = "none"        # no verdict: the call failed or the reply was not in the verdict form


@dataclass(frozen=True)
class JudgeVerdict:
    """The LLM judge's reading of one accepted kernel: `model` ruled `ruling` because of `reason`. Only a
    REJECT changes anything (the kernel loses its acceptance); NONE leaves the hard checks' verdict standing."""

    ruling: JudgeRuling
    reason: str
    model: str

    @property
    def rejects(self) -> bool:
        return self.ruling is JudgeRuling.REJECT

    def summary(self) -> str:
        said = "no verdict" if self.ruling is JudgeRuling.NONE else self.ruling.value
        return f"judge: {said} ({self.reason})"

    def to_dict(self) -> dict:
        return {"ruling": self.ruling.value, "reason": self.reason, "model": self.model}

    @classmethod
    def from_dict(cls, data: dict) -> "JudgeVerdict":
        return cls(ruling=JudgeRuling(data["ruling"]), reason=data["reason"], model=data["model"])


class Rejected(Exception):
    """A verdict other than OK, raised where it is found and turned into an EvalResult by the evaluation."""

    def __init__(self, status: Status, reason: str, line: int | None = None, rule: str | None = None,
                 violations: list[dict] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.line, self.rule = status, reason, line, rule
        self.violations = violations or []

    def to_result(self) -> EvalResult:
        return EvalResult(status=self.status, reason=self.reason, line=self.line, rule=self.rule,
                          violations=list(self.violations))
