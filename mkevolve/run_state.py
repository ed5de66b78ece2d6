"""state.json: the checkpoint of a run, written atomically after every step so a run can resume.

It holds each subproblem's Beam, so it sits above the search service (the run loop's layer), not among the
base modules."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path

from mkevolve.fsutil import write_atomic
from mkevolve.search.beam import Beam
from mkevolve.text import member_of

STATE_VERSION = 1


class StateError(ValueError):
    """A state.json that cannot be resumed from; the message names the file and the reason."""


class Step(str, Enum):
    """The last step a run finished; resume starts at the one after it."""

    STARTED = "started"
    DECOMPOSED = "decomposed"
    REFINED = "refined"        # this iteration's decomposition is final
    EVOLVED = "evolved"        # every subproblem of this iteration has been evolved
    EVALUATED = "evaluated"    # end-to-end evaluation done, best/ updated
    SWAPPED = "swapped"
    FINISHED = "finished"


class SubkernelStatus(str, Enum):
    """A subproblem's outcome in one iteration, as state.json spells it (a str, so the JSON is unchanged)."""

    OK = "ok"              # it has an accepted kernel (the verifier's OK)
    FAILING = "failing"    # no accepted kernel: its PyTorch code stands in


@dataclass
class SubkernelRecord:
    """One subproblem's outcome in one iteration."""

    status: SubkernelStatus
    speedup: float | None = None
    runtime_ms: float | None = None
    candidate: str | None = None
    origin: str = ""
    precision: str | None = None
    # its kernel's largest error against the subproblem run in fp64, and eager fp32's (verify.correctness)
    error_vs_fp64: float | None = None
    eager_error_vs_fp64: float | None = None
    reason: str = ""                  # why it has no accepted kernel (and its PyTorch code stands in)
    candidates: int = 0               # candidates made for it in this iteration (0 in older state files)

    def __post_init__(self) -> None:
        # state.json (and a caller may) give the plain string; one outside the set is refused here.
        self.status = member_of(SubkernelStatus, self.status)

    def outcome(self) -> str:
        """What the composed solution runs for it, and why, in one line."""
        if self.candidate is None:
            return f"PyTorch code: {self.reason or 'no accepted kernel'}"
        speed = "speedup unknown" if self.speedup is None else f"speedup {self.speedup:.2f}x"
        return f"Triton kernel {self.candidate} ({self.status.value}, {speed})"


@dataclass
class IterationRecord:
    index: int
    refinement: str                          # initial | split | fuse | total_fuse | none
    subproblems: list[str]
    budget: dict[str, int]
    subkernels: dict[str, SubkernelRecord]
    e2e_status: str = ""
    e2e_reason: str = ""
    e2e_speedup: float | None = None
    e2e_error_vs_fp64: float | None = None         # the composed solution's, against the problem in fp64
    e2e_eager_error_vs_fp64: float | None = None   # eager fp32's on the same inputs
    runtime_ms: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    kept: bool = False
    pytorch: list[str] = field(default_factory=list)   # composed with their PyTorch code: no accepted kernel
    # Whether the verifier ran the composed solution (False: rejected before it ran, e2e_not_run says why);
    # None in state files written before this field, whose readers must infer it.
    e2e_ran: bool | None = None
    e2e_not_run: str = ""
    asked: str = ""   # the refinement agent asked this iteration and for what, even if its answer was rejected

    @classmethod
    def from_dict(cls, data: dict) -> "IterationRecord":
        data = dict(data)
        data["subkernels"] = {k: _subkernel_record(k, v) for k, v in data["subkernels"].items()}
        return cls(**data)


def _subkernel_record(name: str, data: dict) -> SubkernelRecord:
    try:
        return SubkernelRecord(**data)
    except ValueError as err:
        raise ValueError(f"subproblem {name!r}: {err}") from None


@dataclass
class RunState:
    problem: str
    run_id: str
    iteration: int = 0                 # the iteration in progress (0 before the first)
    step: Step = Step.STARTED
    beams: dict[str, Beam] = field(default_factory=dict)       # subproblem -> its beam
    beam_sources: dict[str, str] = field(default_factory=dict)  # subproblem -> source hash of its beam
    evolved: list[str] = field(default_factory=list)           # done in the iteration in progress
    history: list[IterationRecord] = field(default_factory=list)
    best_iteration: int | None = None
    best_score: float | None = None
    needs_total_fuse: bool = False
    refinement: str = "initial"        # how the iteration in progress got its decomposition
    asked: str = ""                    # the refinement agent the iteration in progress asked (IterationRecord.asked)
    budget: dict[str, int] = field(default_factory=dict)       # calls per subproblem, this iteration
    made: dict[str, int] = field(default_factory=dict)         # candidates made per subproblem, this iteration
    stop: str = ""                     # why the search ended before its last iteration (nothing could change)
    version: int = STATE_VERSION

    def to_dict(self) -> dict:
        """What state.json holds: beams as Beam.to_dict() and enums as their strings, in field order."""
        data = asdict(replace(self, beams={}))  # asdict would turn a Beam's enums into objects, not strings
        data["beams"] = {name: beam.to_dict() for name, beam in self.beams.items()}
        data["step"] = self.step.value
        for record in data["history"]:
            for sub in record["subkernels"].values():
                sub["status"] = sub["status"].value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RunState":
        data = dict(data)
        data["step"] = Step(data["step"])
        data["beams"] = {name: Beam.from_dict(beam) for name, beam in data.get("beams", {}).items()}
        data["history"] = [IterationRecord.from_dict(h) for h in data["history"]]
        return cls(**data)

    def save(self, run_dir: Path) -> None:
        write_atomic(Path(run_dir) / "state.json", json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        path = Path(run_dir) / "state.json"
        if not path.is_file():
            raise StateError(f"{path}: no state.json here; is this a run directory?")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != STATE_VERSION:
                raise StateError(f"{path}: state version {data.get('version')!r}, expected {STATE_VERSION}")
            return cls.from_dict(data)
        except StateError:
            raise
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise StateError(f"{path}: corrupted state ({type(err).__name__}: {err}); "
                             "start a new run or restore the file") from None
