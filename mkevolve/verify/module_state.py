"""Module state: a candidate's buffers after its calls, against the reference Model's after the same calls.

Outputs are not all a forward does. A batch norm in training also moves its running mean and variance, which
the model reads once it is switched to eval mode; a kernel that skips that update returns the right outputs
and leaves a model that behaves differently later (and a kernel that updates them on the first call only is
faster on every other). So where the reference's forward changes floating-point buffers (recorded with the
reference sets: ReferenceSet.mutated_buffers), the candidate's harness keeps its model's buffers after the
first call and after the last, and the trusted side replays the same calls (the same input sets in the same
order, the calls that timing left out skipped) on a fresh reference Model.

ModelNew may name and nest its modules as it likes (a composed solution does), so buffers are matched by value,
not by name: every buffer the reference changed must be held, within the tolerance, by a distinct buffer of
ModelNew with its shape and dtype (a maximum bipartite matching). Integer counters (num_batches_tracked) are
not compared: they steer behaviour only through the floating-point state they update, which is.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import torch

from mkevolve.problem import shifted_values
from mkevolve.verify.candidate_run import CallPlan
from mkevolve.verify.reference import ReferenceSet
from mkevolve.workers import wire

Buffers = list[tuple[str, torch.Tensor]]   # (the reference's name for it, its value)


@dataclass(frozen=True)
class StateMismatch:
    name: str                  # the reference's buffer, e.g. "bn.running_mean"
    shape: tuple[int, ...]
    closest_error: float | None  # max abs error of the nearest candidate buffer of the same shape; None: none

    def describe(self) -> str:
        closest = ("no buffer of ModelNew has its shape" if self.closest_error is None else
                   f"the nearest buffer of ModelNew with its shape is off by up to {self.closest_error:.3g}")
        return f"`{self.name}` (shape {self.shape}): {closest}"


def replay(reference: ReferenceSet, plan: CallPlan, skipped: set[int], names: list[str]) -> tuple[Buffers, Buffers]:
    """The named buffers of a fresh reference Model after the plan's first call and after its last, the calls
    at `skipped` positions left out as the candidate's harness left them out, each on its inputs as the
    candidate got them (shifted: harness.Call.shift)."""
    model = reference.build_model()
    inputs: dict[str, list] = {}
    first: Buffers = []
    for position, call in enumerate(plan.calls):
        if position in skipped:
            continue
        if call.inputs not in inputs:
            inputs[call.inputs] = wire.read_values(reference.inputs_file(call.inputs), reference.device)
        with torch.no_grad():
            model(*shifted_values(inputs[call.inputs], call.shift))
        if position == 0:
            first = _named(model, names)
    return first, _named(model, names)


def _named(model: torch.nn.Module, names: list[str]) -> Buffers:
    buffers = dict(model.named_buffers())
    return [(name, buffers[name].detach().clone()) for name in names]


def mismatches(expected: Buffers, actual: list, atol: float, rtol: float) -> list[StateMismatch]:
    """The expected buffers that no distinct tensor of `actual` matches (same shape and dtype, allclose).
    Candidates of one kind are stacked and compared at once: one comparison per expected buffer, however many
    buffers ModelNew registers."""
    stacks = _stacks([value for value in actual if isinstance(value, torch.Tensor)])
    graph = nx.Graph()
    top = [("reference", i) for i in range(len(expected))]
    graph.add_nodes_from(top)
    for i, (_, ref) in enumerate(expected):
        stack, indices = stacks.get(_kind(ref), (None, []))
        if stack is not None:
            close = torch.isclose(stack, ref, atol=atol, rtol=rtol, equal_nan=True).reshape(len(indices), -1).all(1)
            graph.add_edges_from((("reference", i), ("candidate", indices[j]))
                                 for j in close.nonzero().flatten().tolist())
    matched = nx.bipartite.maximum_matching(graph, top_nodes=top)
    return [StateMismatch(name, tuple(ref.shape), _closest_error(ref, stacks))
            for i, (name, ref) in enumerate(expected) if ("reference", i) not in matched]


def _closest_error(ref: torch.Tensor, stacks: dict) -> float | None:
    """The max abs error of the candidate buffer of ref's kind nearest to it; None when there is none."""
    stack, indices = stacks.get(_kind(ref), (None, []))
    if stack is None:
        return None
    errors = (stack.double() - ref.double()).abs().reshape(len(indices), -1)
    return float(errors.amax(1).min()) if errors.shape[1] else 0.0


def _kind(value: torch.Tensor) -> tuple:
    return tuple(value.shape), value.dtype, value.device


def _stacks(candidates: list[torch.Tensor]) -> dict[tuple, tuple[torch.Tensor, list[int]]]:
    """The candidates grouped by shape, dtype and device: each group stacked, with the candidates' positions."""
    groups: dict[tuple, list[int]] = {}
    for index, value in enumerate(candidates):
        groups.setdefault(_kind(value), []).append(index)
    return {kind: (torch.stack([candidates[i] for i in indices]), indices) for kind, indices in groups.items()}
