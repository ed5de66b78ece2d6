"""A solution folder (a run's best/): its files, manifest.yaml, and the PyTorch alternative of a subkernel."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

import yaml

from mkevolve.codebase import KERNELS_DIR, PROBLEM_FILE, PROBLEMS_DIR, SOLUTION_FILE
from mkevolve.fsutil import write_atomic
from mkevolve.text import member_of

MANIFEST = "manifest.yaml"
ORIGIN_PYTORCH = "pytorch"
_ALTERNATIVE_MARKER = "# mkevolve: PyTorch alternative"


class SolutionError(ValueError):
    """A folder that is not a usable solution; the message names the folder and what is missing."""


class EntryStatus(str, Enum):
    """A manifest entry's status (a str, so manifest.yaml spells it as before)."""

    OK = "ok"              # its kernel passed its subproblem's checks
    PYTORCH = "pytorch"    # a run put the subproblem's own PyTorch code in, having no accepted kernel


@dataclass
class SubkernelEntry:
    origin: str                       # the model that wrote it, "builtin", "pytorch" or "hand"
    candidate: str | None = None      # candidate id in the run, when it came from one
    status: EntryStatus = EntryStatus.OK
    speedup: float | None = None      # vs torch.compile of its own subproblem
    runtime_ms: float | None = None   # inside the end-to-end forward
    runtime_share: float | None = None
    precision: str | None = None
    # its largest error against its subproblem run in fp64, and eager fp32's there (None: not measured)
    error_vs_fp64: float | None = None
    eager_error_vs_fp64: float | None = None
    sha256: str = ""
    reused_from: str | None = None    # "<solution folder> (<subkernel>)" when `port` carried it over
    reason: str | None = None         # for PyTorch code a run put in: why no Triton kernel was accepted

    def __post_init__(self) -> None:
        # manifest.yaml (and a caller may) give the plain string; one outside the set is refused here.
        self.status = member_of(EntryStatus, self.status)


def mode_name(eval_mode: bool) -> str:
    """How a manifest, `eval` and a packed file's header name the module mode checks ran in."""
    return "eval" if eval_mode else "train"


@dataclass
class Manifest:
    problem: str
    device: str
    status: str = ""
    speedup: float | None = None      # end to end, vs torch.compile of the original
    iteration: int | None = None
    # end to end: the largest error against the original run in fp64, and eager fp32's (None: not measured)
    error_vs_fp64: float | None = None
    eager_error_vs_fp64: float | None = None
    versions: dict[str, str] = field(default_factory=dict)
    subkernels: dict[str, SubkernelEntry] = field(default_factory=dict)
    # The module mode its checks ran in, "train" or "eval" (None: a manifest from before it was recorded). A
    # kernel verified in one mode is not verified in the other: batch norm and dropout differ between them.
    mode: str | None = None

    def write(self, folder: Path) -> None:
        data = asdict(self)
        for entry in data["subkernels"].values():
            entry["status"] = entry["status"].value  # safe_dump writes plain strings only
        write_atomic(Path(folder) / MANIFEST, yaml.safe_dump(data, sort_keys=False))

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        path = Path(folder) / MANIFEST
        if not path.is_file():
            raise SolutionError(f"{folder}: no {MANIFEST}; is this a solution folder (a run's best/)?")
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        try:
            data["subkernels"] = {k: SubkernelEntry(**v) for k, v in (data.get("subkernels") or {}).items()}
            return cls(**data)
        except (TypeError, ValueError) as err:
            raise SolutionError(f"{path}: malformed manifest ({err})") from None

    @property
    def pytorch_subkernels(self) -> set[str]:
        return {n for n, e in self.subkernels.items() if e.origin == ORIGIN_PYTORCH}

    @property
    def coverage(self) -> "Coverage":
        pytorch = self.pytorch_subkernels
        return Coverage(names=list(self.subkernels), pytorch=[n for n in self.subkernels if n in pytorch])


@dataclass(frozen=True)
class Coverage:
    """How much of a solution runs in Triton, as a run's last line, its report and `eval` say it."""

    names: list[str]                  # every subkernel, in order
    pytorch: list[str]                # those that run their subproblem's PyTorch code instead

    @property
    def triton(self) -> int:
        return len(self.names) - len(self.pytorch)

    @property
    def complete(self) -> bool:
        return not self.pytorch

    def line(self) -> str:
        """Either 'all 3 subkernels in Triton' or 'partial: 2 of 3 in Triton (logcumsumexp runs PyTorch code)'."""
        if self.complete:
            return f"all {len(self.names)} subkernel{'s' if len(self.names) != 1 else ''} in Triton"
        verb = "runs" if len(self.pytorch) == 1 else "run"
        return (f"partial: {self.triton} of {len(self.names)} in Triton "
                f"({', '.join(self.pytorch)} {verb} PyTorch code)")


def amdahl_contribution(share: float | None, speedup: float | None) -> float | None:
    """How much faster end to end is because this subkernel runs `speedup` x its torch.compile: with it
    at a fraction `share` of the time, running torch.compile's version instead would take
    (1 - share) + share * speedup of the time."""
    if share is None or speedup is None:
        return None
    return (1.0 - share) + share * speedup


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pytorch_alternative(subproblem_source: str) -> str:
    """A subkernel file that runs the subproblem's own PyTorch code: the swap's alternative."""
    return (f"{_ALTERNATIVE_MARKER}: this subproblem runs its reference PyTorch code, not a Triton kernel.\n"
            f"{subproblem_source.rstrip()}\n\n\nclass ModelNew(Model):\n"
            '    """The reference module itself, standing in for a Triton subkernel."""\n')


def is_pytorch_alternative(source: str) -> bool:
    return source.startswith(_ALTERNATIVE_MARKER)


def copy_solution(source: Path, target: Path) -> None:
    """Replace `target` by the solution files of `source`, swapping folders so a reader never sees half."""
    source, target = Path(source), Path(target)
    staging = target.with_name(f".{target.name}.new")
    old = target.with_name(f".{target.name}.old")
    for leftover in (staging, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    staging.mkdir(parents=True)
    for name in (SOLUTION_FILE, PROBLEM_FILE, MANIFEST):
        if (source / name).is_file():
            shutil.copy2(source / name, staging / name)
    for sub in (KERNELS_DIR, PROBLEMS_DIR):
        if (source / sub).is_dir():
            shutil.copytree(source / sub, staging / sub)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    if old.exists():
        shutil.rmtree(old)


def recover_solution(target: Path) -> None:
    """After a crash between the two renames of copy_solution, put the last complete folder back."""
    target = Path(target)
    old = target.with_name(f".{target.name}.old")
    if not target.exists() and old.exists():
        old.rename(target)
