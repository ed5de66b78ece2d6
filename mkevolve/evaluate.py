"""`mkevolve eval`: re-verify a solution folder, each subkernel on its own subproblem and then end to end."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

from mkevolve.codebase import (
    KERNELS_DIR,
    PROBLEM_FILE,
    PROBLEMS_DIR,
    SOLUTION_FILE,
    Decomposition,
)
from mkevolve.config import RunConfig, config_from_args
from mkevolve.exit_codes import ExitCode
from mkevolve.problem import ProblemError, read_source
from mkevolve.report import fmt_accuracy
from mkevolve.solution import (
    MANIFEST,
    Coverage,
    Manifest,
    SolutionError,
    amdahl_contribution,
    is_pytorch_alternative,
    mode_name,
    sha256_of,
)
from mkevolve.verify.profile import SubkernelProfile
from mkevolve.verify.result import EvalResult, Status
from mkevolve.workers.pool import Job

UNKNOWN_NO_GPU = "unknown (no GPU)"


class SubkernelKind(str, Enum):
    TRITON = "triton"      # a kernel, checked against its subproblem like any candidate
    PYTORCH = "pytorch"    # the subproblem's own PyTorch code (a swap): not a kernel, not checked locally
    MISSING = "missing"    # the folder has the subproblem but no implementation file


@dataclass
class SubkernelEvaluation:
    """One subkernel: its local verdict, its speed against its own torch.compile, its part of the whole."""

    name: str
    kind: SubkernelKind
    status: str                        # the local verdict ("ok", "incorrect", ...), or the kind when unchecked
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    precision: str | None = None
    error_vs_fp64: float | None = None          # against its subproblem run in fp64
    eager_error_vs_fp64: float | None = None    # eager fp32's on the same inputs
    speedup: float | None = None       # vs torch.compile of its subproblem
    runtime_ms: float | None = None    # inside one end-to-end forward
    share: float | None = None         # of the subkernels' end-to-end time
    contribution: float | None = None  # end-to-end speedup this subkernel's own speedup accounts for (Amdahl)
    origin: str | None = None          # from the manifest
    edited: bool = False               # the file differs from the one the manifest recorded

    @property
    def passed_locally(self) -> bool:
        return self.kind is SubkernelKind.PYTORCH or self.status == Status.OK.value


@dataclass
class SolutionEvaluation:
    folder: str
    problem: str
    device: str
    subkernels: list[SubkernelEvaluation]
    end_to_end: EvalResult
    diagnosis: str
    mode: str = "train"                # the module mode it was checked in (solution.mode_name)

    @property
    def passed(self) -> bool:
        return self.end_to_end.passed

    @property
    def on_gpu(self) -> bool:
        return self.device not in ("cpu", "unknown")

    @property
    def failing_locally(self) -> list[str]:
        return [s.name for s in self.subkernels if not s.passed_locally]

    @property
    def coverage(self) -> Coverage:
        """From the files themselves (a person may have swapped one by hand), not from the manifest."""
        return Coverage(names=[s.name for s in self.subkernels],
                        pytorch=[s.name for s in self.subkernels if s.kind is SubkernelKind.PYTORCH])

    def subkernel(self, name: str) -> SubkernelEvaluation:
        return next(s for s in self.subkernels if s.name == name)

    def to_dict(self) -> dict:
        return {"folder": self.folder, "problem": self.problem, "device": self.device, "mode": self.mode,
                "passed": self.passed,
                "diagnosis": self.diagnosis, "failing_locally": self.failing_locally,
                "coverage": self.coverage.line(), "pytorch": self.coverage.pytorch,
                "end_to_end": self.end_to_end.to_dict(),
                "subkernels": [{**asdict(s), "kind": s.kind.value, "passed_locally": s.passed_locally}
                               for s in self.subkernels]}


# ---- the folder ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SolutionFolder:
    """A solution folder on disk: its subproblem names in top-level order, and its manifest if it has one."""

    path: Path
    names: list[str]
    manifest: Manifest | None

    def problem_file(self, name: str) -> Path:
        return self.path / PROBLEMS_DIR / f"{name}.py"

    def kernel_file(self, name: str) -> Path:
        return self.path / KERNELS_DIR / f"{name}.py"

    def kind(self, name: str) -> SubkernelKind:
        path = self.kernel_file(name)
        if not path.is_file():
            return SubkernelKind.MISSING
        return SubkernelKind.PYTORCH if is_pytorch_alternative(path.read_text(encoding="utf-8")) \
            else SubkernelKind.TRITON

    @property
    def pytorch(self) -> frozenset[str]:
        """Subkernels whose file is the subproblem's PyTorch code: what the swap writes, or a person copies in."""
        return frozenset(n for n in self.names if self.kind(n) is SubkernelKind.PYTORCH)


def open_solution(folder: str | Path) -> SolutionFolder:
    """The folder as a solution, or a ProblemError naming what is missing."""
    path = Path(folder)
    if not path.is_dir():
        raise ProblemError(path, "no such folder (expected a solution folder such as a run's best/)")
    for required in (SOLUTION_FILE, PROBLEMS_DIR):
        if not (path / required).exists():
            raise ProblemError(path, f"no {required}; is this a solution folder (a run's best/)?")
    try:
        manifest = Manifest.read(path)
    except SolutionError as err:
        if (path / MANIFEST).exists():
            raise ProblemError(path / MANIFEST, str(err).split(": ", 1)[-1]) from None
        manifest = None
    if (path / PROBLEM_FILE).is_file():
        names = Decomposition.read(path).names
    else:
        names = sorted(p.stem for p in (path / PROBLEMS_DIR).glob("*.py"))
    if not names:
        raise ProblemError(path, f"{PROBLEMS_DIR}/ holds no subproblem files")
    return SolutionFolder(path=path, names=names, manifest=manifest)


def resolve_problem(solution: SolutionFolder, override: str | None) -> Path:
    """The original problem: `override` (--problem) when given, else the manifest's."""
    if override:
        read_source(override)
        return Path(override)
    if solution.manifest is None:
        raise ProblemError(solution.path, f"no {MANIFEST} to name the problem; give it with --problem FILE")
    recorded = Path(solution.manifest.problem)
    if not recorded.is_file():
        raise ProblemError(solution.path / MANIFEST, f"its problem {recorded} does not exist (was it moved?); "
                           "give it with --problem FILE")
    return recorded


# ---- evaluation ----------------------------------------------------------------------------------------


def describe_speedup(value: float | None, on_gpu: bool) -> str:
    if value is None:
        return "unknown" if on_gpu else UNKNOWN_NO_GPU
    return f"{value:.3f}x"


def measure_runtimes(verifier, problem_path: Path, folder: Path) -> dict[str, float] | None:
    """Each subkernel's median milliseconds inside one end-to-end forward; None without a GPU."""
    config = verifier.config
    job = Job("mkevolve.verify.profile:profile_subkernels",
              {"problem_path": str(Path(problem_path).resolve()),
               "solution_path": str((Path(folder) / SOLUTION_FILE).resolve()),
               "seed": config.seed, "eval_mode": config.eval_mode,
               "timeout_s": config.timeout}, timeout=2 * config.timeout + 60)
    outcome = verifier.run_jobs([job])[0]
    if not outcome.ok or not isinstance(outcome.value, SubkernelProfile):
        return None
    return outcome.value.runtime_ms


def _local_results(solution: SolutionFolder, verifier) -> dict[str, EvalResult]:
    triton = [n for n in solution.names if solution.kind(n) is SubkernelKind.TRITON]
    pairs = [(solution.problem_file(n), solution.kernel_file(n)) for n in triton]
    return dict(zip(triton, verifier.check_kernels(pairs, timed=True), strict=True))


def _subkernel(solution: SolutionFolder, name: str, result: EvalResult | None) -> SubkernelEvaluation:
    kind = solution.kind(name)
    entry = solution.manifest.subkernels.get(name) if solution.manifest else None
    edited = False
    if entry is not None and kind is not SubkernelKind.MISSING:
        edited = entry.sha256 != sha256_of(solution.kernel_file(name).read_text(encoding="utf-8"))
    row = SubkernelEvaluation(name=name, kind=kind, status=kind.value, origin=entry.origin if entry else None,
                              edited=edited)
    if kind is SubkernelKind.MISSING:
        row.reason = f"no {KERNELS_DIR}/{name}.py"
    if kind is SubkernelKind.PYTORCH and entry is not None and entry.reason:
        row.reason = entry.reason  # why the run (or a swap) put PyTorch code there
    if result is not None:
        row.status, row.reason, row.speedup = result.status.value, result.reason, result.speedup
        row.max_abs_err, row.max_rel_err, row.precision = result.max_abs_err, result.max_rel_err, result.precision
        row.error_vs_fp64, row.eager_error_vs_fp64 = result.error_vs_fp64, result.eager_error_vs_fp64
    return row


def diagnose(subkernels: list[SubkernelEvaluation], end_to_end: EvalResult) -> str:
    """One sentence on where a failure lies: which subkernels fail locally, or the composition."""
    if end_to_end.passed:
        return "end to end passes"
    failing = [s.name for s in subkernels if not s.passed_locally]
    why = f"{end_to_end.status.value}: {end_to_end.reason}" if end_to_end.reason else end_to_end.status.value
    if failing:
        return f"end to end fails ({why}); failing locally: {', '.join(failing)}"
    return (f"every subkernel passes locally, but end to end fails ({why}): the composition "
            f"({SOLUTION_FILE}, or a subkernel called with shapes its subproblem does not cover) is at fault")


def evaluate_solution(folder: str | Path, problem_path: str | Path, verifier) -> SolutionEvaluation:
    """Every subkernel against its own subproblem, then the whole folder against the problem; on a GPU
    also each subkernel's share of the end-to-end time and its Amdahl contribution."""
    solution = open_solution(folder)
    problem_path = Path(problem_path)
    local = _local_results(solution, verifier)
    rows = [_subkernel(solution, name, local.get(name)) for name in solution.names]
    end_to_end = verifier.check_composite(problem_path, solution.path, pytorch=solution.pytorch, timed=True)
    if end_to_end.passed and verifier.on_gpu:
        runtimes = measure_runtimes(verifier, problem_path, solution.path) or {}
        total = sum(runtimes.values())
        for row in rows:
            row.runtime_ms = runtimes.get(row.name)
            row.share = row.runtime_ms / total if total and row.runtime_ms is not None else None
            row.contribution = amdahl_contribution(row.share, row.speedup)
    return SolutionEvaluation(folder=str(solution.path), problem=str(problem_path), device=verifier.device_name,
                              subkernels=rows, end_to_end=end_to_end, diagnosis=diagnose(rows, end_to_end),
                              mode=mode_name(verifier.config.eval_mode))


# ---- the command ---------------------------------------------------------------------------------------


def solution_config(args) -> tuple[RunConfig, SolutionFolder]:
    """A command's config and its solution folder. The module mode is the one the folder's manifest records,
    unless --eval/--no-eval or --config says otherwise: a solution is checked in the mode it was verified in
    (a run with --eval leaves batch-norm kernels that read the running statistics)."""
    config = config_from_args(args)
    solution = open_solution(args.solution_dir)
    recorded = solution.manifest.mode if solution.manifest else None
    if recorded in (mode_name(False), mode_name(True)) and getattr(args, "eval_mode", None) is None \
            and getattr(args, "config", None) is None:
        config = replace(config, eval_mode=recorded == mode_name(True))
    return config, solution


def eval_command(args) -> int:
    """`mkevolve eval SOLUTION_DIR`: 0 when end to end passes, 1 when it fails, 2 for a bad folder or problem."""
    from mkevolve.verify.verifier import Verifier

    config, solution = solution_config(args)
    problem_path = resolve_problem(solution, args.problem)
    with Verifier(config) as verifier:
        evaluation = evaluate_solution(solution.path, problem_path, verifier)
    if args.json:
        print(json.dumps(evaluation.to_dict(), indent=1))
    else:
        print_evaluation(evaluation)
    return ExitCode.OK if evaluation.passed else ExitCode.FAILED


def _row_cells(row: SubkernelEvaluation) -> list[str]:
    colour = "green" if row.passed_locally else "red"
    error = "-" if row.max_abs_err is None else f"{row.max_abs_err:.2g}"
    if row.kind is SubkernelKind.PYTORCH:
        speed = "n/a (PyTorch)"
    else:
        speed = "unknown" if row.speedup is None else f"{row.speedup:.3f}x"
    share = "unknown" if row.share is None else f"{100 * row.share:.1f}%"
    contribution = "unknown" if row.contribution is None else f"{row.contribution:.3f}x"
    return [row.name, row.kind.value, f"[{colour}]{row.status}[/{colour}]", error,
            fmt_accuracy(row.error_vs_fp64, row.eager_error_vs_fp64), speed, share, contribution]


def _notes(row: SubkernelEvaluation) -> list[str]:
    notes = [row.reason if row.passed_locally else f"{row.status}: {row.reason}"] if row.reason else []
    if row.edited:
        notes.append("edited since the manifest was written")
    if row.kind is SubkernelKind.PYTORCH:
        notes.append("runs its subproblem's PyTorch code (not checked locally as a kernel)")
    return notes


def print_evaluation(evaluation: SolutionEvaluation) -> None:
    from mkevolve.display import make_console
    from rich.markup import escape
    from rich.table import Table

    console = make_console()
    console.print(f"solution: {evaluation.folder}\nproblem:  {evaluation.problem}\ndevice:   {evaluation.device}\n"
                  f"mode:     {evaluation.mode}")
    table = Table(title="subkernels", caption="max err: against eager fp32; vs fp64: the largest error against "
                  "its subproblem run in fp64, eager fp32's beside it; speedup: vs torch.compile of its subproblem; "
                  "share: of the end-to-end time; Amdahl: the end-to-end speedup its own speedup accounts for")
    table.add_column("subkernel", no_wrap=True)
    for column in ("kind", "verdict", "max err", "vs fp64", "speedup", "share", "Amdahl"):
        table.add_column(column)
    for row in evaluation.subkernels:
        table.add_row(*_row_cells(row))
    console.print(table)
    # Whole lines (soft wrap): reasons and the diagnosis are what a person searches and copies.
    for row in evaluation.subkernels:
        for note in _notes(row):
            console.print(f"  {row.name}: {note}", markup=False, highlight=False, soft_wrap=True)
    e2e = evaluation.end_to_end
    colour = "green" if e2e.passed else "red"
    speedup = describe_speedup(e2e.speedup, evaluation.on_gpu)
    console.print(f"end to end: [{colour}]{e2e.status.value}[/{colour}], speedup {speedup}")
    console.print(evaluation.diagnosis, markup=False, highlight=False, soft_wrap=True)
    if not evaluation.on_gpu:
        console.print("speedup, share and Amdahl are unknown: there is no GPU, so the kernels ran under the "
                      "Triton interpreter for correctness only", soft_wrap=True)
    style = "green" if evaluation.coverage.complete else "bold yellow"
    console.print(f"[{style}]{escape(evaluation.coverage.line())}[/{style}]", soft_wrap=True)
