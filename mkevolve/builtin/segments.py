"""Segmentation: where to cut the traced units into groups (one subproblem each), under the fusion rules and
the constraints every cut must keep (tensor boundaries, one group per parameter owner, random draw order)."""

from __future__ import annotations

import dataclasses
import itertools

from torch import fx

from mkevolve.builtin.construction import Owner
from mkevolve.builtin.errors import UnsupportedModule
from mkevolve.builtin.kinds import EPILOGUE_ANCHORS, Kind
from mkevolve.builtin.tracing import TracedModule, external_inputs
from mkevolve.builtin.values import ValueKind


class Segmentation:
    """Groups of consecutive units, given by cut points (the unit index each later group starts at)."""

    def __init__(self, traced: TracedModule, order_follow_ups: bool = True):
        self.traced = traced
        self.unit_of = traced.unit_of()
        self.order_follow_ups = order_follow_ups   # off only to tell whether follow-ups' draws force one group
        self.attention_tails = _masked_attention_tails(traced, self.unit_of)

    def groups(self, cuts: list[int]) -> list[range]:
        bounds = [0] + sorted(cuts) + [len(self.traced.units)]
        return [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]

    # -- the fusion rules --

    def initial_cuts(self) -> list[int]:
        cuts, open_group, anchored, closed = [], False, False, False
        for unit in self.traced.units:
            start = False
            if unit.kind is Kind.RANDOM:
                start, anchored, closed = open_group, False, True      # a group of its own
            elif unit.kind is Kind.ANCHOR:
                start = open_group and (anchored or closed) and unit.index not in self.attention_tails
                anchored, closed = True, False
            elif closed:
                start, anchored, closed = True, False, False
            if unit.kind is Kind.REDUCTION:
                closed = True
            if start and unit.index > 0:
                cuts.append(unit.index)
            open_group = True
        return cuts

    # -- validity --

    def crossing(self, cut: int) -> list[fx.Node]:
        """Values made before unit `cut` that later units take as inputs (views and shape values are
        recomputed where needed, so their bases cross instead), or that the forward returns."""
        later = {n for unit in self.traced.units[cut:] for n in unit.nodes}
        made = self._made_before(cut)
        needed = [n for n in external_inputs(self.traced, later) if n in made]
        returned = [n for n in self.traced.returned if n in made and n not in needed]
        return needed + returned

    def _made_before(self, cut: int) -> set[fx.Node]:
        return {n for unit in self.traced.units[:cut] for n in unit.nodes}

    def valid_cut(self, cut: int) -> bool:
        """Every value a later subproblem takes is one contiguous tensor; returned values are tensors; a masked
        attention's `weights @ v` stays with its softmax (`_masked_attention_tails`)."""
        if cut in self.attention_tails:
            return False
        values = self.traced.values
        later = {n for unit in self.traced.units[cut:] for n in unit.nodes}
        made = self._made_before(cut)
        taken = [n for n in external_inputs(self.traced, later) if n in made]
        returned = [n for n in self.traced.returned if n in made]
        return (all(values[n].kind is ValueKind.TENSOR and (values[n].contiguous or self.copied_out(n))
                    for n in taken)
                and all(values[n].kind is ValueKind.TENSOR for n in returned))

    def copied_out(self, node: fx.Node) -> bool:
        """A strided tensor that a layer itself made (an RNN's batch-first output, or a pointwise op over
        it): the group that makes it returns a contiguous copy, which changes no value. A strided view
        is not copied: its base crosses instead and the view is recomputed."""
        unit = self.traced.units[self.unit_of[node]] if node in self.unit_of else None
        if unit is None or node in self.traced.sinkable or node in self.traced.returned:
            return False   # the forward's result is given back as it is made, strides included
        if unit.kind is not Kind.VIEW:
            return True
        base = node.all_input_nodes[:1]
        return bool(base) and self.traced.values[base[0]].kind is not ValueKind.TENSOR

    def has_work(self, group: range) -> bool:
        return any(self.traced.units[i].kind is not Kind.VIEW for i in group)

    # -- constraints: owners, random order --

    def normalize(self, cuts: list[int]) -> list[int]:
        """Move or drop cuts until every constraint holds: tensor boundaries, one group per owner,
        random draws in the original order, no group without work."""
        cuts = sorted({c for c in cuts if 0 < c < len(self.traced.units)})
        while True:
            fixed = self._fix_boundaries(cuts)
            fixed = self._fix_owners(fixed)
            fixed = self._fix_random_order(fixed)
            fixed = self._fix_empty(fixed)
            if fixed == cuts:
                return cuts
            cuts = fixed

    def _fix_boundaries(self, cuts: list[int]) -> list[int]:
        """An invalid cut moves to the nearest valid point between its neighbours, else it goes."""
        result: list[int] = []
        for i, cut in enumerate(cuts):
            low = result[-1] if result else 0
            high = cuts[i + 1] if i + 1 < len(cuts) else len(self.traced.units)
            if self.valid_cut(cut):
                result.append(cut)
                continue
            moved = next((c for c in itertools.chain(range(cut - 1, low, -1), range(cut + 1, high))
                          if self.valid_cut(c)), None)
            if moved is not None:
                result.append(moved)
        return sorted(set(result))

    def _group_index(self, cuts: list[int]) -> list[int]:
        index, group = [], 0
        cut_set = set(cuts)
        for unit in self.traced.units:
            if unit.index in cut_set:
                group += 1
            index.append(group)
        return index

    def _owner_groups(self, cuts: list[int]) -> dict[Owner, set[int]]:
        index = self._group_index(cuts)
        placed: dict[Owner, set[int]] = {}
        for unit in self.traced.units:
            for key in unit.owners:
                placed.setdefault(key, set()).add(index[unit.index])
        for link in self.traced.links:
            groups = set().union(*(placed.get(k, set()) for k in link))
            for key in link:
                placed[key] = set(groups)
        return placed

    def shareable(self, key: Owner) -> bool:
        """A layer with no state and no random draws: each group that calls it builds its own copy."""
        leaf = self.traced.construction.leaves.get(key.name) if key.is_leaf else None
        return leaf is not None and leaf.stateless and not any(key in link for link in self.traced.links)

    def _fix_owners(self, cuts: list[int]) -> list[int]:
        for key, groups in self._owner_groups(cuts).items():
            if len(groups) > 1 and not self.shareable(key):
                low, high = min(groups), max(groups)
                return [c for i, c in enumerate(cuts) if not low <= i < high]
        return cuts

    def owner_placement(self, cuts: list[int]) -> dict[Owner, set[int]]:
        """The groups that build each owner: every user of a shareable layer, else one group; unused owners
        that draw random numbers go next to the owner drawn just before them."""
        placed = {k: (g if self.shareable(k) else {min(g)}) for k, g in self._owner_groups(cuts).items()}
        draws = self.random_owners()
        for key in sorted(draws, key=draws.get):
            if key not in placed:
                earlier = [min(placed[k]) for k in draws if k in placed and draws[k] < draws[key]]
                placed[key] = {max(earlier) if earlier else 0}
        return placed

    def random_draws(self) -> list[tuple[Owner, float]]:
        """(owner, order) for every random draw of the original's __init__: constructions, and statements that
        change layers after they are built (custom inits, replayed init loops), which run in their subproblem."""
        construction = self.traced.construction
        draws: list[tuple[Owner, float]] = [(Owner.leaf(p), r.order) for p, r in construction.leaves.items()
                                            if r.draws_random]
        draws += [(Owner.raw(n), r.order) for n, r in self.traced.raws.items() if r.draws_random]
        if self.order_follow_ups:
            draws += [(key, f.order) for key, follow_ups in self.traced.follow_ups.items() for f in follow_ups
                      if f.draws_random]
        return draws

    def random_owners(self) -> dict[Owner, float]:
        """Owner -> the order of its first random draw, for owners that draw."""
        owners: dict[Owner, float] = {}
        for key, order in self.random_draws():
            owners[key] = min(order, owners.get(key, order))
        return owners

    def _fix_random_order(self, cuts: list[int]) -> list[int]:
        placed = self.owner_placement(cuts)
        by_group: dict[int, list[float]] = {}
        for key, order in self.random_draws():
            by_group.setdefault(min(placed.get(key, {0})), []).append(order)
        groups = sorted(by_group)
        for a, b in itertools.combinations(groups, 2):
            if max(by_group[a]) > min(by_group[b]):
                return [c for i, c in enumerate(cuts) if not a <= i < b]
        return cuts

    def _fix_empty(self, cuts: list[int]) -> list[int]:
        for i, group in enumerate(self.groups(cuts)):
            if not self.has_work(group):
                drop = i - 1 if i > 0 else 0
                return [c for j, c in enumerate(cuts) if j != drop]
        return cuts

    # -- choosing cuts --

    def best_cut(self, group: range) -> int | None:
        """The cut inside `group` with the fewest crossing tensors, balanced heavy work, next to a heavy op."""
        units = self.traced.units
        heavy = [units[i].kind in (Kind.ANCHOR, Kind.REDUCTION) for i in range(len(units))]
        best = None
        for cut in range(group.start + 1, group.stop):
            left, right = range(group.start, cut), range(cut, group.stop)
            if not (self.has_work(left) and self.has_work(right) and self.valid_cut(cut)):
                continue
            balance = abs(sum(heavy[i] for i in left) - sum(heavy[i] for i in right))
            adjacent = 0 if heavy[cut - 1] or heavy[cut] else 1
            made_here = [n for n in self.crossing(cut) if self.unit_of[n] >= group.start]
            score = (len(made_here), balance, adjacent, cut)
            best = min(best, (score, cut)) if best else (score, cut)
        return best[1] if best else None

    def cut_to_fuse(self, cuts: list[int]) -> int | None:
        """The cut whose removal saves most: next to a group without heavy work, else the largest tensor. None
        when no cut may go: a single group, or every cut next to a random draw's group."""
        units = self.traced.units
        groups = self.groups(cuts)
        best = None
        for i, cut in enumerate(cuts):
            if any(units[j].kind is Kind.RANDOM for g in (groups[i], groups[i + 1]) for j in g):
                continue     # a random draw stays apart: no kernel can make torch's numbers
            light = any(not any(units[j].kind in (Kind.ANCHOR, Kind.REDUCTION) for j in g)
                        for g in (groups[i], groups[i + 1]))
            traffic = sum(self.traced.values[n].nbytes for n in self.crossing(cut))
            score = (0 if light else 1, -traffic, cut)
            best = min(best, (score, cut)) if best else (score, cut)
        return best[1] if best else None

    def one_kernel(self) -> bool:
        """The whole forward is one anchor (a GEMM, convolution or normalisation) and the elementwise chain
        after it: one kernel with a fused epilogue. Cutting it would write the anchor's output to memory
        and read it back, for nothing. So is a masked attention alone (scores, mask, softmax, `weights @ v`):
        cut, its scores would get no kernel."""
        working = [u for u in self.traced.units if u.kind is not Kind.VIEW]
        if not working or working[0].kind is not Kind.ANCHOR:
            return False
        if working[-1].index in self.attention_tails:
            return [u.kind for u in working].count(Kind.ANCHOR) == 2
        return working[0].label in EPILOGUE_ANCHORS and all(u.kind is Kind.POINTWISE for u in working[1:])

    def decompose_cuts(self) -> list[int]:
        cuts = self._first_cuts()
        if len(self.groups(cuts)) == 1 and self.order_follow_ups:
            self._refuse_single_group_for_follow_ups()
        return cuts

    def _first_cuts(self) -> list[int]:
        cuts = self.normalize(self.initial_cuts())
        if len(self.groups(cuts)) == 1 and not self.one_kernel():
            cut = self.best_cut(range(len(self.traced.units)))
            if cut is not None:
                cuts = self.normalize([cut])
        return cuts

    def _refuse_single_group_for_follow_ups(self) -> None:
        """Statements that draw random numbers after layers of later groups are built would tie every group into
        one: an exact decomposition would be the whole module. Say which statement does it, rather than write
        the original again as one subproblem."""
        free = Segmentation(self.traced, order_follow_ups=False)
        if len(free.groups(free.decompose_cuts())) == 1:
            return
        last = max((f for follow_ups in self.traced.follow_ups.values() for f in follow_ups if f.draws_random),
                   key=lambda f: f.order)
        raise UnsupportedModule(f"Model.__init__ draws random numbers in `{last.statement.splitlines()[0][:60]}` "
                                "after building later subproblems' layers: exact only as one subproblem, since a "
                                "top-level may re-initialise its subproblems' tensors only in a loop over "
                                "self.modules() (or the like) that draws after every layer is built")


_ATTENTION_PRODUCTS = {"matmul", "bmm"}
_SOFTMAXES = {"softmax", "_softmax"}
_INDEX_MASKS = {"tril", "triu"}


def _masked_attention_tails(traced: TracedModule, unit_of: dict[fx.Node, int]) -> set[int]:
    """The units that are a causally masked attention's `weights @ v`: a matmul whose left operand is (through
    views) a softmax of scores masked by tril/triu of ones (as F.scaled_dot_product_attention(is_causal=True)
    expands). Only a fused attention kernel computes such a mask, from its query and key offsets: cut between
    the softmax and this product, the scores' subproblem would get no kernel."""
    units = traced.units

    def source(node: fx.Node) -> fx.Node:
        while node in unit_of and units[unit_of[node]].kind is Kind.VIEW and node.all_input_nodes:
            node = node.all_input_nodes[0]
        return node

    def masked(softmax: fx.Node) -> bool:
        """Whether a tril/triu feeds the softmax, searched back to the scores' own anchor."""
        seen, todo = set(), list(softmax.all_input_nodes)
        while todo:
            node = todo.pop()
            if node in seen or node not in unit_of:
                continue
            seen.add(node)
            unit = units[unit_of[node]]
            if unit.label in _INDEX_MASKS:
                return True
            if unit.kind is not Kind.ANCHOR:
                todo += node.all_input_nodes
        return False

    tails = set()
    for unit in units:
        if unit.kind is Kind.ANCHOR and unit.label in _ATTENTION_PRODUCTS and unit.nodes[0].args:
            weights = unit.nodes[0].args[0]
            if not isinstance(weights, fx.Node):
                continue
            weights = source(weights)
            if weights in unit_of and units[unit_of[weights]].label in _SOFTMAXES and masked(weights):
                tails.add(unit.index)
    return tails


def hoist_late_loops(traced: TracedModule) -> TracedModule:
    """Move to the top-level the init loops that draw after every layer is built (MobileNetV2's kaiming loop),
    when replaying them in the subproblems would tie every group into one.

    The top-level runs them after building all subproblems, as the original runs them after building all its
    layers, so every draw keeps its place. Their replays leave the subproblems, which then start from the
    layers' default initialisation. The equivalence check tells whether the items come in the same order."""
    if _group_count(traced) > 1:
        return traced
    late = _late_loops(traced)
    if not late:
        return traced
    follow_ups = {owner: kept for owner, items in traced.follow_ups.items()
                  if (kept := [f for f in items if f.statement not in late])}
    hoisted = dataclasses.replace(traced, follow_ups=follow_ups, top_statements=tuple(late))
    return hoisted if _group_count(hoisted) > 1 else traced


def _group_count(traced: TracedModule) -> int:
    """How many subproblems the fusion rules and the draw-order constraints allow."""
    segmentation = Segmentation(traced)
    return len(segmentation.groups(segmentation._first_cuts()))


def _late_loops(traced: TracedModule) -> list[str]:
    """Init loops whose draws all come after every other draw of the construction, in the original's order."""
    construction = [order for _, order in Segmentation(traced, order_follow_ups=False).random_draws()]
    drawing = [f for follow_ups in traced.follow_ups.values() for f in follow_ups if f.draws_random]
    first_draw: dict[str, float] = {}
    for f in drawing:
        if f.loop is not None:
            first_draw[f.statement] = min(f.order, first_draw.get(f.statement, f.order))
    late: list[str] = []
    for statement in sorted(first_draw, key=first_draw.get, reverse=True):
        others = construction + [f.order for f in drawing if f.statement not in (*late, statement)]
        if others and first_draw[statement] < max(others):
            break
        late.append(statement)
    return late[::-1]
