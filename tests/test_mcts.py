"""MCTS over kernel candidates: the tree's rules with a fake Propose, then the search through EvolveKernel and
a whole `mkevolve run --search mcts`, driven by recorded replies (replay provider)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from fixtures.replay_kernels.fakes import PROBLEM, FakeVerifier, timed_ok

from mkevolve.agents.evolve import evolve_kernel
from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import RetryPolicy, make_client
from mkevolve.search import mcts
from mkevolve.search.beam import Beam, Candidate, PromptKind, candidate_id, ranked
from mkevolve.search.mcts import (EXPLORATION, FAIL_COST, UNTIMED_COST, Tree, cost_of, max_children, mcts_search,
                                  uct)
from mkevolve.solution import Manifest
from mkevolve.verify.result import EvalResult, Status

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NO_RETRY_WAIT = RetryPolicy(attempts=2, base_delay_s=0.0)
FAILING = EvalResult(status=Status.INCORRECT, max_abs_err=1.0)
UNTIMED_PASS = EvalResult(status=Status.OK)


def candidate(seq: int, result: EvalResult, parent: Candidate | None = None, source: str = "# code") -> Candidate:
    kind = PromptKind.GENERATE if parent is None else (PromptKind.REFINE if parent.passed else PromptKind.DEBUG)
    return Candidate(id=candidate_id(seq), subproblem="s", parent=parent.id if parent else None, kind=kind,
                     source=source, result=result)


class FakePropose:
    """Records each step's parents (ids, None for a fresh generation) and answers with the verdicts of
    `results`, in order (the last one repeated), each child numbered after the last."""

    def __init__(self, *results: EvalResult, start: int = 0, source: str = "# code"):
        self.results = list(results) or [FAILING]
        self.seq = itertools.count(start)
        self.source = source
        self.steps: list[list[str | None]] = []
        self.made: list[Candidate] = []

    def __call__(self, parents: list[Candidate | None]) -> list[Candidate]:
        self.steps.append([p.id if p else None for p in parents])
        children = []
        for parent in parents:
            seq = next(self.seq)
            result = self.results[min(seq, len(self.results) - 1)]
            children.append(candidate(seq, result, parent, self.source))
        self.made += children
        return children


def searched_tree(monkeypatch) -> list[Tree]:
    """The trees mcts_search builds, kept for inspection."""
    trees = []
    build = Tree.from_members

    def keep(*args, **kwargs):
        trees.append(build(*args, **kwargs))
        return trees[-1]

    monkeypatch.setattr(mcts.Tree, "from_members", keep)
    return trees


# ---- costs and the widening cap -------------------------------------------------------------------------


def test_cost_is_latency_over_compile_with_a_fixed_penalty_for_failures():
    assert cost_of(candidate(0, timed_ok(2.0))) == pytest.approx(0.5)
    assert cost_of(candidate(0, timed_ok(1.0))) == pytest.approx(1.0)
    assert cost_of(candidate(0, FAILING)) == FAIL_COST == 2.0
    assert cost_of(candidate(0, EvalResult(status=Status.CHEATING, rule="torch-compute"))) == FAIL_COST
    assert cost_of(candidate(0, UNTIMED_PASS)) == UNTIMED_COST == 1.0      # passes, speed unknown (CPU)
    assert cost_of(candidate(0, timed_ok(0.1))) == FAIL_COST               # capped: no worse than a failure


def test_progressive_widening_caps_children_by_visits():
    assert [max_children(n) for n in range(11)] == [1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 4]
    tree = Tree()
    assert tree.root.may_widen()                       # the empty tree may take its first child
    a = tree.add(tree.root, candidate(0, FAILING))
    assert not tree.root.may_widen() and a.may_widen()  # 1 visit: 1 child
    a1 = tree.add(a, candidate(1, FAILING, a.candidate))
    assert (a.visits, len(a.children), a.may_widen()) == (2, 1, True)
    tree.add(a, candidate(2, FAILING, a.candidate))
    assert (a.visits, len(a.children), a.may_widen()) == (3, 2, False)
    tree.add(a1, candidate(3, FAILING, a1.candidate))
    assert (a.visits, len(a.children), a.may_widen()) == (4, 2, False)
    tree.add(a1, candidate(4, FAILING, a1.candidate))
    assert (a.visits, len(a.children), a.may_widen()) == (5, 2, True)     # ceil(sqrt 5) = 3
    tree.reserve(a)                                    # a child planned in this step counts against the cap
    assert not a.may_widen()


def test_a_search_keeps_every_node_within_its_cap(monkeypatch):
    """Width 1, nine failing kernels: the root (9 visits) ends with exactly 3 children, each of them (3
    visits) with exactly 2."""
    trees = searched_tree(monkeypatch)
    propose = FakePropose(FAILING)
    mcts_search(Beam(width=1), 9, propose)
    (tree,) = trees
    assert (tree.root.visits, len(tree.root.children)) == (9, 3)
    assert [(c.visits, len(c.children)) for c in tree.root.children] == [(3, 2)] * 3
    nodes = [tree.root]
    while nodes:
        node = nodes.pop()
        assert len(node.children) <= max_children(node.visits)
        nodes += node.children
    assert propose.steps[:3] == [[None], ["c0000"], [None]]


# ---- UCT and backpropagation ---------------------------------------------------------------------------


def test_uct_picks_the_lower_cost_child_at_equal_visits():
    tree = Tree()
    slow = tree.add(tree.root, candidate(0, timed_ok(1.0)))
    fast = tree.add(tree.root, candidate(1, timed_ok(2.0)))
    failing = tree.add(tree.root, candidate(2, FAILING))
    assert tree.by_uct(tree.root) == [fast, slow, failing]
    assert Tree(root=tree.root, exploration=10.0).by_uct(tree.root)[0] is fast   # equal bonuses cancel out


def test_uct_explores_a_rarely_visited_child_when_the_constant_says_so():
    """A: 5 visits at compile's speed (cost 1.0); B: 1 visit at 0.8x (cost 1.25). Pure exploitation takes A;
    the default constant gives B, seen once in 6, a bonus of 0.5 * sqrt(ln 6) = 0.67 against A's 0.30."""
    tree = Tree()
    a = tree.add(tree.root, candidate(0, timed_ok(1.0)))
    for seq in range(1, 5):
        tree.add(a, candidate(seq, timed_ok(1.0), a.candidate))
    b = tree.add(tree.root, candidate(5, timed_ok(0.8)))
    assert (a.visits, a.mean_cost, b.visits, b.mean_cost) == (5, pytest.approx(1.0), 1, pytest.approx(1.25))
    assert Tree(root=tree.root, exploration=0.0).by_uct(tree.root)[0] is a
    assert Tree(root=tree.root, exploration=EXPLORATION).by_uct(tree.root)[0] is b
    assert uct(mean_cost=5.0, visits=0, parent_visits=6, exploration=0.0) == -math.inf   # unvisited first


def test_backpropagation_updates_every_ancestor_and_virtual_loss_is_lifted():
    tree = Tree()
    a = tree.add(tree.root, candidate(0, FAILING))                       # cost 2.0
    a1 = tree.add(a, candidate(1, timed_ok(2.0), a.candidate))           # cost 0.5
    tree.reserve(a1)                                                     # a refine of a1 in flight
    assert [(n.in_flight, n.seen) for n in (a1, a, tree.root)] == [(1, 2), (1, 3), (1, 3)]
    assert a1.mean_cost == pytest.approx((0.5 + FAIL_COST) / 2)           # the virtual loss counts as a failure
    a1a = tree.settle(a1, candidate(2, timed_ok(4.0), a1.candidate))     # cost 0.25
    assert a1a.parent is a1 and a1.planned == 0
    assert [(n.visits, n.total_cost, n.in_flight) for n in (a1a, a1, a, tree.root)] == [
        (1, 0.25, 0), (2, 0.75, 0), (3, 2.75, 0), (3, 2.75, 0)]


def test_virtual_loss_spreads_one_step_over_the_beam_members():
    """Three members from earlier iterations are the root's children; the root (3 visits) is at its cap,
    so one step of width 3 gives each member one child rather than the best member three."""
    members = [candidate(i, timed_ok(1.0 + i)) for i in range(3)]
    propose = FakePropose(timed_ok(0.5), start=3)
    mcts_search(Beam(width=3, members=list(members), next_seq=3), 3, propose)
    assert propose.steps == [["c0002", "c0001", "c0000"]]                # best (lowest cost) first


# ---- budget, settling, the beam ------------------------------------------------------------------------


@pytest.mark.parametrize("budget, width", [(10, 4), (7, 2), (1, 4), (5, 1)])
def test_the_budget_is_spent_exactly(budget, width):
    propose = FakePropose(FAILING, timed_ok(1.5), FAILING, timed_ok(0.7))
    mcts_search(Beam(width=width), budget, propose)
    assert sum(len(step) for step in propose.steps) == budget
    assert all(1 <= len(step) <= width for step in propose.steps)


def test_replies_without_code_still_spend_the_budget_on_fresh_generations():
    """Nothing to debug: the root is widened past its cap rather than the search stalling."""
    propose = FakePropose(FAILING, source="")
    beam = mcts_search(Beam(width=2), 6, propose)
    assert sum(len(step) for step in propose.steps) == 6
    assert all(parent is None for step in propose.steps for parent in step)
    assert beam.members == [] and beam.best is None


def test_settled_stops_the_search_early():
    propose = FakePropose(FAILING, UNTIMED_PASS)
    beam = mcts_search(Beam(width=4), 10, propose, settled=lambda b: any(m.passed for m in b.members))
    assert propose.steps == [[None], ["c0000"]]                          # the debug child passed: stop
    assert [m.id for m in beam.members] == ["c0001", "c0000"]
    assert mcts_search(beam, 10, propose, settled=lambda b: True) is beam and len(propose.steps) == 2


def test_the_beam_ends_with_the_best_width_of_everything_made():
    speedups = [0.5, 1.1, 3.0, 0.9, 2.2, 1.7, 0.6, 2.9, 1.0, 1.3, 0.8, 4.0]
    members = [candidate(100, timed_ok(2.5)), candidate(101, FAILING)]
    propose = FakePropose(*(timed_ok(s) for s in speedups))
    beam = mcts_search(Beam(width=3, members=list(members)), len(speedups), propose)
    assert len(propose.made) == len(speedups)
    expected = ranked(members + propose.made)[:3]
    assert [m.id for m in beam.members] == [m.id for m in expected] == ["c0011", "c0002", "c0007"]


# ---- through EvolveKernel and `mkevolve run`, with recorded replies --------------------------------------


def saved(folder: Path, subproblem: str, cid: str) -> dict:
    return json.loads((folder / subproblem / f"{cid}.json").read_text())


def test_evolve_kernel_with_mcts_debugs_a_failing_kernel_and_refines_the_best(tmp_path):
    script = FIXTURES / "mcts" / "kernels_gpu.yaml"
    config = RunConfig(model=f"replay:{script}", beam_width=2, search="mcts", llm_parallel=4)
    events = EventLog()
    client = make_client(config, events, retry=NO_RETRY_WAIT)
    prompts = []
    complete = client.complete
    client.complete = lambda request, on_text=None: prompts.append(request) or complete(request, on_text)
    beam = evolve_kernel("relu_shift", PROBLEM, Beam(width=2), 5, FakeVerifier(), client, config,
                         tmp_path / "candidates")

    assert client.provider.remaining == 0     # every reply was taken, each by the request it is pinned to
    assert sorted((r.agent, r.sample) for r in prompts) == [("debug", 1), ("debug", 3), ("generate", 0),
                                                           ("generate", 2), ("refine", 4)]
    assert all("fixture: broken" in r.prompt for r in prompts if r.agent == "debug")
    lineage = [(saved(tmp_path / "candidates", "relu_shift", candidate_id(i))["parent"],
                saved(tmp_path / "candidates", "relu_shift", candidate_id(i))["kind"]) for i in range(5)]
    assert lineage == [(None, "generate"), ("c0000", "debug"), (None, "generate"), ("c0000", "debug"),
                       ("c0003", "refine")]
    assert [m.id for m in beam.members] == ["c0003", "c0001"]
    assert beam.best.id == "c0003" and beam.best.result.speedup == 2.0 and beam.best.accepted is True
    assert events.of_kind("beam")[0]["made"] == 5


@pytest.fixture(scope="module")
def mcts_run(tmp_path_factory) -> tuple[Path, int]:
    problem = FIXTURES / "replay_run" / "sharp_sigmoid.py"
    out = tmp_path_factory.mktemp("mcts")
    code = main(["run", str(problem), "--out", str(out), "--model", f"replay:{FIXTURES / 'mcts' / 'run_cpu.yaml'}",
                 "--search", "mcts", "--beam-width", "2", "--iterations", "1", "--budget", "6",
                 "--decompose-attempts", "1", "--retries", "0", "--workers", "2", "--trials", "3"])
    (run_dir,) = (out / problem.stem).iterdir()
    return run_dir, code


def test_a_whole_run_with_mcts_sends_the_tree_s_prompts_and_writes_best(mcts_run):
    run_dir, code = mcts_run
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    calls = [(e["agent"], e["subproblem"], e["sample"], e["error"]) for e in rows if e["kind"] == "llm_call"]
    assert sorted(calls, key=lambda c: (c[1] or "", c[2])) == [
        ("decompose", None, 0, None),
        ("generate", "scale", 0, None),                 # passes: without a GPU nothing more to gain
        ("generate", "squash_halve", 0, None),          # fails
        ("debug", "squash_halve", 1, None),             # the failing kernel's child (prompt pinned to its code)
        ("generate", "squash_halve", 2, None),          # the root has earned a second child
    ]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["search"] == "mcts"
    folder = run_dir / "iterations" / "iter_01" / "candidates"
    assert [(r["parent"], r["kind"], r["result"]["status"]) for r in
            (saved(folder, "squash_halve", candidate_id(i)) for i in range(3))] == [
        (None, "generate", "incorrect"), ("c0000", "debug", "incorrect"), (None, "generate", "ok")]
    assert code == 0
    manifest = Manifest.read(run_dir / "best")
    assert manifest.status == "ok" and set(manifest.subkernels) == {"scale", "squash_halve"}
    assert manifest.subkernels["squash_halve"].candidate == "c0002"
