"""One kernel of a plan: the value it materialises, the anchor it is built around, the values it fuses.

The plan (`plan.py`) forms these; each kind's emitter (`emit_*.py`, listed in `registry.py`) writes one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import BatchStats, Param, Reduce, Shape, Value


@dataclass(frozen=True)
class RowSpace:
    """What a row kernel reduces: the input shape per config and the adjacent run of reduced dims."""

    shapes: tuple[Shape, ...]
    dims: tuple[int, ...]

    def reduced(self) -> tuple[Shape, ...]:
        return tuple(tuple(1 if d in self.dims else s for d, s in enumerate(shape)) for shape in self.shapes)


@dataclass
class KernelPlan:
    """One kernel: it materialises `root`; `body` is every value it computes in registers."""

    root: Value
    kind: str                                  # a registry.KernelKind name: pointwise, rows, matmul, conv, ...
    anchor: Value | None = None                # the GEMM/conv/pool whose output the epilogue starts from
    row: RowSpace | None = None
    reductions: list[Reduce] = field(default_factory=list)   # in dependency order
    body: set[int] = field(default_factory=set)
    leaves: list[Value] = field(default_factory=list)        # tensors it reads
    target: Param | None = None                # write into this buffer instead of a new tensor

    @property
    def full_space(self) -> bool:
        """Row kernels: the output has the reduced input's shape (softmax), not the reduced shape (sum)."""
        return self.row is not None and self.root.shapes == self.row.shapes

    def written_in_place(self) -> list[Param]:
        """Module tensors the kernel overwrites: its target, or the running statistics a BatchStats updates."""
        if self.target is not None:
            return [self.target]
        if isinstance(self.anchor, BatchStats):
            return list(self.anchor.running)
        return []
