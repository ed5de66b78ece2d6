"""Scan kernels: torch.cumsum and torch.cumprod along one dim.

The input is seen as (O, R, I): O outer positions, R along the scanned dim, I inner positions. A program owns
one outer position and BLOCK_I inner ones and walks R in BLOCK_R chunks: each chunk is scanned in registers
(tl.cumsum / tl.cumprod along the chunk) and combined with the running total of the chunks before it, which
is then the chunk's last row.
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, indent, make_operands, output_param
from .errors import UnsupportedSubproblem
from .indexing import Operand
from .ir import Program, Scan
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature

# Per kind: the running total's start, the chunk's scan, and how the total before a chunk joins its scan.
_SCANS = {"sum": ("0.0", "tl.cumsum", "+"), "prod": ("1.0", "tl.cumprod", "*")}
# Elements of a [BLOCK_R, BLOCK_I] chunk, at most: 16 fp32 values a thread at 4 warps.
_CHUNK_ELEMENTS = 2048
_MAX_BLOCK_I = 32      # inner positions a program takes: a whole 128-byte line of each row


def along_dim_params(x: Operand, kernel: KernelPlan, output: str, along: str) -> list[KernelParam]:
    """The kernel parameters of a walk along one dim of an (O, R, I) view, shared by scans and arg reductions."""
    return [x.pointer("input as [O, R, I], read through its strides", "x_ptr"), output_param(kernel, output),
            KernelParam("R", f"elements along the {along} dim"), KernelParam("I", "inner positions"),
            KernelParam("stride_o", "input stride over outer positions"),
            KernelParam("stride_r", f"input stride along the {along} dim"),
            KernelParam("stride_i", "input stride over inner positions"),
            constexpr("BLOCK_R", f"{along} elements per chunk"), constexpr("BLOCK_I", "inner positions per program")]


# A program's place: one outer position, BLOCK_I inner ones, and the chunk loop's first lines.
ALONG_DIM_START = ["o = tl.program_id(0).to(tl.int64)", "i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)",
                   "imask = i < I"]
ALONG_DIM_CHUNK = [
    "for r0 in range(0, R, BLOCK_R):",
    "    r = r0 + tl.arange(0, BLOCK_R)",
    "    mask = (r[:, None] < R) & imask[None, :]",
    "    at = o * stride_o + r[:, None].to(tl.int64) * stride_r + i[None, :] * stride_i  # past 2**31 elements too"]


def along_dim_view_lines(x: str, dim: int) -> list[str]:
    """Launcher lines seeing `x` as `src` [outer, length, inner] about `dim`."""
    return [f"outer, length = {x}.shape[:{dim}].numel(), {x}.shape[{dim}]",
            f"inner = {x}.shape[{dim + 1}:].numel()",
            "# a view where the dims allow it; dims that cannot merge are copied by reshape",
            f"src = {x}.reshape(outer, length, inner)"]


def along_dim_launcher(name: str, x: str, dim: int, out_shape: str, dtype: str) -> str:
    """`{name}_launch(x)`: x seen as (O, R, I) about `dim`, the output allocated as `out_shape`, one program per
    outer position and BLOCK_I inner ones."""
    lines = along_dim_view_lines(x, dim) + [
        f"out = torch.empty({out_shape}, device={x}.device, dtype={dtype})",
        "if out.numel():",
        f"    block_i = min(_next_power_of_2(inner), {_MAX_BLOCK_I})",
        f"    block_r = min(_next_power_of_2(length), {_CHUNK_ELEMENTS} // block_i)",
        f"    {name}[(outer, _cdiv(inner, block_i))](src, out, length, inner, *src.stride(), BLOCK_R=block_r, "
        "BLOCK_I=block_i, num_warps=4)",
        "return out"]
    return f'''def {name}_launch({x}):
{indent(lines, 4)}
'''


def emit_scan(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Scan = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem(f"cum{anchor.kind} written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    start, scan, combine = _SCANS[anchor.kind]
    params = along_dim_params(x, kernel, "output [O, R, I], contiguous", "scanned")
    body = ALONG_DIM_START + [
        f"total = tl.full([BLOCK_I], {start}, tl.float32)  # the scan of every chunk before this one",
        *ALONG_DIM_CHUNK,
        f"    x = tl.load(x_ptr + at, mask=mask, other={start})",
        f"    y = {scan}(x, axis=0) {combine} total[None, :]",
        "    tl.store(out_ptr + (o * R + r[:, None]) * I + i[None, :], y, mask=mask)",
        "    last = tl.minimum(r0 + BLOCK_R, R) - 1",
        "    total = tl.sum(tl.where(r[:, None] == last, y, 0.0), axis=0)  # the chunk's last row",
    ]
    source = f'''@triton.jit
{signature(name, params)}
    # Cumulative {anchor.kind} along R of an (O, R, I) view: one outer position and BLOCK_I inner ones per
    # program, R walked in chunks, each scanned in registers and joined ({combine}) to the total before it.
{indent(body, 4)}
'''
    launcher = along_dim_launcher(name, x.name, anchor.dim, f"{x.name}.shape", "torch.float32")
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x)], False,
                        description=f"cumulative {anchor.kind} along dim {anchor.dim}")
