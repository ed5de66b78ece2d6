"""The fused elementwise kernel: one program per BLOCK consecutive output elements."""

from __future__ import annotations

from .configs import Variant
from .emit_common import (
    ExprEmitter,
    KernelSource,
    LauncherArg,
    Region,
    ScalarArgs,
    block_autotune,
    describe_body,
    indent,
    make_operands,
    output_param,
)
from .errors import UnsupportedSubproblem
from .indexing import GroupIndices, Indexer, Space
from .ir import Program
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature


def emit_pointwise(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    operands = make_operands(kernel.leaves)
    rank = kernel.root.rank
    indexer = Indexer(kernel.root.shapes, [Space("flat", tuple(range(rank)))], list(operands.values()))
    scalars = ScalarArgs()
    emitter = ExprEmitter(indexer, operands, scalars)
    body: list[str] = []
    region = Region(body, mask="mask", indices=GroupIndices(indexer, {0: "offs"}, body, "e"))
    result = emitter.value(kernel.root, region)
    ops = describe_body(kernel, program.values) or "copy"

    writes_into = kernel.target is not None
    autotune = variant.autotune and not writes_into
    params = ([output_param(kernel, "output, contiguous")]
              + [o.pointer() for o in operands.values()] + [KernelParam("numel", "output elements")]
              + indexer.kernel_signature() + scalars.kernel_signature()
              + [constexpr("BLOCK", "output elements per program")])
    decorator = _autotune(variant) if autotune else ""
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # Elementwise {ops}.
    # Each program computes BLOCK consecutive elements of the contiguous output; operands are read
    # through broadcast strides, one per group of merged dims.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
{indent(body, 4)}
    tl.store(out_ptr + offs, {result}, mask=mask)
'''
    tensor_args = [LauncherArg(o.name, value=v) for v, o in zip(kernel.leaves, operands.values())]
    if not tensor_args and not writes_into:
        # torch.zeros/ones/full alone (an output, or a GEMM's operand): no tensor says its device or shape
        raise UnsupportedSubproblem(f"a tensor of one value ({ops}) written out alone; it is taken only as an "
                                    "operand of elementwise work or as a recurrent layer's zero state")
    scalar_args = [LauncherArg(n, scalar=s) for n, s in scalars.params]
    launcher_name = f"{name}_launch"
    launcher_args = ", ".join((["out"] if writes_into else []) + [a.name for a in tensor_args + scalar_args])
    frame = f"_broadcast_shape({', '.join(a.name + '.shape' for a in tensor_args)})"
    alloc = [*_CONTIGUOUS_TARGET, "shape = out.shape"] if writes_into else [
        f"shape = {frame}",
        f"out = torch.empty(shape, device={tensor_args[0].name}.device, dtype=torch.float32)"]
    strides = indexer.wrapper_lines("shape", {o.name: o.name for o in operands.values()})
    call_args = ", ".join(["out"] + [a.name for a in tensor_args] + ["numel"] + indexer.kernel_params()
                          + [a.name for a in scalar_args])
    if autotune:
        launch = ['grid = lambda meta: (_cdiv(numel, meta["BLOCK"]),)', f"{name}[grid]({call_args})"]
    else:
        block, warps = variant.pointwise[0]
        launch = [f"{name}[(_cdiv(numel, {block}),)]({call_args}, BLOCK={block}, num_warps={warps})"]
    launcher = f'''def {launcher_name}({launcher_args}):
{indent(alloc + ["numel = out.numel()"] + strides + launch + ["return out"], 4)}
'''
    return KernelSource(source, launcher, launcher_name, tensor_args + scalar_args, writes_into,
                        description=f"elementwise {ops}")


# The kernel writes its output flat; a module tensor written in place is contiguous in every known problem.
_CONTIGUOUS_TARGET = ["if not out.is_contiguous():",
                      "    raise ValueError('the module tensor this kernel writes in place is not contiguous')"]


def _autotune(variant: Variant) -> str:
    return block_autotune(variant.pointwise, ["numel"])
