"""Max unpooling: nn.MaxUnpool1d/2d/3d and F.max_unpool*, a scatter.

The output is zeros of the unpooled size (the launcher makes it with torch.zeros); each input element is then
written at its index, a flat position within its (N, C) plane of the output. Input and indices are read as flat
[planes * L] (L elements per input plane), the output as [planes, OUT_L]; one lane per input element:

    out[plane, at[i]] = x[i]        plane = i // L

Where indices repeat, PyTorch's CPU kernel writes each plane's elements in order, so the last one wins; its CUDA
kernel lets the writes race (pytorch/pytorch#78249). Here a first launch, `_claim`, keeps for every output
position the last plane position naming it (an atomic max into an int32 buffer of -1s), and only that element
writes: the same answer every run, and the CPU's. Where no index can repeat (a max pool's, of windows that do not
overlap: `Unpool.distinct`) the claim is skipped. An index outside the plane, which PyTorch refuses with an
error, is skipped: a kernel cannot raise.
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, flat_autotune, indent, make_operands, output_param
from .errors import UnsupportedSubproblem
from .indexing import Operand
from .ir import Program, Unpool
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature

_START = ["offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
          "mask = offs < numel",
          "plane = offs // L",
          "at = tl.load(at_ptr + offs, mask=mask, other=0)",
          "ok = mask & (at >= 0) & (at < OUT_L)  # PyTorch raises for a position outside the plane; this skips it"]


def emit_unpool(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Unpool = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("a max unpool written into a module buffer")
    operands = make_operands(kernel.leaves)
    x, indices = operands[anchor.x.id], operands[anchor.indices.id]
    claims = not anchor.distinct
    source = (_claim_kernel(name, indices, variant) if claims else "") + _write_kernel(name, x, indices, kernel,
                                                                                       variant, claims)
    launcher = _launcher(name, anchor, x.name, indices.name, variant, claims)
    spatial = len(anchor.scale)
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x),
                                                             LauncherArg(indices.name, value=anchor.indices)],
                        False, description=f"max unpool ({spatial}d, a scatter)")


def _sizes_params() -> list[KernelParam]:
    return [KernelParam("numel", "input elements"), KernelParam("L", "input elements per plane"),
            KernelParam("OUT_L", "output elements per plane"), constexpr("BLOCK", "input elements per program")]


def _claim_kernel(name: str, indices: Operand, variant: Variant) -> str:
    params = [indices.pointer("int64 positions within each output plane [planes * L]", "at_ptr"),
              KernelParam("claim_ptr", "int32 [planes, OUT_L], -1s: the last plane position naming each output"),
              *_sizes_params()]
    body = _START + ["tl.atomic_max(claim_ptr + plane * OUT_L + at, (offs - plane * L).to(tl.int32), mask=ok)"]
    return f'''{flat_autotune(variant)}@triton.jit
{signature(f"{name}_claim", params)}
    # Where indices repeat, the last element of the plane (in order) writes, as PyTorch's CPU kernel does:
    # each output position keeps the largest plane position that names it.
{indent(body, 4)}


'''


def _write_kernel(name: str, x: Operand, indices: Operand, kernel: KernelPlan, variant: Variant,
                  claims: bool) -> str:
    params = [x.pointer("values [planes * L]", "x_ptr"),
              indices.pointer("int64 positions within each output plane [planes * L]", "at_ptr")]
    body = list(_START)
    if claims:
        params.append(KernelParam("claim_ptr", "int32 [planes, OUT_L]: the plane position that writes each output"))
        body.append("ok = ok & (tl.load(claim_ptr + plane * OUT_L + at, mask=ok, other=-1) == offs - plane * L)")
    params += [output_param(kernel, "output [planes, OUT_L], zeros where nothing is written"), *_sizes_params()]
    body += ["v = tl.load(x_ptr + offs, mask=ok)", "tl.store(out_ptr + plane * OUT_L + at, v, mask=ok)"]
    unique = "the claimed writer alone" if claims else "no position is named twice"
    return f'''{flat_autotune(variant)}@triton.jit
{signature(name, params)}
    # Scatter: each input element to its position in its output plane ({unique}).
{indent(body, 4)}
'''


def _out_size(x: str, rank_from_end: int, scale: int, offset: int) -> str:
    """Python source of one unpooled size: a number, or the input's size * stride + offset."""
    if scale == 0:
        return str(offset)
    size = f"{x}.shape[-{rank_from_end}] * {scale}"
    return size if offset == 0 else f"{size} {'+' if offset > 0 else '-'} {abs(offset)}"


def _launcher(name: str, anchor: Unpool, x: str, indices: str, variant: Variant, claims: bool) -> str:
    spatial = len(anchor.scale)
    dims = range(spatial, 0, -1)            # -spatial .. -1
    sizes = [_out_size(x, n, s, o) for n, s, o in zip(dims, anchor.scale, anchor.offset)]
    lines = [f"values, at = {x}.reshape(-1), {indices}.reshape(-1)  # views where contiguous",
             f"L = {' * '.join(f'{x}.shape[-{n}]' for n in dims)}",
             f"out = torch.zeros((*{x}.shape[:-{spatial}], {', '.join(sizes)}), device={x}.device, "
             "dtype=torch.float32)",
             f"OUT_L = {' * '.join(f'out.shape[-{n}]' for n in dims)}",
             "numel = values.numel()",
             "if numel:"]
    if variant.autotune:
        grid, tail = 'grid = lambda meta: (_cdiv(numel, meta["BLOCK"]),)', ")"
    else:
        block, warps = variant.pointwise[0]
        grid, tail = f"grid = (_cdiv(numel, {block}),)", f", BLOCK={block}, num_warps={warps})"
    launches = [grid]
    if claims:
        launches += ["claim = torch.full(out.shape, -1, device=out.device, dtype=torch.int32)",
                     f"{name}_claim[grid](at, claim, numel, L, OUT_L{tail}"]
    launches.append(f"{name}[grid](values, at, {'claim, ' if claims else ''}out, numel, L, OUT_L{tail}")
    lines += ["    " + line for line in launches] + ["return out"]
    return f"def {name}_launch({x}, {indices}):\n{indent(lines, 4)}\n"
