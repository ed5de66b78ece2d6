"""How the original was built: a profiler hook records each torch.nn layer's constructor arguments, which
tensors the top module creates itself, and which constructions draw random numbers, in order; a line tracer
on the top module's __init__ places its own statements in that order."""

from __future__ import annotations

import inspect
import itertools
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import nn

from mkevolve.builtin import expansions
from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.problem import seed_everything


class OwnerKind(str, Enum):
    LEAF = "leaf"      # a torch.nn layer of the module, by its path ("blocks.0.linear")
    RAW = "raw"        # a parameter, buffer or plain tensor of the module itself, by its name


@dataclass(frozen=True, order=True)
class Owner:
    """What a unit's tensors belong to, and so what a subproblem must build to have them."""

    kind: OwnerKind
    name: str

    @classmethod
    def leaf(cls, path: str) -> "Owner":
        return cls(OwnerKind.LEAF, path)

    @classmethod
    def raw(cls, name: str) -> "Owner":
        return cls(OwnerKind.RAW, name)

    @property
    def is_leaf(self) -> bool:
        return self.kind is OwnerKind.LEAF


@dataclass
class LeafRecord:
    """A torch.nn layer of the original, with the arguments its constructor received."""

    path: str
    cls: type
    arguments: list[tuple[str, Any, Any]]   # (parameter name, value, default or inspect.Parameter.empty)
    order: int
    draws_random: bool
    stateless: bool = False   # no parameters or buffers: every subproblem that calls it may build its own
    expressions: dict[str, str] = field(default_factory=dict)  # argument -> source in the top-level's terms


@dataclass
class RawRecord:
    """A parameter or buffer the top module creates itself, with the statements that create it."""

    name: str
    statements: list[str]
    free_names: list[str]
    order: int
    draws_random: bool
    local: str = ""   # its name inside the module that creates it ("bias" for "attn.bias")

    def __post_init__(self):
        self.local = self.local or self.name


@dataclass
class RootLines:
    """The top module's __init__ line by line: when each line first ran, in the order of the construction events,
    and which lines drew random numbers. A statement that changes layers after they are built (a custom init)
    keeps its place among the random draws this way."""

    first_order: dict[int, int] = field(default_factory=dict)   # line number -> order
    drawing: set[int] = field(default_factory=set)

    def order(self, first: int, last: int) -> int | None:
        """When the statement on lines first..last started; None where it never ran."""
        return min((o for line, o in self.first_order.items() if first <= line <= last), default=None)

    def draws(self, first: int, last: int) -> bool:
        return any(first <= line <= last for line in self.drawing)


@dataclass
class Construction:
    root_arguments: dict[str, Any]
    leaves: dict[str, LeafRecord]
    raw_order: dict[str, tuple[int, bool]]   # qualified name ("bias", "attn.bias") -> (order, draws)
    module_arguments: dict[str, dict[str, Any]] = field(default_factory=dict)  # user submodule path -> its init args
    root_lines: RootLines = field(default_factory=RootLines)


def record_construction(model_cls: type, init_args: list) -> tuple[nn.Module, Construction]:
    """Build the module with a profiler that sees every module constructor and the top module's setattr."""
    counter = itertools.count()
    open_frames: dict[int, tuple[nn.Module, Any, list, torch.Tensor]] = {}
    finished: list[tuple[nn.Module, Any, list, int, bool]] = []
    seen: set[int] = set()
    root_box: dict[str, Any] = {}
    raw_events: dict[tuple[int, str], tuple[int, bool]] = {}
    last_state = [torch.random.get_rng_state()]
    lines = _LineRecorder(model_cls, counter)

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_name == "__init__" and code.co_argcount:
            obj = frame.f_locals.get(code.co_varnames[0])
            if isinstance(obj, nn.Module) and id(obj) not in seen:
                seen.add(id(obj))
                root_box.setdefault("root", obj)
                state = torch.random.get_rng_state()
                open_frames[id(frame)] = (obj, code, _frame_arguments(frame), state)
        elif event == "return" and id(frame) in open_frames:
            obj, code, arguments, before = open_frames.pop(id(frame))
            after = torch.random.get_rng_state()
            finished.append((obj, code, arguments, next(counter), not torch.equal(before, after)))
            last_state[0] = after
        elif event == "call" and code.co_name in ("__setattr__", "register_buffer", "register_parameter"):
            _note_raw(frame, root_box.get("root"), raw_events, counter, last_state)

    with torch.random.fork_rng(devices=[]):
        seed_everything(0)
        previous, previous_trace = sys.getprofile(), sys.gettrace()
        sys.setprofile(profile)
        sys.settrace(lines.call)
        try:
            model = model_cls(*init_args)
        except Exception as err:  # noqa: BLE001  (the user's constructor: any failure leaves nothing to trace)
            raise UnsupportedModule(f"Model(*get_init_inputs()) raised {type(err).__name__}: {err}") from None
        finally:
            sys.settrace(previous_trace)
            sys.setprofile(previous)
    construction = _construction(model, finished, raw_events)
    construction.root_lines = lines.recorded
    return model, construction


class _LineRecorder:
    """A trace function that follows the lines of the top module's __init__ only (every other frame runs
    untraced), taking orders from the same counter as the construction events."""

    def __init__(self, model_cls: type, counter):
        self.model_cls = model_cls
        self.counter = counter
        self.recorded = RootLines()
        self.root_frame = None
        self.last: tuple[int, torch.Tensor] | None = None   # the line running now, and the RNG state it began with

    def call(self, frame, event, arg):
        code = frame.f_code
        if (self.root_frame is None and code.co_name == "__init__" and code.co_argcount
                and isinstance(frame.f_locals.get(code.co_varnames[0]), self.model_cls)):
            self.root_frame = frame
            return self.line
        return None

    def line(self, frame, event, arg):
        if event in ("line", "return"):
            state = torch.random.get_rng_state()
            if self.last is not None and not torch.equal(state, self.last[1]):
                self.recorded.drawing.add(self.last[0])
            self.last = (frame.f_lineno, state)
            if event == "line" and frame.f_lineno not in self.recorded.first_order:
                self.recorded.first_order[frame.f_lineno] = next(self.counter)
        return self.line


def _frame_arguments(frame) -> list[tuple[str, Any]]:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:count])
    if code.co_flags & 0x04:  # *args
        names.append(code.co_varnames[count])
        count += 1
    if code.co_flags & 0x08:  # **kwargs
        names.append(code.co_varnames[count])
    return [(n, frame.f_locals.get(n)) for n in names[1:]]


def _note_raw(frame, root, raw_events, counter, last_state) -> None:
    locals_ = frame.f_locals
    owner = locals_.get("self")
    # The top module's and the user's own submodules' tensors; torch.nn layers are rebuilt by constructor.
    if root is None or not isinstance(owner, nn.Module) or (owner is not root and is_torch_layer(owner)):
        return
    name = locals_.get("name")
    value = locals_.get("value", locals_.get("tensor", locals_.get("param")))
    if isinstance(name, str) and isinstance(value, torch.Tensor) and (id(owner), name) not in raw_events:
        state = torch.random.get_rng_state()
        raw_events[(id(owner), name)] = (next(counter), not torch.equal(state, last_state[0]))
        last_state[0] = state


def layer_paths(model: nn.Module) -> set[str]:
    """Paths of the outermost torch.nn layers: the leaves a subproblem rebuilds by constructor."""
    layers = {p for p, m in model.named_modules() if p and is_torch_layer(m)}
    return {p for p in layers if not any(p.startswith(q + ".") for q in layers)}


def _construction(model: nn.Module, finished, raw_events) -> Construction:
    paths = {id(m): p for p, m in model.named_modules()}
    layers = layer_paths(model)
    leaves, root_arguments, module_arguments = {}, {}, {}
    for obj, code, arguments, order, draws in finished:
        path = paths.get(id(obj))
        if obj is model:
            root_arguments = dict(arguments)
            continue
        if path is not None and not is_torch_layer(obj):
            module_arguments[path] = dict(arguments)
        if path not in layers:
            continue
        if isinstance(obj, nn.RNNBase):
            recorded = _rnn_arguments(obj)
        else:
            recorded = _with_defaults(_init_function(type(obj), code), arguments)
        stateless = next(obj.parameters(), None) is None and next(obj.buffers(), None) is None
        leaves[path] = LeafRecord(path, type(obj), recorded, order, draws, stateless and not draws)
    raw_order = {}
    for (owner, name), event in raw_events.items():
        if owner in paths:
            raw_order[f"{paths[owner]}.{name}" if paths[owner] else name] = event
    return Construction(root_arguments, leaves, raw_order, module_arguments)


def _rnn_arguments(layer: nn.RNNBase) -> list[tuple[str, Any, Any]]:
    """nn.RNN/LSTM/GRU take (*args, **kwargs), so their frame says nothing by name; every setting is an
    attribute of the built layer, and RNNBase's signature gives the defaults."""
    params = inspect.signature(nn.RNNBase.__init__).parameters
    names = ["input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional"]
    if isinstance(layer, nn.LSTM):
        names.append("proj_size")
    result = [(name, getattr(layer, name), params[name].default) for name in names]
    if isinstance(layer, nn.RNN):
        result.insert(3, ("nonlinearity", layer.nonlinearity, "tanh"))
    return result


def _init_function(cls: type, code):
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if getattr(init, "__code__", None) is code:
            return init
    return None


def _with_defaults(function, arguments: list[tuple[str, Any]]) -> list[tuple[str, Any, Any]]:
    params = inspect.signature(function).parameters if function is not None else {}
    result = []
    for name, value in arguments:
        param = params.get(name)
        default = param.default if param is not None else inspect.Parameter.empty
        if param is not None and param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            if value:
                raise UnsupportedModule(f"a layer takes *args/**kwargs ({name}); cannot rebuild it")
            continue
        result.append((name, value, default))
    return result


def plain_tensor_attributes(model: nn.Module) -> set[str]:
    """Tensors the top module holds as plain attributes (`self.hidden = torch.randn(...)`): state it
    creates in __init__ like a buffer, rebuilt by the same statements."""
    return {name for name, value in vars(model).items() if isinstance(value, torch.Tensor)}


def is_torch_layer(module: nn.Module) -> bool:
    # An expanded transformer layer is traced through like a container: its children are the layers.
    return (type(module).__module__.startswith("torch.nn")
            and not isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict, *expansions.CONTAINERS)))
