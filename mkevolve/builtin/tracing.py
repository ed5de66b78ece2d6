"""Tracing: the original's forward as units over an fx graph, with the value each node had on the problem's
inputs and the records of what builds each parameter. Traced once per file content; later calls share it."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

from mkevolve.builtin import expansions
from mkevolve.builtin.construction import (Construction, LeafRecord, Owner, RawRecord, is_torch_layer,
                                           plain_tensor_attributes, record_construction)
from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.builtin.init_loops import loop_follow_ups
from mkevolve.builtin.init_source import FollowUp, InitSource, imported_names, init_links, raw_records
from mkevolve.builtin.kinds import POSITION_FACTORIES, PURE_VIEWS, Kind, kind_of
from mkevolve.builtin.values import ValueInfo, ValueKind, module_constants
from mkevolve.codebase import ProblemSkeleton
from mkevolve.problem import ProblemError, call_inputs, load_problem, make_inputs, read_source, seed_everything
from mkevolve.pysource import parse_python


@dataclass
class Unit:
    """One step of the forward: a layer call, or one function/method call (with its own kind)."""

    index: int
    nodes: list[fx.Node]
    label: str
    kind: Kind
    owners: set[Owner]        # the layers and raw tensors it uses


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
    links: list[set[Owner]]                      # owners that must stay in one subproblem
    follow_ups: dict[Owner, list[FollowUp]]      # owner -> statements run after it is built
    tracer: str                                  # "fx" or "export"
    constants: dict[str, Any]                    # module-level literals of the problem file
    sinkable: set[fx.Node] = field(default_factory=set)   # shape values and pure views, recomputed on demand
    tensor_constants: dict[str, torch.Tensor] = field(default_factory=dict)  # made in forward, not in __init__
    returned: list[fx.Node] = field(default_factory=list)  # nodes the forward returns
    top_statements: tuple[str, ...] = ()         # init loops the top-level runs after building every subproblem

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
    model, construction = record_construction(problem.model_cls, init_args)
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
    constants = module_constants(module_globals)
    import_names = imported_names(imports)
    raws = raw_records(units, construction, init_source, model, constants, import_names, source)
    links, follow_ups = init_links(init_source, model, construction, constants, import_names)
    for owner, replays in loop_follow_ups(init_source, model, construction, constants, import_names).items():
        links.append({owner})   # a replayed layer is built once, never copied into each subproblem that calls it
        follow_ups.setdefault(owner, []).extend(replays)
    return TracedModule(
        problem_name=path.stem, source=source, skeleton=ProblemSkeleton.from_source(path.stem, source),
        graph_module=gm, values=values, units=units, shape_nodes=shape_nodes, construction=construction,
        raws=raws, imports=imports, output_spec=output_spec,
        placeholders=[n for n in gm.graph.nodes if n.op == "placeholder"], links=links, follow_ups=follow_ups,
        tracer=tracer, constants=constants,
        sinkable=shape_nodes | _pure_views(units, values) | _position_factories(units, shape_nodes),
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
    views = {u.nodes[0] for u in units if len(u.nodes) == 1 and u.kind is Kind.VIEW and u.label in PURE_VIEWS}
    return {v for v in views if not any(a not in views and a in values and values[a].kind is not ValueKind.TENSOR
                                        for a in v.all_input_nodes[:1])}


def _position_factories(units: list[Unit], shape_nodes: set[fx.Node]) -> set[fx.Node]:
    """`torch.arange(x.shape[1])` and the like: tensors made from shape values alone, which the subproblem
    that reads one recomputes rather than taking it from another (an integer tensor crossing between
    subproblems is one more input that the builtin kernels only take as an embedding's positions)."""
    return {u.nodes[0] for u in units if len(u.nodes) == 1 and u.label in POSITION_FACTORIES
            and all(a in shape_nodes for a in u.nodes[0].all_input_nodes)}


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


def node_label(node: fx.Node, model: nn.Module) -> str:
    if node.op == "call_module":
        return type(model.get_submodule(node.target)).__name__.lower()
    if node.op == "call_method":
        return str(node.target)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


def owner_of(target: str, model: nn.Module, leaves: dict[str, LeafRecord]) -> Owner:
    """What the tensor at `target` (a get_attr path) belongs to."""
    if target in leaves:
        return Owner.leaf(target)
    parent = target.rpartition(".")[0]
    if parent == "":
        return Owner.raw(target)
    # An expanded layer reads its children's parameters (MultiheadAttention's out_proj.weight): the owner
    # is the outermost layer above them.
    ancestor = parent
    while ancestor:
        if ancestor in leaves:
            return Owner.leaf(ancestor)
        ancestor = ancestor.rpartition(".")[0]
    holder = model.get_submodule(parent)
    # A tensor of the user's own submodule (a GraphModule keeps such submodules as plain nn.Module): rebuilt
    # by the statements of that class's __init__.
    if type(holder) is nn.Module or not is_torch_layer(holder):
        return Owner.raw(target)
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
        owners = {owner_of(a.target, model, leaves) for a in node.all_input_nodes
                  if a.op == "get_attr" and a.target not in tensor_constants}
        if node.op == "call_module":
            if node.target not in leaves:
                raise UnsupportedModule(f"cannot rebuild module '{node.target}' "
                                        f"({type(model.get_submodule(node.target)).__name__})")
            owners.add(Owner.leaf(node.target))
        layer = _export_layer(node, leaves) if tracer == "export" else None
        if layer is not None and layer == last_layer:
            units[-1].nodes.append(node)
            units[-1].owners |= owners
            continue
        last_layer = layer
        label = type(model.get_submodule(layer)).__name__.lower() if layer else node_label(node, model)
        units.append(Unit(len(units), [node], label, kind_of(label, node, values, model), owners))
    if not units:
        raise UnsupportedModule("the forward does no computation")
    return units


def _export_layer(node: fx.Node, leaves: dict[str, LeafRecord]) -> str | None:
    """The torch.nn layer an exported node came from, if any (its innermost module)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    path = re.sub(r"@\d+$", "", path)
    return path if path in leaves else None
