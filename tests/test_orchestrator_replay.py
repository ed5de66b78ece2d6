"""Split, Fuse and TotalFuse in whole runs: `mkevolve run --model replay:<yaml>` over recorded replies.

The problem (fixtures/replay_run/sharp_sigmoid.py) is y = sigmoid(20 x) / 2 on x = randn(8, 64). Two runs:

split run (split_total_fuse.yaml; --refine-every 3, 4 iterations, budget 2, no --fuse)
  0  Decompose: scale (x * 20), squash_halve (sigmoid(x) / 2)
  1  both new, one call each; squash_halve's kernel has the exponent's sign wrong: it fails, so its own
     PyTorch code stands in (guarded completion) and the iteration passes end to end, partial
  2  no refinement; squash_halve is failing and takes both calls (two more failures); scale keeps its beam;
     partial again
  3  refinement: Split squash_halve into squash and halve; the squash kernel is exact only for x <= 5, which
     its own randn inputs never exceed, so every subkernel passes alone, but the composite feeds it 20 x
     and fails end to end; the guarded fallback keeps scale's kernel alone, which passes: partial
  4  TotalFuse (not a refinement step: 4 % 3 != 0) into one subproblem, whole, whose kernel passes: the
     first solution entirely in Triton, which replaces the partial best/; with no GPU to time a refined
     kernel, the second call of its budget is not made

fuse run (fuse.yaml; --fuse --refine-every 2, 2 iterations, budget 3)
  0  Decompose: scale, squash, halve
  1  three new subproblems, one call each; all pass; end to end passes
  2  refinement with nothing failing: Fuse squash and halve into squash_halve; scale keeps its beam and
     gets no call; squash_halve gets all three, of which two are made (generate fails, debug fixes it; no
     refine call without a GPU to time it)

Every recorded reply is pinned by agent, subproblem and sample. The test checks state.json, events.jsonl,
the iteration folders, and that best/ verifies again from its own folder. Last, the Split agent alone is
given a reply that replaces the failing subproblem by one renamed subproblem, which it must reject.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from mkevolve.agents.split import split
from mkevolve.cli import main
from mkevolve.codebase import Decomposition
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import make_client
from mkevolve.llm.parse import extract_code
from mkevolve.run_layout import BEST
from mkevolve.run_state import RunState, Step
from mkevolve.solution import Manifest
from mkevolve.workers.pool import WorkerPool
from mkevolve.verify.verifier import Verifier

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "replay_run"
PROBLEM = FIXTURES / "sharp_sigmoid.py"
SPLIT_SCRIPT = FIXTURES / "split_total_fuse.yaml"
FUSE_SCRIPT = FIXTURES / "fuse.yaml"
COMMON = ["--beam-width", "1", "--decompose-attempts", "1", "--retries", "0", "--workers", "2", "--trials", "5"]


class Run(NamedTuple):
    dir: Path
    code: int  # the exit status of `mkevolve run`: 0 when best/ holds a verified solution


def _run(out: Path, script: Path, *flags: str) -> Run:
    code = main(["run", str(PROBLEM), "--out", str(out), "--model", f"replay:{script}", *COMMON, *flags])
    (run_dir,) = (out / PROBLEM.stem).iterdir()
    return Run(run_dir, code)


@pytest.fixture(scope="module")
def split_outcome(tmp_path_factory) -> Run:
    return _run(tmp_path_factory.mktemp("split"), SPLIT_SCRIPT,
                "--iterations", "4", "--refine-every", "3", "--budget", "2")


@pytest.fixture(scope="module")
def fuse_outcome(tmp_path_factory) -> Run:
    return _run(tmp_path_factory.mktemp("fuse"), FUSE_SCRIPT,
                "--fuse", "--iterations", "2", "--refine-every", "2", "--budget", "3")


@pytest.fixture(scope="module")
def split_run(split_outcome) -> Path:
    return split_outcome.dir


@pytest.fixture(scope="module")
def fuse_run(fuse_outcome) -> Path:
    return fuse_outcome.dir


def events(run_dir: Path, kind: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in rows if kind is None or e["kind"] == kind]


def timeline(run_dir: Path) -> list[tuple]:
    """LLM calls as (agent, subproblem, sample), interleaved with each iteration's decomposition event."""
    steps = []
    for event in events(run_dir):
        if event["kind"] == "decomposition":
            steps.append(("decomposition", event["iteration"], event["refinement"]))
        elif event["kind"] == "llm_call":
            steps.append((event["agent"], event["subproblem"], event["sample"]))
    return steps


def history(run_dir: Path) -> list[tuple]:
    return [(r.index, r.refinement, r.subproblems, r.budget, r.e2e_status) for r in RunState.load(run_dir).history]


def iteration(run_dir: Path, index: int) -> Path:
    return run_dir / "iterations" / f"iter_{index:02d}"


def subproblem_files(run_dir: Path, index: int) -> set[str]:
    return {p.stem for p in (iteration(run_dir, index) / "subkernel_problems").glob("*.py")}


def candidates(run_dir: Path, index: int) -> dict[str, list[str]]:
    """Per subproblem, the candidate ids evolved in that iteration (one per LLM call)."""
    folder = iteration(run_dir, index) / "candidates"
    if not folder.is_dir():
        return {}
    return {d.name: sorted(p.stem for p in d.glob("c*.json")) for d in sorted(folder.iterdir())}


def fixture_kernel(name: str) -> str:
    return extract_code((FIXTURES / name).read_text())


def verdict(run_dir: Path, index: int, subproblem: str, cid: str) -> dict:
    return json.loads((iteration(run_dir, index) / "candidates" / subproblem / f"{cid}.json").read_text())


def refinement_agents(run_dir: Path) -> list[tuple]:
    return [(e["agent"], e["outcome"], e["fallback"], sorted(e["subproblems"]))
            for e in events(run_dir, "decomposition_result")]


# -- the split run: Split of a failing subproblem, then TotalFuse -----------------------------------------


def test_split_run_calls_the_agents_in_order_and_uses_every_reply_once(split_run):
    assert timeline(split_run) == [
        ("decompose", None, 0),
        ("decomposition", 0, "initial"),
        ("decomposition", 1, "none"),
        ("generate", "scale", 0),
        ("generate", "squash_halve", 0),
        ("decomposition", 2, "none"),
        ("debug", "squash_halve", 1),          # scale has a kernel: no call for it
        ("debug", "squash_halve", 2),
        ("split", "squash_halve", 0),
        ("decomposition", 3, "split"),
        ("generate", "squash", 0),             # scale, unchanged, gets no call again
        ("generate", "halve", 0),
        ("total_fuse", None, 0),
        ("decomposition", 4, "total_fuse"),
        ("generate", "whole", 0),              # passes: no refine call without a GPU to time it
    ]
    calls = events(split_run, "llm_call")
    assert all(call["error"] is None for call in calls), [c["error"] for c in calls if c["error"]]
    assert len(calls) == len(yaml.safe_load(SPLIT_SCRIPT.read_text())["replies"])


def test_split_run_history(split_run):
    assert history(split_run) == [
        (1, "none", ["scale", "squash_halve"], {"scale": 1, "squash_halve": 1}, "ok"),
        (2, "none", ["scale", "squash_halve"], {"scale": 0, "squash_halve": 2}, "ok"),
        (3, "split", ["scale", "squash", "halve"], {"scale": 0, "squash": 1, "halve": 1}, "ok"),
        (4, "total_fuse", ["whole"], {"whole": 2}, "ok"),
    ]
    state = RunState.load(split_run)
    first, second, third, _ = state.history
    # Without an accepted kernel squash_halve ran its PyTorch code, which says why.
    # Iteration 3's composite failed with all three kernels; the guarded fallback kept scale's (the first half,
    # no speedups on a CPU) and ran squash and halve as PyTorch code.
    assert [r.pytorch for r in state.history] == [["squash_halve"], ["squash_halve"], ["squash", "halve"], []]
    assert "reverted to its PyTorch code" in third.subkernels["squash"].reason
    assert first.subkernels["squash_halve"].origin == second.subkernels["squash_halve"].origin == "pytorch"
    assert "no accepted kernel among 1 candidate(s); the closest, c0000: incorrect" in \
        first.subkernels["squash_halve"].reason
    assert [r.kept for r in state.history] == [True, True, True, True]  # partial ties: the later one is kept
    assert state.step is Step.FINISHED and state.best_iteration == 4 and not state.needs_total_fuse
    # scale's one kernel, from iteration 1, is the one every later iteration uses.
    assert first.subkernels["scale"].candidate == "c0000"
    assert second.subkernels["scale"] == replace(first.subkernels["scale"], candidates=0) == third.subkernels["scale"]
    assert [r.subkernels["scale"].candidates for r in state.history[:3]] == [1, 0, 0]  # one call, in iteration 1
    assert first.subkernels["squash_halve"].status == second.subkernels["squash_halve"].status == "failing"


def test_a_failing_subproblem_takes_the_budget_and_is_split_in_two(split_run):
    assert candidates(split_run, 1) == {"scale": ["c0000"], "squash_halve": ["c0000"]}
    assert candidates(split_run, 2) == {"squash_halve": ["c0001", "c0002"]}
    assert [verdict(split_run, 2, "squash_halve", c)["result"]["status"] for c in ("c0001", "c0002")] == \
        ["incorrect", "incorrect"]
    assert candidates(split_run, 3) == {"halve": ["c0000"], "squash": ["c0000"]}
    assert subproblem_files(split_run, 2) == {"scale", "squash_halve"}
    assert subproblem_files(split_run, 3) == {"scale", "squash", "halve"}
    scale = [(iteration(split_run, i) / "subkernel_problems" / "scale.py").read_text() for i in range(4)]
    assert len(set(scale)) == 1  # the split left scale's source as it was, so its beam carried over
    split_event = next(e for e in events(split_run, "decomposition") if e["iteration"] == 3)
    assert split_event["subproblems"] == ["scale", "squash", "halve"] and split_event["fallback"] is False


def test_local_pass_global_fail_leads_to_total_fuse(split_run):
    third = RunState.load(split_run).history[2]
    assert {n: s.status for n, s in third.subkernels.items()} == {"scale": "ok", "squash": "ok", "halve": "ok"}
    # The composite of the three failed; the guarded fallback's, with scale's kernel alone, passed.
    assert third.e2e_status == "ok" and "output mismatch" in third.subkernels["squash"].reason
    squash = verdict(split_run, 3, "squash", "c0000")
    assert squash["result"]["status"] == "ok" and squash["result"]["trials"] == 5
    assert squash["result"]["max_abs_err"] < 1e-4
    accepted = (iteration(split_run, 3) / "candidates" / "squash" / "c0000.py").read_text()
    assert accepted == fixture_kernel("kernel_squash_saturating.md")
    composite = [e["status"] for e in events(split_run, "verdict") if e.get("composite")]
    assert composite == ["ok", "ok", "incorrect", "ok", "ok"]  # 1 and 2 with squash_halve's PyTorch code
    assert subproblem_files(split_run, 4) == {"whole"}
    assert list(RunState.load(split_run).beams) == ["whole"]  # the beams of deleted subproblems are gone


def test_split_run_refinements_were_applied_not_fallen_back(split_run):
    assert refinement_agents(split_run) == [
        ("decompose", "passed", False, ["scale", "squash_halve"]),
        ("split", "passed", False, ["halve", "scale", "squash"]),
        ("total_fuse", "passed", False, ["whole"]),
    ]
    attempts = events(split_run, "decomposition_attempt")
    assert [(a["agent"], a["passed"]) for a in attempts] == [("decompose", True), ("split", True),
                                                             ("total_fuse", True)]
    assert not any(e["fallback"] for e in events(split_run, "decomposition"))


# -- the fuse run: Fuse when nothing fails at a refinement step -------------------------------------------


def test_fuse_run_calls_the_agents_in_order_and_uses_every_reply_once(fuse_run):
    assert timeline(fuse_run) == [
        ("decompose", None, 0),
        ("decomposition", 0, "initial"),
        ("decomposition", 1, "none"),
        ("generate", "scale", 0),
        ("generate", "squash", 0),
        ("generate", "halve", 0),
        ("fuse", None, 0),
        ("decomposition", 2, "fuse"),
        ("generate", "squash_halve", 0),       # scale keeps its beam: no call
        ("debug", "squash_halve", 1),          # passes: no refine call without a GPU to time it
    ]
    calls = events(fuse_run, "llm_call")
    assert all(call["error"] is None for call in calls), [c["error"] for c in calls if c["error"]]
    assert len(calls) == len(yaml.safe_load(FUSE_SCRIPT.read_text())["replies"])


def test_fuse_run_history_and_beams(fuse_run):
    assert history(fuse_run) == [
        (1, "none", ["scale", "squash", "halve"], {"scale": 1, "squash": 1, "halve": 1}, "ok"),
        (2, "fuse", ["scale", "squash_halve"], {"scale": 0, "squash_halve": 3}, "ok"),
    ]
    state = RunState.load(fuse_run)
    first, second = state.history
    assert first.kept and second.kept and state.best_iteration == 2
    assert second.subkernels["scale"] == replace(first.subkernels["scale"], candidates=0)
    assert second.subkernels["squash_halve"].candidate == "c0001"  # the debugged kernel
    assert candidates(fuse_run, 2) == {"squash_halve": ["c0000", "c0001"]}
    assert [verdict(fuse_run, 2, "squash_halve", c)["result"]["status"] for c in ("c0000", "c0001")] \
        == ["incorrect", "ok"]
    assert [(r.subkernels["scale"].candidates, r.subkernels["squash_halve"].candidates)
            for r in state.history[1:]] == [(0, 2)]
    assert sorted(state.beams) == ["scale", "squash_halve"]
    assert state.beams["scale"].next_seq == 1 and [m.id for m in state.beams["scale"].members] == ["c0000"]
    assert state.beams["squash_halve"].next_seq == 2


def test_fuse_run_fusion_was_applied(fuse_run):
    assert refinement_agents(fuse_run) == [
        ("decompose", "passed", False, ["halve", "scale", "squash"]),
        ("fuse", "passed", False, ["scale", "squash_halve"]),
    ]
    assert subproblem_files(fuse_run, 1) == {"scale", "squash", "halve"}
    assert subproblem_files(fuse_run, 2) == {"scale", "squash_halve"}
    assert (iteration(fuse_run, 1) / "subkernel_problems" / "scale.py").read_text() == \
        (iteration(fuse_run, 2) / "subkernel_problems" / "scale.py").read_text()
    assert not any(e["fallback"] for e in events(fuse_run, "decomposition"))


# -- best/ of both runs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("run, script, best_iteration, kernels", [
    ("split_outcome", SPLIT_SCRIPT, 4, {"whole": "kernel_whole.md"}),
    ("fuse_outcome", FUSE_SCRIPT, 2, {"scale": "kernel_scale.md", "squash_halve": "kernel_squash_halve.md"}),
])
@pytest.mark.slow
def test_best_is_the_kept_iteration_and_verifies_again(request, run, script, best_iteration, kernels):
    run_dir, code = request.getfixturevalue(run)
    assert code == 0, "the run ended without a verified end-to-end solution"
    best = run_dir / BEST
    manifest = Manifest.read(best)
    assert manifest.status == "ok" and manifest.iteration == best_iteration
    assert set(manifest.subkernels) == set(kernels)
    for name, reply in kernels.items():
        assert (best / "subkernel_implementations" / f"{name}.py").read_text() == fixture_kernel(reply)
        assert manifest.subkernels[name].origin == f"replay:{script}"
    assert {p.stem for p in (best / "subkernel_problems").glob("*.py")} == set(kernels)
    with Verifier(RunConfig(workers=1, trials=5)) as verifier:
        result = verifier.check_composite(PROBLEM, best)
    assert result.passed, result.reason
    assert result.launches >= len(kernels)


# -- Split must give exactly two subproblems per failing one ----------------------------------------------


@pytest.fixture(scope="module")
def split_into_one(split_run):
    """The Split agent over iteration 2's decomposition (squash_halve failing), given one recorded reply that
    replaces squash_halve by a single renamed subproblem."""
    before = Decomposition.read(iteration(split_run, 2))
    config = RunConfig(model=f"replay:{FIXTURES / 'split_into_one.yaml'}", retries=0, trials=2, timeout=120.0)
    log = EventLog()
    with WorkerPool(1) as pool:
        after = split(PROBLEM, before, ["squash_halve"], config, make_client(config, log), pool, log)
    return before, after, log


def test_the_split_into_one_reply_is_read_and_checked(split_into_one):
    before, _, log = split_into_one
    assert before.names == ["scale", "squash_halve"]
    assert [(c["agent"], c["error"]) for c in log.of_kind("llm_call")] == [("split", None)]
    (attempt,) = log.of_kind("decomposition_attempt")
    assert attempt["subproblems"] == ["scale", "sigmoid_half"] and attempt["check_s"] is not None


def test_a_split_into_one_subproblem_is_rejected(split_into_one):
    before, after, log = split_into_one
    (attempt,) = log.of_kind("decomposition_attempt")
    assert not attempt["passed"] and attempt["reasons"]
    assert after is before
    assert [(e["agent"], e["outcome"]) for e in log.of_kind("decomposition_result")] == [("split", "unchanged")]
