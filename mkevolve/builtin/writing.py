"""Code writing: for one segmentation, the subproblem files (groups with the same code share one) and the
top-level that builds and calls them in sequence."""

from __future__ import annotations

import ast
import builtins
import hashlib
import inspect
import itertools
import keyword
import operator
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from mkevolve.builtin.construction import LeafRecord, Owner
from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.builtin.init_source import FollowUp, self_path
from mkevolve.builtin.kinds import Kind
from mkevolve.builtin.segments import Segmentation
from mkevolve.builtin.tracing import TracedModule, closure, external_inputs, node_label, owner_of
from mkevolve.builtin.values import literal_source, same_value
from mkevolve.codebase import PROBLEM_FILE, PROBLEMS_DIR, class_alias, safe_name
from mkevolve.pysource import parse_python


_INFIX = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
          operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
          operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.lshift: "<<",
          operator.rshift: ">>", operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=",
          operator.gt: ">", operator.ge: ">="}
_PREFIX = {operator.neg: "-", operator.pos: "+", operator.invert: "~", operator.not_: "not "}
_RESERVED = {"self", "torch", "nn", "F", "math", "operator", "super", "x"} | set(dir(builtins))


@dataclass
class OwnerCode:
    """How a subproblem builds one owner: attribute name and the statements (parameterised later)."""

    key: Owner
    attribute: str
    order: float


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
        placed = sorted((k for k, g in self.placement.items() if index in g), key=self._owner_order)
        owners = self._owner_codes(placed)
        names = self._canonical_names(inputs, ordered, owners)
        if not outputs:
            raise UnsupportedModule(f"units {group.start}-{group.stop - 1} compute nothing the rest of the forward "
                                    "uses")
        lines = [f"{names[n]} = {self._expression(n, names, owners)}" for n in ordered]
        values = self.traced.values
        returned = [names[n] + ("" if values[n].contiguous or n in self.traced.returned else ".contiguous()")
                    for n in outputs]
        lines.append(f"return {', '.join(returned)}")
        labels = [u.label for u in units if u.kind is not Kind.VIEW] or [units[0].label]
        return GroupCode(group, labels, lines, inputs, outputs, owners)

    def _owner_order(self, owner: Owner) -> int:
        if owner.is_leaf:
            return self.traced.construction.leaves[owner.name].order
        return self.traced.raws[owner.name].order if owner.name in self.traced.raws else -1

    def _owner_codes(self, keys: list[Owner]) -> list[OwnerCode]:
        codes, taken = [], set()
        for key in keys:
            if key.is_leaf:
                base = self.traced.construction.leaves[key.name].cls.__name__.lower()
            else:
                base = _identifier(key.name)
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
            base = _identifier(node_label(node, self.model))
            if node.op == "call_module":
                base = next(o.attribute for o in owners if o.key == Owner.leaf(node.target))
            names[node] = _unique(base if base not in _RESERVED else f"{base}_out", taken)
            taken.add(names[node])
        return names

    def _expression(self, node: fx.Node, names: dict[fx.Node, str], owners: list[OwnerCode]) -> str:
        def arg(value) -> str:
            return self._argument(value, names, owners)

        args = [arg(a) for a in node.args]
        kwargs = [f"{k}={arg(v)}" for k, v in node.kwargs.items()]
        if node.op == "call_module":
            attribute = next(o.attribute for o in owners if o.key == Owner.leaf(node.target))
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
                return f"torch.tensor({literal_source(constant.tolist())}, dtype={constant.dtype})"
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
        return literal_source(value)

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
        key = owner_of(target, self.model, self.traced.construction.leaves)
        attribute = next(o.attribute for o in owners if o.key == key)
        if key.is_leaf:
            rest = target[len(key.name) + 1:]
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
        bases = [safe_name("_".join(_dedupe(p.groups[0].labels)[:4]), default="block") + self._grouping_suffix(p)
                 for p in patterns]
        for pattern, base in zip(patterns, bases):
            clash = bases.count(base) > 1
            digest = hashlib.sha256(pattern.groups[0].key.encode()).hexdigest()[:6]
            pattern.name = f"{base}_{digest}" if clash else base
            pattern.params = self._params(pattern)
        return patterns

    def _grouping_suffix(self, pattern: Pattern) -> str:
        """"_depthwise" or "_grouped" in the name of a pattern of such convolutions (conv2d_depthwise)."""
        tags = {_conv_grouping(self.traced.construction.leaves[o.key.name])
                for o in pattern.groups[0].owners if o.key.is_leaf}
        return "_depthwise" if "[depthwise]" in tags else "_grouped" if "[grouped]" in tags else ""

    def _pattern_key(self, code: GroupCode) -> str:
        attributes = {o.key: o.attribute for o in code.owners}
        init = []
        for step in self._init_steps(code):
            if isinstance(step, list):
                init.append(self._follow_up_source(step, attributes))
            elif step.key.is_leaf:
                leaf = self.traced.construction.leaves[step.key.name]
                init.append(f"{step.attribute}={leaf.cls.__qualname__}{_conv_grouping(leaf)}{_parameters_made(leaf)}")
            else:
                init.append(f"{step.attribute}=" + "\n".join(self.traced.raws[step.key.name].statements))
        return "\n".join(code.forward_lines + init)

    def _init_steps(self, code: GroupCode) -> list[OwnerCode | list[FollowUp]]:
        """What the subproblem's __init__ does, in the order the original does it (which keeps its random draws
        in order): build each owner, run each follow-up statement; one loop's replays on several layers run
        as one loop."""
        steps: list[tuple[float, OwnerCode | FollowUp]] = [(o.order, o) for o in code.owners]
        here = {o.key for o in code.owners}
        steps += [(f.order, f) for o in code.owners for f in self.traced.follow_ups.get(o.key, [])
                  if not f.tie or all(Owner.leaf(layer) in here for layer in f.layers)]   # else: the top-level's
        merged: list[OwnerCode | list[FollowUp]] = []
        for _, step in sorted(steps, key=lambda s: s[0]):
            if isinstance(step, OwnerCode):
                merged.append(step)
            elif step.loop is not None and merged and isinstance(merged[-1], list) and merged[-1][0].loop == step.loop:
                merged[-1].append(step)
            else:
                merged.append([step])
        return merged

    def _follow_up_source(self, run: list[FollowUp], attributes: dict[Owner, str]) -> str:
        """A follow-up statement on the subproblem's attributes; a replayed loop, over all its layers in `run`."""
        first = run[0]
        if first.loop is not None:
            return first.loop.statement([(f.layers[0], f"self.{attributes[Owner.leaf(f.layers[0])]}") for f in run])
        statement = first.statement
        for layer in first.layers:
            statement = _rename_self_attribute(statement, layer, attributes[Owner.leaf(layer)])
        return statement

    def _params(self, pattern: Pattern) -> list[tuple[str, str, str]]:
        """(parameter name, owner attribute or "" for a free name of a raw owner, argument name), in the
        order the owners are built; raw owners' free names keep their own names."""
        first = pattern.groups[0]
        raw_names = list(dict.fromkeys(n for o in first.owners for n in self._free_names(o.key)))
        leaf_args: list[tuple[str, str]] = []
        for position, owner in enumerate(first.owners):
            if owner.key.is_leaf:
                leaf_args += [(owner.attribute, name)
                              for name, _, _ in self.traced.construction.leaves[owner.key.name].arguments
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

    def _free_names(self, owner: Owner) -> list[str]:
        """Model arguments and constants the statements that build an owner read."""
        if not owner.is_leaf:
            return self.traced.raws[owner.name].free_names
        return [n for f in self.traced.follow_ups.get(owner, []) for n in f.free_names]

    def _is_default(self, owner: Owner, argument: str) -> bool:
        leaf = self.traced.construction.leaves[owner.name]
        for name, value, default in leaf.arguments:
            if name == argument:
                return default is not _EMPTY and same_value(value, default)
        return True

    def _argument_value(self, code: GroupCode, param: tuple[str, str, str]) -> tuple[Any, str]:
        """The value a parameter takes for one group, and its source in the top-level."""
        name, attribute, argument = param
        if not attribute:
            arguments = self.traced.construction.root_arguments
            return (arguments[name] if name in arguments else self.traced.constants[name]), name
        owner = next(o for o in code.owners if o.attribute == attribute)
        leaf = self.traced.construction.leaves[owner.key.name]
        value = next(v for n, v, _ in leaf.arguments if n == argument)
        return value, leaf.expressions.get(argument) or literal_source(value)

    def _subproblem_source(self, pattern: Pattern) -> str:
        first = pattern.groups[0]
        arrow = " -> ".join(first.labels)
        count = len(pattern.groups)
        doc = f"Subproblem {pattern.name} of {self.traced.problem_name}: {arrow} ({count} instance{'s' * (count > 1)})."
        lines = [f'"""{doc}"""', ""]
        params = ", ".join(["self"] + [p[0] for p in pattern.params])
        body = ["class Model(nn.Module):", f"    def __init__({params}):", "        super().__init__()"]
        body += [f"        {line}" for line in self._init_body(pattern)]
        inputs = ", ".join(["self"] + [("x" if len(first.input_nodes) == 1 else f"x{i}")
                                       for i in range(len(first.input_nodes))])
        body += ["", f"    def forward({inputs}):"] + [f"        {line}" for line in first.forward_lines]
        body += [""] + self._input_functions(pattern)
        lines += _imports_for("\n".join(body), self.traced.imports) + ["", ""] + body
        return "\n".join(lines) + "\n"

    def _init_body(self, pattern: Pattern) -> list[str]:
        first = pattern.groups[0]
        attributes = {o.key: o.attribute for o in first.owners}
        lines = []
        for step in self._init_steps(first):
            if isinstance(step, list):
                lines += self._follow_up_source(step, attributes).splitlines()
            else:
                lines += self._owner_lines(step, pattern)
        return lines

    def _owner_lines(self, owner: OwnerCode, pattern: Pattern) -> list[str]:
        if not owner.key.is_leaf:
            raw = self.traced.raws[owner.key.name]
            renamed = [_rename_self_attribute(s, raw.local, owner.attribute) for s in raw.statements]
            return [line for s in renamed for line in s.splitlines()]
        leaf = self.traced.construction.leaves[owner.key.name]
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
        return [f"self.{owner.attribute} = nn.{leaf.cls.__name__}({', '.join(args)})"]

    def _input_functions(self, pattern: Pattern) -> list[str]:
        entries = []
        for code in pattern.groups:
            init = "[" + ", ".join(literal_source(self._argument_value(code, p)[0]) for p in pattern.params) + "]"
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
        init_lines += self._ties_across(codes)
        for statement in self.traced.top_statements:     # init loops that draw after every layer is built
            init_lines += statement.splitlines()
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

    def _ties_across(self, codes: list[GroupCode]) -> list[str]:
        """Parameters shared by layers of two subproblems (`self.lm_head.weight = self.wte.weight`), tied once
        every subproblem is built: each layer named by its subproblem's attribute and its own within it."""
        where = {o.key: (code.attribute, o.attribute) for code in codes for o in code.owners}
        lines = []
        for follow_ups in self.traced.follow_ups.values():
            for tie in (f for f in follow_ups if f.tie):
                if not all(Owner.leaf(layer) in where for layer in tie.layers):
                    continue    # a layer no subproblem builds: the forward never reads the parameter
                if len({where[Owner.leaf(layer)][0] for layer in tie.layers}) > 1:
                    statement = tie.statement
                    for layer in tie.layers:
                        statement = _rename_self_attribute(statement, layer, ".".join(where[Owner.leaf(layer)]))
                    lines.append(statement)
        return lines

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
            return literal_source(value)

        if self.traced.tracer == "export":
            from torch.utils import _pytree as pytree

            flat = [render_value(v) for v in output.args[0]]
            return _render_structure(pytree.tree_unflatten(flat, self.traced.output_spec))
        return render_value(output.args[0])


_EMPTY = inspect.Parameter.empty


def _conv_grouping(leaf: LeafRecord) -> str:
    """A depthwise or grouped convolution is its own pattern, apart from dense ones of the same class: a dense
    convolution is a GEMM for tensor cores, a depthwise one a memory-bound window sum (MobileNetV2 has both
    kinds of nn.Conv2d): each kind then gets its own search, budget and timing."""
    if not issubclass(leaf.cls, nn.modules.conv._ConvNd):
        return ""
    arguments = {name: value for name, value, _ in leaf.arguments}
    groups, channels = arguments.get("groups", 1), arguments.get("in_channels")
    if groups == 1:
        return ""
    return "[depthwise]" if groups == channels else "[grouped]"


# Constructor flags that decide whether a layer has a parameter or buffer at all (nn.Linear's bias, a norm's affine).
_PRESENCE_FLAGS = ("bias", "affine", "elementwise_affine", "track_running_stats")


def _parameters_made(leaf: LeafRecord) -> str:
    """The presence flags a layer was built with: layers of one class with and without a bias (a language
    model's attention projections and its bias-free head) are two patterns, since one kernel file cannot take
    a parameter that only some instances have."""
    flags = [f"{name}={bool(value)}" for name, value, _ in leaf.arguments if name in _PRESENCE_FLAGS]
    return f"[{', '.join(flags)}]" if flags else ""


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
    """The statement with `self.<old>` (an attribute, or a dotted path such as `transformer.wte`) read as
    `self.<new>`, and a buffer or parameter registered as `old` registered as `new`."""
    if old == new:
        return statement

    class Rename(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            if self_path(node) == old:
                return ast.parse(f"self.{new}", mode="eval").body
            return self.generic_visit(node)

        def visit_Call(self, node: ast.Call) -> ast.AST:
            self.generic_visit(node)
            if (isinstance(node.func, ast.Attribute) and node.func.attr in ("register_buffer", "register_parameter")
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == old):
                node.args[0] = ast.Constant(new)
            return node

    return ast.unparse(Rename().visit(parse_python(statement)))
