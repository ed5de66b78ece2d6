"""Recurrence kernels: one direction of one layer of nn.RNN, nn.LSTM or nn.GRU, one launch per time step.

A step depends on the step before it through h (and an LSTM's c), so the launcher walks the steps and each
launch is one step for the whole batch: a program owns BLOCK_B batch rows and BLOCK_H hidden units, multiplies
its rows of h_{t-1} [BLOCK_B, H] by the columns of W_hh^T that feed its units' gates (one [BLOCK_B, BLOCK_H]
accumulator per gate, K = H walked in BLOCK_K chunks), adds b_hh and the input's share of the gates (computed
for every step before, by a GEMM), and applies the cell. Its units' new h go straight to row t of the output
buffer, where the next launch reads them (an LSTM's c to the buffer's last row, in place): launches on one
stream run in order, so no program sees a half-written step. A launch takes the whole buffers and the step's
time t, so the launcher's loop does no per-step tensor work beside the launch itself (each launch costs the
host about 16 us on an H200's machine, scripts/results/launch_cost_h200_2026-12-06.json).

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

# Gate names in the order of W_hh's row blocks (PyTorch's order), per cell: Cell.gates of them.
_GATES = {Cell.LSTM: ("i", "f", "g", "o"), Cell.GRU: ("r", "z", "n"), Cell.RNN_TANH: ("a",), Cell.RNN_RELU: ("a",)}
BLOCK_H = 32        # hidden units per program: H = 256 gives 8 programs per batch block
BLOCK_K = 32        # hidden units of h_{t-1} per tl.dot step
MAX_BLOCK_B = 64    # batch rows per program, at least 16 (tl.dot's smallest tile)


def _cell_lines(cell: Cell) -> list[str]:
    """The cell applied to its gates: `x_<gate>` the input's share, `hw_<gate>` the hidden state's (h W_hh^T +
    b_hh)."""
    if cell is Cell.LSTM:
        return ["i = _sigmoid(x_i + hw_i)", "f = _sigmoid(x_f + hw_f)", "g = _tanh(x_g + hw_g)",
                "o = _sigmoid(x_o + hw_o)",
                "c = f * c_prev + i * g",
                "h = o * _tanh(c)"]
    if cell is Cell.GRU:
        return ["r = _sigmoid(x_r + hw_r)", "z = _sigmoid(x_z + hw_z)", "n = _tanh(x_n + r * hw_n)",
                "h = n + z * (h_prev - n)"]
    if cell is Cell.RNN_RELU:
        return [f"h = {maximum('x_a + hw_a', '0.0')}"]
    return ["h = _tanh(x_a + hw_a)"]


def _params(anchor: Recurrence, ops: dict[int, Operand]) -> list[KernelParam]:
    lstm, gates = anchor.cell is Cell.LSTM, anchor.cell.gates
    params = [ops[anchor.gates.id].pointer(f"x W_ih^T + b_ih of every step [T, B, {gates}H] (or [B, T, {gates}H])",
                                           "x_ptr"),
              ops[anchor.w_hh.id].pointer(f"W_hh [{gates}H, H]", "w_ptr")]
    if anchor.b_hh is not None:
        params.append(ops[anchor.b_hh.id].pointer(f"b_hh [{gates}H]", "bias_ptr"))
    for state in ("h0", "c0"):
        if getattr(anchor, state) is not None:
            params.append(ops[getattr(anchor, state).id].pointer(f"{state[0]} before the first step [B, H]",
                                                                 f"{state}_ptr"))
    params += [KernelParam("out_ptr", f"[{'T + 1' if lstm else 'T'}, B, H], contiguous: h after each step"
                                      + (", then c after the last" if lstm else "")),
               KernelParam("t", "this step's time"),
               KernelParam("t_prev", "the time of the step before (t - 1 forwards, t + 1 backwards)")]
    params += [KernelParam("T", "steps: c's row in out")] if lstm else []
    params += [KernelParam("B", "batch rows"), KernelParam("H", "hidden units"),
               KernelParam("stride_xt", "x's stride over time"), KernelParam("stride_xb", "x's stride over batch rows"),
               KernelParam("stride_xg", "x's stride over gates")]
    for state in ("h0", "c0"):
        if getattr(anchor, state) is not None:
            params += [KernelParam(f"stride_{state}b", f"{state}'s stride over batch rows"),
                       KernelParam(f"stride_{state}h", f"{state}'s stride over units")]
    params += [KernelParam("stride_wg", "W_hh's stride over gate rows"),
               KernelParam("stride_wk", "W_hh's stride over hidden units"),
               constexpr("FIRST", "the first step: h (and c) before it are " + ("given" if anchor.h0 else "zeros")),
               constexpr("BLOCK_B", "batch rows per program"), constexpr("BLOCK_H", "hidden units per program"),
               constexpr("BLOCK_K", "units of h per tl.dot")]
    return params


def _gate(q: int, stride: str = "") -> str:
    """The offset of gate q's block of H rows (W_hh, b_hh) or columns (x), `stride` apart: "" for the first."""
    return "" if not q else f" + {q} * H * {stride}" if stride else f" + {q} * H"


def _previous_h(anchor: Recurrence) -> list[str]:
    """Lines pointing `h_rows` at this program's rows of h before the step, `h_unit` apart: h0 at the first step
    (where given), else row t_prev of out."""
    step_before = ["h_rows, h_unit = out_ptr + (t_prev * B).to(tl.int64) * H + rows[:, None] * H, 1"]
    if anchor.h0 is None:
        return step_before
    return ["if FIRST:", "    h_rows, h_unit = h0_ptr + rows[:, None] * stride_h0b, stride_h0h", "else:",
            "    " + step_before[0]]


def _body(anchor: Recurrence, precision: str) -> list[str]:
    names = _GATES[anchor.cell]
    lines = ["rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)",
             "units = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)",
             "rmask, umask = rows < B, units < H",
             "mask = rmask[:, None] & umask[None, :]",
             *_previous_h(anchor),
             "# hw_<gate>: h W_hh^T for this program's units, gate by gate (gate q's unit j: row q * H + j of W_hh)"]
    lines += [f"hw_{g} = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)" for g in names]
    loop = ["for k0 in range(0, H, BLOCK_K):",
            "    k = k0 + tl.arange(0, BLOCK_K)",
            "    kmask = k < H",
            "    hk = tl.load(h_rows + k[None, :] * h_unit, mask=rmask[:, None] & kmask[None, :], other=0.0)",
            "    w_at = w_ptr + k[:, None] * stride_wk + units[None, :] * stride_wg  # W_hh^T [BLOCK_K, BLOCK_H]",
            "    wmask = kmask[:, None] & umask[None, :]"]
    for q, g in enumerate(names):
        loop += [f"    w_{g} = tl.load(w_at{_gate(q, 'stride_wg')}, mask=wmask, other=0.0)",
                 f'    hw_{g} = tl.dot(hk, w_{g}, hw_{g}, input_precision="{precision}")']
    lines += loop if anchor.h0 is not None else ["if not FIRST:  # else h is zeros", *("    " + line for line in loop)]
    if anchor.b_hh is not None:
        lines += [f"hw_{g} += tl.load(bias_ptr + units{_gate(q)}, mask=umask, other=0.0)[None, :]"
                  for q, g in enumerate(names)]
    lines += ["x_at = x_ptr + t.to(tl.int64) * stride_xt + rows[:, None] * stride_xb + units[None, :] * stride_xg"]
    lines += [f"x_{g} = tl.load(x_at{_gate(q, 'stride_xg')}, mask=mask, other=0.0)" for q, g in enumerate(names)]
    lines += ["state = rows[:, None] * H + units[None, :]  # this program's block of a [B, H] row of out"]
    if anchor.cell is Cell.LSTM:
        lines += ["c_at = out_ptr + (T * B).to(tl.int64) * H + state"]
        first = ("tl.load(c0_ptr + rows[:, None] * stride_c0b + units[None, :] * stride_c0h, mask=mask, other=0.0)"
                 if anchor.c0 is not None else "0.0")
        lines += ["if FIRST:", f"    c_prev = {first}", "else:", "    c_prev = tl.load(c_at, mask=mask, other=0.0)"]
    if anchor.cell is Cell.GRU:     # h itself joins the new state; h_rows points at it (_previous_h)
        load = "h_prev = tl.load(h_rows + units[None, :] * h_unit, mask=mask, other=0.0)"
        lines += [load] if anchor.h0 is not None else ["if FIRST:", "    h_prev = 0.0", "else:", "    " + load]
    lines += _cell_lines(anchor.cell)
    lines += ["tl.store(out_ptr + (t * B).to(tl.int64) * H + state, h, mask=mask)"]
    if anchor.cell is Cell.LSTM:
        lines += ["tl.store(c_at, c, mask=mask)"]
    return lines


def _launcher(name: str, anchor: Recurrence, ops: dict[int, Operand]) -> str:
    """`{name}_launch(<operands>)`: the output buffer, then one launch per step, in the direction's order."""
    lstm = anchor.cell is Cell.LSTM
    x, w = ops[anchor.gates.id].name, ops[anchor.w_hh.id].name
    states = [ops[v.id].name for v in (anchor.h0, anchor.c0) if v is not None]
    pointers = [ops[v.id].name for v in anchor.operands()] + ["out"]
    time, batch = anchor.time_dim, 1 - anchor.time_dim
    strides = [f"{x}.stride({time})", f"{x}.stride({batch})", f"{x}.stride(2)"]
    strides += [f"*{s}.stride()" for s in states] + [f"*{w}.stride()"]
    lines = [f"T, B = {x}.shape[{time}], {x}.shape[{batch}]",
             f"H = {w}.shape[1]",
             f"# h after each step{', then c after the last' if lstm else ''}",
             f"out = torch.empty(({'T + 1' if lstm else 'T'}, B, H), device={x}.device, dtype=torch.float32)",
             f"strides = ({', '.join(strides)})",
             f"block_b = min({MAX_BLOCK_B}, max(16, _next_power_of_2(B)))",
             f"grid = (_cdiv(B, block_b), _cdiv(H, {BLOCK_H}))",
             f"for step, t in enumerate({'reversed(range(T))' if anchor.reverse else 'range(T)'}):",
             f"    {name}[grid](",
             f"        {', '.join(pointers)}, t, t {'+' if anchor.reverse else '-'} 1, {'T, ' if lstm else ''}B, H,",
             f"        *strides, FIRST=step == 0, BLOCK_B=block_b, BLOCK_H={BLOCK_H}, BLOCK_K={BLOCK_K}, num_warps=4)",
             "return out"]
    return f"def {name}_launch({', '.join(ops[v.id].name for v in anchor.operands())}):\n{indent(lines, 4)}\n"


def emit_recurrence(kernel: KernelPlan, name: str, variant: Variant, program: Program) -> KernelSource:
    anchor: Recurrence = kernel.anchor
    if kernel.target is not None:
        raise UnsupportedSubproblem(f"a {anchor.cell.value} layer written into a module buffer")
    ops = make_operands(kernel.leaves)
    direction = "backwards" if anchor.reverse else "forwards"
    # t and t_prev take every value: specialised (as Triton does to 1 and multiples of 16) they would compile
    # the kernel three times over
    source = f'''@triton.jit(do_not_specialize=["t", "t_prev"])
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
