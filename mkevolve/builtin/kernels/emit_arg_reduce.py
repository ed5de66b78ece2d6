"""Arg-reduction kernels: torch.argmax and torch.argmin along one dim (also the indices of max/min with a dim).

The input is seen as (O, R, I): O outer positions, R along the reduced dim, I inner positions. A program owns
one outer position and BLOCK_I inner ones and walks R in BLOCK_R chunks, keeping per inner position the best
value so far, its first position, and the first NaN's position (PyTorch returns a NaN's position when the
row has one). argmin is argmax of -x: negation is exact, so ties and NaNs fall where they did.
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, indent, make_operands, output_param
from .errors import UnsupportedSubproblem
from .ir import ArgReduce, Program
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature

# Elements of a [BLOCK_R, BLOCK_I] chunk, at most: 16 fp32 values a thread at 4 warps.
_CHUNK_ELEMENTS = 2048
_MAX_BLOCK_I = 32      # inner positions a program takes: a whole 128-byte line of each row
_NONE = "2147483647"   # a position past any row: "not found yet"


def emit_arg_reduce(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: ArgReduce = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem(f"arg{anchor.kind} written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    sign = "" if anchor.kind == "max" else "-"
    params = [x.pointer("input as [O, R, I], read through its strides", "x_ptr"),
              output_param(kernel, "output [O, 1, I] int64 positions along R, contiguous"),
              KernelParam("R", "elements along the reduced dim"), KernelParam("I", "inner positions"),
              KernelParam("stride_o", "input stride over outer positions"),
              KernelParam("stride_r", "input stride along the reduced dim"),
              KernelParam("stride_i", "input stride over inner positions"),
              constexpr("BLOCK_R", "reduced elements per chunk"), constexpr("BLOCK_I", "inner positions per program")]
    body = [
        "o = tl.program_id(0).to(tl.int64)",
        "i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)",
        "imask = i < I",
        'best = tl.full([BLOCK_I], -float("inf"), tl.float32)',
        "best_at = tl.zeros([BLOCK_I], tl.int32)       # a row of only -inf: its first position",
        f"nan_at = tl.full([BLOCK_I], {_NONE}, tl.int32)",
        "for r0 in range(0, R, BLOCK_R):",
        "    r = r0 + tl.arange(0, BLOCK_R)",
        "    mask = (r[:, None] < R) & imask[None, :]",
        "    at = o * stride_o + r[:, None].to(tl.int64) * stride_r + i[None, :] * stride_i  # past 2**31 elements too",
        f"    x = {sign}tl.load(x_ptr + at, mask=mask, other=0.0)",
        "    nan = mask & (x != x)",
        f"    nan_at = tl.minimum(nan_at, tl.min(tl.where(nan, r[:, None], {_NONE}), axis=0))",
        '    x = tl.where(mask & (x == x), x, -float("inf"))',
        "    top = tl.max(x, axis=0)",
        f"    top_at = tl.min(tl.where(mask & (x == top[None, :]), r[:, None], {_NONE}), axis=0)",
        "    later = top > best  # strictly: an equal value in an earlier chunk keeps its first position",
        "    best_at = tl.where(later, top_at, best_at)",
        "    best = tl.where(later, top, best)",
        f"found = tl.where(nan_at < {_NONE}, nan_at, best_at)",
        "tl.store(out_ptr + o * I + i, found.to(tl.int64), mask=imask)",
    ]
    source = f'''@triton.jit
{signature(name, params)}
    # arg{anchor.kind} along R of an (O, R, I) view: one outer position and BLOCK_I inner ones per program, R
    # walked in chunks; per inner position the best value, its first position and the first NaN's position.
{indent(body, 4)}
'''
    dim = anchor.dim
    lines = [f"outer, length = {x.name}.shape[:{dim}].numel(), {x.name}.shape[{dim}]",
             f"inner = {x.name}.shape[{dim + 1}:].numel()",
             "# a view where the dims allow it; dims that cannot merge are copied by reshape",
             f"src = {x.name}.reshape(outer, length, inner)",
             f"out = torch.empty((*{x.name}.shape[:{dim}], 1, *{x.name}.shape[{dim + 1}:]), device={x.name}.device, "
             "dtype=torch.int64)",
             "if out.numel():",
             f"    block_i = min(_next_power_of_2(inner), {_MAX_BLOCK_I})",
             f"    block_r = min(_next_power_of_2(length), {_CHUNK_ELEMENTS} // block_i)",
             f"    {name}[(outer, _cdiv(inner, block_i))](src, out, length, inner, *src.stride(), BLOCK_R=block_r, "
             "BLOCK_I=block_i, num_warps=4)",
             "return out"]
    launcher = f'''def {name}_launch({x.name}):
{indent(lines, 4)}
'''
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x)], False,
                        description=f"arg{anchor.kind} along dim {dim}")
