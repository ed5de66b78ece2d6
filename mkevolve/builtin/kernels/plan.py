"""Fusion: which values become real tensors, and which kernel computes each of them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UnsupportedSubproblem
from .ir import (Attention, Gather, IndexMask, IntOp, Param, Pointwise, Program, Reduce, Scalar, SizeOf, Unpool,
                 Value, View, base_of, is_integer, is_leaf, walk)
from .kernel_plan import KernelPlan, RowSpace
from .registry import ANCHOR_TYPES, POINTWISE, ROWS, kind_of_anchor


@dataclass
class Plan:
    program: Program
    kernels: list[KernelPlan]                  # in launch order
    materialized: set[int]


def plan(program: Program) -> Plan:
    _copy_leaf_outputs(program)
    materialized = _required_tensors(program)
    targets = {a.value.id: a.target for a in program.assigns}
    while True:
        formed = [_form(program.values[vid], materialized, targets.get(vid)) for vid in sorted(materialized)]
        conflicts = _conflicts(formed, materialized)
        if not conflicts:
            break
        materialized |= conflicts
    kernels = {state.kernel.root.id: state.kernel for state in formed}
    ordered = [kernels[vid] for vid in sorted(kernels)]
    for kernel in ordered:
        _check_special_reads(kernel, program)
        _check_no_read_after_write(kernel, ordered)
    return Plan(program, ordered, materialized)


def _check_special_reads(kernel: KernelPlan, program: Program) -> None:
    """Only an attention kernel computes ones_like/tril masks (it has the query and key offsets). Integer
    tensors are read by elementwise code and reductions, which convert them to float32 as PyTorch promotes
    them (the lowering refuses integer arithmetic), and as a gather's or a max unpool's indices; a GEMM's or
    convolution's template loads its operands as they are, so none takes one."""
    for leaf in kernel.leaves:
        if is_integer(leaf):
            readers = [program.values[vid] for vid in kernel.body if leaf in program.values[vid].operands()]
            if not all(_reads_integers(reader, leaf) for reader in readers):
                raise UnsupportedSubproblem("an integer tensor is an operand of a GEMM, convolution, attention or "
                                            "other template (only elementwise code, reductions and gathers' "
                                            "indices read integers)")
        if isinstance(leaf, IndexMask):
            raise UnsupportedSubproblem("a ones_like/tril/triu mask used other than in a fused attention's scores")


def _reads_integers(reader: Value, leaf: Value) -> bool:
    return (isinstance(reader, (Pointwise, Reduce)) or isinstance(reader, Gather) and reader.index is leaf
            or isinstance(reader, Unpool) and reader.indices is leaf)


def _check_no_read_after_write(writer: KernelPlan, kernels: list[KernelPlan]) -> None:
    """A kernel that writes into a module tensor overwrites the old values in place. Kernels launched after
    it must not read them (they would see the new ones), and it reads them only element for element."""
    written = writer.written_in_place()
    for kernel in kernels:
        if kernel.root.id < writer.root.id:
            continue
        for leaf in kernel.leaves:
            target = next((t for t in written if base_of(leaf) is t), None)
            if target is not None and (kernel is not writer or leaf is not target):
                raise UnsupportedSubproblem(
                    f"self.{target.path} is overwritten in place, and a kernel launched at or after that "
                    "write reads its old values (or reads it other than element for element)")


def _copy_leaf_outputs(program: Program) -> None:
    """A forward must not return its input (or a view of it): such outputs get an identity kernel."""
    def fix(spec):
        if isinstance(spec, (tuple, list)):
            return type(spec)(fix(s) for s in spec)
        if is_leaf(spec) and is_integer(spec):
            raise UnsupportedSubproblem("the forward returns an integer tensor it was given, or a view of one "
                                        "(kernels write float32)")
        if is_leaf(spec):
            return program.add(Pointwise(spec.shapes, op="identity", args=(spec,)))
        return spec
    program.outputs = fix(program.outputs)


def _required_tensors(program: Program) -> set[int]:
    """Values that must exist as tensors: outputs, view bases, GEMM/conv/pool operands, shape sources."""
    required: set[int] = set()

    def need(value: Value) -> None:
        while isinstance(value, View):
            value = value.base
        if not is_leaf(value):
            required.add(value.id)

    for value in program.output_values():
        need(value)
    for assign in program.assigns:
        required.add(assign.value.id)
    for effect in program.effects:
        required.add(effect.id)
    for value in _live(program):
        if isinstance(value, View):
            need(value.base)
            for arg in value.args:
                for size in _sizes_in(arg):
                    need(_shape_source(size, required))
        elif isinstance(value, ANCHOR_TYPES):
            for operand in value.operands():
                need(operand)
        elif isinstance(value, Pointwise):
            for scalar in list(value.args) + list(value.attrs.values()):
                if isinstance(scalar, Scalar) and scalar.expr is not None:
                    for size in _sizes_in(scalar.expr):
                        need(_shape_source(size, required))
    return required


def _live(program: Program) -> list[Value]:
    """Values the outputs depend on. Attention leaves the softmax it replaced behind, unused; an attention's
    logits are read inside its kernel, so their scalars (and the shapes they use) stay live."""
    live: set[int] = set()
    stack = program.output_values() + [a.value for a in program.assigns] + list(program.effects)
    while stack:
        value = stack.pop()
        if value.id in live:
            continue
        live.add(value.id)
        stack.extend(value.operands())
        if isinstance(value, Attention):
            stack.append(value.logits)
    return [v for v in program.values if v.id in live]


def _sizes_in(value) -> list[SizeOf]:
    if isinstance(value, SizeOf):
        return [value]
    if isinstance(value, IntOp):
        return _sizes_in(value.a) + _sizes_in(value.b)
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _sizes_in(v)]
    if isinstance(value, slice):
        return _sizes_in([value.start, value.stop, value.step])
    return []


def _shape_source(size: SizeOf, required: set[int]) -> Value:
    """A tensor with the same size at some dim that exists anyway, found through elementwise operands.

    Rewrites `size` in place to point at it; the size's own tensor if there is none.
    """
    value, dim = size.tensor, size.dim
    while not (is_leaf(value) or value.id in required):
        aligned = None
        for operand in (value.operands() if isinstance(value, Pointwise) else []):
            d = dim - (value.rank - operand.rank)
            if d >= 0 and all(o[d] == s[dim] for o, s in zip(operand.shapes, value.shapes)):
                aligned = (operand, d)
                break
        if aligned is None:
            return value
        value, dim = aligned
    size.tensor, size.dim = value, dim
    return value


@dataclass
class _Forming:
    kernel: KernelPlan
    materialized: set[int]
    prefer_rows: bool = False       # a reduction is reachable: fuse it, and leave GEMMs/convs to their own kernel
    conflicts: set[int] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)


def _form(root: Value, materialized: set[int], target: Param | None) -> _Forming:
    anchored = isinstance(root, ANCHOR_TYPES)
    kind = kind_of_anchor(root) if anchored else POINTWISE
    kernel = KernelPlan(root=root, kind=kind.name, anchor=root if anchored else None, target=target)
    state = _Forming(kernel, materialized, prefer_rows=_reaches_reduction(root, materialized))
    _visit(state, root)
    kernel.reductions.sort(key=lambda r: r.id)
    return state


def _reaches_reduction(root: Value, materialized: set[int]) -> bool:
    """Whether the root's elementwise expression (or the root itself) contains a reduction."""
    inside = walk(root, lambda v: isinstance(v, Pointwise) and (v is root or v.id not in materialized))
    return any(isinstance(value, Reduce) for value in inside)


def _visit(state: _Forming, value: Value) -> None:
    kernel = state.kernel
    if value.id in state.seen:
        return
    state.seen.add(value.id)
    is_root = value is kernel.root
    if not is_root and (value.id in state.materialized or is_leaf(value) or isinstance(value, View)):
        kernel.leaves.append(value)
        return
    if isinstance(value, ANCHOR_TYPES):
        if is_root:
            kernel.body.add(value.id)
            kernel.leaves.extend(o for o in value.operands() if o not in kernel.leaves)
            return
        if (kernel.anchor is None and kernel.row is None and not state.prefer_rows and kernel.target is None
                and value.shapes == kernel.root.shapes and kind_of_anchor(value).takes_epilogue):
            kernel.anchor, kernel.kind = value, kind_of_anchor(value).name
            kernel.body.add(value.id)
            kernel.leaves.extend(o for o in value.operands() if o not in kernel.leaves)
            return
        state.conflicts.add(value.id)
        kernel.leaves.append(value)
        return
    if isinstance(value, Reduce):
        space = RowSpace(value.base.shapes, value.dims)
        if (kernel.row is None and kernel.anchor is None and kernel.target is None
                and kernel.root.shapes in (space.shapes, space.reduced())):
            kernel.row, kernel.kind = space, ROWS.name
        if kernel.row != space:
            state.conflicts.add(value.id)
            kernel.leaves.append(value)
            return
        kernel.body.add(value.id)
        kernel.reductions.append(value)
        _visit(state, value.base)
        return
    kernel.body.add(value.id)
    for operand in value.operands():
        _visit(state, operand)


def _conflicts(formed: list[_Forming], materialized: set[int]) -> set[int]:
    """Values a kernel could not absorb, and reductions/anchors absorbed by more than one kernel."""
    conflicts: set[int] = set()
    owners: dict[int, int] = {}
    for state in formed:
        kernel = state.kernel
        conflicts |= state.conflicts
        for vid in kernel.body:
            if vid == kernel.root.id:
                continue
            value_is_shared = vid in owners and owners[vid] != kernel.root.id
            if value_is_shared and _expensive(kernel, vid):
                conflicts.add(vid)
            owners[vid] = kernel.root.id
    return conflicts - materialized


def _expensive(kernel: KernelPlan, vid: int) -> bool:
    """Reductions and GEMM/conv/pool are computed once; elementwise values may be recomputed per kernel."""
    return any(r.id == vid for r in kernel.reductions) or (kernel.anchor is not None and kernel.anchor.id == vid)
