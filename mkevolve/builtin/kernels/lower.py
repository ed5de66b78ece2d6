"""Walk a traced graph and lower every live node into the tensor program, checking shapes against the trace."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree

from . import handlers_layers, handlers_losses, handlers_math
from .builders import Builder
from .calls import Call, Handler
from .errors import UnsupportedOps, UnsupportedSubproblem
from .ir import Assign, Input, Program, Scalar, Value, View, is_integer, is_leaf
from .mutation import (check_no_stale_alias, is_inplace_name, is_module_attribute, mutated_input,
                       touches_caller_tensor)
from .trace import FX_CONSTANT, INDEX_DTYPES, Trace

FUNCTIONS: dict[str, Handler] = {**handlers_math.FUNCTIONS, **handlers_layers.FUNCTIONS, **handlers_losses.FUNCTIONS}
MODULES: dict[type, Handler] = {**handlers_math.MODULES, **handlers_layers.MODULES, **handlers_losses.MODULES}

_INPLACE_OPERATORS = {"iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "truediv"}
_FLOAT_DTYPES = (torch.float32, torch.bool)


def function_key(target: Any) -> str:
    """The handler name for a call_function target: torch/F name, `operator.<name>`, or the aten op name."""
    if isinstance(target, torch._ops.OpOverload):
        name = target._schema.name.split("::")[-1]
        key = f"aten.{name}"
        return key if key in FUNCTIONS else _strip_inplace(name)
    if target is getattr:
        return "getattr"
    name = getattr(target, "__name__", repr(target))
    module = getattr(target, "__module__", "") or ""
    if module in ("_operator", "operator") or target in vars(operator).values():
        return "operator." + _INPLACE_OPERATORS.get(name, name)
    if module == "math":
        return "math." + name
    return _strip_inplace(name)


def _strip_inplace(name: str) -> str:
    """`relu_` computes what `relu` computes; the program is functional."""
    if name.endswith("_") and not name.endswith("__"):
        return name[:-1]
    return name


def lower(trace: Trace) -> Program:
    for config in trace.configs:
        config.model.train(trace.mode == "train")   # module handlers read `training` (BatchNorm)
    return _Lowering(trace).run()


class _Lowering:
    def __init__(self, trace: Trace):
        self.trace = trace
        self.program = Program()
        self.builder = Builder(self.program, [c.model for c in trace.configs])
        self.nodes = [trace.nodes(c) for c in range(len(trace.configs))]
        self.env: dict[fx.Node, Any] = {}

    def run(self) -> Program:
        graph_nodes = self.nodes[0]
        output = graph_nodes[-1]
        order = {node: index for index, node in enumerate(graph_nodes)}  # position in the forward
        live = self._keep_mutations(graph_nodes, order, _live(self._user_outputs(output)))
        missing = self._missing_handlers(graph_nodes, live)
        if missing:
            raise UnsupportedOps(missing)
        for index, node in enumerate(graph_nodes):
            if node.op == "output":
                break
            if node not in live:
                self._check_dead(node)
                continue
            self.env[node] = self._lower_node(index, node)
            self._rebind_mutated(node, order, live)
        self.program.outputs = self._outputs(output)
        for value in self.program.output_values():
            if not isinstance(value, Value):
                raise UnsupportedSubproblem(f"forward returns a {type(value).__name__}, not a tensor")
        return self.program

    # --- graph plumbing --------------------------------------------------------------------------

    def _user_outputs(self, output: fx.Node) -> list:
        values = output.args[0]
        if self.trace.kind == "export":
            return [values[i] for i in self.trace.user_output_indices]
        return [values]

    def _outputs(self, output: fx.Node):
        values = [_pairs_as_tuples(self._arg(v)) for v in self._user_outputs(output)]
        if self.trace.kind == "export":
            return _pytree.tree_unflatten(values, self.trace.out_spec)
        return values[0]

    def _keep_mutations(self, nodes: list[fx.Node], order: dict[fx.Node, int], live: set[fx.Node]) -> set[fx.Node]:
        """`y.relu_()` as a statement: its result is unused, yet it is live when `y` is read after it. One on
        a plain tensor attribute (`self.hidden.copy_(x)`) is always live: its result is written back
        (_write_back). One on a parameter or buffer nothing reads afterwards stays dead, as the running
        statistics a training-mode batch norm updates do (BatchNorm's int64 `num_batches_tracked += 1`). One
        on a forward input, or on a view of an attribute, stays dead, so _check_dead refuses the caller-visible
        mutation."""
        model = self.trace.configs[0].model
        module_of = model.get_submodule
        # fx gives each `self.state` in the source its own get_attr node: any of them reads the attribute
        attribute_reads: dict[str, list[fx.Node]] = {}
        for node in nodes:
            if node.op == "get_attr":
                attribute_reads.setdefault(node.target, []).append(node)
        changed = True
        while changed:      # a kept op makes its inputs live, which can keep an earlier in-place op
            changed = False
            for node in nodes:
                mutated = None if node in live else mutated_input(node, module_of)
                if mutated is None:
                    continue
                attribute = is_module_attribute(mutated)
                readers = attribute_reads[mutated.target] if attribute else [mutated]
                read_later = (attribute or not touches_caller_tensor(mutated, module_of)) and any(
                    u in live and order[u] > order[node] for reader in readers for u in reader.users)
                plain_attribute = attribute and not _is_parameter_or_buffer(model, mutated.target)
                if read_later or plain_attribute:
                    live |= _live([node])
                    changed = True
        return live

    def _rebind_mutated(self, node: fx.Node, order: dict[fx.Node, int], live: set[fx.Node]) -> None:
        """After `F.relu(y, inplace=True)` or `y.mul_(2)`, later reads of `y` read the op's result."""
        model = self.trace.configs[0].model
        mutated = mutated_input(node, model.get_submodule)
        if mutated is None or not isinstance(self.env.get(mutated), Value):
            return      # nothing mutated, or Python number arithmetic (`n += 1` rebinds, it mutates nothing)
        check_no_stale_alias(node, mutated, model.get_submodule, order, live)
        self.env[mutated] = self.env[node]
        if is_module_attribute(mutated):
            self._write_back(node, mutated.target, order, live)

    def _write_back(self, node: fx.Node, path: str, order: dict[fx.Node, int], live: set[fx.Node]) -> None:
        """`self.<path>.copy_(x)`: the caller sees the attribute change, so the program writes the op's result
        into it (an Assign), and every read of `self.<path>` from here on, through any get_attr node, reads
        the result; get_attr nodes taken earlier hold the same tensor, so they are rebound too."""
        value = self.env[node]
        if not isinstance(value, Value) or is_leaf(value) or isinstance(value, View):
            raise UnsupportedSubproblem(f"{_describe(node)} changes the metadata of self.{path}, not its values; "
                                        "the generated program cannot express that")
        if self.program.assigned(path) is not None:
            raise UnsupportedSubproblem(f"self.{path} is written twice in one forward")
        self.program.assigns.append(Assign(self.builder.param(path, value.shapes), value))
        model = self.trace.configs[0].model
        if not _is_parameter_or_buffer(model, path):
            self.program.plain_attributes.append(path)
        for other in self.env:
            if other.op == "get_attr" and other.target == path:
                check_no_stale_alias(node, other, model.get_submodule, order, live)
                self.env[other] = value

    def _check_dead(self, node: fx.Node) -> None:
        """An in-place op left dead (nothing reads the tensor it changes afterwards, or that tensor is the
        caller's) still changes its input; the program cannot express that."""
        if node.op in ("call_method", "call_function") and not node.users:
            key = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
            if isinstance(key, str) and is_inplace_name(key):
                if self.trace.kind == "export" and self._mutates_buffer(node):
                    return
                raise UnsupportedSubproblem(f"in-place {key} whose result is not used (mutation of its input)")

    def _mutates_buffer(self, node: fx.Node) -> bool:
        first = node.args[0] if node.args else None
        return isinstance(first, fx.Node) and first.name in self.trace.placeholder_params

    def _arg(self, value):
        if isinstance(value, fx.Node):
            return self.env[value]
        if isinstance(value, (tuple, list)):
            return type(value)(self._arg(v) for v in value)
        if isinstance(value, dict):
            return {k: self._arg(v) for k, v in value.items()}
        if isinstance(value, slice):  # `x[:, :T]` with T a traced size
            return slice(self._arg(value.start), self._arg(value.stop), self._arg(value.step))
        return value

    def _traced_shapes(self, index: int):
        """The node's shape per config for tensor results (the rank must agree); the raw entries otherwise."""
        shapes = [self.trace.configs[c].shapes[self.nodes[c][index].name] for c in range(len(self.nodes))]
        if not all(isinstance(s, tuple) and all(isinstance(d, int) for d in s) for s in shapes):
            return shapes
        if len({len(s) for s in shapes}) > 1:
            raise UnsupportedSubproblem(f"{_describe(self.nodes[0][index])} has rank {len(shapes[0])} under one "
                                        "input config and a different rank under another")
        return tuple(shapes)

    def _check_dtype(self, node: fx.Node, value) -> None:
        """Tensor results must be float32 (or masks); a tuple's entries are checked where they are taken.
        Integer results pass only where no arithmetic computes them: integer inputs and buffers, torch.arange,
        argmax/argmin and views of them (kernels read them as indices, or convert them as PyTorch
        promotes them)."""
        dtype = self.trace.configs[0].dtypes[node.name]
        if dtype in INDEX_DTYPES and isinstance(value, Value) and is_integer(value):
            return
        if isinstance(dtype, torch.dtype) and dtype not in _FLOAT_DTYPES:
            raise UnsupportedSubproblem(f"{_describe(node)} produces {dtype}; only float32 is supported")

    # --- nodes -----------------------------------------------------------------------------------

    def _lower_node(self, index: int, node: fx.Node):
        result = self._lower_value(index, node)
        self._check_dtype(node, result)
        return result

    def _lower_value(self, index: int, node: fx.Node):
        shapes = self._traced_shapes(index)
        if node.op == "placeholder":
            return self._placeholder(node, shapes)
        if node.op == "get_attr":
            return self._get_attr(node, shapes)
        call = Call(name="", args=list(self._arg(node.args)), kwargs=self._arg(dict(node.kwargs)),
                    shapes=shapes if isinstance(shapes, tuple) else None, results=shapes)
        handler = self._handler(node, call)
        result = handler(self.builder, call)
        if isinstance(result, Value) and isinstance(shapes, tuple) and result.shapes != shapes:
            raise UnsupportedSubproblem(f"internal error: {_describe(node)} lowered to shapes {result.shapes}, "
                                        f"the trace says {shapes}")
        return result

    def _handler(self, node: fx.Node, call: Call) -> Handler:
        if node.op == "call_module":
            modules = [c.model.get_submodule(node.target) for c in self.trace.configs]
            call.modules, call.path, call.name = modules, node.target, type(modules[0]).__name__
            handler = MODULES.get(type(modules[0]))
            if handler is None:
                raise UnsupportedSubproblem(f"module {_module_name(modules[0])} is not supported")
            return handler
        call.name = node.target if node.op == "call_method" else function_key(node.target)
        if node.op == "call_method":
            call.name, call.method = _strip_inplace(call.name), True
        handler = FUNCTIONS.get(call.name)
        if handler is None:
            raise UnsupportedSubproblem(f"op {call.name!r} ({_describe(node)}) is not supported")
        return handler

    def _missing_handlers(self, nodes: list[fx.Node], live: set[fx.Node]) -> list[str]:
        """Every live op and module without a handler, before any is lowered: stopping at the first would
        name one where the person (or the next agent) needs the whole list."""
        missing = []
        for node in nodes:
            if node not in live:
                continue
            if node.op == "call_module":
                module = self.trace.configs[0].model.get_submodule(node.target)
                if type(module) not in MODULES:
                    missing.append(_module_name(module))
            elif node.op == "call_method" and _strip_inplace(node.target) not in FUNCTIONS:
                missing.append(f"Tensor.{node.target}")
            elif node.op == "call_function" and function_key(node.target) not in FUNCTIONS:
                missing.append(_function_label(node.target))
        return list(dict.fromkeys(missing))

    def _placeholder(self, node: fx.Node, shapes) -> Value:
        path = self.trace.placeholder_params.get(node.name)
        if path is not None:
            return self.builder.param(path, shapes)
        index = self.trace.placeholder_inputs.index(node.name)
        dtype = self.trace.configs[0].dtypes[node.name]
        value = self.program.add(Input(shapes, index=index, name=node.name, integer=dtype in INDEX_DTYPES,
                                       boolean=dtype == torch.bool))
        self.program.inputs.append(value)
        return value

    def _get_attr(self, node: fx.Node, shapes):
        """A parameter or buffer of the model; constants that tracing created (`torch.tensor(0.5)` in
        forward) are inlined when they hold one number."""
        if not node.target.startswith(FX_CONSTANT):
            tensor = _resolve(self.trace.configs[0].model, node.target)
            if isinstance(tensor, torch.Tensor):
                return self.program.assigned(node.target) or self.builder.param(
                    node.target, shapes, integer=tensor.dtype in INDEX_DTYPES)
            raise UnsupportedSubproblem(f"attribute {node.target} is not a tensor")
        values = {_constant_value(_resolve(c.graph_module, node.target)) for c in self.trace.configs}
        if len(values) == 1 and None not in values:
            return Scalar(values.pop())
        raise UnsupportedSubproblem(f"tensor constant {node.target} created in forward")


def _pairs_as_tuples(spec):
    """A (values, indices) pair the forward returns as it is (`return self.pool(x)`, `return x.max(dim=1)`): its
    two tensors, as a tuple."""
    if isinstance(spec, handlers_math.ValuesIndices):
        return (spec.item(0), spec.item(1))
    if isinstance(spec, (tuple, list)):
        return type(spec)(_pairs_as_tuples(s) for s in spec)
    return spec


def _constant_value(tensor: torch.Tensor) -> float | None:
    if tensor.numel() != 1 or tensor.device.type == "meta":
        return None
    return float(tensor.item())


def _resolve(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _is_parameter_or_buffer(model: nn.Module, path: str) -> bool:
    owner, _, name = path.rpartition(".")
    module = model.get_submodule(owner)
    return name in module._parameters or name in module._buffers


def _live(roots: list) -> set[fx.Node]:
    live: set[fx.Node] = set()
    stack = [n for n in _pytree.tree_leaves(roots) if isinstance(n, fx.Node)]
    while stack:
        node = stack.pop()
        if node in live:
            continue
        live.add(node)
        stack.extend(node.all_input_nodes)
    return live


def _describe(node: fx.Node) -> str:
    return f"node {node.name} = {node.op} {getattr(node.target, '__name__', node.target)}"


def _function_label(target: Any) -> str:
    """`aten.cumsum`, `torch.cumsum`, `operator.xor`: the op as a person would search for it."""
    if isinstance(target, torch._ops.OpOverload):
        return "aten." + target._schema.name.split("::")[-1]
    key = function_key(target)
    if "." in key:
        return key
    module = getattr(target, "__module__", None) or "torch"
    return f"{module}.{getattr(target, '__name__', key)}"


def _module_name(module: nn.Module) -> str:
    cls = type(module)
    prefix = "nn." if cls.__module__.startswith("torch.nn") else f"{cls.__module__}."
    return prefix + cls.__name__
