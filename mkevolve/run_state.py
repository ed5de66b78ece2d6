"""state.json: the checkpoint of a run, written atomically after every step so a run can resume."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from mkevolve.fsutil import write_atomic

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


@dataclass
class SubkernelRecord:
    """One subproblem's outcome in one iteration."""

    status: str
    speedup: float | None = None
    runtime_ms: float | None = None
    candidate: str | None = None
    origin: str = ""
    precision: str | None = None
    reason: str = ""                  # why it has no accepted kernel (and its PyTorch code stands in)
    candidates: int = 0               # candidates made for it in this iteration (0 in older state files)

    def outcome(self) -> str:
        """What the composed solution runs for it, and why, in one line."""
        if self.candidate is None:
            return f"PyTorch code: {self.reason or 'no accepted kernel'}"
        speed = "speedup unknown" if self.speedup is None else f"speedup {self.speedup:.2f}x"
        return f"Triton kernel {self.candidate} ({self.status}, {speed})"


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
        data["subkernels"] = {k: SubkernelRecord(**v) for k, v in data["subkernels"].items()}
        return cls(**data)


@dataclass
class RunState:
    problem: str
    run_id: str
    iteration: int = 0                 # the iteration in progress (0 before the first)
    step: Step = Step.STARTED
    beams: dict[str, dict] = field(default_factory=dict)       # subproblem -> Beam.to_dict()
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

    def save(self, run_dir: Path) -> None:
        data = asdict(self)
        data["step"] = self.step.value
        write_atomic(Path(run_dir) / "state.json", json.dumps(data, indent=1))

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        path = Path(run_dir) / "state.json"
        if not path.is_file():
            raise StateError(f"{path}: no state.json here; is this a run directory?")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != STATE_VERSION:
                raise StateError(f"{path}: state version {data.get('version')!r}, expected {STATE_VERSION}")
            data["step"] = Step(data["step"])
            data["history"] = [IterationRecord.from_dict(h) for h in data["history"]]
            return cls(**data)
        except StateError:
            raise
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise StateError(f"{path}: corrupted state ({type(err).__name__}: {err}); "
                             "start a new run or restore the file") from None
