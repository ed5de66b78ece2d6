"""Assemble the generated file: kernels, launchers, ModelNew (the problem's __init__, a launching forward)."""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

from mkevolve.pysource import parse_python

from .cleanup import drop_unused_assignments
from .configs import k_split
from .emit_common import KernelSource, attribute
from .errors import UnsupportedSubproblem
from .geometry import sliding_windows, transposed_size
from .ir import Input, IntOp, Param, Scalar, SizeOf, Value, View
from .plan import Plan
from .pointwise_ops import HELPER_SOURCES

_PROVIDED_NAMES = {"torch", "nn", "triton", "tl"}
_EXCLUDED_DEFS = {"Model", "get_inputs", "get_init_inputs", "get_input_configs", "ModelNew"}

# Host-side arithmetic in plain Python: triton.cdiv and triton.next_power_of_2 are constexpr functions whose
# host calls cost microseconds each, which a forward of a few microseconds of GPU work cannot hide. For the
# same reason the shape and stride helpers remember their answers per shape: a GroupNorm launcher with three
# operands took 14 us per call on a 2-core CPU (the kernel launch left out), 6 us with the answers remembered.
HOST_HELPERS = '''import functools


def _cdiv(a, b):
    return -(-a // b)


def _next_power_of_2(n):
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.lru_cache(maxsize=None)
def _broadcast_shape(*shapes):
    """The shape that all `shapes` broadcast to (torch's rules, in plain Python)."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape):
            d = rank - len(shape) + i
            if size != 1:
                out[d] = size
    return tuple(out)


def _as_buffer(module, name):
    """A plain tensor attribute that forward writes in place becomes a non-persistent buffer, so that
    Module.to moves it with the parameters and the kernel writing it finds it on its own device."""
    tensor = getattr(module, name)
    delattr(module, name)
    module.register_buffer(name, tensor, persistent=False)


@functools.lru_cache(maxsize=None)
def _group_sizes(shape, groups):
    """Number of positions in each group of merged dims."""
    sizes = []
    for group in groups:
        n = 1
        for d in group:
            n *= shape[d]
        sizes.append(n)
    return tuple(sizes)


def _group_strides(t, shape, groups):
    """Element stride of `t` broadcast to `shape`, per group of merged dims (0 where `t` is broadcast)."""
    return _strides_in_frame(tuple(t.shape), t.stride(), tuple(shape), groups)


@functools.lru_cache(maxsize=None)
def _strides_in_frame(t_shape, t_strides, shape, groups):
    """_group_strides of a tensor given by its shape and strides."""
    lead = len(shape) - len(t_shape)
    strides = []
    for group in groups:
        dims = [d for d in group if shape[d] != 1 and d >= lead and t_shape[d - lead] != 1]
        strides.append(t_strides[dims[-1] - lead] if dims else 0)
    return tuple(strides)


def _row_warps(block, per_thread):
    """Warps for a row kernel: about `per_thread` fp32 values per thread, between 1 and 32 warps."""
    return max(1, min(32, block // (32 * per_thread)))


@functools.lru_cache(maxsize=None)
def _sm_count(device):
    """The multiprocessors of a CUDA device; for a CPU (the interpreter) 4, so small test shapes split too."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
''' + "".join("\n\n" + inspect.getsource(f).replace(f"def {f.__name__}(", f"def _{f.__name__}(", 1)
         for f in (k_split, sliding_windows, transposed_size))


@dataclass
class ProblemSource:
    """What the generated file takes from the problem's source text."""

    stem: str
    init: ast.FunctionDef | None
    forward_args: ast.arguments
    bases: list[str]
    support: list[ast.stmt]                 # imports, constants, helper classes and functions the init uses

    @classmethod
    def parse(cls, path: Path, source: str) -> "ProblemSource":
        tree = parse_python(source)
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        if model is None:
            raise UnsupportedSubproblem("Model is not a top-level class statement in the problem file")
        methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
        if "forward" not in methods:
            raise UnsupportedSubproblem("Model defines no forward method")
        init = methods.get("__init__")
        if init is not None:
            init = _SuperCall().visit(parse_python(ast.unparse(init)).body[0])
        bases = [ast.unparse(b) for b in model.bases] or ["nn.Module"]
        roots = ([init] if init is not None else []) + list(model.bases)
        return cls(path.stem, init, methods["forward"].args, bases, _support(tree, roots))

    def forward_arg_names(self) -> list[str]:
        args = self.forward_args
        if args.vararg or args.kwarg or args.kwonlyargs:
            raise UnsupportedSubproblem("Model.forward takes *args, **kwargs or keyword-only arguments")
        return [a.arg for a in args.posonlyargs + args.args][1:]


class _SuperCall(ast.NodeTransformer):
    """`super(Model, self)` becomes `super()`, which works inside ModelNew."""

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []
        return node


def _support(tree: ast.Module, roots: list[ast.AST]) -> list[ast.stmt]:
    """Module-level statements the copied __init__ needs, transitively, in source order; forwards dropped."""
    defined: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        for name in _bound_names(stmt):
            if name not in _EXCLUDED_DEFS:
                defined.setdefault(name, stmt)
    needed: list[ast.stmt] = []
    pending = [name for root in roots for name in _used_names(root)]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name in _PROVIDED_NAMES or name not in defined:
            continue
        seen.add(name)
        stmt = defined[name]
        if stmt not in needed:
            needed.append(stmt)
            pending.extend(_used_names(_without_forward(stmt)))
    order = {id(s): i for i, s in enumerate(tree.body)}
    return [_without_forward(s) for s in sorted(needed, key=lambda s: order[id(s)])]


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _used_names(node: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def _without_forward(stmt: ast.stmt) -> ast.stmt:
    """Helper modules keep their constructors; their forward (torch math) is never called by ModelNew."""
    if not isinstance(stmt, ast.ClassDef):
        return stmt
    copy = parse_python(ast.unparse(stmt)).body[0]
    copy.body = [n for n in copy.body if not (isinstance(n, ast.FunctionDef) and n.name == "forward")] or [ast.Pass()]
    return copy


# --- forward --------------------------------------------------------------------------------------------


class ForwardWriter:
    """The forward of one module mode: views and kernel launches, nothing else."""

    def __init__(self, plan: Plan, launches: dict[int, KernelSource], arg_names: list[str]):
        self.plan = plan
        self.launches = launches
        self.arg_names = arg_names
        self.names: dict[int, str] = {}
        self.lines: list[str] = []

    def write(self) -> list[str]:
        for value in self.plan.program.inputs:
            name = self.arg_names[value.index]
            self.lines.append(f"{name} = {name}.contiguous()")
            self.names[value.id] = name
        for kernel in self.plan.kernels:
            source = self.launches[kernel.root.id]
            args = [self.tensor(a.value) if a.value is not None else self.scalar(a.scalar) for a in source.args]
            if source.writes_into:
                target = self.tensor(kernel.target)
                self.lines.append(f"{source.launcher_name}({', '.join([target] + args)})")
                self.names[kernel.root.id] = target
            else:
                name = f"t{kernel.root.id}"
                self.lines.append(f"{name} = {source.launcher_name}({', '.join(args)})")
                self.names[kernel.root.id] = name
        self.lines.append(f"return {self.outputs(self.plan.program.outputs)}")
        return self.lines

    def outputs(self, spec) -> str:
        if isinstance(spec, (tuple, list)):
            inner = ", ".join(self.outputs(s) for s in spec)
            return f"({inner},)" if len(spec) == 1 and isinstance(spec, tuple) else (
                f"({inner})" if isinstance(spec, tuple) else f"[{inner}]")
        return self.tensor(spec)

    def tensor(self, value: Value) -> str:
        if value.id in self.names:
            return self.names[value.id]
        if isinstance(value, Param):
            name = attribute(value.path)
        elif isinstance(value, View):
            base = self.tensor(value.base)
            name = f"v{value.id}"
            self.lines.append(f"{name} = {_view_call(base, value, self.shape_value)}")
        elif isinstance(value, Input):
            name = self.arg_names[value.index]
        else:
            raise AssertionError(f"{value!r} is used in forward but no kernel computes it")
        self.names[value.id] = name
        return name

    def scalar(self, scalar: Scalar) -> str:
        if scalar.attr is not None:
            return attribute(scalar.attr)
        if scalar.expr is not None:
            return self.shape_value(scalar.expr)
        raise AssertionError("literal scalars are inlined in kernels")

    def shape_value(self, value) -> str:
        if isinstance(value, SizeOf):
            return f"{self.tensor(value.tensor)}.shape[{value.dim}]"
        if isinstance(value, IntOp):
            symbol = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "truediv": "/", "pow": "**"}[value.op]
            return f"({self.shape_value(value.a)} {symbol} {self.shape_value(value.b)})"
        if isinstance(value, Scalar):
            return self.scalar(value) if not value.is_literal else repr(value.value)
        if isinstance(value, slice):
            parts = [self.shape_value(p) if p is not None else "" for p in (value.start, value.stop, value.step)]
            return ":".join(parts[:2]) + (f":{parts[2]}" if value.step is not None else "")
        if isinstance(value, tuple):
            inner = ", ".join(self.shape_value(v) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if isinstance(value, list):
            return "[" + ", ".join(self.shape_value(v) for v in value) + "]"
        if value is Ellipsis:
            return "..."
        return repr(value)


def _view_call(base: str, view: View, render) -> str:
    if view.method == "__getitem__":
        index = view.args[0]
        inner = ", ".join(render(i) for i in index) if isinstance(index, tuple) else render(index)
        return f"{base}[{inner}]"
    call = f"{base}.{view.method}({', '.join(render(a) for a in view.args)})"
    return call if view.item is None else f"{call}[{view.item}]"


# --- the file ---------------------------------------------------------------------------------------------


@dataclass
class ModeForward:
    mode: str
    lines: list[str]


def assemble(problem: ProblemSource, kernels: list[KernelSource], forwards: list[ModeForward],
             description: str, main_block: str, plain_attributes: list[str]) -> str:
    """The file: header, host helpers, kernels and launchers, the problem's support code, ModelNew (whose
    __init__ makes `plain_attributes` buffers), and `main_block` (self_check.py). Of the helpers, host and
    device (HOST_HELPERS, pointwise_ops.HELPER_SOURCES), the file carries those its code calls."""
    helpers = {**_definitions(HOST_HELPERS), **{name: text.rstrip() for name, text in HELPER_SOURCES.items()}}
    support = "\n\n\n".join(ast.unparse(s) for s in problem.support)
    body = []
    for kernel in kernels:
        body += [drop_unused_assignments(kernel.kernel.rstrip()), drop_unused_assignments(kernel.launcher.rstrip())]
    if support:
        body.append(support)
    body += [_model_new(problem, forwards, plain_attributes), main_block]
    used = _used_helpers(helpers, "\n\n\n".join(body))
    remembers = any("@functools." in helpers[name] for name in used)
    header = (f'"""Triton kernels for {problem.stem}: {description}."""\n\n'
              + ("import functools\n\n" if remembers else "")
              + "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl")
    return "\n\n\n".join([header, *(helpers[name] for name in used), *body]) + "\n"


def _definitions(source: str) -> dict[str, str]:
    """The top-level functions of `source`, by name, each with its own text, decorators included."""
    lines = source.splitlines()
    return {node.name: "\n".join(lines[min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1:
                                       node.end_lineno])
            for node in parse_python(source).body if isinstance(node, ast.FunctionDef)}


def _used_helpers(helpers: dict[str, str], body: str) -> list[str]:
    """The helpers `body` calls, directly or through one another, in the order `helpers` lists them: a
    generated file carries only what it uses."""
    needed: set[str] = set()
    pending = _names(body)
    while pending:
        name = pending.pop()
        if name in helpers and name not in needed:
            needed.add(name)
            pending |= _names(helpers[name])
    return [name for name in helpers if name in needed]


def _names(source: str) -> set[str]:
    return {node.id for node in ast.walk(parse_python(source)) if isinstance(node, ast.Name)}


def _model_new(problem: ProblemSource, forwards: list[ModeForward], plain_attributes: list[str]) -> str:
    args = ", ".join(["self"] + problem.forward_arg_names())
    call = ", ".join(problem.forward_arg_names())
    methods = []
    if problem.init is not None:
        methods.append(ast.unparse(problem.init) + "".join(_as_buffer_line(p) for p in plain_attributes))
    elif plain_attributes:
        raise UnsupportedSubproblem(f"forward writes self.{plain_attributes[0]}, which Model has no __init__ of "
                                    "its own to make a buffer in")
    if len(forwards) == 1:
        methods.append(f"def forward({args}):\n" + _body(forwards[0].lines))
    else:
        train, evaluation = forwards
        methods.append(f"def forward({args}):\n"
                       "    # the module modes differ (batch or running statistics, dropout on or off)\n"
                       f"    if self.training:\n        return self._forward_train({call})\n"
                       f"    return self._forward_eval({call})")
        methods.append(f"def _forward_train({args}):\n" + _body(train.lines))
        methods.append(f"def _forward_eval({args}):\n" + _body(evaluation.lines))
    body = "\n\n".join(_indent_block(m, 4) for m in methods)
    return f"class ModelNew({', '.join(problem.bases)}):\n{body}"


def _as_buffer_line(path: str) -> str:
    owner, _, name = path.rpartition(".")
    return f"\n    _as_buffer({attribute(owner) if owner else 'self'}, {name!r})"


def _body(lines: list[str]) -> str:
    return "\n".join("    " + line for line in lines)


def _indent_block(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line.strip() else "" for line in text.splitlines())
