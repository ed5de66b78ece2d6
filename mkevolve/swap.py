"""`mkevolve swap`: replace one subkernel of a solution folder, after it passes locally and end to end."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

from mkevolve.codebase import KERNELS_DIR
from mkevolve.config import ConfigError, build_config
from mkevolve.evaluate import (
    SolutionFolder,
    describe_speedup,
    measure_runtimes,
    open_solution,
    resolve_problem,
    solution_config,
)
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.problem import ProblemError
from mkevolve.run_layout import ITERATIONS
from mkevolve.search.beam import ID_PREFIX, CandidateRecord
from mkevolve.solution import (
    ORIGIN_PYTORCH,
    EntryStatus,
    Manifest,
    SubkernelEntry,
    copy_solution,
    mode_name,
    pytorch_alternative,
    sha256_of,
)
from mkevolve.verify.result import EvalResult

BACKUPS_DIR = "backups"
ORIGIN_HAND = "hand"
_CANDIDATE_ID = re.compile(rf"^{ID_PREFIX}\d+$")


class ReplacementKind(str, Enum):
    FILE = "file"
    PYTORCH = "pytorch"
    CANDIDATE = "candidate"


@dataclass(frozen=True)
class Replacement:
    """The new source of a subkernel, where it came from, and how the manifest records it."""

    kind: ReplacementKind
    source: str
    origin: str
    candidate: str | None
    label: str


@dataclass
class SwapOutcome:
    subkernel: str
    replacement: Replacement
    accepted: bool
    reason: str = ""                    # why it was refused
    local: EvalResult | None = None     # None for PyTorch code, which is not checked as a kernel
    before: EvalResult | None = None    # end to end, the folder as it was
    after: EvalResult | None = None     # end to end, with the replacement
    backup: Path | None = None
    on_gpu: bool = False                # whether speedups could be measured at all


# ---- what replaces the subkernel ----------------------------------------------------------------------


def require_subkernel(solution: SolutionFolder, name: str) -> None:
    if name not in solution.names:
        raise ProblemError(solution.path, f"no subkernel '{name}' (have: {', '.join(solution.names)})")


def _run_dir_of(solution: SolutionFolder) -> Path:
    run_dir = solution.path.resolve().parent
    if not (run_dir / ITERATIONS).is_dir():
        raise ProblemError(solution.path, "a candidate id needs the run's candidates, but this folder is not "
                                          "inside a run directory (no ../iterations/)")
    return run_dir


def _problem_hash(path: Path) -> str | None:
    """The subproblem hash in the verdict record saved next to a candidate; None when there is no record."""
    if not path.is_file():
        return None
    try:
        return CandidateRecord.read(path).problem_sha256
    except json.JSONDecodeError as err:
        raise ProblemError(path, f"not a readable candidate record ({err.msg} at line {err.lineno})") from None
    except (KeyError, TypeError, ValueError) as err:
        raise ProblemError(path, f"not a readable candidate record ({type(err).__name__}: {err})") from None


def find_candidate(solution: SolutionFolder, name: str, candidate_id: str) -> Replacement:
    """A saved candidate of the run that wrote this solution, written for the same subproblem source."""
    run_dir = _run_dir_of(solution)
    subproblem_hash = sha256_of(solution.problem_file(name).read_text(encoding="utf-8"))
    found = sorted(run_dir.glob(f"iterations/iter_*/candidates/{name}/{candidate_id}.py"), reverse=True)
    for path in found:
        if _problem_hash(path.with_suffix(".json")) == subproblem_hash:
            try:
                model = build_config(run_dir / "config.yaml").model
            except ConfigError:
                model = "unknown"
            iteration = path.parts[-4]
            return Replacement(ReplacementKind.CANDIDATE, path.read_text(encoding="utf-8"), model, candidate_id,
                               f"candidate {candidate_id} ({iteration}, written by {model})")
    if found:
        raise ProblemError(found[0], f"candidate {candidate_id} was written for another version of subproblem "
                                     f"{name}, not the one in {solution.path}")
    raise ProblemError(run_dir, f"no candidate {candidate_id} of subproblem {name} under iterations/*/candidates/")


def resolve_replacement(solution: SolutionFolder, name: str, spec: str) -> Replacement:
    """`spec` as the command line gives it: a file, 'pytorch', or a candidate id of the run."""
    if spec == ORIGIN_PYTORCH:
        source = pytorch_alternative(solution.problem_file(name).read_text(encoding="utf-8"))
        return Replacement(ReplacementKind.PYTORCH, source, ORIGIN_PYTORCH, None,
                           f"the PyTorch code of subproblem {name}")
    path = Path(spec)
    if path.is_file():
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ProblemError(path, "not UTF-8 text") from None
        return Replacement(ReplacementKind.FILE, source, ORIGIN_HAND, None, f"the file {path}")
    if _CANDIDATE_ID.match(spec):
        return find_candidate(solution, name, spec)
    raise ProblemError(spec, f"no such file; expected a kernel file, '{ORIGIN_PYTORCH}', or a candidate id "
                             f"such as {ID_PREFIX}0003")


# ---- the swap -----------------------------------------------------------------------------------------


def _check_trial(trial: SolutionFolder, name: str, replacement: Replacement, problem_path: Path,
                 verifier, outcome: SwapOutcome) -> None:
    """Fill in the trial's verdicts; refuse the swap (outcome.reason) at the first failure."""
    if replacement.kind is not ReplacementKind.PYTORCH:
        outcome.local = verifier.check_kernel(trial.problem_file(name), trial.kernel_file(name), timed=True)
        if not outcome.local.passed:
            outcome.reason = f"it fails its subproblem: {outcome.local.summary()}"
            return
    outcome.after = verifier.check_composite(problem_path, trial.path, pytorch=trial.pytorch, timed=True)
    if not outcome.after.passed:
        outcome.reason = f"it passes its subproblem but the solution then fails end to end: {outcome.after.summary()}"


def _backup(solution: SolutionFolder, name: str) -> Path | None:
    current = solution.kernel_file(name)
    if not current.is_file():
        return None
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    target, n = solution.path / BACKUPS_DIR / f"{name}-{stamp}.py", 1
    while target.exists():
        n += 1
        target = solution.path / BACKUPS_DIR / f"{name}-{stamp}-{n}.py"
    target.parent.mkdir(exist_ok=True)
    shutil.copy2(current, target)
    return target


def _updated_manifest(solution: SolutionFolder, name: str, outcome: SwapOutcome, problem_path: Path,
                      verifier) -> Manifest:
    manifest = solution.manifest or Manifest(problem=str(problem_path.resolve()), device=verifier.device_name)
    local, replacement = outcome.local, outcome.replacement
    manifest.subkernels[name] = SubkernelEntry(
        origin=replacement.origin, candidate=replacement.candidate,
        status=EntryStatus.OK,  # written only once the trial passed, locally and end to end
        speedup=local.speedup if local else None, precision=local.precision if local else None,
        error_vs_fp64=local.error_vs_fp64 if local else None,
        eager_error_vs_fp64=local.eager_error_vs_fp64 if local else None, sha256=sha256_of(replacement.source))
    manifest.status, manifest.speedup = outcome.after.status.value, outcome.after.speedup
    manifest.error_vs_fp64 = outcome.after.error_vs_fp64
    manifest.eager_error_vs_fp64 = outcome.after.eager_error_vs_fp64
    manifest.mode = mode_name(verifier.config.eval_mode)     # the end-to-end check that now stands ran in it
    runtimes = measure_runtimes(verifier, problem_path, solution.path) if verifier.on_gpu else None
    if runtimes is not None:
        total = sum(runtimes.values())
        for entry_name, entry in manifest.subkernels.items():
            entry.runtime_ms = runtimes.get(entry_name)
            entry.runtime_share = entry.runtime_ms / total if total and entry.runtime_ms is not None else None
    return manifest


def swap_subkernel(folder: str | Path, name: str, replacement: Replacement, problem_path: str | Path,
                   verifier) -> SwapOutcome:
    """Verify `replacement` in a copy of the folder (locally, then end to end); only if both pass, back up
    the current file, write the new one and update manifest.yaml. A refused swap changes nothing."""
    solution = open_solution(folder)
    require_subkernel(solution, name)
    problem_path = Path(problem_path)
    outcome = SwapOutcome(subkernel=name, replacement=replacement, accepted=False, on_gpu=verifier.on_gpu)
    with tempfile.TemporaryDirectory(prefix="mkevolve-swap-") as scratch:
        trial_path = Path(scratch) / "trial"
        copy_solution(solution.path, trial_path)
        write_atomic(trial_path / solution.kernel_file(name).relative_to(solution.path), replacement.source)
        _check_trial(open_solution(trial_path), name, replacement, problem_path, verifier, outcome)
    if outcome.reason:
        return outcome
    outcome.before = verifier.check_composite(problem_path, solution.path, pytorch=solution.pytorch, timed=True)
    outcome.backup = _backup(solution, name)
    write_atomic(solution.kernel_file(name), replacement.source)
    _updated_manifest(solution, name, outcome, problem_path, verifier).write(solution.path)
    outcome.accepted = True
    return outcome


# ---- the command ---------------------------------------------------------------------------------------


def _end_to_end(result: EvalResult, on_gpu: bool) -> str:
    return f"{result.status.value}, speedup {describe_speedup(result.speedup, on_gpu)}"


def _change(before: EvalResult, after: EvalResult, on_gpu: bool) -> str:
    line = f"end to end: {_end_to_end(before, on_gpu)} -> {_end_to_end(after, on_gpu)}"
    if before.speedup and after.speedup:
        line += f" ({after.speedup / before.speedup:.3f}x the previous speed)"
    return line


def print_outcome(outcome: SwapOutcome, folder: Path) -> None:
    name, replacement = outcome.subkernel, outcome.replacement
    if not outcome.accepted:
        print(f"swap of {name} refused: {replacement.label}: {outcome.reason}")
        print(f"nothing changed in {folder}")
        return
    print(f"swapped {name} for {replacement.label}")
    if outcome.local is None:
        print("  locally: PyTorch code, not a kernel (the end-to-end check allows PyTorch in this subkernel only)")
    else:
        print(f"  locally: {outcome.local.summary()}")
    print(f"  {_change(outcome.before, outcome.after, outcome.on_gpu)}")
    kept = f"; the previous file is kept as {outcome.backup}" if outcome.backup else ""
    print(f"  wrote {folder / KERNELS_DIR / (name + '.py')} and manifest.yaml{kept}")


def swap_command(args) -> int:
    """`mkevolve swap SOLUTION_DIR SUBKERNEL (FILE | pytorch | CANDIDATE_ID)`: 0 swapped, 1 refused, 2 bad input."""
    from mkevolve.verify.verifier import Verifier

    config, solution = solution_config(args)
    require_subkernel(solution, args.subkernel)
    problem_path = resolve_problem(solution, args.problem)
    replacement = resolve_replacement(solution, args.subkernel, args.replacement)
    with Verifier(config) as verifier:
        outcome = swap_subkernel(solution.path, args.subkernel, replacement, problem_path, verifier)
    print_outcome(outcome, solution.path)
    return ExitCode.OK if outcome.accepted else ExitCode.FAILED
