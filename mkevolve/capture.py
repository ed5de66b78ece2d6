"""`mkevolve capture MODEL.py`: time a model's regions, rank them by share, and write the top ones as problems.

A region is a submodule timed around its real calls inside a full forward pass. Its share of the model's time
gives an Amdahl ceiling, 1 / (1 - share): the end-to-end speedup if the region took no time at all, so the most
that any kernel for it can give. The top regions are written as KernelBench-form problem files that rebuild the
region from MODEL.py itself (the real weights and buffers) and call it at the shapes it saw.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from rich.table import Table
from torch import nn

from mkevolve.config import ConfigError, config_from_args
from mkevolve.display import make_console
from mkevolve.fsutil import write_atomic
from mkevolve.problem import ProblemError, call_inputs, import_file, seed_everything, to_device

# Containers are never the unit of work themselves (ModuleList/ModuleDict have no forward at all): their
# members are the regions.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
# A region holding more than this fraction of the time is opened one level, so a backbone shows its blocks.
_DOMINANT_SHARE = 0.5
# Literals a generated get_inputs() can write back with repr().
_LITERALS = (bool, int, float, str, type(None))


class CaptureError(ProblemError):
    """A model file or model that cannot be captured; one line naming the file."""


# ---- what capture records ------------------------------------------------------------------------------


@dataclass
class ArgSpec:
    """One positional argument of a region's first call: a tensor to draw again, or a literal to write back."""

    kind: str                          # "tensor" | "literal"
    shape: list[int] | None = None
    dtype: str | None = None           # e.g. "torch.float32"
    low: int | None = None             # integer tensors: the range of values seen (indices stay valid)
    high: int | None = None
    literal: str | None = None         # repr() of a literal


@dataclass
class RegionRow:
    path: str                          # get_submodule path, e.g. "layer1.0"
    type: str                          # the module's class name
    calls: int                         # calls per forward pass (a shared block is called several times)
    ms: float                          # median over the timed runs of the summed calls, milliseconds
    share: float                       # ms / whole-model ms
    ceiling: float | None              # Amdahl ceiling 1 / (1 - share); None when infinite (share 1)
    inputs: list[ArgSpec] = field(default_factory=list)
    problem: str | None = None         # the problem file written for it
    skipped: str | None = None         # why no problem file was written for a top region


@dataclass
class CaptureReport:
    model: str
    device: str
    timer: str                         # "cuda events" or "cpu perf_counter"
    torch_version: str
    date: str
    seed: int
    eval_mode: bool
    warmup: int
    runs: int
    total_ms: float                    # median whole-model forward, milliseconds
    rows: list[RegionRow]


# ---- loading MODEL.py ----------------------------------------------------------------------------------


@dataclass
class ModelFile:
    path: Path
    module: ModuleType

    def build(self, seed: int) -> nn.Module:
        """The full model as the generated problems rebuild it: seed, then get_model() or Model(*init)."""
        seed_everything(seed)
        get_model = getattr(self.module, "get_model", None)
        what = "get_model()" if callable(get_model) else "Model(*get_init_inputs())"
        try:
            model = get_model() if callable(get_model) else self.module.Model(*self.module.get_init_inputs())
        except Exception as err:
            raise CaptureError(self.path, f"{what} raised {type(err).__name__}: {err}") from None
        if not isinstance(model, nn.Module):
            raise CaptureError(self.path, f"{what} returned {type(model).__name__}, not a torch.nn.Module")
        return model

    def inputs(self, seed: int, device: torch.device) -> list:
        seed_everything(seed)
        return to_device(call_inputs(self.path, self.module.get_inputs, "get_inputs"), device)


def load_model_file(path: str | Path) -> ModelFile:
    """Import MODEL.py: get_model() and get_inputs(), or a KernelBench Model with get_init_inputs()."""
    path = Path(path).resolve()
    module = import_file(path, prefix="mkevolve_capture")
    model_cls = getattr(module, "Model", None)
    kernelbench = (isinstance(model_cls, type) and issubclass(model_cls, nn.Module)
                   and callable(getattr(module, "get_init_inputs", None)))
    if not callable(getattr(module, "get_model", None)) and not kernelbench:
        raise CaptureError(path, "defines neither get_model() nor a Model class with get_init_inputs()")
    if not callable(getattr(module, "get_inputs", None)):
        raise CaptureError(path, "defines no get_inputs()")
    return ModelFile(path=path, module=module)


def captured_inputs(model_file: ModelFile, seed: int, device: torch.device) -> list:
    """The model's inputs as capture draws them, and integrate again: get_inputs() seeded with seed + 1 (the
    weights were drawn after seeding with seed)."""
    return model_file.inputs(seed + 1, device)


# ---- regions -------------------------------------------------------------------------------------------


def _open(prefix: str, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """A module's children as regions, containers replaced by their members (one level)."""
    regions = []
    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(child, _CONTAINERS) and any(True for _ in child.children()):
            regions += [(f"{path}.{n}", c) for n, c in child.named_children()]
        else:
            regions.append((path, child))
    return regions


def _dedup(regions: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """One entry per module object: a block registered under two names is one region."""
    seen, out = set(), []
    for path, module in regions:
        if id(module) not in seen:
            seen.add(id(module))
            out.append((path, module))
    return out


# ---- timing --------------------------------------------------------------------------------------------


class _Timer:
    """Start/stop marks around calls: CUDA events on a GPU (device time), perf_counter on CPU (host time)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two marks; on CUDA only after synchronize()."""
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class _Probe:
    """Per-region state the hooks fill during one forward pass."""

    path: str
    module: nn.Module
    open: list = field(default_factory=list)       # start marks of calls not yet returned (re-entrant calls)
    pairs: list = field(default_factory=list)      # (start, end) marks of this pass's calls
    seen: bool = False                             # the first call has been recorded
    inputs: list[ArgSpec] | None = None            # the first call's arguments, or None when unsupported
    unsupported: str | None = None                 # why the first call cannot be replayed
    samples: list[float] = field(default_factory=list)   # per timed run: summed ms of its calls
    calls: int = 0


def _attach(probe: _Probe, timer: _Timer) -> list:
    def before(module, args, kwargs):
        if not probe.seen:  # recorded now: a later in-place op may change what it was called with
            probe.seen = True
            try:
                probe.inputs = record_inputs(args, kwargs)
            except _Unsupported as why:
                probe.unsupported = str(why)
        probe.open.append(timer.mark())

    def after(module, args, kwargs, output):
        probe.pairs.append((probe.open.pop(), timer.mark()))

    return [probe.module.register_forward_pre_hook(before, with_kwargs=True),
            probe.module.register_forward_hook(after, with_kwargs=True)]


def _forward(model_file: ModelFile, model: nn.Module, inputs: list) -> None:
    try:
        model(*inputs)
    except Exception as err:
        raise CaptureError(model_file.path, f"the model's forward raised {type(err).__name__}: {err}") from None


@dataclass
class _Timing:
    probes: list[_Probe]
    total_ms: float


def time_regions(model_file: ModelFile, model: nn.Module, inputs: list, regions: list[tuple[str, nn.Module]],
                 device: torch.device, warmup: int, runs: int) -> _Timing:
    """Warm up, then `runs` forward passes; each region's and the whole model's median, in milliseconds."""
    timer = _Timer(device)
    probes = [_Probe(path, module) for path, module in regions]
    handles = [h for probe in probes for h in _attach(probe, timer)]
    totals = []
    try:
        with torch.no_grad():
            for i in range(warmup + runs):
                for probe in probes:
                    probe.pairs.clear()
                timer.synchronize()
                start = timer.mark()
                _forward(model_file, model, inputs)
                end = timer.mark()
                timer.synchronize()
                if i < warmup:
                    continue
                totals.append(timer.ms(start, end))
                for probe in probes:
                    probe.calls = len(probe.pairs)
                    probe.samples.append(sum(timer.ms(a, b) for a, b in probe.pairs))
    finally:
        for handle in handles:
            handle.remove()
    return _Timing(probes=probes, total_ms=statistics.median(totals))


# ---- recording a region's arguments --------------------------------------------------------------------


class _Unsupported(Exception):
    pass


def _arg_spec(value: Any) -> ArgSpec:
    if isinstance(value, torch.Tensor):
        spec = ArgSpec(kind="tensor", shape=list(value.shape), dtype=str(value.dtype))
        if not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
            # Integer tensors are often indices: draw them again from the range that was seen.
            spec.low = int(value.min()) if value.numel() else 0
            spec.high = int(value.max()) if value.numel() else 0
        return spec
    if _is_literal(value):
        return ArgSpec(kind="literal", literal=repr(value))
    raise _Unsupported(f"an argument of type {type(value).__name__} that is neither a tensor nor a literal")


def _is_literal(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_literal(v) for v in value)
    return isinstance(value, _LITERALS) and not (isinstance(value, float) and not math.isfinite(value))


def record_inputs(args: tuple, kwargs: dict) -> list[ArgSpec]:
    """A call's arguments as ArgSpecs; raises _Unsupported with the reason it cannot be replayed."""
    if kwargs:
        raise _Unsupported(f"called with keyword arguments ({', '.join(kwargs)})")
    return [_arg_spec(value) for value in args]


# ---- ranking -------------------------------------------------------------------------------------------


def ceiling_of(share: float) -> float | None:
    """Amdahl: the end-to-end speedup if the region took no time; None (infinite) for the whole model."""
    return None if share >= 1.0 else 1.0 / (1.0 - share)


def whole_ms(timing: _Timing) -> float:
    """The whole model's milliseconds. Medians of parts can add up to more than the median of the whole by
    noise; the whole is never less than its disjoint parts, so shares always sum to at most 1."""
    return max(timing.total_ms, sum(statistics.median(p.samples) for p in timing.probes if p.calls))


def rank(timing: _Timing) -> list[RegionRow]:
    """Rows for the regions that ran, by share, largest first."""
    ran = [p for p in timing.probes if p.calls]
    ms = {p.path: statistics.median(p.samples) for p in ran}
    total = whole_ms(timing)
    rows = []
    for probe in ran:
        share = ms[probe.path] / total if total > 0 else 0.0
        rows.append(RegionRow(path=probe.path, type=type(probe.module).__name__, calls=probe.calls,
                              ms=ms[probe.path], share=share, ceiling=ceiling_of(share)))
    return sorted(rows, key=lambda row: row.share, reverse=True)


# ---- the generated problem file ------------------------------------------------------------------------


_PROBLEM_TEMPLATE = '''"""Region `{path}` ({type}) of {model}, captured by `mkevolve capture` at its real shapes.

{share:.1%} of the model's time on {device} ({timer}); Amdahl ceiling {ceiling}: the end-to-end speedup if
this region took no time. Model rebuilds the whole model from the file above exactly as capture did (seed
{seed}) and keeps the region, so its weights and buffers are the real ones.
"""

import importlib.util
import random
import sys

import torch
from torch import nn

MODEL_FILE = {model_file!r}
REGION = {path!r}
SEED = {seed!r}
EVAL = {eval_mode!r}


def _build_full_model():
    name = {module_name!r}
    spec = importlib.util.spec_from_file_location(name, MODEL_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    spec.loader.exec_module(module)
    random.seed(SEED)
    torch.manual_seed(SEED)
    if callable(getattr(module, "get_model", None)):
        model = module.get_model()
    else:
        model = module.Model(*module.get_init_inputs())
    return model.eval() if EVAL else model


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.region = _build_full_model().get_submodule(REGION)

    def forward(self, *args):
        return self.region(*args)


def get_inputs():
    return [
{inputs}
    ]


def get_init_inputs():
    return []
'''


def _input_expr(spec: ArgSpec) -> str:
    if spec.kind == "literal":
        return spec.literal
    shape = tuple(spec.shape)
    if spec.dtype == "torch.bool":
        return f"torch.randint(0, 2, {shape}).bool()"
    if spec.low is not None:
        return f"torch.randint({spec.low}, {spec.high + 1}, {shape}, dtype={spec.dtype})"
    return f"torch.randn({shape}, dtype={spec.dtype})"


def problem_source(report: CaptureReport, row: RegionRow, model_file: Path) -> str:
    ceiling = "unbounded" if row.ceiling is None else f"{row.ceiling:.2f}x"
    inputs = "\n".join(f"        {_input_expr(spec)}," for spec in row.inputs)
    return _PROBLEM_TEMPLATE.format(path=row.path, type=row.type, model=model_file.name, share=row.share,
                                    device=report.device, timer=report.timer, ceiling=ceiling, seed=report.seed,
                                    model_file=str(model_file),
                                    module_name=f"mkevolve_captured_{model_file.stem}", eval_mode=report.eval_mode,
                                    inputs=inputs)


def safe_name(model_file: Path, region: str) -> str:
    """A file stem that is a problem name: `<model>_<region>` with every non-word character as `_`."""
    return re.sub(r"\W", "_", f"{model_file.stem}_{region}")


# ---- the command ---------------------------------------------------------------------------------------


@dataclass
class CaptureSettings:
    top: int = 5
    warmup: int = 3          # untimed passes: allocator, cuDNN autotuning and lazy init settle
    runs: int = 20           # timed passes; medians are taken over them
    seed: int = 0
    eval_mode: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cuda" if torch.cuda.is_available()
                                                                      else "cpu"))


def capture(path: str | Path, out_dir: str | Path, settings: CaptureSettings) -> CaptureReport:
    """Time the regions, rank them, write capture.json and the top regions' problem files under out_dir."""
    model_file = load_model_file(path)
    model = model_file.build(settings.seed).to(settings.device)
    model = model.eval() if settings.eval_mode else model
    inputs = captured_inputs(model_file, settings.seed, settings.device)
    timing = _timed(model_file, model, inputs, settings)
    rows = rank(timing)
    if not rows:
        raise CaptureError(model_file.path, "no submodule of the model ran in its forward: nothing to capture")
    report = CaptureReport(
        model=str(model_file.path), device=str(settings.device),
        timer="cuda events" if settings.device.type == "cuda" else "cpu perf_counter",
        torch_version=torch.__version__, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seed=settings.seed, eval_mode=settings.eval_mode, warmup=settings.warmup, runs=settings.runs,
        total_ms=whole_ms(timing), rows=rows)
    probes = {p.path: p for p in timing.probes}
    out_dir = Path(out_dir)
    for row in rows[:settings.top]:
        _write_problem(report, row, probes[row.path], model_file.path, out_dir)
    write_atomic(out_dir / "capture.json", json.dumps(asdict(report), indent=2) + "\n")
    return report


def _timed(model_file: ModelFile, model: nn.Module, inputs: list, settings: CaptureSettings) -> _Timing:
    """Time the opened children; a region over half the time is opened one level more and timed again."""
    regions = _dedup(_open("", model))
    timing = time_regions(model_file, model, inputs, regions, settings.device, settings.warmup, settings.runs)
    dominant = [row.path for row in rank(timing) if row.share > _DOMINANT_SHARE]
    opened = []
    for path, module in regions:
        inner = _open(path, module) if path in dominant else []
        opened += inner or [(path, module)]
    if len(opened) == len(regions):
        return timing
    return time_regions(model_file, model, inputs, _dedup(opened), settings.device, settings.warmup,
                        settings.runs)


def _write_problem(report: CaptureReport, row: RegionRow, probe: _Probe, model_file: Path, out_dir: Path) -> None:
    if probe.inputs is None:
        row.skipped = probe.unsupported
        return
    row.inputs = probe.inputs
    target = out_dir / f"{safe_name(model_file, row.path)}.py"
    write_atomic(target, problem_source(report, row, model_file))
    row.problem = str(target)


def _table(report: CaptureReport, top: int) -> Table:
    table = Table(title=f"regions of {Path(report.model).name} by share of {report.total_ms:.3f} ms "
                        f"on {report.device} ({report.timer})")
    for name, justify in [("#", "right"), ("region", "left"), ("type", "left"), ("calls", "right"),
                          ("ms", "right"), ("share", "right"), ("ceiling", "right"), ("problem", "left")]:
        table.add_column(name, justify=justify)
    for i, row in enumerate(report.rows, 1):
        ceiling = "inf" if row.ceiling is None else f"{row.ceiling:.2f}x"
        written = Path(row.problem).name if row.problem else (f"skipped: {row.skipped}" if row.skipped else "")
        table.add_row(str(i), row.path, row.type, str(row.calls), f"{row.ms:.3f}", f"{row.share:.1%}", ceiling,
                      written if i <= top else "")
    return table


def capture_command(args) -> int:
    """`mkevolve capture MODEL.py`: 0 when captured, 2 when the file or the model cannot be used."""
    config = config_from_args(args)
    if args.top < 1 or args.runs < 1 or args.warmup < 0:
        raise ConfigError("--top and --runs must be at least 1, --warmup at least 0")
    settings = CaptureSettings(top=args.top, warmup=args.warmup, runs=args.runs, seed=config.seed,
                               eval_mode=config.eval_mode)
    out_dir = Path(config.out) / Path(args.model_file).stem / "capture"
    report = capture(args.model_file, out_dir, settings)
    console = make_console()
    console.print(_table(report, settings.top))
    outside = report.total_ms - sum(row.ms for row in report.rows)
    console.print(f"outside the regions (the model's own code between them): {max(outside, 0.0):.3f} ms")
    if report.device == "cpu":
        console.print("times are CPU times (no GPU here): shares on a GPU will differ")
    for row in report.rows[:settings.top]:
        if row.skipped:
            console.print(f"skipped {row.path}: {row.skipped}")
    console.print(f"wrote {out_dir / 'capture.json'} and {sum(1 for r in report.rows if r.problem)} problem file(s) "
                  f"in {out_dir}; run one with: python -m mkevolve run FILE")
    return 0
