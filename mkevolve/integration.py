"""`mkevolve integrate MODEL.py RUN_DIR...`: put each captured region's best solution back into the model.

Selection is guarded: a region's replacement is used only when it is correct on the model's own inputs (the
region's real arguments in a full forward pass) and measured faster than the region at those shapes. Otherwise
the original stays and the report says why. Without a GPU nothing is timed (a Triton kernel run by the CPU
interpreter says nothing about its speed), so every time is "unknown" and no replacement is called faster;
`accept_untimed` uses the correct ones anyway, for trying integration where nothing can be timed.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable

import torch
from rich.table import Table
from torch import nn

from mkevolve.codebase import SOLUTION_FILE
from mkevolve.config import TOLERANCE, ConfigError, build_config, config_from_args
from mkevolve.display import make_console
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.problem import (ProblemError, call_inputs, clone_values, flatten_outputs, import_file,
                              seed_everything)
from mkevolve.pysource import parse_python
from mkevolve.run_layout import BEST
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
    rounds: int = 5          # end to end: alternating rounds of eager, integrated and compiled
    tolerance: float = TOLERANCE


@dataclass(frozen=True)
class CallShape:
    """How the model called the region when it was captured (the problem file's constants), so a later call
    can be turned into the problem's inputs, or recognised as a different call."""

    positional: int | None = None      # None: a problem file without these constants; arguments pass as given
    positional_literals: dict = field(default_factory=dict)   # index -> repr of the value
    keyword_inputs: tuple = ()
    keyword_literals: dict = field(default_factory=dict)      # name -> repr of the value
    input_shapes: tuple = ()

    def inputs(self, args: tuple, kwargs: dict) -> list | None:
        """The problem's inputs for this call, or None when it is not the call the solution was verified on:
        other arguments, literal values or tensor shapes."""
        if self.positional is None:
            return None if kwargs else list(args)
        if len(args) != self.positional or set(kwargs) != set(self.keyword_inputs) | set(self.keyword_literals):
            return None
        literals = [(args[i], text) for i, text in self.positional_literals.items()]
        literals += [(kwargs[name], text) for name, text in self.keyword_literals.items()]
        if any(repr(value) != text for value, text in literals):
            return None
        tensors = [a for i, a in enumerate(args) if i not in self.positional_literals]
        tensors += [kwargs[name] for name in self.keyword_inputs]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            return None
        if self.input_shapes and [list(t.shape) for t in tensors] != [list(s) for s in self.input_shapes]:
            return None
        return tensors


class Replacement(nn.Module):
    """Stands where a region was: calls the candidate on the call it was verified on, the original on any
    other; keeps the original for `restore`."""

    def __init__(self, original: nn.Module, candidate: nn.Module, run_dir: str, call: CallShape):
        super().__init__()
        self.original = original
        self.candidate = candidate
        self.run_dir = run_dir
        self.call = call
        self.enabled = True      # False: the original runs (the eager side of the end-to-end timing)

    def forward(self, *args, **kwargs):
        inputs = self.call.inputs(args, kwargs) if self.enabled else None
        return self.original(*args, **kwargs) if inputs is None else self.candidate(*inputs)


# ---- a run directory -----------------------------------------------------------------------------------


@dataclass
class RunDir:
    path: Path
    problem: Path
    region: str
    seed: int                # the run's verifier seed: ModelNew is constructed after seeding with it
    best: Path | None        # None when the run left no best/
    capture_json: Path | None
    call: CallShape = field(default_factory=CallShape)
    constants: dict = field(default_factory=dict)   # the problem file's NAME = literal lines, read once


def read_run_dir(path: str | Path) -> RunDir:
    path = Path(path)
    if not path.is_dir():
        raise IntegrateError(path, "no such run directory")
    problem = _problem_of(path)
    best = path / BEST
    capture_json = problem.parent / "capture.json"
    constants = _constants(problem)
    return RunDir(path=path, problem=problem, region=_constant(problem, constants, "REGION", str),
                  seed=_seed_of(path), best=best if (best / SOLUTION_FILE).is_file() else None,
                  capture_json=capture_json if capture_json.is_file() else None, call=_call_shape(constants),
                  constants=constants)


def _call_shape(constants: dict[str, Any]) -> CallShape:
    if "POSITIONAL" not in constants:  # written before capture recorded how the region is called
        return CallShape()
    return CallShape(positional=constants["POSITIONAL"], positional_literals=constants["POSITIONAL_LITERALS"],
                     keyword_inputs=tuple(constants["KEYWORD_INPUTS"]), keyword_literals=constants["KEYWORD_LITERALS"],
                     input_shapes=tuple(constants.get("INPUT_SHAPES", ())))


def _problem_of(run_dir: Path) -> Path:
    """The run's problem file, from state.json or else best/manifest.yaml."""
    try:
        problem = RunState.load(run_dir).problem
    except StateError:
        try:
            problem = Manifest.read(run_dir / BEST).problem
        except SolutionError:
            raise IntegrateError(run_dir, "neither state.json nor best/manifest.yaml: not a run directory") from None
    if not Path(problem).is_file():
        raise IntegrateError(run_dir, f"its problem file {problem} no longer exists")
    return Path(problem)


def _constants(problem: Path) -> dict[str, Any]:
    """The module-level `NAME = literal` assignments of a problem file capture wrote; read without running it."""
    try:
        tree = parse_python(problem.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as err:
        raise IntegrateError(problem, f"cannot be read ({type(err).__name__})") from None
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue  # not a literal: not one of capture's constants
    return found


def _constant(problem: Path, constants: dict[str, Any], name: str, kind: type) -> Any:
    value = constants.get(name)
    if not isinstance(value, kind):
        raise IntegrateError(problem, f"has no {name} constant: not a problem written by `mkevolve capture`")
    return value


def model_inputs(run: RunDir) -> list:
    """The whole model's inputs as capture drew them."""
    from mkevolve.capture import captured_inputs, load_model_file

    model_file = load_model_file(_constant(run.problem, run.constants, "MODEL_FILE", str))
    return captured_inputs(model_file, _constant(run.problem, run.constants, "SEED", int), torch.device("cpu"))


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
    """ModelNew as the verifier builds it (seeded, the problem's init inputs), then given the region's own
    weights (the model's may be trained) where they can be matched to the candidate's."""
    try:
        problem = import_file(run.problem, prefix="mkevolve_integrate_problem")
        module = import_file(run.best / SOLUTION_FILE, prefix="mkevolve_integrate")
        init = call_inputs(run.problem, problem.get_init_inputs, "get_init_inputs")
        seed_everything(run.seed)
        candidate = module.ModelNew(*init)
        seed_everything(run.seed)
        reference = problem.Model(*init)
    except (ProblemError, AttributeError) as err:
        raise _CandidateFailed(f"cannot load ModelNew: {err}") from None
    except Exception as err:
        raise _CandidateFailed(f"building ModelNew or Model from get_init_inputs() raised {type(err).__name__}: "
                               f"{err}") from None
    weights = "seeded rebuild"
    names = weight_names(candidate, reference) if _same_layout(reference, region) else None
    if names is not None:
        ours = region.state_dict()
        candidate.load_state_dict({mine: ours[theirs] for mine, theirs in names.items()}, strict=False)
        weights = "the model's"
    candidate = candidate.to(device)
    return (candidate.train() if region.training else candidate.eval()), weights


def _same_layout(reference: nn.Module, region: nn.Module) -> bool:
    """The problem's Model holds the region as `self.region`, with the same state-dict names and shapes."""
    rebuilt = getattr(reference, "region", None)
    if not isinstance(rebuilt, nn.Module):
        return False
    a, b = rebuilt.state_dict(), region.state_dict()
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)


def weight_names(candidate: nn.Module, reference: nn.Module) -> dict[str, str] | None:
    """For each tensor of the candidate's state dict, the region's state-dict name of the same tensor, or
    None when one has no match. Both were built from the same seed, so each candidate tensor equals one of
    the problem Model's (`region.<name>`) exactly; equal ones (zeros, ones) pair in order."""
    unused = [(name.removeprefix("region."), t) for name, t in reference.state_dict().items()
              if name.startswith("region.")]
    names = {}
    for mine, tensor in candidate.state_dict().items():
        match = next((i for i, (_, t) in enumerate(unused)
                      if t.shape == tensor.shape and t.dtype == tensor.dtype and torch.equal(t, tensor)), None)
        if match is None:
            return None
        names[mine] = unused.pop(match)[0]
    return names


# ---- the region's real arguments -----------------------------------------------------------------------


@dataclass
class _Call:
    args: list
    kwargs: dict
    calls: int = 0           # calls per forward pass


@contextlib.contextmanager
def fp32_arithmetic():
    """Full fp32 in cuDNN and cuBLAS while outputs are compared. cuDNN convolutions default to TF32, whose
    error (about 1e-3) is ten times the tolerance: against a TF32 reference a kernel more exact than it
    would look wrong. The verifier's references are computed the same way; timing keeps the user's settings."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


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
        with torch.no_grad(), fp32_arithmetic():
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
    inputs = run.call.inputs(tuple(call.args), call.kwargs)
    if inputs is None:
        result.verdict = Verdict.INCORRECT
        result.reason = "the model calls the region with other arguments or shapes than the captured call"
        return result, None
    try:
        candidate, result.weights = build_candidate(run, region, _device_of(model))
        with torch.no_grad(), fp32_arithmetic():
            reference = region(*clone_values(call.args), **call.kwargs)
            output = candidate(*clone_values(inputs))
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
    return _by_speed(result, region, candidate, call, inputs, timed, settings, model_ms)


def _by_speed(result: RegionResult, region: nn.Module, candidate: nn.Module, call: _Call, inputs: list,
              timed: bool, settings: Settings, model_ms: float | None) -> tuple[RegionResult, nn.Module | None]:
    if not timed:
        if settings.accept_untimed:
            result.verdict, result.reason = Verdict.USED, "correct; speed not checked (--accept-untimed, no GPU)"
            return result, candidate
        result.verdict = Verdict.SPEED_UNKNOWN
        result.reason = "correct, but no GPU to time it on; --accept-untimed uses it without a speed check"
        return result, None
    result.region_ms = cuda_ms(lambda: region(*call.args, **call.kwargs), settings)
    result.replacement_ms = cuda_ms(lambda: candidate(*inputs), settings)
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


def _compiled(model: nn.Module, inputs: list) -> tuple[Any, str]:
    """torch.compile of a copy of the model, compiled now (one call); None and why where it fails."""
    try:
        compiled = torch.compile(copy.deepcopy(model))
        with torch.no_grad():
            compiled(*inputs)
        return compiled, ""
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
    e2e = EndToEnd(device=str(device), compile_note="" if timed else UNKNOWN_NO_GPU)
    # Compiled from a copy of the original, before any region is replaced.
    compiled, e2e.compile_note = _compiled(model, inputs) if timed else (None, UNKNOWN_NO_GPU)
    model_ms = cuda_ms(lambda: model(*inputs), settings) if timed else None  # for shares not captured
    results, replacements = [], []
    for run in runs:
        result, candidate = judge(run, model, calls.get(run.region), timed, settings, model_ms)
        if candidate is not None:
            replacements.append(Replacement(model.get_submodule(run.region), candidate, str(run.path), run.call))
            replace(model, run.region, replacements[-1])
        results.append(result)
    _finish(e2e, model, inputs, original_output, results, settings)
    if timed:
        _time_end_to_end(e2e, model, replacements, compiled, inputs, settings)
    return IntegrationReport(model=model_name or type(model).__name__, regions=results, end_to_end=e2e)


def _finish(e2e: EndToEnd, model: nn.Module, inputs: list, original_output: Any, results: list[RegionResult],
            settings: Settings) -> None:
    """The integrated model's error against the original, and the speedup Amdahl predicts."""
    with torch.no_grad(), fp32_arithmetic():
        e2e.max_abs_error, _ = max_error(original_output, model(*clone_values(inputs)))
    used = [r for r in results if r.verdict is Verdict.USED]
    e2e.amdahl = amdahl(used) if used else 1.0  # nothing replaced: the model is the original


def _time_end_to_end(e2e: EndToEnd, model: nn.Module, replacements: list[Replacement], compiled: Any,
                     inputs: list, settings: Settings) -> None:
    """Eager, integrated and compiled in alternating rounds (the order rotates), each the median of its
    round medians: all three are measured in the same state of the process (every import, compilation
    and autotuning done), so drift and what ran before fall on them alike."""
    def eager():
        for r in replacements:
            r.enabled = False
        try:
            return model(*inputs)
        finally:
            for r in replacements:
                r.enabled = True

    forwards = {"eager": eager, "integrated": lambda: model(*inputs)}
    if compiled is not None:
        forwards["compiled"] = lambda: compiled(*inputs)
    names = list(forwards)
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(settings.rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            rounds[name].append(cuda_ms(forwards[name], settings))
    ms = {name: statistics.median(times) for name, times in rounds.items()}
    e2e.eager_ms, e2e.integrated_ms, e2e.compiled_ms = ms["eager"], ms["integrated"], ms.get("compiled")
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
            "integrated vs original output: max abs error "
            + ("unknown" if e2e.max_abs_error is None else f"{e2e.max_abs_error:.3g}")]


def integrate_command(args) -> int:
    """`mkevolve integrate MODEL.py RUN_DIR...`: 0 when the report is written, 2 on bad input."""
    from mkevolve.capture import load_model_file

    config = config_from_args(args)
    if args.runs < 1 or args.warmup < 0:
        raise ConfigError("--runs must be at least 1, --warmup at least 0")
    settings = Settings(accept_untimed=args.accept_untimed, warmup=args.warmup, runs=args.runs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # solutions' Triton kernels run in the interpreter; set before they are imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
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
    return ExitCode.OK

