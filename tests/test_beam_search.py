"""Beam search and the EvolveKernel agent, driven by recorded replies (replay provider)."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.replay_kernels.fakes import GPU_VERDICTS, PROBLEM, ClockedVerifier, FakeVerifier, timed_ok

from mkevolve.agents.evolve import COVERED_PRIORITY, KernelTask, RefineContext, StepProgress, evolve_kernel
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import RetryPolicy, make_client
from mkevolve.llm.parse import ReplyFormatError, extract_code
from mkevolve.llm.types import TokenUsage
from mkevolve.search.beam import Beam, Candidate, PromptKind, beam_search, candidate_id, plan_step
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, EvalResult, Status

FIXTURES = PROBLEM.parent
SCRIPT = FIXTURES / "beam_script.yaml"
NO_RETRY_WAIT = RetryPolicy(attempts=2, base_delay_s=0.0)


def run_script(tmp_path: Path, script: Path, verifier, *, width=1, budget=4, search="beam", cache=None,
               beam: Beam | None = None, context: RefineContext | None = None):
    config = RunConfig(model=f"replay:{script}", beam_width=width, search=search, llm_parallel=4)
    events = EventLog()
    client = make_client(config, events, cache_dir=cache, retry=NO_RETRY_WAIT)
    result = evolve_kernel("relu_shift", PROBLEM, beam or Beam(width=width), budget, verifier, client, config,
                           tmp_path / "candidates", context)
    return result, client, events


def saved(tmp_path: Path, cid: str) -> dict:
    return json.loads((tmp_path / "candidates" / "relu_shift" / f"{cid}.json").read_text())


def test_scripted_sequence_ends_with_refined_kernel_and_full_lineage(tmp_path):
    verifier = FakeVerifier()
    beam, client, events = run_script(tmp_path, SCRIPT, verifier)

    assert verifier.checked == ["broken", "debugged", "cheating", "refined"]
    assert [m.id for m in beam.members] == ["c0003"]
    assert beam.best.id == "c0003" and beam.best.result.speedup == 2.0 and beam.best.accepted is True
    lineage = {cid: saved(tmp_path, cid) for cid in ("c0000", "c0001", "c0002", "c0003")}
    assert [(r["parent"], r["kind"], r["result"]["status"]) for r in lineage.values()] == [
        (None, "generate", "compile_error"), ("c0000", "debug", "ok"),
        ("c0001", "refine", "cheating"), ("c0001", "refine", "ok")]
    assert lineage["c0003"]["result"]["runtime"]["median_ms"] == pytest.approx(0.01)
    assert lineage["c0002"]["result"]["rule"] == "torch-compute"
    source = (tmp_path / "candidates" / "relu_shift" / "c0003.py").read_text()
    assert lineage["c0003"]["source"] == "c0003.py" and "# fixture: refined" in source
    assert beam.next_seq == 4 and client.provider.remaining == 0
    assert [e["id"] for e in events.of_kind("candidate")] == ["c0000", "c0001", "c0002", "c0003"]
    assert events.of_kind("beam")[0]["best"] == "c0003"


def test_prompts_carry_the_verdict_and_the_measurements(tmp_path):
    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1)
    client = make_client(config, retry=NO_RETRY_WAIT)
    prompts = []
    complete = client.complete
    client.complete = lambda request, on_text=None: prompts.append(request) or complete(request, on_text)
    evolve_kernel("relu_shift", PROBLEM, Beam(width=1), 4, FakeVerifier(), client, config,
                  tmp_path / "candidates", RefineContext(share=0.4, end_to_end_ms=0.5))

    generate, debug, refine, _ = (r.prompt for r in prompts)
    assert "forward(float32[32, 48])" in generate and "Target: NVIDIA H200" in generate
    assert "fixture: broken" in debug and "syntax error at line 20" in debug and "line 20" in debug
    assert "fixture: debugged" in refine and "speedup over torch.compile: 1.20x" in refine
    assert "0.0200 ms median" in refine and "40.0% of the whole model's time" in refine
    assert [r.agent for r in prompts] == ["generate", "debug", "refine", "refine"]
    assert [r.sample for r in prompts] == [0, 1, 2, 3]


def test_token_accounting_adds_up_per_agent_subproblem_and_candidate(tmp_path):
    beam, client, events = run_script(tmp_path, SCRIPT, FakeVerifier())
    report = client.tokens()
    assert report.total == TokenUsage(prompt=5900, completion=1130, reasoning=130)
    assert report.by_agent == {"generate": TokenUsage(1200, 300, 50), "debug": TokenUsage(1500, 320, 0),
                               "refine": TokenUsage(3200, 510, 80)}
    assert report.by_subproblem == {"relu_shift": report.total}
    assert report.calls == 4 and report.cached_calls == 0
    per_candidate = [saved(tmp_path, candidate_id(i))["tokens"] for i in range(4)]
    assert sum(t["prompt"] + t["completion"] for t in per_candidate) == report.total.total
    assert sum(e["prompt_tokens"] for e in events.of_kind("llm_call")) == 5900


def test_second_identical_run_is_served_by_the_cache(tmp_path):
    cache = tmp_path / "llm_cache"
    first, first_client, _ = run_script(tmp_path / "a", SCRIPT, FakeVerifier(), cache=cache)
    second, second_client, events = run_script(tmp_path / "b", SCRIPT, FakeVerifier(), cache=cache)

    assert first_client.provider_calls == 4
    assert second_client.provider_calls == 0
    report = second_client.tokens()
    assert report.calls == 0 and report.cached_calls == 4 and report.total == TokenUsage()
    assert all(e["cached"] for e in events.of_kind("llm_call"))
    assert [c.to_dict() | {"cached": None} for c in second.members] == \
        [c.to_dict() | {"cached": None} for c in first.members]
    assert second.members[0].cached is True


def test_a_resumed_run_in_the_same_folder_keeps_saved_verdicts_of_the_same_problem(tmp_path):
    cache = tmp_path / "llm_cache"
    run_script(tmp_path, SCRIPT, FakeVerifier(), cache=cache)
    verifier = FakeVerifier()
    resumed, client, _ = run_script(tmp_path, SCRIPT, verifier, cache=cache)
    assert verifier.checked == [] and client.provider_calls == 0
    assert resumed.best.id == "c0003" and resumed.best.result.speedup == 2.0

    edited = tmp_path / "relu_shift.py"
    edited.write_text(PROBLEM.read_text() + "# edited\n")
    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1)
    verifier = FakeVerifier()
    evolve_kernel("relu_shift", edited, Beam(width=1), 4, verifier, make_client(config, retry=NO_RETRY_WAIT),
                  config, tmp_path / "candidates")
    assert verifier.checked == ["broken", "debugged", "cheating", "refined"]


def test_a_resumed_run_checks_again_a_kernel_its_check_never_ran(tmp_path):
    """A check the time budget left unstarted is no verdict on the kernel: a resumed run checks it, and only it."""
    cache = tmp_path / "llm_cache"
    unrun = EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: the run's time budget was spent")
    first, _, _ = run_script(tmp_path, SCRIPT, FakeVerifier({**GPU_VERDICTS, "refined": unrun}), cache=cache)
    assert first.best.id == "c0001"
    verifier = FakeVerifier()
    resumed, client, _ = run_script(tmp_path, SCRIPT, verifier, cache=cache)
    assert verifier.checked == ["refined"] and client.provider_calls == 0
    assert resumed.best.id == "c0003" and resumed.best.result.speedup == 2.0


def test_on_cpu_the_search_stops_at_the_first_passing_kernel(tmp_path):
    """Without timings a refined kernel could only tie with its parent (and the older wins): no refine call."""
    cpu_verdicts = {**GPU_VERDICTS, "debugged": EvalResult(status=Status.OK),
                    "refined": EvalResult(status=Status.OK)}
    verifier = FakeVerifier(cpu_verdicts, device_name="cpu")
    beam, client, events = run_script(tmp_path, SCRIPT, verifier)
    assert verifier.checked == ["broken", "debugged"] and client.provider_calls == 2
    assert [m.id for m in beam.members] == ["c0001"] and beam.best.id == "c0001"
    (event,) = events.of_kind("beam")
    assert (event["calls"], event["made"]) == (4, 2) and "no GPU to time kernels" in event["settled"]
    again, client, _ = run_script(tmp_path / "again", SCRIPT, verifier, beam=beam)
    assert client.provider_calls == 0 and again.next_seq == 2  # a passing beam on CPU costs no call at all


def test_ties_on_cpu_keep_the_older_kernel():
    older, younger = (Candidate(id=candidate_id(i), subproblem="s", parent=None, kind=PromptKind.GENERATE,
                                source="# code", result=EvalResult(status=Status.OK)) for i in (3, 7))
    beam = Beam(width=1)
    beam.select([younger, older])
    assert [m.id for m in beam.members] == ["c0003"]


def test_the_progress_hook_hears_of_every_batch(tmp_path):
    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1)
    heard = []
    evolve_kernel("relu_shift", PROBLEM, Beam(width=1), 4, FakeVerifier(), make_client(config, retry=NO_RETRY_WAIT),
                  config, tmp_path / "candidates", progress=heard.append)
    assert [(p.done, p.pending, p.passing) for p in heard] == [(0, 4, False), (1, 3, False), (2, 2, True),
                                                              (3, 1, True), (4, 0, True)]
    assert {p.subproblem for p in heard} == {"relu_shift"}


def test_ranking_orders_by_speedup_then_correctness_then_age():
    def candidate(seq: int, result: EvalResult) -> Candidate:
        return Candidate(id=candidate_id(seq), subproblem="s", parent=None, kind=PromptKind.GENERATE,
                         source="# code", result=result)

    failing = candidate(0, EvalResult(status=Status.INCORRECT, max_abs_err=1.0))
    old_cpu_pass = candidate(1, EvalResult(status=Status.OK))
    new_cpu_pass = candidate(2, EvalResult(status=Status.OK))
    slow, fast = candidate(3, timed_ok(0.5)), candidate(4, timed_ok(3.0))
    beam = Beam(width=3)
    beam.select([failing, new_cpu_pass, old_cpu_pass])
    assert [c.id for c in beam.members] == ["c0001", "c0002", "c0000"]
    beam.select([slow, fast])
    assert [c.id for c in beam.members] == ["c0004", "c0003", "c0001"]
    assert failing.score == 0.0 and slow.score == 0.5


def test_plan_step_expands_every_member_within_the_budget():
    members = [Candidate(id=candidate_id(i), subproblem="s", parent=None, kind=PromptKind.GENERATE,
                         source="# code", result=timed_ok(1.0 + i)) for i in range(3)]
    assert plan_step(Beam(width=4), expansion=1, remaining=2) == [None, None]
    assert plan_step(Beam(width=4), expansion=1, remaining=9) == [None] * 4
    full = Beam(width=3, members=members)
    assert [p.id for p in plan_step(full, expansion=2, remaining=5)] == ["c0002", "c0002", "c0001", "c0001",
                                                                          "c0000"]
    short = Beam(width=3, members=members[:1])
    assert [p and p.id for p in plan_step(short, expansion=1, remaining=9)] == ["c0000", None, None]


def test_beam_search_spends_exactly_the_budget_in_steps():
    calls: list[list] = []

    def propose(parents):
        calls.append(parents)
        return [Candidate(id=candidate_id(len(calls) * 10 + i), subproblem="s", parent=None,
                          kind=PromptKind.GENERATE, source="# code", result=timed_ok(1.0))
                for i in range(len(parents))]

    beam_search(Beam(width=4), budget=10, expansion=1, propose=propose)
    assert [len(step) for step in calls] == [4, 4, 2]
    assert calls[0] == [None] * 4 and all(p is not None for p in calls[1])


def test_beam_search_stops_once_settled():
    calls: list[list] = []

    def propose(parents):
        calls.append(parents)
        return [Candidate(id=candidate_id(len(calls) * 10 + i), subproblem="s", parent=None,
                          kind=PromptKind.GENERATE, source="# code", result=EvalResult(status=Status.OK))
                for i in range(len(parents))]

    beam = beam_search(Beam(width=2), budget=10, expansion=1, propose=propose,
                       settled=lambda b: any(m.passed for m in b.members))
    assert [len(step) for step in calls] == [2] and len(beam.members) == 2


def test_replies_without_code_become_failed_candidates_with_the_reason(tmp_path):
    beam, client, _ = run_script(tmp_path, FIXTURES / "bad_replies.yaml", FakeVerifier(), width=2, budget=2)
    no_code, timed_out = saved(tmp_path, "c0000"), saved(tmp_path, "c0001")
    assert no_code["result"]["status"] == "compile_error" and no_code["source"] is None
    assert "no fenced code block" in no_code["result"]["reason"]
    assert "fuse the ReLU" in no_code["reply_excerpt"]
    assert "timed out (gave up after 2 attempts)" in timed_out["result"]["reason"]
    assert beam.members == [] and beam.best is None
    assert beam.codeless == timed_out["result"]["reason"]  # kept in the beam, for the subproblem's outcome
    assert Beam.from_dict(json.loads(json.dumps(beam.to_dict()))).codeless == beam.codeless
    assert client.provider_calls == 3  # the timed-out call was tried twice
    assert not (tmp_path / "candidates" / "relu_shift" / "c0000.py").exists()


def test_a_kernel_that_fails_the_final_cheating_check_is_not_accepted(tmp_path):
    verifier = FakeVerifier(final_rejections=("refined",))
    beam, _, _ = run_script(tmp_path, SCRIPT, verifier)
    assert verifier.static_checked == ["refined"]
    assert beam.members[0].id == "c0003" and beam.members[0].accepted is False
    assert beam.members[0].result.status is Status.CHEATING and beam.best is None
    record = saved(tmp_path, "c0003")
    assert record["accepted"] is False and record["result"]["rule"] == "reference-access"


def test_beam_round_trips_through_json_and_a_resumed_search_continues_its_ids(tmp_path):
    first, _, _ = run_script(tmp_path, SCRIPT, FakeVerifier(), budget=2)
    assert [m.id for m in first.members] == ["c0001"]
    restored = Beam.from_dict(json.loads(json.dumps(first.to_dict())))
    assert restored.to_dict() == first.to_dict()
    assert restored.input_shapes == ["forward(float32[32, 48]), constructed with ()"]

    verifier = FakeVerifier()
    resumed, client, _ = run_script(tmp_path, SCRIPT, verifier, budget=2, beam=restored)
    assert [m.id for m in resumed.members] == ["c0003"] and resumed.members[0].parent == "c0001"
    assert verifier.checked == ["cheating", "refined"]
    assert restored.next_seq == 2 and [m.id for m in restored.members] == ["c0001"]  # the input is untouched


def test_parallel_sampling_spends_the_budget_on_independent_generations(tmp_path):
    script = tmp_path / "samples.yaml"
    script.write_text("replies:\n" + "".join(
        f"  - {{agent: generate, sample: {i}, reply_file: {FIXTURES / name}}}\n"
        for i, name in enumerate(["broken.md", "refined.md", "debugged.md"])))
    verifier = FakeVerifier()
    beam, client, _ = run_script(tmp_path, script, verifier, width=2, budget=3, search="parallel")
    assert verifier.batches == [1, 1, 1]  # each reply is checked on its own, as soon as it is in
    assert [(m.id, m.kind) for m in beam.members] == [("c0001", "generate"), ("c0002", "generate")]
    assert beam.best.id == "c0001" and all(m.parent is None for m in beam.members)


@dataclass
class _Generated:
    source: str
    precision: str
    variant: int
    description: str


def _fake_generator(monkeypatch, count: int, unsupported: str | None = None):
    module = types.ModuleType("mkevolve.builtin.kernels")

    class UnsupportedSubproblem(Exception):
        pass

    class UnsupportedOps(UnsupportedSubproblem):
        pass

    def variant_count(problem_path, target, mode=None):
        if unsupported:
            raise UnsupportedSubproblem(unsupported)
        return count

    def generate_kernel(problem_path, variant=0, target="cuda", mode=None):
        return _Generated(f"# fixture: v{variant}\n# target {target}\n# mode {mode}\n", "ieee", variant,
                          "Template kernel")

    module.UnsupportedSubproblem, module.UnsupportedOps = UnsupportedSubproblem, UnsupportedOps
    module.variant_count, module.generate_kernel = variant_count, generate_kernel
    monkeypatch.setitem(sys.modules, "mkevolve.builtin.kernels", module)


def test_builtin_task_replies_with_a_variant_then_says_when_none_is_left(monkeypatch):
    _fake_generator(monkeypatch, count=2)
    task = KernelTask(kind=PromptKind.REFINE, problem_path=PROBLEM, variant=1, target="cpu")
    assert extract_code(task.builtin_reply()) == "# fixture: v1\n# target cpu\n# mode train\n"
    in_eval = KernelTask(PromptKind.REFINE, PROBLEM, variant=1, target="cpu", eval_mode=True).builtin_reply()
    assert "# mode eval" in extract_code(in_eval)
    exhausted = KernelTask(PromptKind.REFINE, PROBLEM, variant=2, target="cpu").builtin_reply()
    assert "all 2 have been tried" in exhausted
    with pytest.raises(ReplyFormatError):
        extract_code(exhausted)


def test_builtin_task_explains_an_unsupported_subproblem_in_prose(monkeypatch):
    _fake_generator(monkeypatch, count=0, unsupported="scatter with data-dependent indices")
    reply = KernelTask(PromptKind.GENERATE, PROBLEM, variant=0, target="cuda").builtin_reply()
    assert "scatter with data-dependent indices" in reply
    with pytest.raises(ReplyFormatError):
        extract_code(reply)


def test_builtin_model_gives_each_request_the_next_variant_and_stops_at_the_last(tmp_path):
    """The real generator, answered in a worker: relu_shift has three CPU variants, so of a budget of four
    only three calls are made, and a later search on the same beam makes none."""
    wrong = EvalResult(status=Status.INCORRECT, max_abs_err=1.0, max_rel_err=1.0)
    verdicts = {"cpu-single-block-rows": wrong, "cpu-looped-rows": wrong,
                "cpu-split-rows": EvalResult(status=Status.OK)}
    config = RunConfig(model="builtin", beam_width=2)
    events = EventLog()
    client = make_client(config, events, cache_dir=tmp_path / "cache")
    verifier = FakeVerifier(verdicts, device_name="cpu")
    beam = evolve_kernel("relu_shift", PROBLEM, Beam(width=2), 4, verifier, client, config,
                         tmp_path / "candidates")
    # The two generations of the first step are checked side by side, in either order.
    assert sorted(verifier.checked) == ["cpu-looped-rows", "cpu-single-block-rows", "cpu-split-rows"]
    assert [m.id for m in beam.members] == ["c0002", "c0000"]  # the passing one first, then the older
    assert saved(tmp_path, "c0002")["kind"] == "debug" and beam.next_seq == 3
    assert not (tmp_path / "candidates" / "relu_shift" / "c0003.json").exists()
    assert beam.exhausted_for("builtin") == ("the builtin generator has no further kernel for this subproblem: "
                                             "all 3 of its variants have been tried")
    assert beam.exhausted_for("anthropic/claude-opus-4-5") is None  # another model may still be asked
    again = evolve_kernel("relu_shift", PROBLEM, beam, 4, verifier, client, config, tmp_path / "candidates")
    assert client.provider_calls == 3 and again.next_seq == 3 and again.exhausted == beam.exhausted
    assert [(e["calls"], e["budget"]) for e in events.of_kind("beam")] == [(3, 4), (0, 4)]
    assert client.cache is None and not (tmp_path / "cache").exists()


def test_builtin_model_declines_a_subproblem_it_cannot_write_without_a_call(tmp_path):
    """The real generator on nn.Fold: it says what it has no kernel for, and no request is made."""
    config = RunConfig(model="builtin", beam_width=4)
    events = EventLog()
    client = make_client(config, events)
    verifier = FakeVerifier(device_name="cpu")
    fold = Path(__file__).resolve().parent / "subproblems" / "fold.py"
    beam = evolve_kernel("fold", fold, Beam(width=4), 8, verifier, client, config, tmp_path / "candidates")
    assert beam.exhausted_for("builtin") == "the builtin generator has no kernel for: nn.Fold"
    assert client.provider_calls == 0 and beam.next_seq == 0 and beam.members == []
    assert verifier.checked == [] and not (tmp_path / "candidates").exists()
    assert events.of_kind("llm_call") == [] and events.of_kind("beam")[0]["exhausted"] == beam.exhausted.reason
    restored = Beam.from_dict(json.loads(json.dumps(beam.to_dict())))
    assert restored.exhausted == beam.exhausted


def test_a_reply_without_code_is_quoted_in_the_verdict(tmp_path):
    script = tmp_path / "refusal.yaml"
    script.write_text("replies:\n  - {agent: generate, reply: \"I cannot write a kernel for a cumsum.\"}\n")
    beam, _, _ = run_script(tmp_path, script, FakeVerifier(), budget=1)
    reason = saved(tmp_path, "c0000")["result"]["reason"]
    assert reason.startswith("no code: the reply has no fenced code block")
    assert reason.endswith("the reply says: I cannot write a kernel for a cumsum.") and beam.best is None


@pytest.mark.slow
def test_scripted_sequence_through_the_real_verifier(tmp_path):
    """End to end on CPU: real workers, the Triton interpreter, the real cheating rules."""
    from mkevolve.verify.verifier import Verifier

    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1, workers=2, timeout=120)
    client = make_client(config, retry=NO_RETRY_WAIT)
    with Verifier(config) as verifier:
        beam = evolve_kernel("relu_shift", PROBLEM, Beam(width=1), 4, verifier, client, config,
                             tmp_path / "candidates")
        device = verifier.device_name
    statuses = [saved(tmp_path, candidate_id(i))["result"]["status"] for i in range(beam.next_seq)]
    assert beam.best.accepted is True
    if device == "cpu":  # no speed on CPU: a refined kernel could only tie, so the search stops at the first pass
        assert statuses == ["compile_error", "ok"]
        assert [m.id for m in beam.members] == ["c0001"] and beam.best.result.speedup is None
    else:
        assert statuses == ["compile_error", "ok", "cheating", "ok"]
        assert saved(tmp_path, "c0002")["result"]["rule"] == "torch-compute"
        speedups = {cid: saved(tmp_path, cid)["result"]["speedup"] for cid in ("c0001", "c0003")}
        assert beam.best.id == max(speedups, key=lambda cid: (speedups[cid], cid == "c0001"))


def _failed(seq: int, kind: PromptKind, source: str = "def f(): pass") -> Candidate:
    return Candidate(candidate_id(seq), "sub", None, kind, source, EvalResult(status=Status.COMPILE_ERROR))


def test_a_failing_beam_is_split_only_after_a_debug_round():
    beam = Beam(width=4)
    beam.select([_failed(0, PromptKind.GENERATE), _failed(1, PromptKind.GENERATE)])
    assert not beam.split_allowed(agent_exhausted=False)       # fixable-looking failures: debug first
    assert beam.split_allowed(agent_exhausted=True)            # the agent has nothing more to offer
    beam.select([_failed(2, PromptKind.DEBUG)])
    assert beam.debug_rounds == 1 and beam.split_allowed(agent_exhausted=False)
    assert Beam.from_dict(beam.to_dict()).debug_rounds == 1    # survives a resume
    codeless = Beam(width=4)
    codeless.select([_failed(0, PromptKind.GENERATE, source="")])
    assert codeless.split_allowed(agent_exhausted=False)       # nothing to debug


def test_a_reply_is_checked_while_the_next_one_is_still_being_written(tmp_path):
    """One call at a time, the second reply slow: the first kernel's check must not wait for it."""
    script = tmp_path / "slow.yaml"
    script.write_text("replies:\n"
                      f"  - {{agent: generate, sample: 0, reply_file: {FIXTURES / 'broken.md'}}}\n"
                      f"  - {{agent: generate, sample: 1, delay_s: 0.6, reply_file: {FIXTURES / 'refined.md'}}}\n")
    config = RunConfig(model=f"replay:{script}", beam_width=2, search="parallel", llm_parallel=1)
    client = make_client(config, retry=NO_RETRY_WAIT)
    verifier = ClockedVerifier()
    evolve_kernel("relu_shift", PROBLEM, Beam(width=2), 2, verifier, client, config, tmp_path / "candidates")
    assert verifier.began["broken"] < 0.4 <= 0.6 <= verifier.began["refined"]


def test_a_steps_checks_go_to_the_workers_ahead_of_steps_further_from_their_end(tmp_path):
    """Each check carries how many of its step's candidates still lack a verdict (the worker pool serves the
    smallest first): all 3 for the step's first check, fewer as its candidates get their verdicts."""
    script = tmp_path / "three.yaml"
    script.write_text("replies:\n" + "".join(f"  - {{agent: generate, sample: {i}, reply_file: {FIXTURES / name}}}\n"
                                             for i, name in enumerate(["refined.md", "debugged.md", "broken.md"])))
    verifier = FakeVerifier()
    run_script(tmp_path, script, verifier, width=3, budget=3, search="parallel")
    assert sorted(verifier.checked) == ["broken", "debugged", "refined"]
    unfinished = [p % COVERED_PRIORITY for p in verifier.priorities]
    assert unfinished[0] == 3 and unfinished == sorted(unfinished, reverse=True) and min(unfinished) >= 1


def test_checks_of_a_subproblem_with_a_passing_kernel_wait_behind_those_without(tmp_path):
    """Once the subproblem has a passing kernel, its further checks carry COVERED_PRIORITY: under a time budget
    every subproblem's first kernels are checked first."""
    script = tmp_path / "three.yaml"
    script.write_text("replies:\n" + "".join(f"  - {{agent: generate, sample: {i}, reply_file: {FIXTURES / name}}}\n"
                                             for i, name in enumerate(["broken.md", "refined.md", "debugged.md"])))
    fresh = FakeVerifier()
    run_script(tmp_path, script, fresh, width=3, budget=3, search="parallel")
    assert min(fresh.priorities) < COVERED_PRIORITY          # no kernel passed before the first check
    passing = Candidate(id="c0099", subproblem="relu_shift", parent=None, kind=PromptKind.GENERATE,
                        source="# fixture: refined\n", result=timed_ok(1.0))
    (tmp_path / "again").mkdir()
    covered = FakeVerifier()
    run_script(tmp_path / "again", script, covered, width=3, budget=3, search="parallel",
               beam=Beam(width=3, members=[passing]))
    assert covered.priorities and all(p >= COVERED_PRIORITY for p in covered.priorities)


def test_a_step_is_covered_once_one_of_its_children_passes():
    step = StepProgress(3)
    assert step.rank() == 3
    with step.one_child():
        step.covered = True           # what a passing child's verdict sets
    assert step.rank() == 2 + COVERED_PRIORITY
