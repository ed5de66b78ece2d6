"""The builtin decomposer: traces a module, cuts its graph at fusion blockers and writes the subproblem files.

It answers Decompose, Split, Fuse and TotalFuse without an LLM, in the same `### FILE:` reply format a model
uses, so its output goes through the same parsing and checks. A decomposition it wrote records its cut
points in the top-level's docstring; Split and Fuse start from them.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import inspect
import itertools
import keyword
import math
import operator
import re
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from mkevolve.codebase import PROBLEM_FILE, PROBLEMS_DIR, ProblemSkeleton, class_alias, safe_name, wrap_original
from mkevolve.llm.builtin import expansions
from mkevolve.problem import ProblemError, call_inputs, load_problem, make_inputs, read_source, seed_everything
from mkevolve.pysource import parse_python


class UnsupportedModule(Exception):
    """The builtin decomposer cannot handle this module or request; the message says what stops it."""


# ---- Operation kinds --------------------------------------------------------------------------------


class Kind(Enum):
    ANCHOR = "anchor"          # GEMM, convolution, normalisation: starts a group
    REDUCTION = "reduction"    # closes the group it ends
    POINTWISE = "pointwise"    # joins the open group as an epilogue
    VIEW = "view"              # joins the open group; does no arithmetic


_ANCHORS = {
    "linear", "bilinear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "conv1d", "conv2d",
    "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convtranspose1d", "convtranspose2d",
    "convtranspose3d", "convolution", "_convolution", "batchnorm1d", "batchnorm2d", "batchnorm3d",
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "layernorm", "layer_norm", "native_layer_norm", "groupnorm", "group_norm", "native_group_norm",
    "instancenorm1d", "instancenorm2d", "instancenorm3d", "instance_norm", "rmsnorm", "rms_norm",
    "localresponsenorm", "local_response_norm", "embedding", "multiheadattention",
    "scaled_dot_product_attention", "lstm", "gru", "rnn",
}
# Anchors the builtin kernels fuse an elementwise epilogue into (GEMM, convolution and row-kernel templates).
_EPILOGUE_ANCHORS = {
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convtranspose1d", "convtranspose2d", "convtranspose3d",
    "convolution", "_convolution", "layernorm", "layer_norm", "groupnorm", "group_norm", "rmsnorm", "rms_norm",
    "batchnorm1d", "batchnorm2d", "batchnorm3d", "batch_norm", "instancenorm1d", "instancenorm2d",
    "instancenorm3d", "instance_norm",
}
_REDUCTIONS = {
    "sum", "mean", "amax", "amin", "prod", "logsumexp", "softmax", "_softmax", "log_softmax", "_log_softmax",
    "softmin", "logsoftmax", "softmax2d", "norm", "linalg_vector_norm", "var", "std", "var_mean", "std_mean",
    "cumsum", "cumprod", "argmax", "argmin", "all", "any", "max_pool1d", "max_pool2d", "max_pool3d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "maxpool1d", "maxpool2d", "maxpool3d", "avgpool1d", "avgpool2d", "avgpool3d",
    "adaptiveavgpool1d", "adaptiveavgpool2d", "adaptiveavgpool3d", "adaptivemaxpool1d", "adaptivemaxpool2d",
    "adaptivemaxpool3d", "lppool1d", "lppool2d", "normalize",
}
_VIEWS = {
    "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "squeeze", "unsqueeze",
    "contiguous", "expand", "expand_as", "view_as", "reshape_as", "getitem", "chunk", "split", "unbind",
    "narrow", "select", "slice", "clone", "alias", "detach", "_unsafe_view", "identity", "movedim",
    "split_with_sizes", "getattr",
}
# Views with no side effects: a subproblem that needs one recomputes it from its base tensor.
_PURE_VIEWS = {
    "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand",
    "expand_as", "view_as", "reshape_as", "getitem", "chunk", "split", "unbind", "narrow", "select", "slice",
    "_unsafe_view", "movedim", "alias", "split_with_sizes", "getattr",
}
# Reductions that take a second tensor are elementwise (torch.max(a, b)).
_BINARY_WHEN_TWO_TENSORS = {"max", "min"}

_INFIX = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
          operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
          operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.lshift: "<<",
          operator.rshift: ">>", operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=",
          operator.gt: ">", operator.ge: ">="}
_PREFIX = {operator.neg: "-", operator.pos: "+", operator.invert: "~", operator.not_: "not "}
_RESERVED = {"self", "torch", "nn", "F", "math", "operator", "super", "x"} | set(dir(builtins))


# ---- What the original builds: constructor records -------------------------------------------------


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
class Construction:
    root_arguments: dict[str, Any]
    leaves: dict[str, LeafRecord]
    raw_order: dict[str, tuple[int, bool]]   # qualified name ("bias", "attn.bias") -> (order, draws)
    module_arguments: dict[str, dict[str, Any]] = field(default_factory=dict)  # user submodule path -> its init args


def _record_construction(model_cls: type, init_args: list) -> tuple[nn.Module, Construction]:
    """Build the module with a profiler that sees every module constructor and the top module's setattr."""
    counter = itertools.count()
    open_frames: dict[int, tuple[nn.Module, Any, list, torch.Tensor]] = {}
    finished: list[tuple[nn.Module, Any, list, int, bool]] = []
    seen: set[int] = set()
    root_box: dict[str, Any] = {}
    raw_events: dict[tuple[int, str], tuple[int, bool]] = {}
    last_state = [torch.random.get_rng_state()]

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
        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            model = model_cls(*init_args)
        except Exception as err:  # noqa: BLE001  (the user's constructor: any failure leaves nothing to trace)
            raise UnsupportedModule(f"Model(*get_init_inputs()) raised {type(err).__name__}: {err}") from None
        finally:
            sys.setprofile(previous)
    return model, _construction(model, finished, raw_events)


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
    if root is None or not isinstance(owner, nn.Module) or (owner is not root and _is_torch_layer(owner)):
        return
    name = locals_.get("name")
    value = locals_.get("value", locals_.get("tensor", locals_.get("param")))
    if isinstance(name, str) and isinstance(value, torch.Tensor) and (id(owner), name) not in raw_events:
        state = torch.random.get_rng_state()
        raw_events[(id(owner), name)] = (next(counter), not torch.equal(state, last_state[0]))
        last_state[0] = state


def layer_paths(model: nn.Module) -> set[str]:
    """Paths of the outermost torch.nn layers: the leaves a subproblem rebuilds by constructor."""
    layers = {p for p, m in model.named_modules() if p and _is_torch_layer(m)}
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
        if path is not None and not _is_torch_layer(obj):
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


# ---- The original's __init__ source: raw parameters and argument expressions ------------------------


@dataclass
class InitSource:
    """The top module's __init__ as statements, for slicing out what creates one parameter."""

    statements: list[ast.stmt]
    arg_names: set[str]
    module_globals: dict[str, Any]

    @classmethod
    def of(cls, source: str, module_globals: dict[str, Any], class_name: str = "Model") -> InitSource:
        tree = parse_python(source)
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
        init = next((n for n in (model.body if model else []) if isinstance(n, ast.FunctionDef)
                     and n.name == "__init__"), None)
        if init is None:
            return cls([], set(), module_globals)
        args = init.args
        names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        return cls(list(init.body), names - {"self"}, module_globals)

    def raw_statements(self, name: str) -> tuple[list[str], list[str]]:
        """The statements that create self.<name> (its inputs, its definition, in-place inits after it)
        and the free names they need."""
        index = self._definition(name)
        if index is None:
            raise UnsupportedModule(f"cannot find the statement that creates self.{name} in Model.__init__")
        chosen = {index}
        pending = list(_loaded_names(self.statements[index]))
        while pending:
            needed = pending.pop()
            for j in range(index - 1, -1, -1):
                if j not in chosen and needed in _assigned_names(self.statements[j]):
                    chosen.add(j)
                    pending += _loaded_names(self.statements[j])
                    break
        for j in range(index + 1, len(self.statements)):
            stmt = self.statements[j]
            if isinstance(stmt, ast.Expr) and _self_attributes(stmt) == {name}:
                chosen.add(j)
        picked = [self.statements[j] for j in sorted(chosen)]
        if any(_self_attributes(s) - {name} for s in picked):
            raise UnsupportedModule(f"self.{name} is created from other attributes of the module")
        assigned = set().union(*(_assigned_names(s) for s in picked))
        free = [n for n in dict.fromkeys(n for s in picked for n in _loaded_names(s))
                if n not in assigned and n != "self"]
        return [ast.unparse(s) for s in picked], free

    def _definition(self, name: str) -> int | None:
        found = None
        for i, stmt in enumerate(self.statements):
            if isinstance(stmt, ast.Assign) and any(_is_self_attr(t, name) for t in stmt.targets) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                  and isinstance(stmt.value.func, ast.Attribute)
                  and stmt.value.func.attr in ("register_buffer", "register_parameter")
                  and stmt.value.args and isinstance(stmt.value.args[0], ast.Constant)
                  and stmt.value.args[0].value == name):
                found = i
        return found

    def leaf_expressions(self, leaf: LeafRecord, root_arguments: dict[str, Any]) -> dict[str, str]:
        """Constructor arguments of a layer made by `self.<attr> = Layer(...)`, as expressions over the
        top module's arguments and module constants, where they evaluate to what the layer received."""
        call = self._constructor_call(leaf.path)
        if call is None or any(isinstance(a, ast.Starred) for a in call.args):
            return {}
        try:
            bound = inspect.signature(leaf.cls.__init__).bind(None, *call.args,
                                                              **{k.arg: k.value for k in call.keywords if k.arg})
        except TypeError:
            return {}  # the call does not bind as written (a **kwargs spread): keep the literal values
        namespace = {name: self.module_globals[name] for name in self.literal_globals}
        namespace.update(root_arguments)
        values = {name: value for name, value, _ in leaf.arguments}
        expressions = {}
        for name, node in list(bound.arguments.items())[1:]:
            names = _loaded_names_expr(node) if isinstance(node, ast.expr) else {"*"}
            if name not in values or not names <= set(namespace):
                continue
            try:
                value = eval(compile(ast.Expression(node), "<init>", "eval"), {"__builtins__": builtins}, namespace)
            except (ArithmeticError, TypeError, ValueError, IndexError, KeyError):
                continue  # the expression needs more than sizes and constants: keep the literal value
            if _same_value(value, values[name]):
                expressions[name] = ast.unparse(node)
        return expressions

    @property
    def literal_globals(self) -> set[str]:
        return set(_constants(self.module_globals))

    def _constructor_call(self, path: str) -> ast.Call | None:
        if "." in path:
            return None
        for stmt in self.statements:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _is_self_attr(stmt.targets[0], path)
                    and isinstance(stmt.value, ast.Call)):
                return stmt.value
        return None

    def follow_ups(self) -> list[tuple[ast.stmt, set[str]]]:
        """Statements that change attributes after they are built (custom inits such as
        `nn.init.zeros_(self.fc.bias)` or `self.conv.bias = nn.Parameter(...)`), with the attributes they name."""
        found = []
        for stmt in self.statements:
            touches_inside = isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                _is_nested_self_attribute(t) for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))
            plain_call = isinstance(stmt, ast.Expr) and not (
                isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute)
                and stmt.value.func.attr in ("register_buffer", "register_parameter", "__init__"))
            if (touches_inside or plain_call) and _self_attributes(stmt):
                found.append((stmt, _self_attributes(stmt)))
        return found


def _is_nested_self_attribute(node: ast.AST) -> bool:
    """self.<a>.<b>...: an attribute of something the module holds."""
    return (isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, (ast.Attribute, ast.Subscript))
            and _root_is_self(node))


def _root_is_self(node: ast.AST) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _is_self_attr(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
            and node.value.id == "self")


def _self_attributes(stmt: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self"} - {"register_buffer", "register_parameter"}


def _assigned_names(stmt: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _loaded_names(stmt: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


def _loaded_names_expr(node: ast.AST) -> set[str]:
    return set(_loaded_names(node)) - set(dir(builtins))


# ---- Values: literals and example values --------------------------------------------------------------


def _literal(value: Any) -> str:
    """Python source for a constructor or config value; UnsupportedModule when it has none."""
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return f"float('{value}')"
    if isinstance(value, torch.Size):
        value = tuple(value)
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, torch.dtype):
        return str(value)
    raise UnsupportedModule(f"a {type(value).__name__} value cannot be written as a literal")


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return (numbers or type(a) is type(b)) and a == b


class ValueKind(Enum):
    TENSOR = "tensor"
    TENSORS = "tensors"       # a tuple or list of tensors
    OTHER = "other"           # a Python value (a size, a scale) or anything else


@dataclass(frozen=True)
class ValueInfo:
    """What a graph value was when the original ran on its own inputs."""

    kind: ValueKind
    shape: tuple = ()
    dtype: torch.dtype | None = None
    contiguous: bool = True
    nonneg: bool = False
    low: int = 0
    high: int = 1
    nbytes: int = 0
    python: Any = None

    @classmethod
    def of(cls, value: Any) -> ValueInfo:
        if isinstance(value, torch.Tensor):
            return cls._tensor(value)
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return cls(ValueKind.TENSORS)
        literal = isinstance(value, (int, float, bool, str, type(None)))
        return cls(ValueKind.OTHER, python=value if literal else None)

    @classmethod
    def _tensor(cls, t: torch.Tensor) -> ValueInfo:
        floating = t.is_floating_point()
        low = high = 0
        if not floating and t.dtype != torch.bool and t.numel():
            low, high = int(t.min()), int(t.max())
        nonneg = bool(t.numel() == 0 or (t.min() >= 0).item()) if t.dtype != torch.bool else True
        return cls(ValueKind.TENSOR, tuple(t.shape), t.dtype, t.is_contiguous(), nonneg, low, high,
                   t.numel() * t.element_size())

    def factory(self) -> str:
        """Source that makes a random input like this value (non-negative stays non-negative)."""
        if self.kind is not ValueKind.TENSOR:
            return _literal(self.python)
        shape = ", ".join(str(d) for d in self.shape)
        if self.dtype == torch.bool:
            return f"torch.rand({shape}) < 0.5"
        if self.dtype.is_floating_point:
            dtype = "" if self.dtype == torch.float32 else f", dtype={self.dtype}"
            return f"torch.{'rand' if self.nonneg else 'randn'}({shape}{dtype})"
        dtype = "" if self.dtype == torch.int64 else f", dtype={self.dtype}"
        return f"torch.randint({self.low}, {self.high + 1}, ({shape}{',' if len(self.shape) == 1 else ''}){dtype})"


# ---- Tracing ---------------------------------------------------------------------------------------------


@dataclass
class Unit:
    """One step of the forward: a layer call, or one function/method call (with its own kind)."""

    index: int
    nodes: list[fx.Node]
    label: str
    kind: Kind
    owners: set[str]          # keys of the owners it uses: "leaf:<path>" or "raw:<name>"


@dataclass
class TracedModule:
    """The original's forward as units over an fx graph, with example values and owner records."""

    problem_name: str
    source: str
    skeleton: ProblemSkeleton
    graph_module: fx.GraphModule
    values: dict[fx.Node, ValueInfo]
    units: list[Unit]
    shape_nodes: set[fx.Node]
    construction: Construction
    raws: dict[str, RawRecord]
    imports: tuple[str, ...]
    output_spec: Any
    placeholders: list[fx.Node]
    links: list[set[str]]                        # owner keys that must stay in one subproblem
    follow_ups: dict[str, list[FollowUp]]        # owner key -> statements run after it is built
    tracer: str                                  # "fx" or "export"
    constants: dict[str, Any]                    # module-level literals of the problem file
    sinkable: set[fx.Node] = field(default_factory=set)   # shape values and pure views, recomputed on demand
    tensor_constants: dict[str, torch.Tensor] = field(default_factory=dict)  # made in forward, not in __init__
    returned: list[fx.Node] = field(default_factory=list)  # nodes the forward returns

    @property
    def fingerprint(self) -> str:
        text = "|".join(f"{u.label}:{u.kind.value}" for u in self.units)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def unit_of(self) -> dict[fx.Node, int]:
        return {node: unit.index for unit in self.units for node in unit.nodes}


class _Tracer(fx.Tracer):
    """torch.nn layers are leaves; the user's own modules are traced through, and so are the attention
    layers, through the traceable rewrites in `expansions` (their own forwards have untraceable fast paths)."""

    def call_module(self, m: nn.Module, forward, args, kwargs):
        expand = expansions.EXPANSIONS.get(type(m))
        if expand is None:
            return super().call_module(m, forward, args, kwargs)
        try:
            return expand(m, *args, **kwargs)
        except NotImplementedError:
            # A variant the rewrite does not cover (a key padding mask): checked before it adds any node,
            # so the layer stays one call, a whole-layer subproblem, as without the rewrite.
            return super().call_module(m, forward, args, kwargs)


_CACHE: OrderedDict[tuple, TracedModule | UnsupportedModule] = OrderedDict()
_CACHE_SIZE = 8
_CACHE_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple, threading.Lock] = {}


def trace_problem(problem_path: str | Path, eval_mode: bool = False) -> TracedModule:
    """Trace once per (file content, mode); later calls reuse the result (or its error)."""
    path = Path(problem_path).resolve()
    source = read_source(path)
    key = (str(path), hashlib.sha256(source.encode()).hexdigest(), eval_mode)
    with _CACHE_LOCK:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
        if cached is None:
            try:
                cached = _trace(path, source, eval_mode)
            except UnsupportedModule as err:
                cached = err
            with _CACHE_LOCK:
                _CACHE[key] = cached
                while len(_CACHE) > _CACHE_SIZE:
                    _CACHE.popitem(last=False)
    if isinstance(cached, UnsupportedModule):
        raise cached
    return cached


def _trace(path: Path, source: str, eval_mode: bool) -> TracedModule:
    try:
        problem = load_problem(path)
    except ProblemError as err:
        raise UnsupportedModule(err.reason) from None
    config = problem.configs[0]
    try:
        init_args = call_inputs(path, config.get_init_inputs, "get_init_inputs")
        inputs = make_inputs(path, config, 1, torch.device("cpu"))
    except ProblemError as err:
        raise UnsupportedModule(err.reason) from None
    model, construction = _record_construction(problem.model_cls, init_args)
    model.train(not eval_mode)
    gm, tracer, output_spec = _graph(model, inputs)
    values = _propagate(gm, inputs)
    module_globals = vars(problem.module)
    init_source = InitSource.of(source, module_globals)
    for leaf in construction.leaves.values():
        leaf.expressions = init_source.leaf_expressions(leaf, construction.root_arguments)
    shape_nodes = _shape_nodes(gm, values)
    tensor_constants = _tensor_constants(gm, model)
    units = _units(gm, values, shape_nodes, model, tracer, construction, tensor_constants)
    imports = tuple(ast.unparse(n) for n in parse_python(source).body
                    if isinstance(n, (ast.Import, ast.ImportFrom)))
    constants = _constants(module_globals)
    import_names = _import_names(imports)
    raws = _raw_records(units, construction, init_source, model, constants, import_names, source)
    links, follow_ups = _links(init_source, model, construction, constants, import_names)
    return TracedModule(
        problem_name=path.stem, source=source, skeleton=ProblemSkeleton.from_source(path.stem, source),
        graph_module=gm, values=values, units=units, shape_nodes=shape_nodes, construction=construction,
        raws=raws, imports=imports, output_spec=output_spec,
        placeholders=[n for n in gm.graph.nodes if n.op == "placeholder"], links=links, follow_ups=follow_ups,
        tracer=tracer, constants=constants, sinkable=shape_nodes | _pure_views(units, values),
        returned=_returned(gm), tensor_constants=tensor_constants)


def _graph(model: nn.Module, inputs: list) -> tuple[fx.GraphModule, str, Any]:
    """fx symbolic tracing, or torch.export with the problem's shapes where symbolic tracing fails."""
    # Tracing runs the user's forward on proxies; what it raises varies (TraceError, TypeError, guard errors),
    # and every failure means the same: try the next tracer, then give up with both reasons.
    try:
        with expansions.expanded_sdpa(), _attributes_kept(model):
            graph = _Tracer().trace(model)
        return fx.GraphModule(model, graph), "fx", None
    except Exception as fx_error:  # noqa: BLE001
        try:
            exported = torch.export.export(model, tuple(inputs), strict=False)
        except Exception as export_error:  # noqa: BLE001
            raise UnsupportedModule(f"neither torch.fx ({type(fx_error).__name__}: {fx_error}) nor torch.export "
                                    f"({type(export_error).__name__}) can trace the module") from None
    gm = exported.module()
    for node in list(gm.graph.nodes):
        if _is_guard(node) and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm, "export", exported.call_spec.out_spec


@contextlib.contextmanager
def _attributes_kept(model: nn.Module):
    """A forward that stores state (`self.hidden = ...`) would leave proxies in the model while it is traced;
    put every module's plain attributes back afterwards. What the tracer itself adds (`_tensor_constant0`,
    which the graph reads) stays."""
    saved = [(m, dict(vars(m))) for m in model.modules()]
    try:
        yield
    finally:
        for module, attributes in saved:
            for name in [n for n, v in vars(module).items() if n not in attributes and isinstance(v, fx.Proxy)]:
                delattr(module, name)
            vars(module).update(attributes)


def plain_tensor_attributes(model: nn.Module) -> set[str]:
    """Tensors the top module holds as plain attributes (`self.hidden = torch.randn(...)`): state it
    creates in __init__ like a buffer, rebuilt by the same statements."""
    return {name for name, value in vars(model).items() if isinstance(value, torch.Tensor)}


def _is_guard(node: fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return node.op in ("call_module", "call_function") and (
        "guards" in str(name) or "_assert" in str(name) or "sym_constrain" in str(name))


def _propagate(gm: fx.GraphModule, inputs: list) -> dict[fx.Node, ValueInfo]:
    values: dict[fx.Node, ValueInfo] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            values[node] = ValueInfo.of(result)
            return result

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        seed_everything(0)
        try:
            Recorder(gm).run(*inputs)
        except Exception as err:  # noqa: BLE001  (the user's forward on a traced graph)
            raise UnsupportedModule(f"the traced graph does not run: {type(err).__name__}: {err}") from None
    return values


_METADATA_METHODS = {"size", "dim", "numel", "ndimension", "nelement"}
_METADATA_ATTRIBUTES = {"shape", "ndim", "dtype", "device", "is_cuda"}


def _shape_nodes(gm: fx.GraphModule, values: dict[fx.Node, ValueInfo]) -> set[fx.Node]:
    """Nodes that compute Python values from tensor metadata; each subproblem that needs one recomputes it."""
    found: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or node not in values \
                or values[node].kind is not ValueKind.OTHER:
            continue
        metadata = (node.op == "call_method" and node.target in _METADATA_METHODS) or (
            node.target is getattr and len(node.args) > 1 and node.args[1] in _METADATA_ATTRIBUTES)
        if metadata or all(a in found for a in node.all_input_nodes):
            found.add(node)
    return found


_SMALL_CONSTANT = 64  # elements: a tensor made in forward from Python values, written out in the subproblem


def _tensor_constants(gm: fx.GraphModule, model: nn.Module) -> dict[str, torch.Tensor]:
    """Tensors the tracer captured as constants (`torch.tensor(self.value)` in forward): the graph holds them,
    the original module does not."""
    owned = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    owned |= plain_tensor_attributes(model)
    found = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in owned:
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                if value.numel() > _SMALL_CONSTANT:
                    raise UnsupportedModule(f"the forward uses a constant tensor of {value.numel()} elements")
                found[node.target] = value.detach().clone()
    return found


def _pure_views(units: list[Unit], values: dict[fx.Node, ValueInfo]) -> set[fx.Node]:
    # Picking an element out of a layer's tuple (an LSTM's (output, (h, c))) is not recomputed from its base:
    # the tuple cannot cross between subproblems, the tensor picked out of it can.
    views = {u.nodes[0] for u in units if len(u.nodes) == 1 and u.kind is Kind.VIEW and u.label in _PURE_VIEWS}
    return {v for v in views if not any(a not in views and a in values and values[a].kind is not ValueKind.TENSOR
                                        for a in v.all_input_nodes[:1])}


def _returned(gm: fx.GraphModule) -> list[fx.Node]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    return list(dict.fromkeys(output.all_input_nodes))


def closure(traced: TracedModule, nodes: set[fx.Node]) -> set[fx.Node]:
    """The shape values and views outside `nodes` that computing `nodes` needs, recomputed in place."""
    needed: set[fx.Node] = set()
    pending = [a for n in nodes for a in n.all_input_nodes if a in traced.sinkable and a not in nodes]
    while pending:
        node = pending.pop()
        if node not in needed:
            needed.add(node)
            pending += [a for a in node.all_input_nodes if a in traced.sinkable and a not in nodes]
    return needed


def external_inputs(traced: TracedModule, nodes: set[fx.Node]) -> list[fx.Node]:
    """Values computed elsewhere (or forward arguments) that `nodes` and their recomputed views take."""
    local = nodes | closure(traced, nodes)
    inputs: list[fx.Node] = []
    for node in traced.graph_module.graph.nodes:
        if node in local:
            for arg in node.all_input_nodes:
                if arg not in local and arg.op != "get_attr" and arg not in inputs:
                    inputs.append(arg)
    return inputs


def _label(node: fx.Node, model: nn.Module) -> str:
    if node.op == "call_module":
        return type(model.get_submodule(node.target)).__name__.lower()
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


def _kind(label: str, node: fx.Node, values: dict[fx.Node, ValueInfo]) -> Kind:
    base = label.rstrip("_")
    if base in _BINARY_WHEN_TWO_TENSORS:
        tensors = [a for a in node.args
                   if isinstance(a, fx.Node) and a in values and values[a].kind is ValueKind.TENSOR]
        return Kind.POINTWISE if len(tensors) >= 2 else Kind.REDUCTION
    if base in _ANCHORS:
        return Kind.ANCHOR
    if base in _REDUCTIONS:
        return Kind.REDUCTION
    if base in _VIEWS:
        return Kind.VIEW
    return Kind.POINTWISE


def _owner_key(target: str, model: nn.Module, leaves: dict[str, LeafRecord]) -> str:
    if target in leaves:
        return f"leaf:{target}"
    parent = target.rpartition(".")[0]
    if parent == "":
        return f"raw:{target}"
    # An expanded layer reads its children's parameters (MultiheadAttention's out_proj.weight): the owner
    # is the outermost layer above them.
    ancestor = parent
    while ancestor:
        if ancestor in leaves:
            return f"leaf:{ancestor}"
        ancestor = ancestor.rpartition(".")[0]
    holder = model.get_submodule(parent)
    # A tensor of the user's own submodule (a GraphModule keeps such submodules as plain nn.Module): rebuilt
    # by the statements of that class's __init__.
    if type(holder) is nn.Module or not _is_torch_layer(holder):
        return f"raw:{target}"
    raise UnsupportedModule(f"'{target}' belongs to {type(model.get_submodule(parent)).__name__}, a module the "
                            "builtin decomposer cannot rebuild (only torch.nn layers and the top module's own "
                            "parameters)")


def _units(gm: fx.GraphModule, values, shape_nodes, model: nn.Module, tracer: str,
           construction: Construction, tensor_constants: dict[str, torch.Tensor]) -> list[Unit]:
    """Compute nodes as units; an exported graph's consecutive nodes from one torch.nn layer form one unit."""
    leaves = construction.leaves
    units: list[Unit] = []
    last_layer = None
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method") or node in shape_nodes:
            continue
        owners = {_owner_key(a.target, model, leaves) for a in node.all_input_nodes
                  if a.op == "get_attr" and a.target not in tensor_constants}
        if node.op == "call_module":
            if node.target not in leaves:
                raise UnsupportedModule(f"cannot rebuild module '{node.target}' "
                                        f"({type(model.get_submodule(node.target)).__name__})")
            owners.add(f"leaf:{node.target}")
        layer = _export_layer(node, leaves) if tracer == "export" else None
        if layer is not None and layer == last_layer:
            units[-1].nodes.append(node)
            units[-1].owners |= owners
            continue
        last_layer = layer
        label = type(model.get_submodule(layer)).__name__.lower() if layer else _label(node, model)
        units.append(Unit(len(units), [node], label, _kind(label, node, values), owners))
    if not units:
        raise UnsupportedModule("the forward does no computation")
    return units


def _is_torch_layer(module: nn.Module) -> bool:
    # An expanded transformer layer is traced through like a container: its children are the layers.
    return (type(module).__module__.startswith("torch.nn")
            and not isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict, *expansions.CONTAINERS)))


def _export_layer(node: fx.Node, leaves: dict[str, LeafRecord]) -> str | None:
    """The torch.nn layer an exported node came from, if any (its innermost module)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    path = re.sub(r"@\d+$", "", path)
    return path if path in leaves else None


def _raw_records(units, construction: Construction, init_source: InitSource, model,
                 constants: dict[str, Any], import_names: set[str], source: str) -> dict[str, RawRecord]:
    """The top module's own parameters and buffers that a subproblem must create: used ones, and unused
    ones whose creation draws random numbers (they shift every later weight)."""
    names = {key[4:] for unit in units for key in unit.owners if key.startswith("raw:")}
    names |= {name for name, (_, draws) in construction.raw_order.items()
              if draws and (name in model._parameters or name in model._buffers
                            or name in plain_tensor_attributes(model))}
    raws = {}
    for name in sorted(names):
        order, draws = construction.raw_order.get(name, (-1, True))
        if "." in name:
            raws[name] = _nested_raw(name, construction, model, source, init_source.module_globals, constants,
                                     import_names, order, draws)
            continue
        statements, free = init_source.raw_statements(name)
        needed = []
        for free_name in free:
            if free_name in construction.root_arguments or free_name in constants:
                needed.append(free_name)
            elif free_name not in import_names and not hasattr(builtins, free_name):
                raise UnsupportedModule(f"self.{name} is created from '{free_name}', which is neither an argument "
                                        "of Model nor a module-level constant")
        raws[name] = RawRecord(name, statements, needed, order, draws)
    return raws


def _nested_raw(name: str, construction: Construction, model: nn.Module, source: str, module_globals,
                constants: dict[str, Any], import_names: set[str], order: int, draws: bool) -> RawRecord:
    """A parameter or buffer of a user-defined submodule (`attn.bias`): the statements of that class's
    __init__ that create it, with the submodule's own constructor arguments written in as literals (the
    subproblem has no such argument; the value is the one this instance received)."""
    parent, _, local = name.rpartition(".")
    cls = type(model.get_submodule(parent))
    statements, free = InitSource.of(source, module_globals, cls.__name__).raw_statements(local)
    arguments = construction.module_arguments.get(parent, {})
    literals, needed = {}, []
    for free_name in free:
        if free_name in arguments:
            literals[free_name] = _literal(arguments[free_name])
        elif free_name in constants:
            needed.append(free_name)
        elif free_name not in import_names and not hasattr(builtins, free_name):
            raise UnsupportedModule(f"{cls.__name__}.{local} is created from '{free_name}', which is neither an "
                                    f"argument of {cls.__name__} nor a module-level constant")
    statements = [_substitute_names(s, literals) for s in statements]
    return RawRecord(name, statements, needed, order, draws, local)


def _substitute_names(statement: str, literals: dict[str, str]) -> str:
    """The statement with each named variable read replaced by its literal source."""
    if not literals:
        return statement

    class Substitute(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id in literals:
                return parse_python(literals[node.id], mode="eval").body
            return node

    return ast.unparse(Substitute().visit(parse_python(statement)))


def _constants(module_globals: dict[str, Any]) -> dict[str, Any]:
    """Module-level values a generated file can write as literals (sizes, shapes, scales)."""
    found = {}
    for name, value in module_globals.items():
        if name.startswith("__") or isinstance(value, (type(sys), type)) or callable(value):
            continue
        try:
            _literal(value)
        except UnsupportedModule:
            continue
        found[name] = value
    return found


def _import_names(imports: tuple[str, ...]) -> set[str]:
    names = {"torch", "nn", "F", "math", "operator"}
    for statement in imports:
        for node in ast.walk(parse_python(statement)):
            if isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return names


@dataclass(frozen=True)
class FollowUp:
    """A statement of the original __init__ that changes layers after they are built."""

    statement: str
    layers: tuple[str, ...]       # the layer attributes it names
    free_names: tuple[str, ...]   # Model arguments and module constants it reads


def _links(init_source: InitSource, model: nn.Module, construction: Construction, constants: dict[str, Any],
           import_names: set[str]) -> tuple[list[set[str]], dict[str, list[FollowUp]]]:
    """Statements after construction that touch layers (custom inits) tie those layers together; each is
    kept under its first layer."""
    links, follow_ups = [], {}
    for stmt, attributes in init_source.follow_ups():
        keys = set()
        for attribute in attributes:
            if attribute in construction.leaves:
                keys.add(f"leaf:{attribute}")
            elif attribute in model._parameters or attribute in model._buffers:
                continue  # raw parameters carry their own follow-ups
            else:
                raise UnsupportedModule(f"Model.__init__ runs `{ast.unparse(stmt)[:60]}` on self.{attribute}, "
                                        "which the builtin decomposer cannot move into a subproblem")
        if keys:
            free = [n for n in dict.fromkeys(_loaded_names(stmt)) if n != "self" and n not in import_names
                    and not hasattr(builtins, n)]
            unknown = [n for n in free if n not in construction.root_arguments and n not in constants]
            if unknown:
                raise UnsupportedModule(f"`{ast.unparse(stmt)[:60]}` in Model.__init__ reads {', '.join(unknown)}, "
                                        "which is neither an argument of Model nor a module-level constant")
            links.append(keys)
            layers = tuple(sorted(k[5:] for k in keys))
            follow_ups.setdefault(min(keys), []).append(FollowUp(ast.unparse(stmt), layers, tuple(free)))
    return links, follow_ups


# ---- Segmentation ----------------------------------------------------------------------------------------


class Segmentation:
    """Groups of consecutive units, given by cut points (the unit index each later group starts at)."""

    def __init__(self, traced: TracedModule):
        self.traced = traced
        self.unit_of = traced.unit_of()

    def groups(self, cuts: list[int]) -> list[range]:
        bounds = [0] + sorted(cuts) + [len(self.traced.units)]
        return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]

    # -- the fusion rules --

    def initial_cuts(self) -> list[int]:
        cuts, open_group, anchored, closed = [], False, False, False
        for unit in self.traced.units:
            start = False
            if unit.kind is Kind.ANCHOR:
                start = open_group and (anchored or closed)
                anchored, closed = True, False
            elif closed:
                start, anchored, closed = True, False, False
            if unit.kind is Kind.REDUCTION:
                closed = True
            if start and unit.index > 0:
                cuts.append(unit.index)
            open_group = True
        return cuts

    # -- validity --

    def crossing(self, cut: int) -> list[fx.Node]:
        """Values made before unit `cut` that later units take as inputs (views and shape values are
        recomputed where needed, so their bases cross instead), or that the forward returns."""
        later = {n for unit in self.traced.units[cut:] for n in unit.nodes}
        made = self._made_before(cut)
        needed = [n for n in external_inputs(self.traced, later) if n in made]
        returned = [n for n in self.traced.returned if n in made and n not in needed]
        return needed + returned

    def _made_before(self, cut: int) -> set[fx.Node]:
        return {n for unit in self.traced.units[:cut] for n in unit.nodes}

    def valid_cut(self, cut: int) -> bool:
        """Every value a later subproblem takes is one contiguous tensor; returned values are tensors."""
        values = self.traced.values
        later = {n for unit in self.traced.units[cut:] for n in unit.nodes}
        made = self._made_before(cut)
        taken = [n for n in external_inputs(self.traced, later) if n in made]
        returned = [n for n in self.traced.returned if n in made]
        return (all(values[n].kind is ValueKind.TENSOR and (values[n].contiguous or self.copied_out(n))
                    for n in taken)
                and all(values[n].kind is ValueKind.TENSOR for n in returned))

    def copied_out(self, node: fx.Node) -> bool:
        """A strided tensor that a layer itself made (an RNN's batch-first output, or a pointwise op over
        it): the group that makes it returns a contiguous copy, which changes no value. A strided view
        is not copied: its base crosses instead and the view is recomputed."""
        unit = self.traced.units[self.unit_of[node]] if node in self.unit_of else None
        if unit is None or node in self.traced.sinkable or node in self.traced.returned:
            return False   # the forward's result is given back as it is made, strides included
        if unit.kind is not Kind.VIEW:
            return True
        base = node.all_input_nodes[:1]
        return bool(base) and self.traced.values[base[0]].kind is not ValueKind.TENSOR

    def has_work(self, group: range) -> bool:
        return any(self.traced.units[i].kind is not Kind.VIEW for i in group)

    # -- constraints: owners, random order --

    def normalize(self, cuts: list[int]) -> list[int]:
        """Move or drop cuts until every constraint holds: tensor boundaries, one group per owner,
        random draws in the original order, no group without work."""
        cuts = sorted({c for c in cuts if 0 < c < len(self.traced.units)})
        while True:
            fixed = self._fix_boundaries(cuts)
            fixed = self._fix_owners(fixed)
            fixed = self._fix_random_order(fixed)
            fixed = self._fix_empty(fixed)
            if fixed == cuts:
                return cuts
            cuts = fixed

    def _fix_boundaries(self, cuts: list[int]) -> list[int]:
        """An invalid cut moves to the nearest valid point between its neighbours, else it goes."""
        result: list[int] = []
        for i, cut in enumerate(cuts):
            low = result[-1] if result else 0
            high = cuts[i + 1] if i + 1 < len(cuts) else len(self.traced.units)
            if self.valid_cut(cut):
                result.append(cut)
                continue
            moved = next((c for c in itertools.chain(range(cut - 1, low, -1), range(cut + 1, high))
                          if self.valid_cut(c)), None)
            if moved is not None:
                result.append(moved)
        return sorted(set(result))

    def _group_index(self, cuts: list[int]) -> list[int]:
        index, group = [], 0
        cut_set = set(cuts)
        for unit in self.traced.units:
            if unit.index in cut_set:
                group += 1
            index.append(group)
        return index

    def _owner_groups(self, cuts: list[int]) -> dict[str, set[int]]:
        index = self._group_index(cuts)
        placed: dict[str, set[int]] = {}
        for unit in self.traced.units:
            for key in unit.owners:
                placed.setdefault(key, set()).add(index[unit.index])
        for link in self.traced.links:
            groups = set().union(*(placed.get(k, set()) for k in link))
            for key in link:
                placed[key] = set(groups)
        return placed

    def shareable(self, key: str) -> bool:
        """A layer with no state and no random draws: each group that calls it builds its own copy."""
        leaf = self.traced.construction.leaves.get(key[5:]) if key.startswith("leaf:") else None
        return leaf is not None and leaf.stateless and not any(key in link for link in self.traced.links)

    def _fix_owners(self, cuts: list[int]) -> list[int]:
        for key, groups in self._owner_groups(cuts).items():
            if len(groups) > 1 and not self.shareable(key):
                low, high = min(groups), max(groups)
                return [c for i, c in enumerate(cuts) if not low <= i < high]
        return cuts

    def owner_placement(self, cuts: list[int]) -> dict[str, set[int]]:
        """The groups that build each owner: every user of a shareable layer, else one group; unused owners
        that draw random numbers go next to the owner drawn just before them."""
        placed = {k: (g if self.shareable(k) else {min(g)}) for k, g in self._owner_groups(cuts).items()}
        draws = self.random_owners()
        for key in sorted(draws, key=draws.get):
            if key not in placed:
                earlier = [min(placed[k]) for k in draws if k in placed and draws[k] < draws[key]]
                placed[key] = {max(earlier) if earlier else 0}
        return placed

    def random_owners(self) -> dict[str, int]:
        """Owner key -> construction order, for owners whose construction draws random numbers."""
        construction = self.traced.construction
        owners = {f"leaf:{p}": r.order for p, r in construction.leaves.items() if r.draws_random}
        owners.update({f"raw:{n}": r.order for n, r in self.traced.raws.items() if r.draws_random})
        return owners

    def _fix_random_order(self, cuts: list[int]) -> list[int]:
        placed = self.owner_placement(cuts)
        draws = self.random_owners()
        by_group: dict[int, list[int]] = {}
        for key, order in draws.items():
            by_group.setdefault(min(placed.get(key, {0})), []).append(order)
        groups = sorted(by_group)
        for a, b in itertools.combinations(groups, 2):
            if max(by_group[a]) > min(by_group[b]):
                return [c for i, c in enumerate(cuts) if not a <= i < b]
        return cuts

    def _fix_empty(self, cuts: list[int]) -> list[int]:
        for i, group in enumerate(self.groups(cuts)):
            if not self.has_work(group):
                drop = i - 1 if i > 0 else 0
                return [c for j, c in enumerate(cuts) if j != drop]
        return cuts

    # -- choosing cuts --

    def best_cut(self, group: range) -> int | None:
        """The cut inside `group` with the fewest crossing tensors, balanced heavy work, next to a heavy op."""
        units = self.traced.units
        heavy = [units[i].kind in (Kind.ANCHOR, Kind.REDUCTION) for i in range(len(units))]
        best = None
        for cut in range(group.start + 1, group.stop):
            left, right = range(group.start, cut), range(cut, group.stop)
            if not (self.has_work(left) and self.has_work(right) and self.valid_cut(cut)):
                continue
            balance = abs(sum(heavy[i] for i in left) - sum(heavy[i] for i in right))
            adjacent = 0 if heavy[cut - 1] or heavy[cut] else 1
            made_here = [n for n in self.crossing(cut) if self.unit_of[n] >= group.start]
            score = (len(made_here), balance, adjacent, cut)
            best = min(best, (score, cut)) if best else (score, cut)
        return best[1] if best else None

    def cut_to_fuse(self, cuts: list[int]) -> int | None:
        """The cut whose removal saves most: next to a group without heavy work, else the largest tensor."""
        units = self.traced.units
        groups = self.groups(cuts)
        best = None
        for i, cut in enumerate(cuts):
            light = any(not any(units[j].kind in (Kind.ANCHOR, Kind.REDUCTION) for j in g)
                        for g in (groups[i], groups[i + 1]))
            traffic = sum(self.traced.values[n].nbytes for n in self.crossing(cut))
            score = (0 if light else 1, -traffic, cut)
            best = min(best, (score, cut)) if best else (score, cut)
        return best[1] if best else None

    def one_kernel(self) -> bool:
        """The whole forward is one anchor (a GEMM, convolution or normalisation) and the elementwise chain
        after it: one kernel with a fused epilogue. Cutting it would write the anchor's output to memory
        and read it back, for nothing."""
        working = [u for u in self.traced.units if u.kind is not Kind.VIEW]
        return (bool(working) and working[0].kind is Kind.ANCHOR and working[0].label in _EPILOGUE_ANCHORS
                and all(u.kind is Kind.POINTWISE for u in working[1:]))

    def decompose_cuts(self) -> list[int]:
        cuts = self.normalize(self.initial_cuts())
        if len(self.groups(cuts)) == 1 and not self.one_kernel():
            cut = self.best_cut(range(len(self.traced.units)))
            if cut is not None:
                cuts = self.normalize([cut])
        return cuts


# ---- Code generation -------------------------------------------------------------------------------------


@dataclass
class OwnerCode:
    """How a subproblem builds one owner: attribute name and the statements (parameterised later)."""

    key: str
    attribute: str
    order: int


@dataclass
class GroupCode:
    """One group rendered in canonical names: its forward, owners and the values that flow in and out."""

    group: range
    labels: list[str]
    forward_lines: list[str]
    input_nodes: list[fx.Node]
    output_nodes: list[fx.Node]
    owners: list[OwnerCode]
    key: str = ""
    pattern: Pattern | None = None
    attribute: str = ""


@dataclass
class Pattern:
    """One subproblem file: a group shape shared by every group whose canonical code is the same."""

    name: str
    groups: list[GroupCode]
    params: list[tuple[str, str, str]] = field(default_factory=list)  # (param, owner attribute or "", argument)


class CodeWriter:
    """Writes the subproblem files and the top-level for one segmentation."""

    def __init__(self, traced: TracedModule, cuts: list[int]):
        self.traced = traced
        self.segmentation = Segmentation(traced)
        self.cuts = cuts
        self.groups = self.segmentation.groups(cuts)
        self.placement = self.segmentation.owner_placement(cuts)
        self.model = traced.graph_module

    def files(self) -> dict[str, str]:
        codes = self.group_codes()
        patterns = self._patterns(codes)
        files = {f"{PROBLEMS_DIR}/{p.name}.py": self._subproblem_source(p) for p in patterns}
        return {PROBLEM_FILE: self._top_level(codes, patterns), **files}

    def pattern_names(self) -> dict[int, str]:
        """Each group's subproblem name, by the unit the group starts at."""
        return {code.group.start: p.name for p in self._patterns(self.group_codes()) for code in p.groups}

    def group_codes(self) -> list[GroupCode]:
        kept = self._live_nodes()
        inputs = [external_inputs(self.traced, k) for k in kept]
        codes = []
        for index, group in enumerate(self.groups):
            elsewhere = {n for j, i in enumerate(inputs) if j != index for n in i} | set(self.traced.returned)
            outputs = [n for n in self.model.graph.nodes if n in kept[index] and n in elsewhere]
            codes.append(self._group_code(index, group, kept[index], inputs[index], outputs))
        return codes

    def _live_nodes(self) -> list[set[fx.Node]]:
        """Each group's nodes, without views that only later groups use (those recompute them)."""
        kept = [{n for i in g for n in self.traced.units[i].nodes} for g in self.groups]
        while True:
            inputs = [set(external_inputs(self.traced, k)) for k in kept]
            dead_any = False
            for index, nodes in enumerate(kept):
                local = nodes | closure(self.traced, nodes)
                elsewhere = {n for j, i in enumerate(inputs) if j != index for n in i} | set(self.traced.returned)
                dead = {n for n in nodes if n in self.traced.sinkable and n not in elsewhere
                        and not any(u in local for u in n.users)}
                if dead and dead != nodes:
                    kept[index] = nodes - dead
                    dead_any = True
            if not dead_any:
                return kept

    # -- one group --

    def _group_code(self, index: int, group: range, kept: set[fx.Node], inputs: list[fx.Node],
                    outputs: list[fx.Node]) -> GroupCode:
        units = [self.traced.units[i] for i in group]
        local = kept | closure(self.traced, kept)
        ordered = [n for n in self.model.graph.nodes if n in local]
        owner_keys = sorted((k for k, g in self.placement.items() if index in g), key=self._owner_order)
        owners = self._owner_codes(owner_keys)
        names = self._canonical_names(inputs, ordered, owners)
        if not outputs:
            raise UnsupportedModule(f"units {group.start}-{group.stop - 1} compute nothing the rest of the forward uses")
        lines = [f"{names[n]} = {self._expression(n, names, owners)}" for n in ordered]
        values = self.traced.values
        returned = [names[n] + ("" if values[n].contiguous or n in self.traced.returned else ".contiguous()")
                    for n in outputs]
        lines.append(f"return {', '.join(returned)}")
        labels = [u.label for u in units if u.kind is not Kind.VIEW] or [units[0].label]
        return GroupCode(group, labels, lines, inputs, outputs, owners)

    def _owner_order(self, key: str) -> int:
        kind, _, name = key.partition(":")
        if kind == "leaf":
            return self.traced.construction.leaves[name].order
        return self.traced.raws[name].order if name in self.traced.raws else -1

    def _owner_codes(self, keys: list[str]) -> list[OwnerCode]:
        codes, taken = [], set()
        for key in keys:
            kind, _, name = key.partition(":")
            if kind == "leaf":
                base = self.traced.construction.leaves[name].cls.__name__.lower()
            else:
                base = _identifier(name)
            attribute = _unique(base, taken)
            taken.add(attribute)
            codes.append(OwnerCode(key, attribute, self._owner_order(key)))
        return codes

    def _canonical_names(self, inputs, ordered, owners) -> dict[fx.Node, str]:
        taken = set(_RESERVED)
        names = {}
        for i, node in enumerate(inputs):
            names[node] = "x" if len(inputs) == 1 else f"x{i}"
        taken |= set(names.values())
        for node in ordered:
            base = _identifier(_label(node, self.model))
            if node.op == "call_module":
                base = next(o.attribute for o in owners if o.key == f"leaf:{node.target}")
            names[node] = _unique(base if base not in _RESERVED else f"{base}_out", taken)
            taken.add(names[node])
        return names

    def _expression(self, node: fx.Node, names: dict[fx.Node, str], owners: list[OwnerCode]) -> str:
        def arg(value) -> str:
            return self._argument(value, names, owners)

        args = [arg(a) for a in node.args]
        kwargs = [f"{k}={arg(v)}" for k, v in node.kwargs.items()]
        if node.op == "call_module":
            attribute = next(o.attribute for o in owners if o.key == f"leaf:{node.target}")
            return f"self.{attribute}({', '.join(args + kwargs)})"
        if node.op == "call_method":
            return f"{args[0]}.{node.target}({', '.join(args[1:] + kwargs)})"
        target = node.target
        if target is operator.getitem:
            return f"{args[0]}[{self._index(node.args[1], names, owners)}]"
        if target is getattr and len(node.args) == 2 and isinstance(node.args[1], str):
            return f"{args[0]}.{node.args[1]}"
        if target in _INFIX and len(args) == 2 and not kwargs:
            return f"{args[0]} {_INFIX[target]} {args[1]}"
        if target in _PREFIX and len(args) == 1 and not kwargs:
            return f"{_PREFIX[target]}{args[0]}"
        return f"{_qualified(target)}({', '.join(args + kwargs)})"

    def _argument(self, value, names, owners) -> str:
        if isinstance(value, fx.Node):
            if value.op == "get_attr" and value.target in self.traced.tensor_constants:
                constant = self.traced.tensor_constants[value.target]
                return f"torch.tensor({_literal(constant.tolist())}, dtype={constant.dtype})"
            if value.op == "get_attr":
                return self._attribute_source(value.target, owners)
            return names[value]
        if isinstance(value, tuple):
            inner = [self._argument(v, names, owners) for v in value]
            return f"({', '.join(inner)},)" if len(inner) == 1 else f"({', '.join(inner)})"
        if isinstance(value, list):
            return "[" + ", ".join(self._argument(v, names, owners) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {self._argument(v, names, owners)}" for k, v in value.items()) + "}"
        if isinstance(value, slice):
            parts = [self._argument(p, names, owners) for p in (value.start, value.stop, value.step)]
            return f"slice({', '.join(parts)})"
        if value is Ellipsis:
            return "..."
        if isinstance(value, (torch.memory_format, torch.layout)):
            return f"torch.{str(value).replace('torch.', '')}"
        if isinstance(value, torch.device):
            return f"torch.device({str(value)!r})"
        return _literal(value)

    def _index(self, index, names, owners) -> str:
        if isinstance(index, tuple) and index:
            return ", ".join(self._index_part(p, names, owners) for p in index)
        return self._index_part(index, names, owners)

    def _index_part(self, part, names, owners) -> str:
        if isinstance(part, slice):
            pieces = ["" if p is None else self._argument(p, names, owners)
                      for p in (part.start, part.stop, part.step)]
            return ":".join(pieces[:2]) + (f":{pieces[2]}" if pieces[2] else "")
        if part is None:
            return "None"
        return self._argument(part, names, owners)

    def _attribute_source(self, target: str, owners: list[OwnerCode]) -> str:
        key = _owner_key(target, self.model, self.traced.construction.leaves)
        attribute = next(o.attribute for o in owners if o.key == key)
        if key.startswith("leaf:"):
            rest = target[len(key) - 5 + 1:]
            return f"self.{attribute}.{rest}" if rest else f"self.{attribute}"
        return f"self.{attribute}"

    # -- patterns and their files --

    def _patterns(self, codes: list[GroupCode]) -> list[Pattern]:
        by_key: dict[str, Pattern] = {}
        for code in codes:
            code.key = self._pattern_key(code)
            pattern = by_key.get(code.key)
            if pattern is None:
                pattern = by_key[code.key] = Pattern("", [])
            pattern.groups.append(code)
            code.pattern = pattern
        patterns = list(by_key.values())
        bases = [safe_name("_".join(_dedupe(p.groups[0].labels)[:4]), default="block") for p in patterns]
        for pattern, base in zip(patterns, bases):
            clash = bases.count(base) > 1
            digest = hashlib.sha256(pattern.groups[0].key.encode()).hexdigest()[:6]
            pattern.name = f"{base}_{digest}" if clash else base
            pattern.params = self._params(pattern)
        return patterns

    def _pattern_key(self, code: GroupCode) -> str:
        owners = []
        for owner in code.owners:
            kind, _, name = owner.key.partition(":")
            if kind == "leaf":
                owners.append(f"{owner.attribute}={self.traced.construction.leaves[name].cls.__qualname__}")
            else:
                raw = self.traced.raws[name]
                owners.append(f"{owner.attribute}=" + "\n".join(raw.statements))
            owners += [f.statement for f in self.traced.follow_ups.get(owner.key, [])]
        return "\n".join(code.forward_lines + owners)

    def _params(self, pattern: Pattern) -> list[tuple[str, str, str]]:
        """(parameter name, owner attribute or "" for a free name of a raw owner, argument name), in the
        order the owners are built; raw owners' free names keep their own names."""
        first = pattern.groups[0]
        raw_names = list(dict.fromkeys(n for o in first.owners for n in self._free_names(o.key)))
        leaf_args: list[tuple[str, str]] = []
        for position, owner in enumerate(first.owners):
            if owner.key.startswith("leaf:"):
                leaf_args += [(owner.attribute, name)
                              for name, _, _ in self.traced.construction.leaves[owner.key[5:]].arguments
                              if any(not self._is_default(g.owners[position].key, name) for g in pattern.groups)]
        counts: dict[str, int] = {}
        for _, name in leaf_args:
            counts[name] = counts.get(name, 0) + 1
        taken = set(raw_names) | _RESERVED
        leaf_params: dict[str, list[tuple[str, str, str]]] = {}
        for attribute, name in leaf_args:
            param = _unique(name if counts[name] == 1 and name not in taken else f"{attribute}_{name}", taken)
            taken.add(param)
            leaf_params.setdefault(attribute, []).append((param, attribute, name))
        params: list[tuple[str, str, str]] = []
        for owner in first.owners:
            params += leaf_params.get(owner.attribute, [])
            params += [(n, "", n) for n in self._free_names(owner.key) if (n, "", n) not in params]
        return params

    def _free_names(self, owner_key: str) -> list[str]:
        """Model arguments and constants the statements that build an owner read."""
        if owner_key.startswith("raw:"):
            return self.traced.raws[owner_key[4:]].free_names
        return [n for f in self.traced.follow_ups.get(owner_key, []) for n in f.free_names]

    def _is_default(self, owner_key: str, argument: str) -> bool:
        leaf = self.traced.construction.leaves[owner_key[5:]]
        for name, value, default in leaf.arguments:
            if name == argument:
                return default is not _EMPTY and _same_value(value, default)
        return True

    def _argument_value(self, code: GroupCode, param: tuple[str, str, str]) -> tuple[Any, str]:
        """The value a parameter takes for one group, and its source in the top-level."""
        name, attribute, argument = param
        if not attribute:
            arguments = self.traced.construction.root_arguments
            return (arguments[name] if name in arguments else self.traced.constants[name]), name
        owner = next(o for o in code.owners if o.attribute == attribute)
        leaf = self.traced.construction.leaves[owner.key[5:]]
        value = next(v for n, v, _ in leaf.arguments if n == argument)
        return value, leaf.expressions.get(argument) or _literal(value)

    def _subproblem_source(self, pattern: Pattern) -> str:
        first = pattern.groups[0]
        arrow = " -> ".join(first.labels)
        count = len(pattern.groups)
        doc = f"Subproblem {pattern.name} of {self.traced.problem_name}: {arrow} ({count} instance{'s' * (count > 1)})."
        lines = [f'"""{doc}"""', ""]
        params = ", ".join(["self"] + [p[0] for p in pattern.params])
        body = ["class Model(nn.Module):", f"    def __init__({params}):", "        super().__init__()"]
        attributes = {o.key: o.attribute for o in first.owners}
        for owner in first.owners:
            body += [f"        {line}" for line in self._owner_lines(owner, pattern, attributes)]
        inputs = ", ".join(["self"] + [("x" if len(first.input_nodes) == 1 else f"x{i}")
                                       for i in range(len(first.input_nodes))])
        body += ["", f"    def forward({inputs}):"] + [f"        {line}" for line in first.forward_lines]
        body += [""] + self._input_functions(pattern)
        lines += _imports_for("\n".join(body), self.traced.imports) + ["", ""] + body
        return "\n".join(lines) + "\n"

    def _owner_lines(self, owner: OwnerCode, pattern: Pattern, attributes: dict[str, str]) -> list[str]:
        kind, _, name = owner.key.partition(":")
        if kind == "raw":
            raw = self.traced.raws[name]
            renamed = [_rename_self_attribute(s, raw.local, owner.attribute) for s in raw.statements]
            return [line for s in renamed for line in s.splitlines()]
        leaf = self.traced.construction.leaves[name]
        by_argument = {(a, n): p for p, a, n in pattern.params}
        args = []
        positional = True
        for argument, _, default in leaf.arguments:
            param = by_argument.get((owner.attribute, argument))
            if param is None:
                positional = False
                continue
            args.append(param if positional and default is _EMPTY else f"{argument}={param}")
            positional = positional and default is _EMPTY
        if getattr(nn, leaf.cls.__name__, None) is not leaf.cls:
            raise UnsupportedModule(f"{leaf.cls.__qualname__} is not a public torch.nn layer")
        lines = [f"self.{owner.attribute} = nn.{leaf.cls.__name__}({', '.join(args)})"]
        for follow_up in self.traced.follow_ups.get(owner.key, []):
            statement = follow_up.statement
            for layer in follow_up.layers:
                statement = _rename_self_attribute(statement, layer, attributes[f"leaf:{layer}"])
            lines += statement.splitlines()
        return lines

    def _input_functions(self, pattern: Pattern) -> list[str]:
        entries = []
        for code in pattern.groups:
            init = "[" + ", ".join(_literal(self._argument_value(code, p)[0]) for p in pattern.params) + "]"
            inputs = "[" + ", ".join(self.traced.values[n].factory() for n in code.input_nodes) + "]"
            entries.append((init, inputs))
        if len(entries) == 1:
            init, inputs = entries[0]
            return ["", "def get_inputs():", f"    return {inputs}", "", "",
                    "def get_init_inputs():", f"    return {init}"]
        lines = ["", "def get_input_configs():", "    return ["]
        lines += [f'        {{"get_init_inputs": lambda: {init}, "get_inputs": lambda: {inputs}}},'
                  for init, inputs in entries]
        lines += ["    ]", "", "", "def get_inputs():", '    return get_input_configs()[0]["get_inputs"]()', "", "",
                  "def get_init_inputs():", '    return get_input_configs()[0]["get_init_inputs"]()']
        return lines

    # -- the top-level --

    def _top_level(self, codes: list[GroupCode], patterns: list[Pattern]) -> str:
        skeleton = self.traced.skeleton
        aliases, bindings = {}, []
        taken = set(skeleton.init_arg_names) | set(self.traced.constants)
        for pattern in patterns:
            alias = _unique(class_alias(pattern.name), taken)
            taken.add(alias)
            aliases[pattern.name] = alias
            bindings.append((alias, pattern.name))
        init_lines = []
        for pattern in patterns:
            for k, code in enumerate(pattern.groups):
                code.attribute = pattern.name if len(pattern.groups) == 1 else f"{pattern.name}_{k}"
        for code in codes:
            args = ", ".join(self._argument_value(code, p)[1] for p in code.pattern.params)
            init_lines.append(f"self.{code.attribute} = {aliases[code.pattern.name]}({args})")
        names = {p: p.target if self.traced.tracer == "fx" else p.name for p in self.traced.placeholders}
        taken = set(names.values())
        forward_lines = []
        counter = itertools.count()
        for code in codes:
            outs = []
            for node in code.output_nodes:
                name = _unique(f"y{next(counter)}", taken)
                taken.add(name)
                names[node] = name
                outs.append(name)
            args = ", ".join(names[n] for n in code.input_nodes)
            forward_lines.append(f"{', '.join(outs)} = self.{code.attribute}({args})")
        forward_lines.append(f"return {self._output(names)}")
        cuts = " ".join(str(c) for c in self.cuts)
        doc = (f"Top-level module of {self.traced.problem_name}: {len(codes)} subproblem calls in sequence.\n\n"
               f"Builtin cuts: [{cuts}] over graph {self.traced.fingerprint}.\n")
        return skeleton.render(doc, bindings, init_lines, forward_lines)

    def _output(self, names: dict[fx.Node, str]) -> str:
        output = next(n for n in self.model.graph.nodes if n.op == "output")

        def render_value(value) -> str:
            if isinstance(value, fx.Node):
                if value not in names:
                    raise UnsupportedModule("the forward returns a value computed outside every subproblem")
                return names[value]
            if isinstance(value, (tuple, list)):
                inner = [render_value(v) for v in value]
                text = ", ".join(inner) + ("," if len(inner) == 1 and isinstance(value, tuple) else "")
                return f"({text})" if isinstance(value, tuple) else f"[{text}]"
            if isinstance(value, dict):
                return "{" + ", ".join(f"{k!r}: {render_value(v)}" for k, v in value.items()) + "}"
            return _literal(value)

        if self.traced.tracer == "export":
            from torch.utils import _pytree as pytree

            flat = [render_value(v) for v in output.args[0]]
            return _render_structure(pytree.tree_unflatten(flat, self.traced.output_spec))
        return render_value(output.args[0])


_EMPTY = inspect.Parameter.empty


def _render_structure(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        inner = [_render_structure(v) for v in value]
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_render_structure(v) for v in value) + "]"
    raise UnsupportedModule(f"cannot return a {type(value).__name__} from the top-level")


def _qualified(target) -> str:
    from torch.fx.node import _get_qualified_name

    name = _get_qualified_name(target)
    short = name.rsplit(".", 1)[-1]
    for public in ("torch.nn.functional", "torch"):  # torch._C._nn.gelu is torch.nn.functional.gelu
        if name.startswith("torch._") and getattr(sys.modules[public], short, None) is target:
            return f"{public}.{short}"
    if name.startswith("_operator."):
        return "operator." + name[len("_operator."):]
    root = name.split(".")[0]
    if root in ("torch", "math", "operator") or (root == name and hasattr(builtins, name)):
        return name
    raise UnsupportedModule(f"the forward calls {name}, which a generated file cannot import")


def _imports_for(body: str, original: tuple[str, ...]) -> list[str]:
    """torch and nn, the original file's imports, and math/operator/F where the body uses them."""
    wanted = ["import torch", "import torch.nn as nn"]
    wanted += [line for line, prefix in (("import math", "math."), ("import operator", "operator."),
                                         ("import torch.nn.functional as F", "F."))
               if re.search(rf"(?<![\w.]){re.escape(prefix)}", body)]
    return list(dict.fromkeys(wanted + list(original)))


def _identifier(text: str) -> str:
    name = re.sub(r"\W+", "_", text).strip("_").lower() or "v"
    if name[0].isdigit():
        name = f"v{name}"
    return f"{name}_" if keyword.iskeyword(name) else name


def _unique(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    for i in itertools.count(1):
        if f"{base}_{i}" not in taken:
            return f"{base}_{i}"
    raise AssertionError("unreachable")


def _dedupe(labels: list[str]) -> list[str]:
    return [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]


def _rename_self_attribute(statement: str, old: str, new: str) -> str:
    if old == new:
        return statement
    tree = parse_python(statement)
    for node in ast.walk(tree):
        if _is_self_attr(node, old):
            node.attr = new
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("register_buffer", "register_parameter") and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == old):
            node.args[0] = ast.Constant(new)
    return ast.unparse(tree)


# ---- Public API: the four replies ---------------------------------------------------------------------------


_CUTS = re.compile(r"Builtin cuts: \[([\d ]*)\] over graph (\w+)")


def decomposition_files(problem_path: str | Path, eval_mode: bool = False) -> dict[str, str]:
    traced = trace_problem(problem_path, eval_mode)
    return CodeWriter(traced, Segmentation(traced).decompose_cuts()).files()


def split_files(problem_path: str | Path, top_level: str, failing: list[str],
                eval_mode: bool = False) -> dict[str, str]:
    """Cut every group of each failing subproblem in two at its best point."""
    traced = trace_problem(problem_path, eval_mode)
    cuts = _own_cuts(traced, top_level)
    segmentation = Segmentation(traced)
    names = CodeWriter(traced, cuts).pattern_names()
    added = []
    for group in segmentation.groups(cuts):
        if names[group.start] in failing:
            cut = segmentation.best_cut(group)
            if cut is not None:
                added.append(cut)
    new_cuts = segmentation.normalize(cuts + added)
    if new_cuts == cuts:
        raise UnsupportedModule(f"cannot split {', '.join(failing)}: no valid cut point inside")
    return CodeWriter(traced, new_cuts).files()


def fuse_files(problem_path: str | Path, top_level: str, eval_mode: bool = False) -> dict[str, str]:
    """Merge the two adjacent groups whose boundary costs most."""
    traced = trace_problem(problem_path, eval_mode)
    cuts = _own_cuts(traced, top_level)
    segmentation = Segmentation(traced)
    cut = segmentation.cut_to_fuse(cuts)
    if cut is None:
        raise UnsupportedModule("there is a single subproblem; nothing to fuse")
    return CodeWriter(traced, segmentation.normalize([c for c in cuts if c != cut])).files()


def total_fuse_files(problem_path: str | Path) -> dict[str, str]:
    path = Path(problem_path)
    return wrap_original(path.stem, read_source(path)).files()


def _own_cuts(traced: TracedModule, top_level: str) -> list[int]:
    match = _CUTS.search(top_level)
    if match is None:
        raise UnsupportedModule("this decomposition was not written by the builtin decomposer, which can only "
                                "refine its own")
    if match.group(2) != traced.fingerprint:
        raise UnsupportedModule("the problem changed since this decomposition was written")
    return [int(c) for c in match.group(1).split()]


def format_reply(files: dict[str, str], note: str) -> str:
    """Files in the reply format every model must use (a note, then one `### FILE:` block per file)."""
    blocks = [f"### FILE: {path}\n```python\n{source.rstrip()}\n```" for path, source in files.items()]
    return "\n\n".join([note] + blocks) + "\n"
