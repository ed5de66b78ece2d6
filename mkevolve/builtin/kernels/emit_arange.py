"""torch.arange read as numbers (a sinusoidal embedding's frequencies, an index for a gather): a kernel that
writes start + step * i in the arange's dtype (int64, int32 or float32).

An embedding's positions never come here: `gather` reads those as a slice of the table.
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, indent, output_param
from .errors import UnsupportedSubproblem
from .ir import Arange, Program
from .kernel_plan import KernelPlan
from .pointwise_ops import literal
from .signature import KernelParam, constexpr, signature

_BLOCK = 1024


def emit_arange(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Arange = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("torch.arange written into a module buffer")
    bounds = (anchor.start, anchor.step)
    if not all(isinstance(v, (int, float)) for v in bounds) or len({s for s in anchor.shapes}) > 1:
        raise UnsupportedSubproblem("torch.arange read by a kernel, with bounds the forward computes from shapes")
    if not program.inputs:
        raise UnsupportedSubproblem("torch.arange in a forward without tensor inputs (no device to put it on)")
    device_of = program.inputs[0]
    (n,) = anchor.shapes[0]
    params = [output_param(kernel, f"output [{n}]: start + step * i"), KernelParam("N", "elements"),
              constexpr("BLOCK", "elements per program")]
    floating = anchor.dtype == "float32"
    if floating:
        # start + step * i rounded once, as PyTorch rounds it (computed in fp64); a step fp32 cannot hold
        # exactly (0.1) can put the two an ulp apart
        value = f"tl.fma(i.to(tl.float32), {literal(anchor.step)}, {literal(anchor.start)})"
    else:
        value = f"({int(anchor.start)} + {int(anchor.step)} * i).to(tl.{anchor.dtype})"
    body = ["i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
            f"tl.store(out_ptr + i, {value}, mask=i < N)"]
    source = f'''@triton.jit
{signature(name, params)}
{indent(body, 4)}
'''
    lines = [f"# {device_of.name or 'the first input'} only says which device the numbers go on",
             f"out = torch.empty({n}, device=device_of.device, dtype=torch.{anchor.dtype})",
             f"{name}[(_cdiv({n}, {_BLOCK}),)](out, {n}, BLOCK={_BLOCK}, num_warps=4)",
             "return out"]
    launcher = f'''def {name}_launch(device_of):
{indent(lines, 4)}
'''
    start, step = (literal(v) if floating else int(v) for v in bounds)
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg("device_of", value=device_of)], False,
                        description=f"arange from {start} by {step}")
