"""The least work of one forward per input config: what the self-check places its time against.

Bytes: every tensor the forward reads from outside its kernels (inputs, parameters, buffers) read once, and
every tensor it hands back (outputs, buffers written in place) written once. What kernels pass one another is not
counted: a perfect fusion would keep it on chip. FLOPs: those of the kernels' anchors (GEMMs, convolutions,
attention; 2 per multiply-add, the registry's `flops`). Elementwise and reduction work, a few operations
per element, is left out: it never sets the floor at 67 TFLOP/s against 4.3 TB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ir import Input, Param, Shape, Value, base_of, is_integer
from .plan import Plan
from .registry import kind_of

_FLOAT_BYTES = 4      # the kernels read and write fp32
_INDEX_BYTES = 8      # integer inputs (gather indices) are counted as int64, torch's index dtype


@dataclass(frozen=True)
class Work:
    input_shapes: tuple[Shape, ...]     # the forward's tensor inputs, in order: which config this is
    min_bytes: int
    flops: int


def forward_work(plan: Plan) -> list[Work]:
    """One Work per input config of the subproblem, in the order of its get_input_configs()."""
    program = plan.program
    inputs = sorted(program.inputs, key=lambda i: i.index)
    reads = [leaf for kernel in plan.kernels for leaf in kernel.leaves if isinstance(base_of(leaf), (Input, Param))]
    writes = program.output_values() + [t for kernel in plan.kernels for t in kernel.written_in_place()]
    configs = len(writes[0].shapes)
    return [Work(input_shapes=tuple(i.shapes[c] for i in inputs),
                 min_bytes=_bytes(reads, c) + _bytes(writes, c),
                 flops=sum(kind_of(k).kernel_flops(k, c) for k in plan.kernels))
            for c in range(configs)]


def _bytes(values: list[Value], config: int) -> int:
    """Bytes of `values` under one config, each tensor once: views of one tensor add up to at most its
    size (a slice reads less of it, an expand no more)."""
    bases: dict[int, Value] = {}
    views: dict[int, dict[int, Value]] = {}
    for value in values:
        base = base_of(value)
        bases[base.id] = base
        views.setdefault(base.id, {})[value.id] = value
    total = 0
    for base_id, base in bases.items():
        size = _numel(base, config)
        read = sum(min(_numel(view, config), size) for view in views[base_id].values())
        total += min(read, size) * _itemsize(base)
    return total


def _numel(value: Value, config: int) -> int:
    return math.prod(value.shapes[config])


def _itemsize(value: Value) -> int:
    return _INDEX_BYTES if is_integer(value) else _FLOAT_BYTES
