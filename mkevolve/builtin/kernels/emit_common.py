"""Shared pieces of kernel emission: elementwise expressions, operand loads, runtime scalars, sources."""

from __future__ import annotations

from dataclasses import dataclass, field

from .configs import Variant
from .indexing import GroupIndices, Indexer, Operand
from .ir import Input, Param, Pointwise, Program, Reduce, Scalar, Value, View, is_integer
from .kernel_plan import KernelPlan
from .pointwise_ops import OPS, literal
from .signature import KernelParam, constexpr, shape_text


@dataclass
class LauncherArg:
    """A launcher parameter: a tensor operand (the value it is) or a runtime scalar."""

    name: str
    value: Value | None = None
    scalar: Scalar | None = None


@dataclass
class KernelSource:
    """One kernel's code: the @triton.jit function(s), its launcher, and what the file must also contain."""

    kernel: str
    launcher: str
    launcher_name: str
    args: list[LauncherArg]                     # in launcher order (after the optional output buffer)
    writes_into: bool = False                   # the launcher's first argument is the buffer to write
    description: str = ""


class ScalarArgs:
    """Scalars that are not literals become kernel parameters `sc0, sc1, ...`."""

    def __init__(self):
        self.params: list[tuple[str, Scalar]] = []

    def kernel_signature(self) -> list[KernelParam]:
        return [KernelParam(name, _scalar_doc(scalar)) for name, scalar in self.params]

    def render(self, scalar: Scalar) -> str:
        if scalar.is_literal:
            return literal(scalar.value)
        for name, known in self.params:
            if known is scalar or (scalar.attr is not None and known.attr == scalar.attr):
                return name
        name = f"sc{len(self.params)}"
        self.params.append((name, scalar))
        return name


@dataclass
class Region:
    """Straight-line kernel code over one tile shape: its lines, load mask, group indices and value cache."""

    lines: list[str]
    mask: str | None
    indices: GroupIndices | None
    bound: dict[int, str] = field(default_factory=dict)     # values provided by the template (acc, reductions)
    cache: dict[int, str] = field(default_factory=dict)


class ExprEmitter:
    """Writes a kernel body's elementwise values as Triton statements, loading leaves through the indexer."""

    def __init__(self, indexer: Indexer | None, operands: dict[int, Operand], scalars: ScalarArgs):
        self.indexer = indexer
        self.operands = operands
        self.scalars = scalars
        self._count = 0

    def fresh(self, stem: str = "v") -> str:
        self._count += 1
        return f"{stem}{self._count}"

    def value(self, value: Value, region: Region) -> str:
        if value.id in region.bound:
            return region.bound[value.id]
        if value.id in region.cache:
            return region.cache[value.id]
        if value.id in self.operands:
            code = self._load(self.operands[value.id], region)
            if is_integer(value):       # indices or a 0/1 mask read as numbers: PyTorch promotes them to float32
                code += ".to(tl.float32)"
        elif isinstance(value, Pointwise):
            code = self._pointwise(value, region)
        else:
            raise AssertionError(f"{value!r} is neither an operand nor elementwise")
        name = self.fresh()
        region.lines.append(f"{name} = {code}")
        region.cache[value.id] = name
        return name

    def _load(self, operand: Operand, region: Region) -> str:
        offset = self.indexer.offset(operand, region.indices)
        if not offset:
            return f"tl.load({operand.name}_ptr)"
        mask = f", mask={region.mask}, other=0.0" if region.mask else ""
        return f"tl.load({operand.name}_ptr + {offset}{mask})"

    def _pointwise(self, value: Pointwise, region: Region) -> str:
        op = OPS[value.op]
        args = [self.value(a, region) if isinstance(a, Value) else self.scalars.render(a) for a in value.args]
        attrs = {k: self.scalars.render(v) for k, v in value.attrs.items()}
        return op.render(args, attrs)


def _scalar_doc(scalar: Scalar) -> str:
    if scalar.attr is not None:
        return f"{attribute(scalar.attr)}, read at each call"
    return "a number the forward computes from shapes"


def attribute(path: str) -> str:
    """`self.<path>` as Python: "blocks.0.conv.stride" -> self.blocks[0].conv.stride."""
    return "self" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path.split("."))


def describe(value: Value) -> str:
    """The tensor as the forward has it, for a kernel signature's comments: "x", "self.fc.weight.t()",
    "t5" (an earlier kernel's output), "a view of t5" (several view calls)."""
    if isinstance(value, View):
        if isinstance(value.base, View):
            while isinstance(value, View):
                value = value.base
            return f"a view of {describe(value)}"
        args = "..." if value.args else ""
        call = "[...]" if value.method == "__getitem__" else f".{value.method}({args})"
        return describe(value.base) + call + (f"[{value.item}]" if value.item is not None else "")
    if isinstance(value, Input):
        return value.name
    if isinstance(value, Param):
        return attribute(value.path)
    return f"t{value.id}"


def output_param(kernel: KernelPlan, role: str) -> KernelParam:
    """`out_ptr`: its role, and the tensor the forward gets back (t<id>, or the buffer it writes into)."""
    name = attribute(kernel.target.path) if kernel.target is not None else f"t{kernel.root.id}"
    return KernelParam("out_ptr", role, detail=f"{name} {shape_text(kernel.root.shapes)}")


def operand_name(value: Value, index: int) -> str:
    stem = {"Input": "in", "Param": "p", "View": "view"}.get(type(value).__name__, "t")
    return f"{stem}{index}"


def is_dense(value: Value) -> bool:
    """Contiguous by construction: inputs (made contiguous in forward), parameters, kernel outputs,
    reshapes of those, and `t[i]` of those (one whole slab along dim 0); transposes, slices and expands are
    read with their real strides per dim."""
    if isinstance(value, View):
        first_dim_item = value.method == "__getitem__" and type(value.args[0]) is int
        reshapes = value.method in ("reshape", "flatten", "unflatten", "squeeze", "unsqueeze")
        return (reshapes or first_dim_item) and is_dense(value.base)
    return True


def make_operands(values: list[Value], start: int = 0) -> dict[int, Operand]:
    return {v.id: Operand(operand_name(v, start + i), v.shapes, dense=is_dense(v), what=describe(v))
            for i, v in enumerate(values)}


def body_leaves(kernel: KernelPlan, program: Program) -> list[Value]:
    """Tensors the fused elementwise/reduction code reads (a GEMM or conv operand may be one too)."""
    leaves: list[Value] = []
    for vid in sorted(kernel.body):
        value = program.values[vid]
        reads = value.operands() if isinstance(value, (Pointwise, Reduce)) else []
        for operand in reads:
            if operand.id not in kernel.body and operand not in leaves:
                leaves.append(operand)
    return leaves


def describe_body(kernel: KernelPlan, program_values: list[Value]) -> str:
    """The elementwise ops a kernel fuses, in program order, e.g. 'add+gelu'."""
    ops = [program_values[vid].op for vid in sorted(kernel.body)
           if isinstance(program_values[vid], Pointwise) and program_values[vid].op != "identity"]
    return "+".join(dict.fromkeys(ops))


def indent(lines: list[str], spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line if line else "" for line in lines)


def block_autotune(blocks: tuple[tuple[int, int], ...], key: list[str]) -> str:
    """An autotune decorator over (BLOCK, num_warps) pairs, for kernels that walk flat output blocks."""
    configs = "".join(f'        triton.Config({{"BLOCK": {b}}}, num_warps={w}),\n' for b, w in blocks)
    return f"@triton.autotune(\n    configs=[\n{configs}    ],\n    key={key!r},\n)\n"


def flat_autotune(variant: Variant) -> str:
    """A flat kernel's autotune decorator over BLOCK where the variant autotunes; else none (the launcher
    passes the variant's own BLOCK)."""
    return block_autotune(variant.pointwise, ["numel"]) if variant.autotune else ""


def unravel_params(x: Operand, kernel: KernelPlan, rank: int, middle: list[KernelParam],
                   strided: range) -> list[KernelParam]:
    """The signature of a copy kernel over flat output positions (`unravel_lines`): the input read through its
    strides, the contiguous output, numel and the output's sizes, then `middle` (the kind's own sizes and
    values), the input's strides along the dims `strided`, and BLOCK."""
    return ([x.pointer("input, read through its strides", "x_ptr"), output_param(kernel, "output, contiguous"),
             KernelParam("numel", "output elements")]
            + [constexpr(f"n{d}", f"output size along dim {d}") for d in range(1, rank)]
            + middle
            + [KernelParam(f"s{d}", f"input stride along dim {d}") for d in strided]
            + [constexpr("BLOCK", "output elements per program")])


def unravel_lines(rank: int) -> list[str]:
    """Kernel lines that take a program's block of flat output positions (`offs`, `mask`) and split each
    into its index per dim, i0 .. i{rank - 1}, by the output sizes n1 .. n{rank - 1} (constexpr: the div/mod
    become multiplies and shifts)."""
    lines = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "mask = offs < numel",
             "rest = offs"]
    for d in range(rank - 1, 0, -1):     # innermost first
        lines += [f"i{d} = rest % n{d}", f"rest = rest // n{d}"]
    return lines + ["i0 = rest"]


def flat_launch(call: str, variant: Variant) -> list[str]:
    """The launcher lines of a kernel over `numel` flat elements: an autotuned BLOCK, or the variant's own."""
    if variant.autotune:
        return ['grid = lambda meta: (_cdiv(numel, meta["BLOCK"]),)', call + ")"]
    block, warps = variant.pointwise[0]
    return [f"grid = (_cdiv(numel, {block}),)", call + f", BLOCK={block}, num_warps={warps})"]


def flat_launcher(name: str, params: list[str], setup: list[str], call: str, variant: Variant) -> str:
    """The launcher of a kernel over an output's flat elements: `setup` makes `out` (and whatever `call`
    takes), then `call` runs over `numel` elements; an empty output launches nothing."""
    lines = setup + ["numel = out.numel()", "if numel:", *("    " + line for line in flat_launch(call, variant)),
                     "return out"]
    return f"def {name}_launch({', '.join(params)}):\n{indent(lines, 4)}\n"
