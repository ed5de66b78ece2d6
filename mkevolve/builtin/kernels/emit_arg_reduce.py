"""Arg-reduction kernels: torch.argmax and torch.argmin along one dim (also the indices of max/min with a dim).

The input is seen as (O, R, I): O outer positions, R along the reduced dim, I inner positions. A program owns
one outer position and BLOCK_I inner ones and walks R in BLOCK_R chunks, keeping per inner position the best
value so far, its first position, and the first NaN's position (PyTorch returns a NaN's position when the
row has one). argmin is argmax of -x: negation is exact, so ties and NaNs fall where they did.
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, indent, make_operands
from .emit_scan import ALONG_DIM_CHUNK, ALONG_DIM_START, along_dim_launcher, along_dim_params
from .errors import UnsupportedSubproblem
from .ir import ArgReduce, Program
from .kernel_plan import KernelPlan
from .signature import signature

_NONE = "2147483647"   # a position past any row: "not found yet"


def emit_arg_reduce(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: ArgReduce = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem(f"arg{anchor.kind} written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    sign = "" if anchor.kind == "max" else "-"
    params = along_dim_params(x, kernel, "output [O, 1, I] int64 positions along R, contiguous", "reduced")
    body = ALONG_DIM_START + [
        'best = tl.full([BLOCK_I], -float("inf"), tl.float32)',
        "best_at = tl.zeros([BLOCK_I], tl.int32)       # a row of only -inf: its first position",
        f"nan_at = tl.full([BLOCK_I], {_NONE}, tl.int32)",
        *ALONG_DIM_CHUNK,
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
    out_shape = f"(*{x.name}.shape[:{dim}], 1, *{x.name}.shape[{dim + 1}:])"
    launcher = along_dim_launcher(name, x.name, dim, out_shape, "torch.int64")
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x)], False,
                        description=f"arg{anchor.kind} along dim {dim}")
