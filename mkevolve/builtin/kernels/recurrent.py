"""Lowering of recurrent layers into the tensor program: nn.RNN, nn.LSTM and nn.GRU, their single-step cells, and
the aten ops torch.export records for both.

Each layer and direction is two kernels: a GEMM that computes the input's share of the gates for every step at
once (x W_ih^T + b_ih: one large matrix product instead of T small ones), then a Recurrence whose launcher walks
the steps, each step one launch that adds h W_hh^T + b_hh and applies the cell (emit_recurrence.py). The
layers' outputs, h_n and c_n are views and concatenations of the Recurrences' buffers. A cell is one step, so
it needs no Recurrence: two GEMMs and the cell's formulas (`cell_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .builders import Builder
from .calls import Call, module_param
from .errors import UnsupportedInMode, UnsupportedSubproblem
from .ir import Cell, IntOp, Pointwise, Recurrence, Value


@dataclass(frozen=True)
class Stack:
    """What a stack of recurrent layers is, however it is called: module attributes or aten arguments."""

    cell: Cell
    hidden: int
    layers: int
    bidirectional: bool
    batch_first: bool

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1


def _cell(layer: nn.Module) -> Cell:
    """The cell of a layer (nn.RNN/LSTM/GRU) or of a single-step cell (nn.RNNCell/LSTMCell/GRUCell)."""
    if isinstance(layer, (nn.LSTM, nn.LSTMCell)):
        return Cell.LSTM
    if isinstance(layer, (nn.GRU, nn.GRUCell)):
        return Cell.GRU
    return Cell.RNN_RELU if layer.nonlinearity == "relu" else Cell.RNN_TANH


def _check_input(x, what: str) -> None:
    if not isinstance(x, Value):
        raise UnsupportedSubproblem(f"{what} of a {type(x).__name__} (a packed sequence?): only a padded "
                                    "(T, B, features) tensor is supported")
    if x.rank != 3:
        raise UnsupportedSubproblem(f"{what} of an unbatched {x.rank}-d input")


def _dropout_refused(what: str, dropout: float) -> UnsupportedInMode:
    return UnsupportedInMode(f"{what} with dropout={dropout} between its layers in training mode: the reference "
                             "draws its random mask from torch's generator; run with --eval")


def _initial_states(hx, cell: Cell, what: str) -> tuple[Value | None, Value | None]:
    """(h0, c0) as given to the layer, each (layers * directions, B, H), or None where it starts from zeros."""
    if hx is None:
        return None, None
    if cell is Cell.LSTM:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise UnsupportedSubproblem(f"{what}'s hx must be a (h0, c0) pair")
        h0, c0 = hx
    else:
        h0, c0 = hx, None
    for state in (h0, c0):
        if state is not None and (not isinstance(state, Value) or state.rank != 3):
            raise UnsupportedSubproblem(f"{what}'s initial state must be a 3-d tensor")
    if _is_zeros(h0) and (c0 is None or _is_zeros(c0)):
        return None, None       # torch.zeros given as the state: the same as none
    return h0, c0


def _is_zeros(value) -> bool:
    """torch.zeros built in the forward (Builder.full of 0): a state that need not be read."""
    return isinstance(value, Pointwise) and value.op == "full" and value.args[0].value == 0.0


def _row(b: Builder, x: Value | None, index) -> Value | None:
    """x[index] along dim 0, a view; None stays None."""
    if x is None:
        return None
    return b.view(x, "select", (0, index), tuple(s[1:] for s in x.shapes))


def recurrent_stack(b: Builder, stack: Stack, x: Value, h0, c0, weights: list[tuple]):
    """The layers of `stack` over x from (h0, c0); weights[layer * directions + direction] is that direction's
    (W_ih, W_hh, b_ih, b_hh), the biases None without them. (output, h_n), and c_n too for an LSTM."""
    cell, time_dim = stack.cell, 1 if stack.batch_first else 0
    finals_h, finals_c = [], []
    for index in range(stack.layers):
        outputs = []
        for direction in range(stack.directions):
            state = index * stack.directions + direction
            w_ih, w_hh, b_ih, b_hh = weights[state]
            gates = b.linear(x, w_ih, b_ih)
            shapes = tuple(s[time_dim:time_dim + 1] + s[1 - time_dim:2 - time_dim] + (stack.hidden,)
                           for s in gates.shapes)
            if cell is Cell.LSTM:      # the cell state's row after the hidden states'
                shapes = tuple((s[0] + 1,) + s[1:] for s in shapes)
            steps = b.program.add(Recurrence(
                shapes, cell=cell, gates=gates, w_hh=w_hh, b_hh=b_hh, h0=_row(b, h0, state), c0=_row(b, c0, state),
                time_dim=time_dim, reverse=bool(direction)))
            hidden = steps
            if cell is Cell.LSTM:
                length = b.size(gates, time_dim)
                hidden = b.view(steps, "narrow", (0, 0, length), tuple((s[0] - 1,) + s[1:] for s in shapes))
                finals_c.append(_row(b, steps, length))
            # the hidden state after a direction's last step: time T - 1 forwards, time 0 backwards
            finals_h.append(_row(b, hidden, 0 if direction else IntOp("sub", b.size(hidden, 0), 1)))
            outputs.append(hidden)
        # the next layer reads time-major states (both directions side by side): its GEMM gives time-major gates
        x, time_dim = b.concat(outputs, 2), 0
    output = b.swap01(x) if stack.batch_first else x
    # (layers * directions, B, H) from each layer's and direction's (B, H)
    h_n = b.concat([b.unsqueeze(h, 0) for h in finals_h], 0)
    if cell is Cell.LSTM:
        return output, h_n, b.concat([b.unsqueeze(c, 0) for c in finals_c], 0)
    return output, h_n


def recurrent_module(b: Builder, call: Call):
    """nn.RNN / nn.LSTM / nn.GRU: (output, h_n), or (output, (h_n, c_n)) for an LSTM."""
    layer, x, what = call.module, call.arg(0, "input"), type(call.module).__name__
    _check_input(x, what)
    if getattr(layer, "proj_size", 0):
        raise UnsupportedSubproblem("nn.LSTM with proj_size > 0")
    stack = Stack(_cell(layer), *(call.module_attr(name) for name in ("hidden_size", "num_layers",
                                                                     "bidirectional", "batch_first")))
    if layer.training and layer.dropout and layer.num_layers > 1:
        raise _dropout_refused(what, layer.dropout)
    weights = []
    for index in range(stack.layers):
        for direction in range(stack.directions):
            suffix = f"_l{index}" + ("_reverse" if direction else "")
            weights.append(tuple(module_param(b, call, f"{name}{suffix}")
                                 for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))
    h0, c0 = _initial_states(call.arg(1, "hx", None), stack.cell, what)
    result = recurrent_stack(b, stack, x, h0, c0, weights)
    return (result[0], result[1:]) if stack.cell is Cell.LSTM else result


def aten_stack(cell: Cell):
    """aten.lstm / gru / rnn_tanh / rnn_relu (input, hx, params, has_biases, num_layers, dropout, train,
    bidirectional, batch_first), as torch.export records the layers: params flat, per layer and direction
    W_ih, W_hh (then b_ih, b_hh with biases); an LSTM's hx the list [h0, c0]. A flat (output, h_n[, c_n])."""
    def handler(b: Builder, call: Call):
        x, what = call.arg(0, "input"), call.name
        _check_input(x, what)
        params, has_biases = list(call.arg(2, "params")), bool(call.arg(3, "has_biases"))
        layers, dropout, train = int(call.arg(4, "num_layers")), float(call.arg(5, "dropout")), call.arg(6, "train")
        if train and dropout and layers > 1:
            raise _dropout_refused(what, dropout)
        per = 4 if has_biases else 2
        if params and params[1].shapes[0][0] != params[1].shapes[0][1] * cell.gates:
            raise UnsupportedSubproblem(f"{what} with projected hidden states (proj_size > 0)")
        stack = Stack(cell, params[1].shapes[0][1], layers, bool(call.arg(7, "bidirectional")),
                      bool(call.arg(8, "batch_first")))
        weights = [tuple(params[i:i + per]) + (None,) * (4 - per) for i in range(0, len(params), per)]
        h0, c0 = _initial_states(call.arg(1, "hx"), cell, what)
        return recurrent_stack(b, stack, x, h0, c0, weights)
    return handler


# --- single steps: nn.RNNCell, nn.LSTMCell, nn.GRUCell and their aten ops ------------------------------
# A cell is one step, so no Recurrence: two GEMMs (x W_ih^T + b_ih, h W_hh^T + b_hh) and the cell's elementwise
# formulas, which the plan fuses into the second GEMM's epilogue and a pointwise kernel. A Python loop of cells
# over time is traced by torch.export, unrolled, as aten.*_cell calls; its first state is often aten.zeros, which
# the step takes as no state at all.


def _gate_views(b: Builder, gates: Value, count: int, hidden: int) -> list[Value]:
    """The `count` gates side by side along the last dim of (B, count * H) or (count * H,), each a view."""
    shapes = tuple(s[:-1] + (hidden,) for s in gates.shapes)
    return [b.view(gates, "narrow", (gates.rank - 1, q * hidden, hidden), shapes) for q in range(count)]


def _state(state, what: str) -> Value | None:
    """A cell's h or c, or None where it starts from zeros (none given, or torch.zeros)."""
    if state is None or _is_zeros(state):
        return None
    if not isinstance(state, Value) or state.rank != 2:
        raise UnsupportedSubproblem(f"{what}'s state must be a 2-d (batch, hidden) tensor")
    return state


def cell_step(b: Builder, cell: Cell, x, h, c, weights: tuple, what: str):
    """One step of `cell` on x (B, input) from h (and c; None: zeros); weights (W_ih, W_hh, b_ih, b_hh), the
    biases None where absent. h', or (h', c') for an LSTM cell."""
    if not isinstance(x, Value) or x.rank != 2:
        raise UnsupportedSubproblem(f"{what} of an input that is not a 2-d (batch, features) tensor")
    h, c = _state(h, what), _state(c, what)
    w_ih, w_hh, b_ih, b_hh = weights
    hidden = w_hh.shapes[0][1]
    x_part = b.linear(x, w_ih, b_ih)
    # h W_hh^T + b_hh; from a zero state only the bias is left (or nothing)
    h_part = b.linear(h, w_hh, b_hh) if h is not None else b_hh
    if cell is Cell.GRU:
        xr, xz, xn = _gate_views(b, x_part, 3, hidden)
        hr, hz, hn = _gate_views(b, h_part, 3, hidden) if h_part is not None else (None, None, None)
        r, z = b.pw("sigmoid", _plus(b, xr, hr)), b.pw("sigmoid", _plus(b, xz, hz))
        n = b.pw("tanh", _plus(b, xn, b.pw("mul", r, hn) if hn is not None else None))
        # h' = n + z (h - n), with h = 0 from zeros
        return b.pw("add", n, b.pw("mul", z, b.pw("sub", h, n) if h is not None else b.pw("neg", n)))
    gates = _plus(b, x_part, h_part)
    if cell is not Cell.LSTM:
        return b.pw("relu" if cell is Cell.RNN_RELU else "tanh", gates)
    i, f, g, o = _gate_views(b, gates, 4, hidden)
    i, f, g, o = b.pw("sigmoid", i), b.pw("sigmoid", f), b.pw("tanh", g), b.pw("sigmoid", o)
    c_next = b.pw("mul", i, g) if c is None else b.pw("add", b.pw("mul", f, c), b.pw("mul", i, g))
    return b.pw("mul", o, b.pw("tanh", c_next)), c_next


def _plus(b: Builder, a: Value, other: Value | None) -> Value:
    return a if other is None else b.pw("add", a, other)


def recurrent_cell_module(b: Builder, call: Call):
    """nn.RNNCell / nn.LSTMCell / nn.GRUCell on a (B, input) batch: h', or (h', c') for an LSTM cell."""
    layer = call.module
    cell = _cell(layer)
    call.module_attr("hidden_size")
    hx = call.arg(1, "hx", None)
    h, c = hx if cell is Cell.LSTM and isinstance(hx, (tuple, list)) else (hx, None)
    weights = tuple(module_param(b, call, name) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    return cell_step(b, cell, call.arg(0, "input"), h, c, weights, type(layer).__name__)


def aten_cell(cell: Cell):
    """aten.rnn_tanh_cell / rnn_relu_cell / gru_cell (input, hx, w_ih, w_hh, b_ih, b_hh) and aten.lstm_cell,
    whose hx is the list [h, c]."""
    def handler(b: Builder, call: Call):
        hx = call.arg(1, "hx")
        h, c = hx if cell is Cell.LSTM else (hx, None)
        weights = tuple(call.arg(i, name, None) for i, name in ((2, "w_ih"), (3, "w_hh"), (4, "b_ih"), (5, "b_hh")))
        return cell_step(b, cell, call.arg(0, "input"), h, c, weights, call.name)
    return handler


ATEN_RECURRENT = {
    "aten.lstm": aten_stack(Cell.LSTM), "aten.gru": aten_stack(Cell.GRU), "aten.rnn_tanh": aten_stack(Cell.RNN_TANH),
    "aten.rnn_relu": aten_stack(Cell.RNN_RELU), "aten.rnn_tanh_cell": aten_cell(Cell.RNN_TANH),
    "aten.rnn_relu_cell": aten_cell(Cell.RNN_RELU), "aten.lstm_cell": aten_cell(Cell.LSTM),
    "aten.gru_cell": aten_cell(Cell.GRU)}
