"""Broadcast indexing: how a kernel finds each operand's element for a position of its output tile.

A kernel's frame (its output shape) is split into spaces, each walked by one flat index in the kernel
(e.g. GEMM rows and cols). Inside a space, adjacent dims merge into groups wherever every operand is
either broadcast in both or dense in both under every input config; each operand then costs one stride
per group and the kernel one div/mod per group it actually needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UnsupportedSubproblem
from .ir import Shape
from .signature import KernelParam, shape_text

FULL, BCAST, ONE = "full", "bcast", "one"


@dataclass(frozen=True)
class Space:
    name: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Operand:
    """A tensor the kernel reads; `dense` tensors are contiguous, so dims merge; others keep one stride per dim."""

    name: str
    shapes: tuple[Shape, ...]
    dense: bool = True
    what: str = ""                             # the tensor in the forward, e.g. "self.fc.bias", for comments

    def pointer(self, role: str = "operand", param: str | None = None) -> KernelParam:
        """The kernel parameter (`<name>_ptr` unless `param` names it), commented with its role, the tensor
        and its shape."""
        return KernelParam(param or f"{self.name}_ptr", role, detail=f"{self.what} {shape_text(self.shapes)}")


@dataclass(frozen=True)
class Group:
    space: int
    dims: tuple[int, ...]


@dataclass
class Indexer:
    frame: tuple[Shape, ...]                   # the frame shape per config
    spaces: list[Space]
    operands: list[Operand]
    prefix: str = ""
    frame_name: str = "output"                 # what the frame is, for comments: output, input, scores
    groups: list[Group] = field(default_factory=list)

    def __post_init__(self):
        self.groups = [g for s in range(len(self.spaces)) for g in self._space_groups(s)]

    @property
    def rank(self) -> int:
        return len(self.frame[0])

    # --- structure -------------------------------------------------------------------------------

    def status(self, operand: Operand, dim: int, config: int) -> str:
        size = self.frame[config][dim]
        if size == 1:
            return ONE
        shape = operand.shapes[config]
        aligned = dim - (self.rank - len(shape))
        if aligned < 0 or shape[aligned] == 1:
            return BCAST
        if shape[aligned] != size:
            raise UnsupportedSubproblem(f"operand {operand.name} of shape {shape} does not broadcast to "
                                        f"{self.frame[config]}")
        return FULL

    def _trivial(self, dim: int) -> bool:
        return all(shape[dim] == 1 for shape in self.frame)

    def _mergeable(self, a: int, b: int) -> bool:
        for operand in self.operands:
            if not operand.dense:
                return False
            for c in range(len(self.frame)):
                sa, sb = self.status(operand, a, c), self.status(operand, b, c)
                if ONE not in (sa, sb) and sa != sb:
                    return False
        return True

    def _space_groups(self, space_index: int) -> list[Group]:
        dims = [d for d in self.spaces[space_index].dims if not self._trivial(d)]
        runs: list[list[int]] = []
        for d in dims:
            previous = runs[-1][-1] if runs else None
            between_trivial = previous is not None and all(self._trivial(x) for x in range(previous + 1, d))
            if previous is not None and between_trivial and self._mergeable(previous, d):
                runs[-1].append(d)
            else:
                runs.append([d])
        return [Group(space_index, tuple(r)) for r in runs]

    def reads(self, operand: Operand, group: Group) -> bool:
        """The operand's offset depends on this group under some config (and needs a stride for it)."""
        if self.same_layout_as_frame(operand):
            return False
        return any(self.status(operand, d, c) == FULL for d in group.dims for c in range(len(self.frame)))

    def groups_of(self, space_index: int) -> list[Group]:
        return [g for g in self.groups if g.space == space_index]

    # --- names -----------------------------------------------------------------------------------

    def size_name(self, group: Group) -> str:
        return f"{self.prefix}n{self.groups.index(group)}"

    def stride_name(self, operand: Operand, group: Group) -> str:
        return f"{operand.name}_s{self.groups.index(group)}"

    def needs_size(self, group: Group) -> bool:
        """Group sizes are kernel arguments only where a div/mod uses them."""
        groups = self.groups_of(group.space)
        return len(groups) > 1 and any(self.reads(o, g) for o in self.operands for g in groups)

    def kernel_params(self) -> list[str]:
        params = [self.size_name(g) for g in self.groups if self.needs_size(g)]
        for operand in self.operands:
            params += [self.stride_name(operand, g) for g in self.groups if self.reads(operand, g)]
        return params

    def kernel_signature(self) -> list[KernelParam]:
        """`kernel_params()` as the kernel declares them, each with its comment. Group sizes are constexpr: a
        div/mod by a known constant compiles to a multiply and a shift, where one by a runtime int64 costs dozens
        of instructions per element. A new size compiles a new kernel, as torch.compile's static shapes do."""
        params = [KernelParam(self.size_name(g), f"{self.frame_name} size over {_dims(g)} (divides the flat index)",
                              constexpr=True) for g in self.groups if self.needs_size(g)]
        for operand in self.operands:
            params += [KernelParam(self.stride_name(operand, g), f"{operand.name} stride over {self.frame_name} "
                                   f"{_dims(g)} (0: broadcast)")
                       for g in self.groups if self.reads(operand, g)]
        return params

    # --- code ------------------------------------------------------------------------------------

    def wrapper_lines(self, frame_var: str, operand_vars: dict[str, str]) -> list[str]:
        """Python lines in the launcher that compute sizes and strides; returns them as `<name> = ...`."""
        lines = []
        sizes = [g for g in self.groups if self.needs_size(g)]
        if sizes:
            lines.append(f"{', '.join(self.size_name(g) for g in sizes)}, = _group_sizes({frame_var}, "
                         f"{self._dims_literal(sizes)})")
        for operand in self.operands:
            read = [g for g in self.groups if self.reads(operand, g)]
            if read:
                lines.append(f"{', '.join(self.stride_name(operand, g) for g in read)}, = _group_strides("
                             f"{operand_vars[operand.name]}, {frame_var}, {self._dims_literal(read)})")
        return lines

    @staticmethod
    def _dims_literal(groups: list[Group]) -> str:
        return "(" + "".join(f"{g.dims!r}, " for g in groups) + ")"

    def same_layout_as_frame(self, operand: Operand) -> bool:
        """A dense operand of the frame's own shape: its offset is the frame's flat index."""
        return (len(self.spaces) == 1 and operand.dense and self.spaces[0].dims == tuple(range(self.rank))
                and all(self.status(operand, d, c) != BCAST for d in range(self.rank) for c in range(len(self.frame))))

    def offset(self, operand: Operand, indices: "GroupIndices") -> str:
        if self.same_layout_as_frame(operand):
            return indices.flat[0]
        terms = [f"{indices.get(g)} * {self.stride_name(operand, g)}" for g in self.groups if self.reads(operand, g)]
        return " + ".join(terms) if terms else ""


def _dims(group: Group) -> str:
    """"dim 1", "dims 2, 3": a group's dims of the frame, for comments."""
    if len(group.dims) == 1:
        return f"dim {group.dims[0]}"
    return "dims " + ", ".join(str(d) for d in group.dims)


class GroupIndices:
    """Emits, on demand and once per region, the per-group index derived from each space's flat index."""

    def __init__(self, indexer: Indexer, flat: dict[int, str], lines: list[str], tag: str):
        self.indexer = indexer
        self.flat = flat                       # space index -> Triton expression of its flat index
        self.lines = lines
        self.tag = tag
        self.cache: dict[Group, str] = {}
        self.quotients: dict[Group, str] = {}

    def get(self, group: Group) -> str:
        """Row-major decomposition of the space's flat index, innermost group first."""
        if group in self.cache:
            return self.cache[group]
        groups = self.indexer.groups_of(group.space)
        if len(groups) == 1:
            self.cache[group] = self.flat[group.space]
            return self.cache[group]
        quotient = self.flat[group.space]
        for k in range(len(groups) - 1, -1, -1):
            g = groups[k]
            if g not in self.cache:
                name = f"{self.tag}_i{self.indexer.groups.index(g)}"
                expr = quotient if k == 0 else f"{quotient} % {self.indexer.size_name(g)}"
                self.lines.append(f"{name} = {expr}")
                self.cache[g] = name
            if g == group:
                return self.cache[g]
            if g not in self.quotients:
                name = f"{self.tag}_q{self.indexer.groups.index(g)}"
                self.lines.append(f"{name} = {quotient} // {self.indexer.size_name(g)}")
                self.quotients[g] = name
            quotient = self.quotients[g]
        raise AssertionError("group not in its space")
