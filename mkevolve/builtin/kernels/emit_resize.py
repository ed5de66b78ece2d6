"""Resampling kernels: F.interpolate and nn.Upsample, nearest or (bi/tri)linear, one output element per lane.

Each output position maps to a source coordinate along each spatial dim as PyTorch's kernels compute it, in
fp32: `ratio` x position for nearest (floor, clamped to the last element), (position + 0.5) x ratio for
nearest-exact, and for linear (position + 0.5) x ratio - 0.5 clamped at 0, or position x ratio with
align_corners. Linear then weighs the two neighbours along each dim, nested dim by dim as PyTorch does.
"""

from __future__ import annotations

import itertools

from .configs import Variant
from .emit_common import (KernelSource, LauncherArg, flat_autotune, flat_launcher, indent, make_operands,
                          unravel_lines, unravel_params)
from .errors import UnsupportedSubproblem
from .ir import Program, Resize
from .kernel_plan import KernelPlan
from .signature import KernelParam, constexpr, signature


def ratio_source(anchor: Resize, x: str, d: int) -> str:
    """Python source, in the launcher, of dim `d`'s ratio of input to output coordinates (`out` is made)."""
    if anchor.mode == "linear" and anchor.align_corners:
        return f"({x}.shape[{d}] - 1) / (out.shape[{d}] - 1) if out.shape[{d}] > 1 else 0.0"
    if anchor.scale_factor is not None and not anchor.recompute_scale_factor:
        return repr(1.0 / anchor.scale_factor[d - 2])
    return f"{x}.shape[{d}] / out.shape[{d}]"


def _source_lines(anchor: Resize, d: int) -> list[str]:
    """Kernel lines giving dim d's source index j{d} (nearest), or its two neighbours j{d}_0, j{d}_1 and
    their weights w{d}_0, w{d}_1 (linear)."""
    position = f"i{d}.to(tl.float32)"
    if anchor.mode == "nearest":
        return [f"j{d} = tl.minimum(({position} * r{d}).to(tl.int64), D{d} - 1)"]
    if anchor.mode == "nearest-exact":
        return [f"j{d} = tl.minimum((({position} + 0.5) * r{d}).to(tl.int64), D{d} - 1)"]
    source = f"{position} * r{d}" if anchor.align_corners else f"tl.maximum(({position} + 0.5) * r{d} - 0.5, 0.0)"
    return [f"src{d} = {source}",
            f"j{d}_0 = src{d}.to(tl.int64)  # src >= 0: the conversion rounds down",
            f"j{d}_1 = tl.minimum(j{d}_0 + 1, D{d} - 1)",
            f"w{d}_1 = src{d} - j{d}_0.to(tl.float32)",
            f"w{d}_0 = 1.0 - w{d}_1"]


def _linear_sum(dims: list[int], corner: tuple[int, ...] = ()) -> str:
    """The weighted sum over the neighbours' corners, outer dim first: w_0 * (...) + w_1 * (...)."""
    if not dims:
        return "x" + "".join(map(str, corner))
    d, rest = dims[0], dims[1:]
    inner = [_linear_sum(rest, corner + (side,)) for side in (0, 1)]
    return " + ".join(f"w{d}_{side} * " + (f"({term})" if rest else term) for side, term in zip((0, 1), inner))


def emit_resize(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Resize = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem("interpolation written into a module buffer")
    x = make_operands(kernel.leaves)[anchor.x.id]
    rank, spatial = anchor.rank, list(range(2, anchor.rank))
    lines = unravel_lines(rank)
    for d in spatial:
        lines += _source_lines(anchor, d)
    base = "i0 * s0 + i1 * s1"
    if anchor.mode == "linear":
        for corner in itertools.product((0, 1), repeat=len(spatial)):
            at = " + ".join(f"j{d}_{side} * s{d}" for d, side in zip(spatial, corner))
            lines.append(f"x{''.join(map(str, corner))} = tl.load(x_ptr + {base} + {at}, mask=mask)")
        lines.append(f"y = {_linear_sum(spatial)}")
    else:
        lines.append(f"y = tl.load(x_ptr + {base} + {' + '.join(f'j{d} * s{d}' for d in spatial)}, mask=mask)")
    decorator = flat_autotune(variant)
    params = unravel_params(x, kernel, rank,
                            [constexpr(f"D{d}", f"input size along dim {d}") for d in spatial]
                            + [KernelParam(f"r{d}", f"input coordinates per output position along dim {d} (fp32)")
                               for d in spatial], range(rank))
    align = ", align_corners" if anchor.mode == "linear" and anchor.align_corners else ""
    source = f'''{decorator}@triton.jit
{signature(name, params)}
    # {anchor.mode} interpolation{align} of dims 2 to {rank - 1}: each output element finds its source
    # coordinate along each dim as PyTorch does (the module's header says how), in fp32.
{indent(lines, 4)}
    tl.store(out_ptr + offs, y, mask=mask)
'''
    sizes = anchor.size or [f"int({x.name}.shape[{d}] * {anchor.scale_factor[d - 2]!r})" for d in spatial]
    call = (f"{name}[grid]({x.name}, out, numel, *out.shape[1:], *{x.name}.shape[2:], *ratios, "
            f"*{x.name}.stride()")
    setup = [f"out = torch.empty((*{x.name}.shape[:2], {', '.join(map(str, sizes))}), device={x.name}.device, "
             "dtype=torch.float32)",
             "ratios = (" + "".join(f"{ratio_source(anchor, x.name, d)}, " for d in spatial) + ")"]
    launcher = flat_launcher(name, [x.name], setup, call, variant)
    return KernelSource(source, launcher, f"{name}_launch", [LauncherArg(x.name, value=anchor.x)], False,
                        description=f"{anchor.mode} interpolation{align} of dims 2 to {rank - 1}")
