"""`mkevolve capture MODEL.py`: time a model's regions, rank them by share, and write the top ones as problems.

A region is a submodule timed around its real calls inside a full forward pass. Its share of the model's time
gives an Amdahl ceiling, 1 / (1 - share): the end-to-end speedup if the region took no time at all, so the most
that any kernel for it can give. The top regions are written as KernelBench-form problem files that build the
region again from its init arguments, or from its parts (fresh weights; `mkevolve integrate` puts the model's
own back), and call it as the model did, at the shapes it saw. Each file is checked before it is written: with
the region's weights loaded, it must reproduce the region's output.
"""

from __future__ import annotations

import ast
import inspect
import json
import keyword
import math
import re
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from rich.table import Table
from torch import nn

from mkevolve.config import TOLERANCE, ConfigError, config_from_args
from mkevolve.display import make_console
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.problem import (ProblemError, call_inputs, clone_values, flatten_outputs, import_file,
                              same_outputs, seed_everything, to_device)
from mkevolve.pysource import parse_python

# Containers are never the unit of work themselves (ModuleList/ModuleDict have no forward at all): their
# members are the regions.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
# A region holding more than this fraction of the time is opened one level, so a backbone shows its blocks.
_DOMINANT_SHARE = 0.5
# Names a keyword argument cannot take as a parameter of the generated forward().
_RESERVED_NAMES = frozenset({"self", "torch", "nn"}) | frozenset(keyword.kwlist)
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
    keyword: str | None = None         # the name it was passed by; None for a positional argument


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
    # False for a row beside the table's disjoint regions (a region's parent or part), tried because the
    # larger regions before it could not be written; the shares of the table's rows sum to at most 1.
    in_table: bool = True


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
    args: list = field(default_factory=list)       # the first call's arguments, copied (to check a rebuild)
    kwargs: dict = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)   # per timed run: summed ms of its calls
    calls: int = 0

    def tensors(self) -> list[torch.Tensor]:
        """The first call's tensors in the order a generated get_inputs() lists them: positional, then keyword."""
        return [v for v in [*self.args, *self.kwargs.values()] if isinstance(v, torch.Tensor)]


def _attach(probe: _Probe, timer: _Timer) -> list:
    def before(module, args, kwargs):
        if not probe.seen:  # recorded now: a later in-place op may change what it was called with
            probe.seen = True
            try:
                probe.inputs = record_inputs(args, kwargs)
                probe.args = clone_values(list(args))
                probe.kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
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

    def probe(self, path: str) -> _Probe:
        return next(p for p in self.probes if p.path == path)

    def has(self, path: str) -> bool:
        return any(p.path == path for p in self.probes)

    def median_ms(self, path: str) -> float | None:
        probe = self.probe(path)
        return statistics.median(probe.samples) if probe.calls else None


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


class _MissingArgument(_Unsupported):
    """An init argument the module does not keep: it may still be assembled from its parts."""


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
    if isinstance(value, dict):
        return all(_is_literal(k) and _is_literal(v) for k, v in value.items())
    return isinstance(value, _LITERALS) and not (isinstance(value, float) and not math.isfinite(value))


def record_inputs(args: tuple, kwargs: dict) -> list[ArgSpec]:
    """A call's arguments as ArgSpecs, positional ones first; raises _Unsupported with the reason it cannot be
    replayed. Keyword arguments keep their names (a transformer block takes its masks and flags by keyword)."""
    specs = [_arg_spec(value) for value in args]
    for name, value in kwargs.items():
        if not name.isidentifier() or name in _RESERVED_NAMES or re.fullmatch(r"arg\d+", name):
            raise _Unsupported(f"a keyword argument named {name!r} cannot be a forward() parameter")
        spec = _arg_spec(value)
        spec.keyword = name
        specs.append(spec)
    return specs


# ---- ranking -------------------------------------------------------------------------------------------


def ceiling_of(share: float) -> float | None:
    """Amdahl: the end-to-end speedup if the region took no time; None (infinite) for the whole model."""
    return None if share >= 1.0 else 1.0 / (1.0 - share)


def whole_ms(timing: _Timing, shown: list[str]) -> float:
    """The whole model's milliseconds. Medians of parts can add up to more than the median of the whole by
    noise; the whole is never less than its disjoint parts (`shown`), so their shares sum to at most 1."""
    parts = [timing.median_ms(path) for path in shown]
    return max(timing.total_ms, sum(ms for ms in parts if ms is not None))


def rank(timing: _Timing, paths: list[str], total_ms: float) -> list[RegionRow]:
    """Rows for the regions among `paths` that ran, by share of `total_ms`, largest first."""
    rows = []
    for probe in (timing.probe(path) for path in paths):
        if not probe.calls:
            continue
        ms = statistics.median(probe.samples)
        share = ms / total_ms if total_ms > 0 else 0.0
        rows.append(RegionRow(path=probe.path, type=type(probe.module).__name__, calls=probe.calls, ms=ms,
                              share=share, ceiling=ceiling_of(share)))
    return sorted(rows, key=lambda row: row.share, reverse=True)


def shown_regions(timing: _Timing, model: nn.Module) -> list[str]:
    """The disjoint regions the table shows: the model's children (containers by their members), and a
    region over half the time opened one level, so a backbone shows its stem and blocks."""
    regions = [path for path, _ in _dedup(_open("", model)) if timing.has(path)]
    total = whole_ms(timing, regions)
    shown = []
    for path in regions:
        inner = [p for p, _ in _open(path, model.get_submodule(path)) if timing.has(p)]
        dominant = (timing.median_ms(path) or 0.0) > _DOMINANT_SHARE * total
        shown += inner if dominant and inner else [path]
    return shown


def _overlaps(path: str, others: list[str]) -> bool:
    return any(path == o or path.startswith(o + ".") or o.startswith(path + ".") for o in others)


# ---- the generated problem file ------------------------------------------------------------------------


_PROBLEM_TEMPLATE = '''"""Region `{path}` ({type}) of {model}, captured by `mkevolve capture` at its real shapes.

{share:.1%} of the model's time on {device} ({timer}); Amdahl ceiling {ceiling}: the end-to-end speedup if
this region took no time. Model builds the region from its init arguments (or from its parts), with fresh
weights; `mkevolve integrate` puts the model's own weights into the solution.{eval_note}
"""

import torch
from torch import nn
{imports}
MODEL_FILE = {model_file!r}
REGION = {path!r}
SEED = {seed!r}
EVAL = {eval_mode!r}
# How the model calls the region: POSITIONAL arguments, of which those in POSITIONAL_LITERALS always had
# these values (repr); then KEYWORD_INPUTS tensors and KEYWORD_LITERALS by keyword. get_inputs() holds the
# tensors only, positional ones first, of INPUT_SHAPES.
POSITIONAL = {positional!r}
POSITIONAL_LITERALS = {positional_literals!r}
KEYWORD_INPUTS = {keyword_inputs!r}
KEYWORD_LITERALS = {keyword_literals!r}
INPUT_SHAPES = {input_shapes!r}
{sources}

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.region = {rebuild}

    def forward(self, {parameters}):
        return self.region({call})


def get_inputs():
    return [
{inputs}
    ]


def get_init_inputs():
    return []
'''


# ---- rebuilding a region from its init arguments -------------------------------------------------------


@dataclass
class Rebuild:
    """Source that constructs a module again: the expression, the imports it needs, and the classes of
    MODEL.py it uses (copied into the problem with what they use)."""

    expression: str = ""
    imports: set[str] = field(default_factory=set)
    copied: set[str] = field(default_factory=set)   # classes of MODEL.py, whose definitions are copied
    assembled: bool = False                          # uses _ASSEMBLED (a module built from its parts)


# Names the problem file defines itself; a region class by one of these names would shadow it.
_TEMPLATE_NAMES = frozenset({"Model", "torch", "nn", "get_inputs", "get_init_inputs"})


def rebuild(module: nn.Module, model_module: ModuleType) -> Rebuild:
    """How to construct `module` again from its init signature: each parameter read from the attribute of
    the same name (torch.nn layers keep theirs), a module argument rebuilt the same way, a parameter the
    module does not keep left at its default. A module that needs an argument it does not keep (torchvision's
    BasicBlock keeps no `inplanes`) is assembled from its parts instead (`_assemble`). Raises _Unsupported
    when neither can be done."""
    found = Rebuild()
    found.expression = _construct(module, model_module, found)
    return found


# The helper a problem file gets when it assembles a module from its parts.
_ASSEMBLED = '''def _assembled(cls, parts, attributes):
    """A `cls` whose own __init__ needs arguments the captured module did not keep: nn.Module's __init__,
    then its parts (built in the order the module registered them) and its plain attributes, as it held them."""
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for name, part in parts:
        setattr(module, name, part)
    for name, value in attributes.items():
        setattr(module, name, value)
    return module
'''


def _construct(module: nn.Module, model_module: ModuleType, found: Rebuild) -> str:
    if type(module) in (nn.Sequential, nn.ModuleList):   # their init takes the parts themselves
        parts = ", ".join(_construct(part, model_module, found) for part in module.children())
        return f"nn.Sequential({parts})" if type(module) is nn.Sequential else f"nn.ModuleList([{parts}])"
    try:
        return _construct_from_signature(module, model_module, found)
    except _MissingArgument:
        return _assemble(module, model_module, found)


def _assemble(module: nn.Module, model_module: ModuleType, found: Rebuild) -> str:
    """`_assembled(Class, [(name, part), ...], {attribute: value})`: every part rebuilt, every plain attribute a
    literal. Tensors the module holds itself (not in a part) would need values of their own: unsupported."""
    cls = type(module)
    if any(t is not None for t in (*module._parameters.values(), *module._buffers.values())):
        raise _Unsupported(f"{cls.__name__} keeps neither its init arguments nor only parts: it holds "
                           "parameters or buffers of its own")
    parts = [f"({name!r}, {'None' if part is None else _construct(part, model_module, found)})"
             for name, part in module._modules.items()]
    attributes = {}
    for name, value in vars(module).items():
        if name.startswith("_") or name == "training":
            continue
        if not _is_literal(value):
            raise _Unsupported(f"{cls.__name__} keeps neither its init arguments nor only literals and parts: "
                               f"its attribute {name!r} is a {type(value).__name__}")
        attributes[name] = value
    found.assembled = True
    return f"_assembled({_class_name(cls, model_module, found)}, [{', '.join(parts)}], {attributes!r})"


def _construct_from_signature(module: nn.Module, model_module: ModuleType, found: Rebuild) -> str:
    cls = type(module)
    try:
        signature = inspect.signature(cls.__init__)
    except (TypeError, ValueError):
        raise _Unsupported(f"{cls.__name__}.__init__ has no readable signature") from None
    arguments = []
    for name, parameter in list(signature.parameters.items())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or name in ("device", "dtype"):
            continue
        if name == "bias" and isinstance(getattr(module, "bias", None), (torch.Tensor, type(None))):
            value = getattr(module, "bias", None) is not None   # layers take a flag and keep the tensor
        elif name in vars(module) or name in module._modules:
            value = getattr(module, name)
        else:
            value = _kept_by_parts(module, name, parameter.default)
            if value is parameter.default:
                continue
        arguments.append(f"{name}={_argument(value, model_module, found)}")
    return f"{_class_name(cls, model_module, found)}({', '.join(arguments)})"


def _kept_by_parts(module: nn.Module, name: str, default: Any) -> Any:
    """An init argument the module passed on to its parts and did not keep (a block's `config`, a layer
    index): the value of that attribute on its submodules when they all hold the same one, else the
    parameter's default (inspect's `empty` where it has none: unsupported)."""
    values = [vars(part)[name] for part in module.modules() if part is not module and name in vars(part)]
    if values and all(v is values[0] or v == values[0] for v in values):
        return values[0]
    if default is inspect.Parameter.empty:
        raise _MissingArgument(f"{type(module).__name__}.__init__ needs {name!r}, which the module does not keep")
    return default


def _config_settings(value: Any) -> dict | None:
    """A configuration object's settings as literals (Hugging Face configs have to_dict()), or None."""
    to_dict = getattr(value, "to_dict", None)
    settings = to_dict() if callable(to_dict) else None
    if not isinstance(settings, dict) or not _is_literal(settings):
        return None
    # to_dict() leaves out the attention implementation chosen when the model was built; eager and sdpa
    # attention mask differently when no mask is passed, so the rebuilt block must use the same one.
    implementation = getattr(value, "_attn_implementation", None)
    if isinstance(implementation, str):
        settings["attn_implementation"] = implementation
    return settings


def _argument(value: Any, model_module: ModuleType, found: Rebuild) -> str:
    if isinstance(value, nn.Module):
        return _construct(value, model_module, found)
    if _is_literal(value):
        return repr(value)
    settings = _config_settings(value)
    if settings is not None:
        return f"{_class_name(type(value), model_module, found)}(**{settings!r})"
    raise _Unsupported(f"an init argument of type {type(value).__name__} is neither a literal, a module "
                       "nor a configuration with to_dict()")


def _class_name(cls: type, model_module: ModuleType, found: Rebuild) -> str:
    """The name the problem file calls `cls` by, adding its import or its copied source."""
    if getattr(nn, cls.__name__, None) is cls:
        return f"nn.{cls.__name__}"
    if cls.__name__ in _TEMPLATE_NAMES or cls.__qualname__ != cls.__name__:
        raise _Unsupported(f"class {cls.__qualname__} cannot be named in a problem file")
    if cls.__module__ == model_module.__name__:
        found.copied.add(cls.__name__)
    else:
        found.imports.add(f"from {cls.__module__} import {cls.__name__}")
    return cls.__name__


def _model_file_imports(model_file: Path) -> list[str]:
    """MODEL.py's top-level imports: classes copied from it keep the names they use."""
    tree = parse_python(model_file.read_text(encoding="utf-8"))
    return [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]


def _model_file_definitions(model_file: Path, names: list[str]) -> list[str]:
    """The sources of MODEL.py's top-level classes, functions and constants that `names` use, directly or
    through each other, in the file's order: a copied class keeps the helpers it calls."""
    source = model_file.read_text(encoding="utf-8")
    defined = {}
    for node in parse_python(source).body:
        targets = [node.name] if isinstance(node, (ast.ClassDef, ast.FunctionDef)) else \
            [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in targets:
            defined[name] = node
    needed, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name in defined and name not in needed:
            needed.add(name)
            pending += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)]
    nodes = sorted({id(defined[n]): defined[n] for n in needed}.values(), key=lambda n: n.lineno)
    return [ast.get_source_segment(source, node) for node in nodes]


def _input_expr(spec: ArgSpec) -> str:
    """How get_inputs() draws a tensor argument again."""
    shape = tuple(spec.shape)
    if spec.dtype == "torch.bool":
        return f"torch.randint(0, 2, {shape}).bool()"
    if spec.low is not None:
        return f"torch.randint({spec.low}, {spec.high + 1}, {shape}, dtype={spec.dtype})"
    return f"torch.randn({shape}, dtype={spec.dtype})"


def _forward_signature(specs: list[ArgSpec]) -> tuple[str, str]:
    """The generated forward's parameters and its call of the region. Tensors are the problem's inputs:
    positional ones as arg0, arg1, ..., keyword ones under their own names, passed on by keyword. Literals
    (None, flags, sizes) are written into the call, so the problem's inputs are its tensors only."""
    if not specs:
        return "*args", "*args"
    parameters, call = [], []
    for i, spec in enumerate(specs):
        name = spec.keyword or f"arg{i}"
        if spec.kind == "tensor":
            parameters.append(name)
        value = name if spec.kind == "tensor" else spec.literal
        call.append(f"{spec.keyword}={value}" if spec.keyword else value)
    return ", ".join(parameters), ", ".join(call)


def problem_source(report: CaptureReport, row: RegionRow, model_file: Path, built: Rebuild) -> str:
    ceiling = "unbounded" if row.ceiling is None else f"{row.ceiling:.2f}x"
    inputs = "\n".join(f"        {_input_expr(spec)}," for spec in row.inputs if spec.kind == "tensor")
    parameters, call = _forward_signature(row.inputs)
    positional = [spec for spec in row.inputs if spec.keyword is None]
    named = [spec for spec in row.inputs if spec.keyword is not None]
    imports = built.imports | (set(_model_file_imports(model_file)) if built.copied else set())
    imports = sorted(imports - {"import torch", "from torch import nn"})  # the template's own
    copied = _model_file_definitions(model_file, sorted(built.copied)) if built.copied else []
    copied += [_ASSEMBLED] if built.assembled else []
    sources = "".join(f"\n\n{source.rstrip()}\n" for source in copied)
    eval_note = "\nCaptured in eval mode: run it with --eval." if report.eval_mode else ""
    return _PROBLEM_TEMPLATE.format(
        path=row.path, type=row.type, model=model_file.name, share=row.share, device=report.device,
        timer=report.timer, ceiling=ceiling, eval_note=eval_note, model_file=str(model_file), seed=report.seed,
        eval_mode=report.eval_mode, imports="".join(f"{line}\n" for line in imports), sources=sources,
        rebuild=built.expression, parameters=parameters, call=call, inputs=inputs,
        positional=len(positional),
        positional_literals={i: spec.literal for i, spec in enumerate(positional) if spec.kind == "literal"},
        keyword_inputs=tuple(spec.keyword for spec in named if spec.kind == "tensor"),
        keyword_literals={spec.keyword: spec.literal for spec in named if spec.kind == "literal"},
        input_shapes=[spec.shape for spec in row.inputs if spec.kind == "tensor"])


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
    timing = time_regions(model_file, model, inputs, _every_region(model), settings.device, settings.warmup,
                          settings.runs)
    shown = shown_regions(timing, model)
    total_ms = whole_ms(timing, shown)
    rows = rank(timing, shown, total_ms)
    if not rows:
        raise CaptureError(model_file.path, "no submodule of the model ran in its forward: nothing to capture")
    report = CaptureReport(
        model=str(model_file.path), device=str(settings.device),
        timer="cuda events" if settings.device.type == "cuda" else "cpu perf_counter",
        torch_version=torch.__version__, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        seed=settings.seed, eval_mode=settings.eval_mode, warmup=settings.warmup, runs=settings.runs,
        total_ms=total_ms, rows=rows)
    _write_top(report, timing, model_file, Path(out_dir), settings.top)
    write_atomic(Path(out_dir) / "capture.json", json.dumps(asdict(report), indent=2) + "\n")
    return report


def _every_region(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every submodule at every depth, containers with members left out (their members are the regions)."""
    return _dedup([(path, module) for path, module in model.named_modules()
                   if path and not (isinstance(module, _CONTAINERS) and any(True for _ in module.children()))])


def _write_top(report: CaptureReport, timing: _Timing, model_file: ModelFile, out_dir: Path, top: int) -> None:
    """Write the `top` largest disjoint regions that can be written. A region that cannot be (a block whose
    init arguments it does not keep) leaves its place to the next largest, its own submodules included;
    those that were tried join the report's rows."""
    shown = {row.path: row for row in report.rows}
    every = rank(timing, [p.path for p in timing.probes], report.total_ms)
    written: list[str] = []
    for candidate in every:
        if len(written) == top:
            break
        if _overlaps(candidate.path, written):
            continue
        row = shown.get(candidate.path)
        if row is None:
            row = candidate
            row.in_table = False
            report.rows.append(row)
        if _write_problem(report, row, timing.probe(row.path), model_file, out_dir):
            written.append(row.path)
    report.rows.sort(key=lambda row: row.share, reverse=True)


def _write_problem(report: CaptureReport, row: RegionRow, probe: _Probe, model_file: ModelFile,
                   out_dir: Path) -> bool:
    """Write the region's problem file; False (and why, in the row) when its call cannot be replayed, it
    cannot be rebuilt from its init arguments, or the rebuilt module does not reproduce it."""
    try:
        if probe.inputs is None:
            raise _Unsupported(probe.unsupported)
        built = rebuild(probe.module, model_file.module)
        row.inputs = probe.inputs
        source = problem_source(report, row, model_file.path, built)
        _check_reproduces(source, probe, model_file.path)
    except _Unsupported as why:
        row.skipped, row.inputs = str(why), []
        return False
    target = out_dir / f"{safe_name(model_file.path, row.path)}.py"
    write_atomic(target, source)
    row.problem = str(target)
    return True


def _check_reproduces(source: str, probe: _Probe, model_file: Path) -> None:
    """Import the problem, load the region's weights into its Model, and call it on the region's first
    arguments: it must give the region's output. Raises _Unsupported with the difference otherwise."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"{model_file.stem}_region.py"
        path.write_text(source, encoding="utf-8")
        try:
            rebuilt = import_file(path, prefix="mkevolve_capture_check").Model()
        except Exception as err:  # whatever the copied code raises: the reason the region is skipped
            raise _Unsupported(f"the rebuilt region cannot be built: {type(err).__name__}: {err}") from None
    device = next(iter(probe.module.state_dict().values()), torch.empty(0)).device
    rebuilt = rebuilt.to(device).train(probe.module.training)
    try:
        rebuilt.region.load_state_dict(probe.module.state_dict())
        with torch.no_grad():
            kwargs = {name: value.clone() if isinstance(value, torch.Tensor) else value
                      for name, value in probe.kwargs.items()}
            expected = probe.module(*clone_values(probe.args), **kwargs)
            got = rebuilt(*clone_values(probe.tensors()))
    except Exception as err:
        raise _Unsupported(f"the rebuilt region fails: {type(err).__name__}: {err}") from None
    others = sorted({type(leaf).__name__ for leaf in flatten_outputs(expected) if not isinstance(leaf, torch.Tensor)})
    if others or isinstance(expected, Mapping):
        holding = f" holding {', '.join(others)}" if others else ""
        raise _Unsupported(f"it returns a {type(expected).__name__}{holding}; a problem's forward returns tensors")
    if not same_outputs(flatten_outputs(expected), flatten_outputs(got), TOLERANCE):
        raise _Unsupported("the module rebuilt from its init arguments computes something else")


def _table(report: CaptureReport) -> Table:
    table = Table(title=f"regions of {Path(report.model).name} by share of {report.total_ms:.3f} ms "
                        f"on {report.device} ({report.timer})")
    for name, justify in [("#", "right"), ("region", "left"), ("type", "left"), ("calls", "right"),
                          ("ms", "right"), ("share", "right"), ("ceiling", "right"), ("problem", "left")]:
        table.add_column(name, justify=justify)
    for i, row in enumerate(report.rows, 1):
        ceiling = "inf" if row.ceiling is None else f"{row.ceiling:.2f}x"
        written = Path(row.problem).name if row.problem else (f"skipped: {row.skipped}" if row.skipped else "")
        table.add_row(str(i), row.path, row.type, str(row.calls), f"{row.ms:.3f}", f"{row.share:.1%}", ceiling,
                      written)
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
    console.print(_table(report))
    outside = report.total_ms - sum(row.ms for row in report.rows if row.in_table)
    console.print(f"outside the regions (the model's own code between them): {max(outside, 0.0):.3f} ms")
    if report.device == "cpu":
        console.print("times are CPU times (no GPU here): shares on a GPU will differ")
    for row in report.rows:
        if row.skipped:
            console.print(f"skipped {row.path}: {row.skipped}")
    console.print(f"wrote {out_dir / 'capture.json'} and {sum(1 for r in report.rows if r.problem)} problem file(s) "
                  f"in {out_dir}; run one with: python -m mkevolve run FILE")
    return ExitCode.OK
