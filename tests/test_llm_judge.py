"""The optional LLM judge (--judge MODEL), driven by replay files: it reads each kernel the hard checks accepted
and may take that acceptance away, never give it; a malformed reply or a failed call is no verdict; each
kernel is judged once; off by default. Last, a whole replayed run whose judge catches a cheat the checks pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.replay_kernels.fakes import PROBLEM, FakeVerifier, timed_ok

from mkevolve.agents.evolve import KernelAgent, evolve_kernel
from mkevolve.agents.judge import JUDGE_AGENT, JudgeReplyError, make_judge, parse_verdict
from mkevolve.cli import main
from mkevolve.config import ConfigError, RunConfig, build_config
from mkevolve.events import EventLog
from mkevolve.llm.client import RetryPolicy, make_client
from mkevolve.report import build_page
from mkevolve.run_layout import BEST
from mkevolve.run_state import RunState
from mkevolve.search.beam import Beam, PromptKind
from mkevolve.solution import Manifest
from mkevolve.verify.result import JudgeRuling, Status

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "judge"
KERNELS = FIXTURES / "kernels.yaml"        # c0000 honest, c0001 sized for the test input only
JUDGE = FIXTURES / "judge.yaml"            # passes c0000, rejects c0001
NO_RETRY_WAIT = RetryPolicy(attempts=2, base_delay_s=0.0)
# Both kernels pass every hard check; the one sized for the test input would be the faster.
VERDICTS = {"debugged": timed_ok(1.2), "shape_cheat": timed_ok(3.0)}


class Search:
    """One parallel-sampling search of relu_shift (two generations, beam width 2) with an optional judge."""

    def __init__(self, tmp_path: Path, judge_script: Path | None, verifier: FakeVerifier | None = None,
                 kernels: Path = KERNELS, cache: Path | None = None):
        self.config = RunConfig(model=f"replay:{kernels}", judge=f"replay:{judge_script}" if judge_script else "",
                                beam_width=2, search="parallel")
        self.events = EventLog()
        self.client = make_client(self.config, self.events, cache_dir=cache, retry=NO_RETRY_WAIT)
        self.judge = make_judge(self.config, self.events, cache_dir=cache, retry=NO_RETRY_WAIT)
        self.verifier = verifier or FakeVerifier(VERDICTS)
        self.folder = tmp_path / "candidates"

    def run(self, beam: Beam | None = None, budget: int = 2) -> Beam:
        return evolve_kernel("relu_shift", PROBLEM, beam or Beam(width=2), budget, self.verifier, self.client,
                             self.config, self.folder, judge=self.judge)

    def saved(self, cid: str) -> dict:
        return json.loads((self.folder / "relu_shift" / f"{cid}.json").read_text())

    def judged(self) -> list[int]:
        """The candidate numbers the judge was asked about, in order."""
        return [e["sample"] for e in self.events.of_kind("llm_call") if e["agent"] == JUDGE_AGENT]


def _judge_script(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "judge.yaml"
    path.write_text("replies:\n" + "".join(f"  - {entry}\n" for entry in entries))
    return path


# ---- a reject, a pass ------------------------------------------------------------------------------------


def test_a_reject_takes_the_kernel_out_of_best_and_a_pass_keeps_the_other(tmp_path):
    search = Search(tmp_path, JUDGE)
    beam = search.run()

    honest, cheat = beam.members  # ranked again: the faster kernel was rejected, so the honest one leads
    assert (honest.id, cheat.id) == ("c0000", "c0001")
    assert beam.best is honest and honest.accepted is True and honest.result.passed
    assert cheat.accepted is False and cheat.result.status is Status.CHEATING and cheat.score == 0.0
    assert cheat.result.rule == "llm-judge" and cheat.result.reason.startswith("[llm-judge] a reviewer rejects it:")
    assert "hard-codes N = 1536" in cheat.result.reason
    assert cheat.result.speedup == 3.0  # the hard checks' measurements stay on record
    assert cheat.judge.ruling is JudgeRuling.REJECT and honest.judge.ruling is JudgeRuling.PASS
    assert honest.judge.model == f"replay:{JUDGE}"

    record = search.saved("c0001")
    assert record["accepted"] is False and record["result"]["rule"] == "llm-judge"
    assert record["judge"]["ruling"] == "reject" and "hard-codes N = 1536" in record["judge"]["reason"]
    assert search.saved("c0000")["judge"]["ruling"] == "pass"
    events = {e["id"]: e for e in search.events.of_kind("judge")}
    assert (events["c0001"]["verdict"], events["c0001"]["accepted"]) == ("reject", False)
    assert (events["c0000"]["verdict"], events["c0000"]["accepted"]) == ("pass", True)
    assert events["c0001"]["subproblem"] == "relu_shift" and "hard-codes" in events["c0001"]["reason"]
    assert sorted(search.judged()) == [0, 1] and search.judge.client.provider_calls == 2


def test_a_rejected_kernel_is_debugged_with_the_judges_reason(tmp_path):
    """The reject is a verdict like any checker's: the rejected kernel is expanded by a debug request whose
    prompt quotes it."""
    search = Search(tmp_path, JUDGE)
    beam = search.run()
    cheat = beam.members[1]
    agent = KernelAgent("relu_shift", PROBLEM, beam, search.verifier, search.client, search.config, search.folder)
    assert agent.kind_for(cheat) is PromptKind.DEBUG
    prompt = agent.prompt(PromptKind.DEBUG, cheat)
    assert "The kernel breaks a rule of the checker ([llm-judge])" in prompt
    assert "a reviewer rejects it: Line 7 hard-codes N = 1536" in prompt


def test_a_pass_changes_nothing_but_the_record(tmp_path):
    both_pass = _judge_script(tmp_path, f"{{agent: judge, reply_file: {FIXTURES / 'pass.md'}}}",
                              f"{{agent: judge, reply_file: {FIXTURES / 'pass.md'}}}")
    judged = Search(tmp_path / "judged", both_pass).run()
    plain = Search(tmp_path / "plain", None).run()

    assert [m.id for m in judged.members] == [m.id for m in plain.members] == ["c0001", "c0000"]
    assert judged.best.id == plain.best.id == "c0001"
    for with_judge, without in zip(judged.members, plain.members, strict=True):
        assert with_judge.result == without.result and with_judge.accepted is without.accepted is True
        assert with_judge.judge.ruling is JudgeRuling.PASS and without.judge is None


# ---- no verdict: the hard checks decide -------------------------------------------------------------------


@pytest.mark.parametrize("reply, why", [
    ("The kernel looks fine to me.", "its first line is not 'VERDICT: pass' or 'VERDICT: reject'"),
    ("Let me read it first.\\nVERDICT: reject\\nIt hard-codes the size.", "its first line is not"),
    ("VERDICT: reject", "no reason follows the verdict"),
    ("VERDICT: probably reject\\nIt hard-codes the size.", "its first line is not"),
    ("VERDICT: reject\\nIt hard-codes the size.\\nVERDICT: pass", "more than one verdict line"),
    ("", "the reply is empty"),
])
def test_a_malformed_reply_is_no_verdict_and_keeps_the_kernel(tmp_path, reply, why):
    script = _judge_script(tmp_path, f"{{agent: judge, sample: 0, reply: \"{reply}\"}}",
                           f"{{agent: judge, sample: 1, reply: \"{reply}\"}}")
    search = Search(tmp_path, script)
    beam = search.run()
    assert beam.best.id == "c0001" and all(m.accepted is True and m.result.passed for m in beam.members)
    for member in beam.members:
        assert member.judge.ruling is JudgeRuling.NONE
        assert member.judge.summary().startswith("judge: no verdict (malformed reply: ") and why in member.judge.reason
    assert search.saved("c0001")["judge"]["ruling"] == "none"
    assert {e["verdict"] for e in search.events.of_kind("judge")} == {"none"}


@pytest.mark.parametrize("failure", ["bad_request", "timeout"])
def test_a_failed_call_is_no_verdict_and_keeps_the_kernel(tmp_path, failure):
    script = _judge_script(tmp_path, *[f"{{agent: judge, fail: {failure}}}"] * 4)
    search = Search(tmp_path, script)
    beam = search.run()
    assert beam.best.id == "c0001" and all(m.accepted is True for m in beam.members)
    for member in beam.members:
        assert member.judge.ruling is JudgeRuling.NONE and member.judge.reason.startswith("the call failed: ")
    assert "replayed failure" in beam.best.judge.reason


def test_an_unanswered_review_is_no_verdict(tmp_path):
    """A replay file with no reply for a review: the call fails for good, and the kernel stands."""
    search = Search(tmp_path, _judge_script(tmp_path, "{agent: judge, sample: 7, reply: unused}"))
    beam = search.run()
    assert beam.best.id == "c0001" and "has no unused reply for agent=judge" in beam.best.judge.reason


def test_parse_verdict_is_strict_about_the_form_and_lenient_about_case_and_spacing():
    assert parse_verdict("  VERDICT: PASS  \n Reads n from the input.\n\n") == (JudgeRuling.PASS,
                                                                                   "Reads n from the input.")
    ruling, reason = parse_verdict("verdict:reject\nskips\n  the bias")
    assert (ruling, reason) == (JudgeRuling.REJECT, "skips the bias")
    for bad in ("**VERDICT: reject**\nx", "VERDICT: reject because\nx", "VERDICT: pass, mostly\nx"):
        with pytest.raises(JudgeReplyError):
            parse_verdict(bad)


# ---- what the judge never sees ---------------------------------------------------------------------------


def test_kernels_a_hard_check_rejected_never_reach_the_judge(tmp_path):
    """Four generations: a compile error, a cheat the checker catches, one the final cheating check rejects,
    and one that passes everything. Only the last is sent to the judge, and its pass accepts nothing else."""
    kernels = tmp_path / "kernels.yaml"
    replays = FIXTURES.parent / "replay_kernels"
    kernels.write_text("replies:\n" + "".join(
        f"  - {{agent: generate, sample: {seq}, reply_file: {replays / name}}}\n"
        for seq, name in enumerate(("broken.md", "cheating.md", "refined.md", "debugged.md"))))
    script = _judge_script(tmp_path, *[f"{{agent: judge, reply_file: {FIXTURES / 'pass.md'}}}"] * 4)
    verifier = FakeVerifier(final_rejections=("refined",))
    search = Search(tmp_path, script, verifier, kernels=kernels)
    search.config.beam_width = 4
    beam = search.run(Beam(width=4), budget=4)

    assert search.judged() == [3] and search.judge.client.provider_calls == 1
    assert [e["id"] for e in search.events.of_kind("judge")] == ["c0003"]
    by_id = {m.id: m for m in beam.members}
    assert by_id["c0002"].accepted is False and by_id["c0002"].result.rule == "reference-access"
    assert by_id["c0001"].result.status is Status.CHEATING and by_id["c0001"].accepted is None
    assert all(by_id[cid].judge is None for cid in ("c0000", "c0001", "c0002"))
    assert beam.best.id == "c0003" and beam.best.judge.ruling is JudgeRuling.PASS


# ---- once per kernel --------------------------------------------------------------------------------------


def test_a_kernel_is_judged_once_across_searches_and_a_resume(tmp_path):
    """The first search judges c0000; the second (the beam restored from its JSON, as a resumed run reads
    state.json) makes and judges c0001 only. The judge file has one reply per kernel: a second review of c0000
    would find none and record no verdict."""
    search = Search(tmp_path, JUDGE)
    first = search.run(budget=1)
    assert search.judged() == [0] and first.best.judge.ruling is JudgeRuling.PASS

    restored = Beam.from_dict(json.loads(json.dumps(first.to_dict())))
    assert restored.members[0].judge == first.members[0].judge
    second = search.run(restored, budget=1)
    assert search.judged() == [0, 1]
    by_id = {m.id: m for m in second.members}
    assert by_id["c0000"].judge.ruling is JudgeRuling.PASS and by_id["c0001"].judge.ruling is JudgeRuling.REJECT
    assert second.best.id == "c0000"


def test_a_search_resumed_in_the_same_folder_asks_the_judge_nothing(tmp_path):
    """A run resumed mid-iteration repeats the search from its saved candidates and cached replies: the rejected
    kernel keeps its saved rejection (it no longer passes, so it is not judged), and the review of the one
    that passed comes from the response cache."""
    Search(tmp_path, JUDGE, cache=tmp_path / "llm_cache").run()
    resumed = Search(tmp_path, JUDGE, cache=tmp_path / "llm_cache")
    beam = resumed.run()
    assert resumed.judge.client.provider_calls == 0 and resumed.judged() == [0]
    assert [e["cached"] for e in resumed.events.of_kind("llm_call") if e["agent"] == JUDGE_AGENT] == [True]
    honest, cheat = beam.members
    assert honest.judge.ruling is JudgeRuling.PASS and beam.best is honest
    assert cheat.result.rule == "llm-judge" and cheat.accepted is None and cheat.judge is None


# ---- off by default -----------------------------------------------------------------------------------


def test_the_judge_is_off_by_default_and_costs_nothing(tmp_path):
    assert RunConfig().judge == "" and make_judge(RunConfig()) is None
    search = Search(tmp_path, None)
    beam = search.run()
    assert search.judge is None and search.events.of_kind("judge") == [] and search.judged() == []
    assert beam.best.id == "c0001" and all(m.judge is None for m in beam.members)
    assert search.saved("c0001")["judge"] is None


def test_the_flag_names_a_model_and_the_builtin_agent_cannot_judge(tmp_path, capsys):
    assert main(["run", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--judge MODEL" in help_text and "may reject a semantic cheat (default: off)" in help_text
    path = tmp_path / "run.yaml"
    path.write_text(f"judge: replay:{JUDGE}\n")
    assert build_config(path).judge == f"replay:{JUDGE}"
    with pytest.raises(ConfigError, match="'judge' cannot be the builtin agent"):
        build_config(overrides={"judge": "builtin"})


def test_a_run_with_a_judge_whose_replay_file_is_missing_makes_nothing(tmp_path, capsys):
    problem = FIXTURES.parent / "replay_run" / "sharp_sigmoid.py"
    code = main(["run", str(problem), "--out", str(tmp_path), "--model", f"replay:{FIXTURES / 'run_kernels.yaml'}",
                 "--judge", f"replay:{tmp_path / 'missing.yaml'}"])
    assert code == 2 and "missing.yaml does not exist" in capsys.readouterr().err
    assert not (tmp_path / "sharp_sigmoid").exists()


# ---- a whole run ------------------------------------------------------------------------------------------


RUN_FLAGS = ["--iterations", "1", "--budget", "3", "--beam-width", "1", "--decompose-attempts", "1",
             "--retries", "0", "--workers", "2", "--trials", "5"]


@pytest.mark.slow
def test_a_replayed_run_whose_judge_rejects_a_cheat_the_checks_passed(tmp_path):
    """sharp_sigmoid, one iteration: the squash kernel skips the sigmoid above x = 5, which its own random inputs
    never reach, so it passes its checks; the judge rejects it, squash keeps its PyTorch code, and the run ends
    with a correct partial best/ (without the judge its composite fails end to end: the run's exit is 1)."""
    problem = FIXTURES.parent / "replay_run" / "sharp_sigmoid.py"
    code = main(["run", str(problem), "--out", str(tmp_path), "--model", f"replay:{FIXTURES / 'run_kernels.yaml'}",
                 "--judge", f"replay:{FIXTURES / 'run_judge.yaml'}", *RUN_FLAGS])
    (run_dir,) = (tmp_path / "sharp_sigmoid").iterdir()
    assert code == 0
    manifest = Manifest.read(run_dir / BEST)
    assert manifest.coverage.pytorch == ["squash"] and manifest.status == "ok"

    state = RunState.load(run_dir)
    (squash,) = state.beams["squash"].members
    assert squash.accepted is False and squash.result.rule == "llm-judge"
    assert squash.judge.ruling is JudgeRuling.REJECT and "Line 14 returns 1.0" in squash.judge.reason
    assert state.beams["scale"].best.judge.ruling is JudgeRuling.PASS

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    verdicts = {e["subproblem"]: e["verdict"] for e in events if e["kind"] == "judge"}
    assert verdicts == {"scale": "pass", "squash": "reject", "halve": "pass"}
    totals = [e for e in events if e["kind"] == "llm_tokens" and "run_judge.yaml" in e["model"]]
    assert len(totals) == 1 and totals[0]["calls"] == 3 and set(totals[0]["by_agent"]) == {"judge"}

    page = build_page(run_dir)
    outcomes = {o.name: o for o in page.outcomes}
    assert "judge: pass (One multiply by 20 per element" in outcomes["scale"].why
    assert "[llm-judge] a reviewer rejects it: Line 14 returns 1.0" in outcomes["squash"].why
    assert any(row.agent == "judge" and row.calls == 3 for row in _token_rows(run_dir))


def _token_rows(run_dir: Path):
    from mkevolve.report import read_events, token_rows

    return token_rows(read_events(run_dir))
