"""`mkevolve integrate MODEL.py RUN_DIR...`: put each captured region's best solution back into the model.

Selection is guarded: a region's replacement is used only when it is correct on the model's own inputs (the
region's real arguments in a full forward pass) and measured faster than the region at those shapes. Otherwise
the original stays and the report says why. Without a GPU nothing is timed (a Triton kernel run by the CPU
interpreter says nothing about its speed), so every time is "unknown" and no replacement is called faster;
`accept_untimed` uses the correct ones anyway, for trying integration where nothing can be timed.
"""

from __future__ import annotations

import ast
import json
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable

import torch
from rich.table import Table
from torch import nn

from mkevolve.codebase import SOLUTION_FILE
from mkevolve.config import TOLERANCE, ConfigError, build_config, config_from_args
from mkevolve.display import make_console
from mkevolve.fsutil import write_atomic
from mkevolve.problem import (ProblemError, call_inputs, clone_values, flatten_outputs, import_file,
                              seed_everything)
from mkevolve.pysource import parse_python
from mkevolve.run_state import RunState, StateError
from mkevolve.solution import Manifest, SolutionError
from mkevolve.verify.timing import time_forward

UNKNOWN_NO_GPU = "unknown (no GPU)"


class IntegrateError(ProblemError):
    """A run directory or model that cannot be integrated; one line naming the path."""


class Verdict(str, Enum):
    USED = "used"
    INCORRECT = "kept: incorrect"
    SLOWER = "kept: slower"
    SPEED_UNKNOWN = "kept: speed unknown"
    NOT_CALLED = "kept: region not called"
    NO_BEST = "skipped: no best"


@dataclass
class RegionResult:
    run_dir: str
    region: str
    verdict: Verdict
    reason: str = ""
    max_abs_error: float | None = None     # candidate vs region on the region's real arguments
    region_ms: float | None = None         # one call at the model's shapes, median, milliseconds (GPU only)
    replacement_ms: float | None = None
    share: float | None = None             # the region's fraction of the model's time
    share_from: str = ""                   # "capture.json" or "measured now"
    weights: str = ""                      # "the model's" (state dict copied) or "seeded rebuild"

    @property
    def speedup(self) -> float | None:
        if self.region_ms is None or not self.replacement_ms:
            return None
        return self.region_ms / self.replacement_ms


@dataclass
class EndToEnd:
    device: str
    eager_ms: float | None = None          # the original model, milliseconds per forward
    integrated_ms: float | None = None
    compiled_ms: float | None = None       # torch.compile of the original model
    compile_note: str = ""
    max_abs_error: float | None = None     # integrated vs original model output
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    amdahl: float | None = None            # 1 / ((1 - sum s) + sum s / r) over the used regions


@dataclass
class IntegrationReport:
    model: str
    regions: list[RegionResult]
    end_to_end: EndToEnd

    @property
    def used(self) -> list[RegionResult]:
        return [r for r in self.regions if r.verdict is Verdict.USED]

    def to_json(self) -> str:
        data = asdict(self)
        for row in data["regions"]:
            row["verdict"] = row["verdict"].value
        return json.dumps(data, indent=2) + "\n"


@dataclass
class Settings:
    accept_untimed: bool = False
    warmup: int = 3          # untimed calls first: allocator, cuDNN autotuning and Triton compilation settle
    runs: int = 20           # timed calls; times are medians over them
    tolerance: float = TOLERANCE


class Replacement(nn.Module):
    """Stands where a region was: calls the candidate; keeps the original for `restore`."""

    def __init__(self, original: nn.Module, candidate: nn.Module, run_dir: str):
        super().__init__()
        self.original = original
        self.candidate = candidate
        self.run_dir = run_dir

    def forward(self, *args, **kwargs):
        return self.candidate(*args, **kwargs)


# ---- a run directory -----------------------------------------------------------------------------------


@dataclass
class RunDir:
    path: Path
    problem: Path
    region: str
    seed: int                # the run's verifier seed: ModelNew is constructed after seeding with it
    best: Path | None        # None when the run left no best/
    capture_json: Path | None


def read_run_dir(path: str | Path) -> RunDir:
    path = Path(path)
    if not path.is_dir():
        raise IntegrateError(path, "no such run directory")
    problem = _problem_of(path)
    best = path / "best"
    capture_json = problem.parent / "capture.json"
    return RunDir(path=path, problem=problem, region=_region_of(problem), seed=_seed_of(path),
                  best=best if (best / SOLUTION_FILE).is_file() else None,
                  capture_json=capture_json if capture_json.is_file() else None)


def _problem_of(run_dir: Path) -> Path:
    """The run's problem file, from state.json or else best/manifest.yaml."""
    try:
        problem = RunState.load(run_dir).problem
    except StateError:
        try:
            problem = Manifest.read(run_dir / "best").problem
        except SolutionError:
            raise IntegrateError(run_dir, "neither state.json nor best/manifest.yaml: not a run directory") from None
    if not Path(problem).is_file():
        raise IntegrateError(run_dir, f"its problem file {problem} no longer exists")
    return Path(problem)


def _constant(problem: Path, name: str, kind: type) -> Any:
    """A module-level `NAME = literal` of a problem file capture wrote; read without running the file."""
    try:
        tree = parse_python(problem.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as err:
        raise IntegrateError(problem, f"cannot be read ({type(err).__name__})") from None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, kind)):
            return node.value.value
    raise IntegrateError(problem, f"has no {name} constant: not a problem written by `mkevolve capture`")


def _region_of(problem: Path) -> str:
    return _constant(problem, "REGION", str)


def model_inputs(run: RunDir) -> list:
    """The whole model's inputs as capture drew them."""
    from mkevolve.capture import captured_inputs, load_model_file

    model_file = load_model_file(_constant(run.problem, "MODEL_FILE", str))
    return captured_inputs(model_file, _constant(run.problem, "SEED", int), torch.device("cpu"))


def _seed_of(run_dir: Path) -> int:
    """The run's seed, read as the run reads its config.yaml (the default one without it)."""
    config = run_dir / "config.yaml"
    try:
        return build_config(config if config.is_file() else None).seed
    except ConfigError as err:
        raise IntegrateError(config, str(err)) from None


def _captured_share(run: RunDir) -> float | None:
    if run.capture_json is None:
        return None
    try:
        rows = json.loads(run.capture_json.read_text(encoding="utf-8")).get("rows", [])
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return next((float(r["share"]) for r in rows if r.get("path") == run.region and "share" in r), None)


# ---- the candidate -------------------------------------------------------------------------------------


class _CandidateFailed(Exception):
    """The candidate could not be built or called; the message says where."""


def build_candidate(run: RunDir, region: nn.Module, device: torch.device) -> tuple[nn.Module, str]:
    """ModelNew as the verifier builds it (seeded, the problem's init inputs), with the region's own weights
    when its state dict has the same names and shapes (the model may hold trained weights)."""
    try:
        module = import_file(run.best / SOLUTION_FILE, prefix="mkevolve_integrate")
        init = call_inputs(run.problem, import_file(run.problem, prefix="mkevolve_integrate_problem")
                           .get_init_inputs, "get_init_inputs")
        seed_everything(run.seed)
        candidate = module.ModelNew(*init)
    except (ProblemError, AttributeError) as err:
        raise _CandidateFailed(f"cannot load ModelNew: {err}") from None
    except Exception as err:
        raise _CandidateFailed(f"ModelNew(*get_init_inputs()) raised {type(err).__name__}: {err}") from None
    weights = "seeded rebuild"
    ours, theirs = region.state_dict(), candidate.state_dict()
    if ours and ours.keys() == theirs.keys() and all(ours[k].shape == theirs[k].shape for k in ours):
        candidate.load_state_dict(ours)
        weights = "the model's"
    candidate = candidate.to(device)
    return (candidate.train() if region.training else candidate.eval()), weights


# ---- the region's real arguments -----------------------------------------------------------------------


@dataclass
class _Call:
    args: list
    kwargs: dict
    calls: int = 0           # calls per forward pass


def record_calls(model: nn.Module, inputs: list, regions: list[str]) -> tuple[dict[str, _Call], Any]:
    """One forward pass with hooks: each region's first arguments (copied before later in-place ops) and its
    call count; and the model's output."""
    seen: dict[str, _Call] = {}

    def hook(path: str) -> Callable:
        def before(module, args, kwargs):
            if path not in seen:
                seen[path] = _Call(clone_values(list(args)),
                                   {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
            seen[path].calls += 1
        return before

    handles = [model.get_submodule(p).register_forward_pre_hook(hook(p), with_kwargs=True) for p in set(regions)]
    try:
        with torch.no_grad():
            output = model(*clone_values(inputs))
    finally:
        for handle in handles:
            handle.remove()
    return seen, output


def max_error(reference: Any, output: Any) -> tuple[float | None, str]:
    """(max abs error, why they cannot be compared or "") over the flattened outputs."""
    ref, out = flatten_outputs(reference), flatten_outputs(output)
    if len(ref) != len(out):
        return None, f"{len(out)} outputs, expected {len(ref)}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(ref, out)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if a != b:
                return None, f"output {i} is {b!r}, expected {a!r}"
            continue
        if a.shape != b.shape:
            return None, f"output {i} has shape {tuple(b.shape)}, expected {tuple(a.shape)}"
        if a.numel():
            worst = max(worst, float((a.double() - b.to(a.device).double()).abs().max()))
    return worst, ""


def _close(reference: Any, output: Any, tolerance: float) -> bool:
    return all(torch.allclose(b.to(a.device), a, atol=tolerance, rtol=tolerance, equal_nan=True)
               for a, b in zip(flatten_outputs(reference), flatten_outputs(output)) if isinstance(a, torch.Tensor))


# ---- timing --------------------------------------------------------------------------------------------


def cuda_ms(fn: Callable[[], Any], settings: Settings) -> float:
    """Median milliseconds of fn() over settings.runs calls, timed as the verifier times kernels (CUDA
    events, L2 flushed before each call), so a region and its replacement are measured alike."""
    return time_forward(fn, warmup=settings.warmup, runs=settings.runs).median_ms


def amdahl(used: list[RegionResult]) -> float | None:
    """The predicted end-to-end speedup, 1 / ((1 - sum s) + sum s / r); None when an s or r is not known."""
    if any(r.share is None or r.speedup is None for r in used):
        return None
    rest = 1.0 - sum(r.share for r in used)
    return 1.0 / (rest + sum(r.share / r.speedup for r in used))


# ---- guarded selection ---------------------------------------------------------------------------------


def _device_of(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


def judge(run: RunDir, model: nn.Module, call: _Call | None, timed: bool, settings: Settings,
          model_ms: float | None) -> tuple[RegionResult, nn.Module | None]:
    """One region's verdict, and the candidate to put in when it is used."""
    result = RegionResult(run_dir=str(run.path), region=run.region, verdict=Verdict.NO_BEST)
    result.share = _captured_share(run)
    result.share_from = "capture.json" if result.share is not None else ""
    if run.best is None:
        result.reason = f"{run.path / 'best' / SOLUTION_FILE} does not exist: the run accepted no solution yet"
        return result, None
    if call is None:
        result.verdict, result.reason = Verdict.NOT_CALLED, "the model's forward did not call it on these inputs"
        return result, None
    region = model.get_submodule(run.region)
    try:
        candidate, result.weights = build_candidate(run, region, _device_of(model))
        with torch.no_grad():
            reference = region(*clone_values(call.args), **call.kwargs)
            output = candidate(*clone_values(call.args), **call.kwargs)
    except _CandidateFailed as err:
        result.verdict, result.reason = Verdict.INCORRECT, str(err)
        return result, None
    except Exception as err:
        result.verdict, result.reason = Verdict.INCORRECT, f"ModelNew.forward raised {type(err).__name__}: {err}"
        return result, None
    result.max_abs_error, mismatch = max_error(reference, output)
    if mismatch or not _close(reference, output, settings.tolerance):
        result.verdict = Verdict.INCORRECT
        result.reason = mismatch or (f"max abs error {result.max_abs_error:.3g} over tolerance "
                                     f"atol=rtol={settings.tolerance:g}")
        return result, None
    return _by_speed(result, region, candidate, call, timed, settings, model_ms)


def _by_speed(result: RegionResult, region: nn.Module, candidate: nn.Module, call: _Call, timed: bool,
              settings: Settings, model_ms: float | None) -> tuple[RegionResult, nn.Module | None]:
    if not timed:
        if settings.accept_untimed:
            result.verdict, result.reason = Verdict.USED, "correct; speed not checked (--accept-untimed, no GPU)"
            return result, candidate
        result.verdict = Verdict.SPEED_UNKNOWN
        result.reason = "correct, but no GPU to time it on; --accept-untimed uses it without a speed check"
        return result, None
    result.region_ms = cuda_ms(lambda: region(*call.args, **call.kwargs), settings)
    result.replacement_ms = cuda_ms(lambda: candidate(*call.args, **call.kwargs), settings)
    if result.share is None and model_ms:
        # Every call of the region costs about what its first one did.
        result.share, result.share_from = min(1.0, result.region_ms * call.calls / model_ms), "measured now"
    if result.replacement_ms >= result.region_ms:
        result.verdict = Verdict.SLOWER
        result.reason = f"{result.replacement_ms:.4f} ms vs the region's {result.region_ms:.4f} ms"
        return result, None
    result.verdict, result.reason = Verdict.USED, f"correct and {result.speedup:.2f}x faster"
    return result, candidate


def replace(model: nn.Module, path: str, replacement: nn.Module) -> None:
    """Put `replacement` at `path`, so model.get_submodule(path) returns it."""
    parent_path, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent_path), name, replacement)


def _compiled_ms(model: nn.Module, inputs: list, settings: Settings) -> tuple[float | None, str]:
    try:
        compiled = torch.compile(model)
        return cuda_ms(lambda: compiled(*inputs), settings), ""
    except Exception as err:  # a model Dynamo/Inductor cannot compile: say so, invent nothing
        return None, f"torch.compile failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def integrate(model: nn.Module, solutions: list[str | Path], inputs: list | None = None,
              settings: Settings | None = None, model_name: str = "") -> IntegrationReport:
    """Replace, in place, each run's region of `model` by the run's best solution where it is correct on
    `inputs` and faster; return the report. Regions that stay are untouched. `inputs` defaults to the
    captured model file's get_inputs(), drawn as capture drew them."""
    settings = settings or Settings()
    runs = [read_run_dir(path) for path in solutions]
    if not runs:
        raise IntegrateError(".", "no run directories given")
    device = _device_of(model)
    inputs = [v.to(device) if isinstance(v, torch.Tensor) else v
              for v in (model_inputs(runs[0]) if inputs is None else inputs)]
    for run in runs:
        try:
            model.get_submodule(run.region)
        except AttributeError:
            raise IntegrateError(run.path, f"region {run.region!r} is not a submodule of the model") from None
    timed = device.type == "cuda"
    calls, original_output = record_calls(model, inputs, [r.region for r in runs])
    e2e = EndToEnd(device=str(device))
    if timed:
        e2e.eager_ms = cuda_ms(lambda: model(*inputs), settings)
        e2e.compiled_ms, e2e.compile_note = _compiled_ms(model, inputs, settings)
    else:
        e2e.compile_note = UNKNOWN_NO_GPU
    results = []
    for run in runs:
        result, candidate = judge(run, model, calls.get(run.region), timed, settings, e2e.eager_ms)
        if candidate is not None:
            replace(model, run.region, Replacement(model.get_submodule(run.region), candidate, str(run.path)))
        results.append(result)
    _finish(e2e, model, inputs, original_output, results, timed, settings)
    return IntegrationReport(model=model_name or type(model).__name__, regions=results, end_to_end=e2e)


def _finish(e2e: EndToEnd, model: nn.Module, inputs: list, original_output: Any, results: list[RegionResult],
            timed: bool, settings: Settings) -> None:
    """The integrated model's error against the original, its time, and the speedups measured and predicted."""
    with torch.no_grad():
        e2e.max_abs_error, _ = max_error(original_output, model(*clone_values(inputs)))
    used = [r for r in results if r.verdict is Verdict.USED]
    e2e.amdahl = amdahl(used) if used else 1.0  # nothing replaced: the model is the original
    if not timed:
        return
    e2e.integrated_ms = cuda_ms(lambda: model(*inputs), settings)
    e2e.speedup_vs_eager = e2e.eager_ms / e2e.integrated_ms
    if e2e.compiled_ms is not None:
        e2e.speedup_vs_compile = e2e.compiled_ms / e2e.integrated_ms


# ---- the command ---------------------------------------------------------------------------------------


def _fmt(value: float | None, unknown: str = "unknown", digits: int = 4) -> str:
    return unknown if value is None else f"{value:.{digits}f}"


def _table(report: IntegrationReport) -> Table:
    table = Table(title=f"integrate into {Path(report.model).name} on {report.end_to_end.device}")
    unknown = UNKNOWN_NO_GPU if report.end_to_end.device == "cpu" else "unknown"
    for name in ("run dir", "region", "verdict", "max abs err", "region ms", "replacement ms", "share", "reason"):
        table.add_column(name)
    for r in report.regions:
        table.add_row(Path(r.run_dir).name, r.region, r.verdict.value,
                      "" if r.max_abs_error is None else f"{r.max_abs_error:.3g}",
                      _fmt(r.region_ms, unknown), _fmt(r.replacement_ms, unknown),
                      "unknown" if r.share is None else f"{r.share:.1%}", r.reason)
    return table


def _summary(e2e: EndToEnd) -> list[str]:
    unknown = UNKNOWN_NO_GPU if e2e.device == "cpu" else "unknown"
    ms = lambda v: unknown if v is None else f"{v:.4f} ms"   # noqa: E731
    x = lambda v: unknown if v is None else f"{v:.2f}x"      # noqa: E731
    compiled = ms(e2e.compiled_ms) if not e2e.compile_note or e2e.compile_note == UNKNOWN_NO_GPU \
        else f"unknown ({e2e.compile_note})"
    return [f"eager original {ms(e2e.eager_ms)}, integrated {ms(e2e.integrated_ms)}, torch.compile {compiled}",
            f"end to end: {x(e2e.speedup_vs_eager)} vs eager, {x(e2e.speedup_vs_compile)} vs torch.compile; "
            f"Amdahl prediction {x(e2e.amdahl)}",
            f"integrated vs original output: max abs error {_fmt(e2e.max_abs_error, digits=3)}"]


def integrate_command(args) -> int:
    """`mkevolve integrate MODEL.py RUN_DIR...`: 0 when the report is written, 2 on bad input."""
    from mkevolve.capture import load_model_file

    config = config_from_args(args)
    if args.runs < 1 or args.warmup < 0:
        raise ConfigError("--runs must be at least 1, --warmup at least 0")
    settings = Settings(accept_untimed=args.accept_untimed, warmup=args.warmup, runs=args.runs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model_file = load_model_file(args.model_file)
    model = model_file.build(config.seed).to(device)  # as capture built it: the same seed, the same weights
    model = model.eval() if config.eval_mode else model
    report = integrate(model, args.run_dirs, model_file.inputs(config.seed + 1, device), settings,
                       model_name=str(model_file.path))
    target = Path(args.output) if args.output else (Path(config.out) / model_file.path.stem / "integrate"
                                                   / "integrate.json")
    write_atomic(target, report.to_json())
    console = make_console()
    console.print(_table(report))
    for line in _summary(report.end_to_end):
        console.print(line)
    console.print(f"{len(report.used)} of {len(report.regions)} region(s) replaced; wrote {target}")
    return 0

