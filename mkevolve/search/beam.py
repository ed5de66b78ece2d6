"""Beam search over kernel candidates: the Candidate and Beam records, their ranking, and the search loop."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable

from mkevolve.fsutil import write_atomic
from mkevolve.llm.types import TokenUsage
from mkevolve.verify.result import EvalResult, JudgeVerdict

ID_PREFIX = "c"


class PromptKind(str, Enum):
    GENERATE = "generate"
    DEBUG = "debug"
    REFINE = "refine"


@dataclass
class Candidate:
    """One kernel the model proposed, with where it came from and what the verifier said of it."""

    id: str
    subproblem: str
    parent: str | None
    kind: PromptKind
    source: str                      # "" when the reply carried no code
    result: EvalResult
    tokens: TokenUsage = field(default_factory=TokenUsage)
    cached: bool = False             # the reply came from the response cache
    accepted: bool | None = None     # the final cheating check: None until it has run
    judge: JudgeVerdict | None = None  # the LLM judge's (--judge), given once, when the hard checks accept it

    @property
    def seq(self) -> int:
        return int(self.id.removeprefix(ID_PREFIX))

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def score(self) -> float:
        """Speedup over torch.compile; 0 for anything incorrect or cheating, and where speed is unknown."""
        if not self.passed or self.result.speedup is None:
            return 0.0
        return self.result.speedup

    def rank_key(self) -> tuple:
        # Higher score first; at equal score (always so on CPU) a passing kernel first; then the older.
        return (-self.score, not self.passed, self.seq)

    def to_dict(self) -> dict:
        return {"id": self.id, "subproblem": self.subproblem, "parent": self.parent, "kind": self.kind.value,
                "source": self.source, "result": self.result.to_dict(), "tokens": asdict(self.tokens),
                "cached": self.cached, "accepted": self.accepted,
                "judge": self.judge.to_dict() if self.judge else None}

    @classmethod
    def from_dict(cls, data: dict) -> "Candidate":
        judge = data.get("judge")  # absent from the records of earlier versions
        return cls(id=data["id"], subproblem=data["subproblem"], parent=data["parent"],
                   kind=PromptKind(data["kind"]), source=data["source"],
                   result=EvalResult.from_dict(data["result"]), tokens=TokenUsage(**data["tokens"]),
                   cached=data["cached"], accepted=data["accepted"],
                   judge=JudgeVerdict.from_dict(judge) if judge else None)


@dataclass
class CandidateRecord:
    """A candidate's `<id>.json` in its subproblem's candidates folder: `Candidate.to_dict()` with the code
    left in `<id>.py` beside it ("source" names that file, null without code), plus what ties the verdict to
    the subproblem it was checked against."""

    candidate: Candidate
    problem_sha256: str | None = None   # of the subproblem's source: a saved verdict holds only for it
    reply_excerpt: str | None = None    # the reply's opening, when it had no code
    ported_from: dict | None = None     # {"solution", "subkernel"} when `port` reused the kernel

    @property
    def source_file(self) -> str | None:
        return f"{self.candidate.id}.py" if self.candidate.source else None

    def to_dict(self) -> dict:
        data = self.candidate.to_dict()
        data.update(source=self.source_file, problem_sha256=self.problem_sha256)
        # Written only when set, as before: readers of older records find the same keys.
        optional = {"reply_excerpt": self.reply_excerpt, "ported_from": self.ported_from}
        data.update({key: value for key, value in optional.items() if value is not None})
        return data

    def write(self, folder: Path) -> Path:
        """Write `<id>.json` into `folder` (the .py is written where the kernel is checked)."""
        return write_atomic(Path(folder) / f"{self.candidate.id}.json", json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_dict(cls, data: dict, source: str = "") -> "CandidateRecord":
        candidate = Candidate.from_dict({**data, "source": source})
        return cls(candidate, problem_sha256=data.get("problem_sha256"), reply_excerpt=data.get("reply_excerpt"),
                   ported_from=data.get("ported_from"))

    @classmethod
    def read(cls, path: Path) -> "CandidateRecord":
        """The record at `path`, its code read from the file it names. Raises OSError, ValueError (bad JSON,
        an unknown status or kind), KeyError or TypeError for a file that is not such a record."""
        path = Path(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"{path}: not a candidate record (a JSON {type(data).__name__})")
        code = path.parent / data["source"] if data.get("source") else None
        source = code.read_text(encoding="utf-8") if code is not None and code.is_file() else ""
        return cls.from_dict(data, source)


def candidate_id(seq: int) -> str:
    return f"{ID_PREFIX}{seq:04d}"


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    return sorted(candidates, key=Candidate.rank_key)


@dataclass(frozen=True)
class Exhausted:
    """The agent has no (further) kernel for this subproblem, in its own words: no call is made for it while
    the same `model` writes the kernels."""

    model: str
    reason: str


@dataclass
class Beam:
    """The best `width` candidates of one subproblem so far, best first, and what a resumed search needs."""

    width: int = 4
    members: list[Candidate] = field(default_factory=list)
    next_seq: int = 0                        # candidate ids (and request samples) continue from here
    input_shapes: list[str] | None = None    # how the subproblem is called, for prompts; found once
    exhausted: Exhausted | None = None       # set when the agent said it has nothing (more) for it
    # Why the newest reply without code had none: such candidates never join the beam, and without this the
    # reason would live only in their candidate files.
    codeless: str = ""
    debug_rounds: int = 0                    # beam steps that included a debug child (before a Split)

    def exhausted_for(self, model: str) -> str | None:
        """Why `model` has nothing more for this subproblem, or None when it may still be asked."""
        return self.exhausted.reason if self.exhausted and self.exhausted.model == model else None

    def take_seq(self) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq

    def select(self, children: list[Candidate]) -> None:
        """Keep the best `width` of the members and the children; a child with no code cannot be expanded."""
        self.members = ranked(self.members + [c for c in children if c.source])[: self.width]
        codeless = [c for c in children if not c.source]
        if codeless:
            self.codeless = codeless[-1].result.reason
        if any(c.kind is PromptKind.DEBUG for c in children):
            self.debug_rounds += 1

    def split_allowed(self, agent_exhausted: bool) -> bool:
        """Whether a failing subproblem may be split now: after a debug round, or when there is nothing to
        debug (the agent has no further kernel, or no reply had code). A kernel with a compile error or a
        small mismatch is usually one fix from passing, and a Split throws the beam away."""
        return self.debug_rounds > 0 or agent_exhausted or not self.members

    @property
    def best(self) -> Candidate | None:
        """The best member that passed every check, the final cheating check included."""
        return next((c for c in ranked(self.members) if c.passed and c.accepted), None)

    def to_dict(self) -> dict:
        return {"width": self.width, "members": [c.to_dict() for c in self.members],
                "next_seq": self.next_seq, "input_shapes": self.input_shapes,
                "exhausted": asdict(self.exhausted) if self.exhausted else None, "codeless": self.codeless,
                "debug_rounds": self.debug_rounds}

    @classmethod
    def from_dict(cls, data: dict) -> "Beam":
        exhausted = data.get("exhausted")  # absent from the checkpoints of earlier versions
        return cls(width=data["width"], members=[Candidate.from_dict(c) for c in data["members"]],
                   next_seq=data["next_seq"], input_shapes=data["input_shapes"],
                   exhausted=Exhausted(**exhausted) if exhausted else None, codeless=data.get("codeless", ""),
                   debug_rounds=data.get("debug_rounds", 0))

    def copy(self) -> "Beam":
        return Beam.from_dict(self.to_dict())


# Turns a list of parents (None: a fresh generation) into evaluated children, one per entry, in order.
Propose = Callable[[list[Candidate | None]], list[Candidate]]
# Whether the search has nothing left to gain (e.g. a kernel passed where speed cannot be measured).
Settled = Callable[[Beam], bool]


def never_settled(beam: Beam) -> bool:
    return False


def plan_step(beam: Beam, expansion: int, remaining: int) -> list[Candidate | None]:
    """The parents of the next step, within the budget: every member `expansion` times (best first), then
    one fresh generation per empty slot of the beam (so an empty beam starts with `width` generations)."""
    expansions = [member for member in ranked(beam.members) for _ in range(expansion)]
    fresh = [None] * max(0, beam.width - len(beam.members))
    return (expansions + fresh)[:remaining]


def beam_search(beam: Beam, budget: int, expansion: int, propose: Propose,
                settled: Settled = never_settled) -> Beam:
    """Spend `budget` proposals in steps: expand the beam, evaluate the children, keep the best `width`; stop
    early once `settled(beam)`."""
    remaining = budget
    while remaining > 0 and not settled(beam):
        parents = plan_step(beam, expansion, remaining)
        beam.select(propose(parents))
        remaining -= len(parents)
    return beam
