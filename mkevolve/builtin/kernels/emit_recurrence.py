"""Recurrence kernels: one direction of one layer of nn.RNN, nn.LSTM or nn.GRU, one launch per time step.

A step depends on the step before it through h (and an LSTM's c), so the launcher walks the steps and each
launch is one step for the whole batch: a program owns BLOCK_B batch rows and BLOCK_H hidden units, multiplies
its rows of h_{t-1} [BLOCK_B, H] by the columns of W_hh^T that feed its units' gates (one [BLOCK_B, BLOCK_H]
accumulator per gate, K = H walked in BLOCK_K chunks), adds b_hh and the input's share of the gates (computed
for every step before, by a GEMM), and applies the cell. Its units' new h (and c) go straight to the output
buffer, where the next launch reads them: launches on one stream run in order, so no program sees a half-written
step.

The sums are grouped as PyTorch groups them, (x W_ih^T + b_ih) + (h W_hh^T + b_hh), and the cells follow its
formulas: LSTM c' = f c + i g, h' = o tanh(c'); GRU n = tanh(x_n + r (h W_hn^T + b_hn)), h' = n + z (h - n).
"""

from __future__ import annotations

from .configs import Variant
from .emit_common import KernelSource, LauncherArg, indent, make_operands
from .errors import UnsupportedSubproblem
from .indexing import Operand
from .ir import Cell, Program, Recurrence
from .kernel_plan import KernelPlan
from .pointwise_ops import maximum
from .signature import KernelParam, constexpr, signature

# Gate names in the order of W_hh's row blocks (PyTorch's order), per cell.
_GATES = {Cell.LSTM: ("i", "f", "g", "o"), Cell.GRU: ("r", "z", "n"), Cell.RNN_TANH: ("a",), Cell.RNN_RELU: ("a",)}
BLOCK_H = 32        # hidden units per program: H = 256 gives 8 programs per batch block
BLOCK_K = 32        # hidden units of h_{t-1} per tl.dot step
MAX_BLOCK_B = 64    # batch rows per program, at least 16 (tl.dot's smallest tile)


def _cell_lines(cell: Cell) -> list[str]:
    """The cell applied to its gates: `x_<gate>` the input's share, `h_<gate>` the hidden state's (b_hh added)."""
    if cell is Cell.LSTM:
        return ["i = _sigmoid(x_i + h_i)", "f = _sigmoid(x_f + h_f)", "g = _tanh(x_g + h_g)",
                "o = _sigmoid(x_o + h_o)",
                "c = f * c_prev + i * g",
                "h = o * _tanh(c)"]
    if cell is Cell.GRU:
        return ["r = _sigmoid(x_r + h_r)", "z = _sigmoid(x_z + h_z)", "n = _tanh(x_n + r * h_n)",
                "h = n + z * (h_prev - n)"]
    if cell is Cell.RNN_RELU:
        return [f"h = {maximum('x_a + h_a', '0.0')}"]
    return ["h = _tanh(x_a + h_a)"]


def _params(anchor: Recurrence, ops: dict[int, Operand]) -> list[KernelParam]:
    cell, gates = anchor.cell, len(_GATES[anchor.cell])
    params = [KernelParam("x_ptr", f"x W_ih^T + b_ih at this step [B, {gates}H]"),
              ops[anchor.w_hh.id].pointer(f"W_hh [{gates}H, H]", "w_ptr")]
    if anchor.b_hh is not None:
        params.append(ops[anchor.b_hh.id].pointer(f"b_hh [{gates}H]", "bias_ptr"))
    params.append(KernelParam("h_ptr", "h before this step [B, H]"))
    if cell is Cell.LSTM:
        params.append(KernelParam("c_ptr", "c before this step [B, H]"))
    params.append(KernelParam("out_ptr", "h after this step [B, H], contiguous"))
    if cell is Cell.LSTM:
        params.append(KernelParam("c_out_ptr", "c after this step [B, H], contiguous"))
    params += [KernelParam("B", "batch rows"), KernelParam("H", "hidden units"),
               KernelParam("stride_xb", "x's stride over batch rows"),
               KernelParam("stride_xg", "x's stride over gates")]
    for state in ("h", "c") if cell is Cell.LSTM else ("h",):
        params += [KernelParam(f"stride_{state}b", f"{state}'s stride over batch rows"),
                   KernelParam(f"stride_{state}h", f"{state}'s stride over units")]
    params += [KernelParam("stride_wg", "W_hh's stride over gate rows"),
               KernelParam("stride_wk", "W_hh's stride over hidden units"),
               constexpr("ZERO_STATE", "h (and c) before this step are zeros: nothing to read"),
               constexpr("BLOCK_B", "batch rows per program"), constexpr("BLOCK_H", "hidden units per program"),
               constexpr("BLOCK_K", "units of h per tl.dot")]
    return params


def _gate(q: int, stride: str = "") -> str:
    """The offset of gate q's block of H rows (W_hh, b_hh) or columns (x), `stride` apart: "" for the first."""
    return "" if not q else f" + {q} * H * {stride}" if stride else f" + {q} * H"


def _body(anchor: Recurrence, precision: str) -> list[str]:
    names = _GATES[anchor.cell]
    lines = ["rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)",
             "units = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)",
             "rmask, umask = rows < B, units < H",
             "mask = rmask[:, None] & umask[None, :]",
             "# h W_hh^T for this program's units, a gate at a time: gate q's unit j is row q * H + j of W_hh"]
    lines += [f"h_{g} = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)" for g in names]
    lines += ["if not ZERO_STATE:",
              "    for k0 in range(0, H, BLOCK_K):",
              "        k = k0 + tl.arange(0, BLOCK_K)",
              "        kmask = k < H",
              "        hk = tl.load(h_ptr + rows[:, None] * stride_hb + k[None, :] * stride_hh,",
              "                     mask=rmask[:, None] & kmask[None, :], other=0.0)",
              "        w_at = w_ptr + k[:, None] * stride_wk + units[None, :] * stride_wg  # W_hh^T [BLOCK_K, BLOCK_H]",
              "        wmask = kmask[:, None] & umask[None, :]"]
    for q, g in enumerate(names):
        lines += [f"        w_{g} = tl.load(w_at{_gate(q, 'stride_wg')}, mask=wmask, other=0.0)",
                  f'        h_{g} = tl.dot(hk, w_{g}, h_{g}, input_precision="{precision}")']
    if anchor.b_hh is not None:
        lines += [f"h_{g} += tl.load(bias_ptr + units{_gate(q)}, mask=umask, other=0.0)[None, :]"
                  for q, g in enumerate(names)]
    lines += ["x_at = x_ptr + rows[:, None] * stride_xb + units[None, :] * stride_xg"]
    lines += [f"x_{g} = tl.load(x_at{_gate(q, 'stride_xg')}, mask=mask, other=0.0)" for q, g in enumerate(names)]
    for state in ("c",) if anchor.cell is Cell.LSTM else ("h",) if anchor.cell is Cell.GRU else ():
        lines += [f"{state}_at = {state}_ptr + rows[:, None] * stride_{state}b + units[None, :] * stride_{state}h",
                  f"{state}_prev = 0.0 if ZERO_STATE else tl.load({state}_at, mask=mask, other=0.0)"]
    lines += _cell_lines(anchor.cell)
    lines += ["out_at = rows[:, None] * H + units[None, :]", "tl.store(out_ptr + out_at, h, mask=mask)"]
    if anchor.cell is Cell.LSTM:
        lines += ["tl.store(c_out_ptr + out_at, c, mask=mask)"]
    return lines


def _launcher(name: str, anchor: Recurrence, ops: dict[int, Operand]) -> str:
    """`{name}_launch(<operands>)`: the output buffer, then one launch per step, in the direction's order."""
    lstm = anchor.cell is Cell.LSTM
    x, w = ops[anchor.gates.id].name, ops[anchor.w_hh.id].name
    h0, c0 = (ops[v.id].name if v is not None else None for v in (anchor.h0, anchor.c0))
    pointers = ["xt", w]
    pointers += [ops[anchor.b_hh.id].name] if anchor.b_hh is not None else []
    pointers += ["h", "c", "out[t]", "out[T]"] if lstm else ["h", "out[t]"]
    strides = ["*xt.stride()", "*h.stride()"] + (["*c.stride()"] if lstm else []) + [f"*{w}.stride()"]
    lines = [f"T, B = {x}.shape[{anchor.time_dim}], {x}.shape[{1 - anchor.time_dim}]",
             f"H = {w}.shape[1]",
             f"# h after each step{', then c after the last' if lstm else ''}",
             f"out = torch.empty(({'T + 1' if lstm else 'T'}, B, H), device={x}.device, dtype=torch.float32)",
             f"h = {h0}" if h0 else "h = out[0]  # not read at the first step (ZERO_STATE)"]
    if lstm:
        lines.append(f"c = {c0}" if c0 else "c = out[T]  # not read at the first step (ZERO_STATE)")
    lines += [f"block_b = min({MAX_BLOCK_B}, max(16, _next_power_of_2(B)))",
              f"grid = (_cdiv(B, block_b), _cdiv(H, {BLOCK_H}))",
              f"for step, t in enumerate({'reversed(range(T))' if anchor.reverse else 'range(T)'}):",
              f"    xt = {x}[t]" if anchor.time_dim == 0 else f"    xt = {x}[:, t]",
              f"    {name}[grid](",
              f"        {', '.join(pointers)}, B, H,",
              f"        {', '.join(strides)},",
              f"        ZERO_STATE={'False' if h0 else 'step == 0'}, BLOCK_B=block_b, BLOCK_H={BLOCK_H}, "
              f"BLOCK_K={BLOCK_K}, num_warps=4)",
              "    h = out[t]"]
    if lstm:
        lines.append("    c = out[T]")
    lines.append("return out")
    names = ", ".join(ops[v.id].name for v in anchor.operands())
    return f"def {name}_launch({names}):\n{indent(lines, 4)}\n"


def emit_recurrence(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Recurrence = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem(f"a {anchor.cell.value} layer written into a module buffer")
    ops = make_operands(kernel.leaves)
    direction = "backwards" if anchor.reverse else "forwards"
    source = f'''@triton.jit
{signature(name, _params(anchor, ops))}
    # One {anchor.cell.value} step ({direction} in time) for BLOCK_B batch rows and BLOCK_H hidden units:
    # h W_hh^T + b_hh for its units' gates by tl.dot, plus the input's share x W_ih^T + b_ih, through the cell.
{indent(_body(anchor, variant.precision), 4)}
'''
    args = [LauncherArg(ops[v.id].name, value=v) for v in anchor.operands()]
    return KernelSource(source, _launcher(name, anchor, ops), f"{name}_launch", args, False,
                        description=f"{anchor.cell.value} steps {direction} ({variant.precision} tl.dot)")


def recurrence_flops(anchor: Recurrence, config: int) -> int:
    """2 per multiply-add of every step's h W_hh^T; the input's share is its GEMM's."""
    steps, batch, hidden = anchor.shapes[config]
    if anchor.cell is Cell.LSTM:
        steps -= 1
    return 2 * steps * batch * hidden * hidden * anchor.cell.gates
