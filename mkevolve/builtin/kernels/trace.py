"""Trace a problem's Model into one fx graph per module mode, with tensor shapes for every input config."""

from __future__ import annotations

import contextlib
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from mkevolve.problem import InputConfig, Problem, call_inputs, seed_everything
from mkevolve.text import first_line
from mkevolve.workers import background

from .errors import UnsupportedSubproblem

MODES = ("train", "eval")
INDEX_DTYPES = (torch.int64, torch.int32)      # indices, or numbers a kernel converts to float32; never a result


class TaggedFloat(float):
    """A float module attribute that remembers its path, so the forward can read it at run time."""

    attr: str

    def __new__(cls, value: float, attr: str):
        obj = super().__new__(cls, value)
        obj.attr = attr
        return obj


class TaggedInt(int):
    attr: str

    def __new__(cls, value: int, attr: str):
        obj = super().__new__(cls, value)
        obj.attr = attr
        return obj


@dataclass
class ConfigTrace:
    """One input config traced: the model instance (meta tensors), its graph, and every node's result shape."""

    model: nn.Module
    graph_module: fx.GraphModule
    shapes: dict[str, Any]                 # node name -> torch.Size, a nested tuple of them, or None
    dtypes: dict[str, Any]


@dataclass
class Trace:
    """The same forward traced under every input config; node i of one config is node i of every other."""

    kind: str                              # "fx" or "export"
    mode: str                              # "train" or "eval"
    configs: list[ConfigTrace]
    placeholder_params: dict[str, str] = field(default_factory=dict)   # export: placeholder -> fqn
    placeholder_inputs: list[str] = field(default_factory=list)        # placeholders that are forward args
    user_output_indices: list[int] = field(default_factory=list)       # export: which outputs are the user's
    out_spec: Any = None                                               # export: the pytree of the user outputs

    @property
    def graph(self) -> fx.Graph:
        return self.configs[0].graph_module.graph

    def nodes(self, config: int) -> list[fx.Node]:
        return list(self.configs[config].graph_module.graph.nodes)


_warm_up_started = threading.Event()


def warm_up_in_background() -> None:
    """Once per process, in a thread: a tiny Linear traced and shape-propagated on the meta device. The first
    meta propagation imports what torch's meta kernels need (about 900 modules, 2.5 s on 2 cores); the
    builtin agent's worker starts this after its first reply (a decomposition, which the run then checks for
    seconds), so that its first kernel reply does not wait for those imports."""
    if _warm_up_started.is_set():
        return
    _warm_up_started.set()

    def trace_tiny_linear() -> None:
        with torch.device("meta"):
            model, inputs = nn.Linear(4, 4), torch.empty(2, 4)
        ShapeProp(fx.symbolic_trace(model)).propagate(inputs)

    background.import_in_background("meta-trace-warm-up", trace_tiny_linear)   # the next job waits for it


def trace_problem(problem: Problem) -> dict[str, Trace]:
    """Trace in training and in eval mode; each mode's graph must be identical across input configs."""
    built = [_build(problem, config) for config in problem.configs]
    return {mode: _trace_mode(problem, built, mode) for mode in MODES}


@dataclass
class _Built:
    model: nn.Module
    inputs: list


def _build(problem: Problem, config: InputConfig) -> _Built:
    """Model and inputs on the meta device: shapes without memory, whatever the problem's sizes."""
    init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
    for attempt in (_meta_device, contextlib.nullcontext):
        try:
            with attempt():
                seed_everything(0)
                model = problem.model_cls(*init)
                inputs = call_inputs(problem.path, config.get_inputs, "get_inputs")
            break
        except Exception as err:  # the meta device is only an optimisation: retry for real
            failure = err
    else:
        raise UnsupportedSubproblem(f"could not build Model and inputs: {type(failure).__name__}: {failure}")
    for i, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            raise UnsupportedSubproblem(f"forward input {i} is a {type(value).__name__}, not a tensor")
        if value.dtype not in (torch.float32, torch.bool, *INDEX_DTYPES):
            raise UnsupportedSubproblem(f"forward input {i} has dtype {value.dtype}; only float32 (and bool "
                                        "masks and integer indices) are supported")
    _tag_scalar_attributes(model, type(model).__module__)
    return _Built(model, inputs)


def _meta_device():
    return torch.device("meta")


def _tag_scalar_attributes(model: nn.Module, problem_module: str) -> None:
    """Number attributes of the problem's own modules become tagged, so traced constants keep their origin."""
    for path, module in model.named_modules():
        if type(module).__module__ != problem_module:
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("_") or isinstance(value, bool):
                continue
            attr = f"{path}.{name}" if path else name
            if type(value) is float:
                setattr(module, name, TaggedFloat(value, attr))
            elif type(value) is int:
                setattr(module, name, TaggedInt(value, attr))


FX_CONSTANT = "_tensor_constant"   # prefix of fx's own attributes for constants met in forward


@contextlib.contextmanager
def _state_kept(models: list[nn.Module]):
    """Restores every module's attributes after a trace, and refuses a forward that assigns a tensor attribute
    (VanillaRNN's `self.hidden = self.tanh(...)`): the graph does not record the assignment, so a kernel would
    silently drop that state, and the tracer's proxy left behind would break the next trace."""
    saved = [(module, dict(vars(module)), dict(module._parameters), dict(module._buffers))
             for model in models for module in model.modules()]
    try:
        yield
    finally:
        assigned = sorted({name for module, attributes, _, _ in saved for name, value in vars(module).items()
                           if isinstance(value, (torch.Tensor, fx.Proxy)) and value is not attributes.get(name)
                           and not name.startswith(FX_CONSTANT)})
        for module, attributes, parameters, buffers in saved:
            for live, kept in ((vars(module), attributes), (module._parameters, parameters),
                               (module._buffers, buffers)):
                live.clear()
                live.update(kept)
    if assigned:
        raise UnsupportedSubproblem(f"Model.forward assigns module state ({', '.join(f'self.{n}' for n in assigned)}"
                                    " = a tensor), which a kernel cannot write; update it in place with copy_")


def _refuse_defaults_taken(built: list[_Built]) -> None:
    """A forward parameter that get_inputs does not give (`h0=None`) takes its default in the reference, and a
    kernel traced without it would be specialised to that default, yet called through a signature that requires
    it: refused, naming the parameters."""
    for b in built:
        names = [p.name for p in inspect.signature(b.model.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(b.inputs) < len(names):
            raise UnsupportedSubproblem(f"Model.forward's {', '.join(names[len(b.inputs):])} are not given by "
                                        "get_inputs (their defaults are used): give every argument in get_inputs")


def _trace_mode(problem: Problem, built: list[_Built], mode: str) -> Trace:
    models = [b.model for b in built]
    _refuse_defaults_taken(built)
    for model in models:
        model.train(mode == "train")
    try:
        with _state_kept(models):
            configs = [_fx_trace(b) for b in built]
        trace = Trace("fx", mode, configs, placeholder_inputs=_placeholders(configs[0]))
    except Exception as fx_err:  # fx fails on shape-dependent Python; export next
        try:
            with _state_kept(models):
                trace = _export_trace(built, mode)
        except Exception as export_err:  # both tracers failed: report both reasons
            raise UnsupportedSubproblem(
                f"cannot trace Model: torch.fx said {type(fx_err).__name__}: {first_line(str(fx_err))}; "
                f"torch.export said {type(export_err).__name__}: {first_line(str(export_err))}") from None
    _check_same_graph(trace)
    return trace


def _placeholders(config: ConfigTrace) -> list[str]:
    return [n.name for n in config.graph_module.graph.nodes if n.op == "placeholder"]


def _fx_trace(b: _Built) -> ConfigTrace:
    signature = inspect.signature(b.model.forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()):
        raise UnsupportedSubproblem("Model.forward takes *args or **kwargs")
    graph_module = fx.GraphModule(b.model, _BufferTracer().trace(b.model))
    _refuse_constant_tensors(graph_module)
    ShapeProp(graph_module).propagate(*b.inputs)
    shapes, dtypes = {}, {}
    for node in graph_module.graph.nodes:
        meta = node.meta.get("tensor_meta")
        shapes[node.name] = _map_meta(meta, lambda m: tuple(m.shape))
        dtypes[node.name] = _map_meta(meta, lambda m: m.dtype)
    return ConfigTrace(b.model, graph_module, shapes, dtypes)


def _refuse_constant_tensors(graph_module: fx.GraphModule) -> None:
    """A tensor of more than one number that forward builds from constants alone (`torch.ones(8, 8).tril()`)
    is traced into the graph as a constant, on the CPU beside meta inputs; only one-number constants are
    inlined (lower.py), so say what to do instead of failing on the devices."""
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and node.target.startswith(FX_CONSTANT):
            tensor = getattr(graph_module, node.target)
            if isinstance(tensor, torch.Tensor) and tensor.numel() > 1:
                raise UnsupportedSubproblem(
                    f"forward builds a {list(tensor.shape)} tensor from constants alone (a mask or table); "
                    "register it as a buffer in __init__")


class _BufferTracer(fx.Tracer):
    """Buffers become graph inputs like parameters: a mask computed from one in forward (`self.bias == 0`)
    stays an operation the kernel can fuse, instead of a constant tensor baked in at trace time."""

    proxy_buffer_attributes = True


def _map_meta(meta, fn):
    if isinstance(meta, TensorMetadata):
        return fn(meta)
    if isinstance(meta, (tuple, list)):
        return tuple(_map_meta(m, fn) for m in meta)
    return None


def _export_trace(built: list[_Built], mode: str) -> Trace:
    configs, params, user_inputs = [], {}, []
    for b in built:
        program = torch.export.export(b.model, tuple(b.inputs))
        params, user_inputs = {}, []
        for spec in program.graph_signature.input_specs:
            kind = spec.kind.name
            if kind in ("PARAMETER", "BUFFER"):
                params[spec.arg.name] = spec.target
            elif kind == "USER_INPUT":
                user_inputs.append(spec.arg.name)
            else:
                raise UnsupportedSubproblem(f"exported graph has a {kind.lower()} input ({spec.arg.name})")
        graph_module = program.graph_module
        shapes, dtypes = {}, {}
        for node in graph_module.graph.nodes:
            val = node.meta.get("val")
            shapes[node.name] = _map_val(val, lambda t: tuple(int(s) for s in t.shape))
            dtypes[node.name] = _map_val(val, lambda t: t.dtype)
        configs.append(ConfigTrace(b.model, graph_module, shapes, dtypes))
        outputs = [i for i, spec in enumerate(program.graph_signature.output_specs)
                   if spec.kind.name == "USER_OUTPUT"]
        out_spec = program.call_spec.out_spec
    return Trace("export", mode, configs, placeholder_params=params, placeholder_inputs=user_inputs,
                 user_output_indices=outputs, out_spec=out_spec)


def _map_val(val, fn):
    if isinstance(val, torch.Tensor):
        return fn(val)
    if isinstance(val, (tuple, list)):
        return tuple(_map_val(v, fn) for v in val)
    return None


def _check_same_graph(trace: Trace) -> None:
    reference = _structure(trace.configs[0].graph_module.graph)
    for c, config in enumerate(trace.configs[1:], start=1):
        other = _structure(config.graph_module.graph)
        if len(other) != len(reference):
            raise UnsupportedSubproblem(f"input config {c} traces to a graph of {len(other)} nodes, "
                                        f"config 0 to {len(reference)}")
        for i, (a, b) in enumerate(zip(reference, other)):
            if a != b:
                raise UnsupportedSubproblem(f"input configs 0 and {c} trace to different graphs at node {i} "
                                            f"({a[0]} {a[1]}): a constant or the control flow depends on "
                                            "the config")


def _structure(graph: fx.Graph) -> list[tuple]:
    index = {node: i for i, node in enumerate(graph.nodes)}

    def canon(value):
        if isinstance(value, fx.Node):
            return ("node", index[value])
        if isinstance(value, (TaggedFloat, TaggedInt)):
            return ("attr", value.attr)
        if isinstance(value, (tuple, list)):
            return tuple(canon(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, canon(v)) for k, v in value.items()))
        return ("const", repr(value))

    return [(n.op, str(n.target), canon(n.args), canon(n.kwargs)) for n in graph.nodes]
