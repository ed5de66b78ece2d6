"""Monte Carlo tree search over kernel candidates: progressive widening, and UCT on normalised latency.

Every node is a candidate kernel; its parent is the candidate it was derived from (a debug prompt for a
failing parent, a refine prompt for a passing one) and a fresh generation hangs off a virtual root. The
beam's members from earlier iterations are the root's first children. Each step descends from the root,
at every node either widening it (a new child: what is proposed) or going down to the child with the
lowest UCT value, and proposes up to `beam.width` such children in one call, so the GPUs stay busy. Which
prompt a child gets stays the agent's business: the search hands it the parent, as beam search does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mkevolve.search.beam import Beam, Candidate, Propose, Settled, never_settled, ranked

# Progressive widening: a node with n visits may have at most ceil(WIDEN_K * n ** WIDEN_ALPHA) children
# (1, 2, 2, 2, 3 ... children for 1, 2, 3, 4, 5 ... visits). With a budget of tens of calls, a square root
# lets a node that keeps paying off grow a few children while a fresh generation still comes every few
# steps; K = 1 gives a new leaf exactly one child (its first debug or refine) before it has earned more.
WIDEN_K = 1.0
WIDEN_ALPHA = 0.5

# A candidate's cost is its latency over torch.compile's (1 / speedup). A failing kernel (incorrect,
# cheating, no code, crashed) costs FAIL_COST, as if it were twice as slow as compile: worse than any
# honest kernel a model usually writes, yet not so much worse that a single failure (often one fix away
# from passing) buries its branch. Passing kernels slower than that are capped at the same cost so that
# one very slow kernel cannot dominate a branch's mean. A kernel that passes where nothing is timed (CPU)
# costs UNTIMED_COST: as fast as compile, the only neutral guess.
FAIL_COST = 2.0
UNTIMED_COST = 1.0

# UCT exploration constant, in cost units. A child seen once among ten visits of its parent gets a bonus of
# 0.5 * sqrt(ln 10) = 0.76: the gap between a 1x and a 4x kernel. So a rarely tried branch is tried again,
# while two or three failures (cost 2 against 1 for compile's speed) are enough to leave a branch alone.
EXPLORATION = 0.5


def cost_of(candidate: Candidate) -> float:
    """Normalised latency: 1 / speedup over torch.compile, FAIL_COST for a failure (see above)."""
    if not candidate.passed:
        return FAIL_COST
    if candidate.score <= 0:           # passed, speed unknown
        return UNTIMED_COST
    return min(1.0 / candidate.score, FAIL_COST)


def max_children(visits: int) -> int:
    """Progressive widening's cap; at least 1, so the root of an empty tree can take its first child."""
    return max(1, math.ceil(WIDEN_K * visits ** WIDEN_ALPHA))


def uct(mean_cost: float, visits: int, parent_visits: int, exploration: float) -> float:
    """Minimisation UCT: lower is better. An unvisited child comes first."""
    if visits == 0:
        return -math.inf
    return mean_cost - exploration * math.sqrt(math.log(max(parent_visits, 1)) / visits)


@dataclass(eq=False)  # identity, not field equality: two nodes with equal counts are still two nodes
class Node:
    """One candidate in the tree (None: the virtual root), with its visit and cost statistics."""

    candidate: Candidate | None
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    visits: int = 0            # evaluations in this node's subtree, its own included
    total_cost: float = 0.0    # their costs, summed
    # Virtual loss: proposals of this step through this node, not yet evaluated. Each counts as a visit at
    # FAIL_COST until its child comes back, so the next selection of the same step prefers another path.
    in_flight: int = 0
    planned: int = 0           # children of this node being proposed in this step

    @property
    def expandable(self) -> bool:
        """The root (fresh generations), or a candidate with code; a reply without code has nothing to
        debug or refine."""
        return self.candidate is None or bool(self.candidate.source)

    @property
    def seen(self) -> int:
        return self.visits + self.in_flight

    @property
    def mean_cost(self) -> float:
        return (self.total_cost + self.in_flight * FAIL_COST) / self.seen if self.seen else 0.0

    def may_widen(self) -> bool:
        """Widening is earned by evaluated visits only: an evaluation still in flight is no evidence."""
        return self.expandable and len(self.children) + self.planned < max_children(self.visits)

    def path(self) -> list[Node]:
        """This node and its ancestors, up to the root."""
        node, nodes = self, []
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes


@dataclass
class Tree:
    root: Node = field(default_factory=lambda: Node(None))
    exploration: float = EXPLORATION

    @classmethod
    def from_members(cls, members: list[Candidate], exploration: float = EXPLORATION) -> Tree:
        """The beam's members as the root's first children, best first, each with its own cost."""
        tree = cls(exploration=exploration)
        for member in ranked(members):
            tree.add(tree.root, member)
        return tree

    def add(self, parent: Node, candidate: Candidate) -> Node:
        """Hang an evaluated candidate under `parent` and back its cost up to the root."""
        child = Node(candidate, parent)
        parent.children.append(child)
        backpropagate(child, cost_of(candidate))
        return child

    def by_uct(self, node: Node) -> list[Node]:
        """The children one may descend into, lowest UCT value first (the older first on a tie)."""
        open_children = [c for c in node.children if c.expandable]
        return sorted(open_children, key=lambda c: uct(c.mean_cost, c.seen, node.seen, self.exploration))

    def select(self) -> Node | None:
        """The node to widen next, or None when no path has room left in this step."""
        return self._descend(self.root)

    def _descend(self, node: Node) -> Node | None:
        if node.may_widen():
            return node
        # In UCT order; a child whose subtree has no room (its widening already planned in this step, or
        # nothing below it with code) hands the choice to the next child rather than end the selection.
        for child in self.by_uct(node):
            found = self._descend(child)
            if found is not None:
                return found
        return None

    def plan(self, count: int) -> list[Node]:
        """Up to `count` nodes to widen in one step, each reserved with a virtual loss. When no node has
        room (every leaf a reply without code, the root at its cap) the root gets a fresh generation past
        its cap: the budget is always spent."""
        targets: list[Node] = []
        while len(targets) < count:
            node = self.select()
            if node is None:
                break
            self.reserve(node)
            targets.append(node)
        if not targets and count > 0:
            self.reserve(self.root)
            targets.append(self.root)
        return targets

    def reserve(self, node: Node) -> None:
        node.planned += 1
        for ancestor in node.path():
            ancestor.in_flight += 1

    def settle(self, node: Node, child: Candidate) -> Node:
        """The proposal reserved on `node` came back as `child`: lift the virtual loss, add the real cost."""
        node.planned -= 1
        for ancestor in node.path():
            ancestor.in_flight -= 1
        return self.add(node, child)


def backpropagate(node: Node, cost: float) -> None:
    """One evaluation at `node`: a visit and its cost for the node and every ancestor."""
    for ancestor in node.path():
        ancestor.visits += 1
        ancestor.total_cost += cost


def mcts_search(beam: Beam, budget: int, propose: Propose, settled: Settled = never_settled,
                exploration: float = EXPLORATION) -> Beam:
    """Spend `budget` proposals in steps of up to `beam.width` tree selections; stop early once
    `settled(beam)`. The beam keeps the best `width` of its members and everything made."""
    tree = Tree.from_members(beam.members, exploration)
    remaining = budget
    while remaining > 0 and not settled(beam):
        targets = tree.plan(min(beam.width, remaining))
        children = propose([target.candidate for target in targets])
        for target, child in zip(targets, children, strict=True):
            tree.settle(target, child)
        beam.select(children)
        remaining -= len(targets)
    return beam
