"""The typed events that report.html and scripts/eval_profile.py read back: written and read through one record
per kind, old logs still read, a wrong-typed field a named error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_loader import load_script
from test_report import copy_run, edit_state, run_dir, section  # noqa: F401  (run_dir: a fixture, used by name)

from mkevolve.cli import main
from mkevolve.event_records import (CandidateEvent, EventFieldError, EventRecord, FinalCheckEvent, LLMCallEvent,
                                    LLMTokensEvent, PortEvent, PortMatch, PortReuse, SwapEvent, SwapSkippedEvent,
                                    TokenCount, VerdictEvent, parse_events)
from mkevolve.events import EventLog, read_event_lines
from mkevolve.llm.tokens import TokenReport
from mkevolve.llm.types import TokenUsage
from mkevolve.report import write_report

RECORDS = [
    LLMCallEvent(model="m", agent="generate", subproblem="linear", sample=2, cached=False, attempts=3,
                 error="timed out", wall_s=1.25, prompt_tokens=10, completion_tokens=20, reasoning_tokens=5),
    LLMTokensEvent(model="m", total=TokenCount(30, 20, 5), by_agent={"generate": TokenCount(30, 20, 5)},
                   by_subproblem={"linear": TokenCount(30, 20, 5)}, calls=3, cached_calls=1, failed_calls=1),
    CandidateEvent(subproblem="linear", id="c0001", parent="c0000", prompt_kind="refine", status="ok",
                   reason="", speedup=1.5, accepted=True, tokens=50, cached=False),
    VerdictEvent(problem="p.py", solution="iter_01/decomposed_solution.py", status="ok", reason="", speedup=None,
                 wall_s=10.0, phases={"load": 0.5, "candidate": 6.0, "candidate.build": 2.0}, composite=True),
    PortEvent(solution="/s", variant="/v.py",
              subproblems=(PortMatch("linear", "reused", "linear", ""), PortMatch("gelu", "new", None, "no match")),
              reused=(PortReuse("linear", "linear"),), evolved=("gelu",), decompose_calls=1),
    SwapEvent(subkernels=("gelu", "add"), status="ok", speedup=1.2, previous=1.1, kept=True),
    SwapSkippedEvent(skipped="every subkernel is at least 1.0 x torch.compile"),
]

# The keys each kind had before the records: a log written now must still carry every one of them.
LEGACY_KEYS = {
    "llm_call": {"model", "agent", "subproblem", "sample", "cached", "attempts", "error", "wall_s",
                 "prompt_tokens", "completion_tokens", "reasoning_tokens"},
    "llm_tokens": {"model", "total", "by_agent", "by_subproblem", "calls", "cached_calls", "failed_calls"},
    "candidate": {"subproblem", "id", "parent", "prompt_kind", "status", "reason", "speedup", "accepted", "tokens",
                  "cached"},
    "verdict": {"problem", "solution", "status", "reason", "speedup", "wall_s", "phases", "composite"},
    "port": {"solution", "variant", "subproblems", "reused", "evolved", "decompose_calls"},
}
SWAP_KEYS = {SwapEvent: {"subkernels", "status", "speedup", "previous", "kept"}, SwapSkippedEvent: {"skipped"}}


def logged(records: list[EventRecord], tmp_path: Path) -> list[dict]:
    """The records written through an EventLog and read back from its file, as raw events."""
    log = EventLog(tmp_path / "events.jsonl")
    for record in records:
        log.record(record)
    return read_event_lines(tmp_path / "events.jsonl")


# ---- writing and reading -------------------------------------------------------------------------------


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_the_log(record, tmp_path):
    (event,) = logged([record], tmp_path)
    assert event["kind"] == record.KIND and isinstance(event["t"], float)
    keys = set(event) - {"kind", "t"}
    assert keys == SWAP_KEYS.get(type(record), LEGACY_KEYS.get(record.KIND))
    assert parse_events([event]) == [record]
    assert type(record).from_json(json.loads(json.dumps(record.to_json()))) == record


def test_the_token_totals_event_keeps_the_keys_of_the_report():
    report = TokenReport(total=TokenUsage(3, 2, 1), by_agent={"generate": TokenUsage(3, 2, 1)}, calls=2)
    assert report.event("m").to_json() == {"model": "m", **report.to_dict()}


def test_kinds_nothing_reads_are_skipped(tmp_path):
    final = FinalCheckEvent(subproblem="linear", id="c0001", status="ok", accepted=True)
    events = logged([final], tmp_path) + [{"kind": "beam", "calls": 3}, {"no": "kind"}, {"kind": 7}]
    assert events[0]["kind"] == "final_check" and events[0]["accepted"] is True
    assert parse_events(events) == []


def test_the_two_shapes_of_a_swap_event_are_told_apart():
    records = parse_events([{"kind": "swap", "skipped": "no GPU"}, {"kind": "swap", "subkernels": ["a"]}])
    assert records == [SwapSkippedEvent("no GPU"), SwapEvent(subkernels=("a",))]


# ---- old logs ------------------------------------------------------------------------------------------


def test_old_events_missing_newer_fields_still_parse():
    old = [
        {"kind": "verdict", "status": "ok", "speedup": None, "solution": "s.py"},     # before profiling
        {"kind": "llm_call", "agent": "decompose", "cached": True},                   # before retries were timed
        {"kind": "llm_tokens", "model": "m", "by_agent": {"generate": {"prompt": 12}}},
        {"kind": "port", "solution": "/s", "reused": [{"variant": "linear"}], "evolved": ["gelu"]},
        {"kind": "candidate", "id": "c0001", "status": "incorrect", "unknown_later_key": 1},
    ]
    verdict, call, tokens, port, candidate = parse_events(old)
    assert verdict == VerdictEvent(status="ok", solution="s.py") and not verdict.profiled
    assert (call.agent, call.cached, call.wall_s, call.attempts) == ("decompose", True, None, 1)
    assert tokens.by_agent == {"generate": TokenCount(prompt=12)} and tokens.calls == 0
    assert port.reused == (PortReuse("linear", None),) and port.subproblems == () and port.decompose_calls == 0
    assert candidate == CandidateEvent(id="c0001", status="incorrect")


def test_a_number_written_without_a_fraction_reads_as_a_float():
    verdict = VerdictEvent.from_json({"wall_s": 10, "phases": {"load": 1}, "speedup": 2})
    assert (verdict.wall_s, verdict.phases, verdict.speedup) == (10.0, {"load": 1.0}, 2.0)
    assert isinstance(verdict.wall_s, float) and isinstance(verdict.phases["load"], float)


# ---- wrong types ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("event, kind, field_name", [
    ({"kind": "llm_call", "cached": "yes"}, "llm_call", "cached"),
    ({"kind": "llm_call", "prompt_tokens": True}, "llm_call", "prompt_tokens"),   # true is no count
    ({"kind": "verdict", "wall_s": "10"}, "verdict", "wall_s"),
    ({"kind": "verdict", "phases": {"load": "0.5"}}, "verdict", "phases.load"),
    ({"kind": "verdict", "phases": [0.5]}, "verdict", "phases"),
    ({"kind": "llm_tokens", "by_agent": {"generate": {"prompt": 1.5}}}, "llm_tokens", "by_agent.generate.prompt"),
    ({"kind": "port", "reused": [{"variant": 3}]}, "port", "reused[0].variant"),
    ({"kind": "swap", "subkernels": "gelu"}, "swap", "subkernels"),
    ({"kind": "swap", "skipped": None}, "swap", "skipped"),
    ({"kind": "candidate", "accepted": "false"}, "candidate", "accepted"),
])
def test_a_wrong_typed_field_is_an_error_naming_the_kind_and_the_field(event, kind, field_name):
    with pytest.raises(EventFieldError) as caught:
        parse_events([{"kind": "beam"}, event])
    assert (caught.value.kind, caught.value.field_name) == (kind, field_name)
    assert f"{kind} event: field {field_name!r}" in str(caught.value)


# ---- the readers ---------------------------------------------------------------------------------------

SMALL_LOG = [
    {"kind": "llm_call", "agent": "generate", "cached": False},                     # an old one, fields missing
    {"kind": "llm_call", "agent": "generate", "cached": True},                      # a cache hit: not a call
    LLMCallEvent(agent="debug", wall_s=0.5).to_json() | {"kind": "llm_call"},
    {"kind": "llm_tokens", "model": "m", "by_agent": {"generate": {"prompt": 1200, "completion": 340}}},
    VerdictEvent(solution="iterations/iter_01/decomposed_solution.py", status="ok", composite=True).to_json()
    | {"kind": "verdict"},
    {"kind": "port", "solution": "/old/run/best", "reused": [{"variant": "linear", "solution": "linear"}],
     "evolved": ["linear_gelu"]},
    {"kind": "swap", "subkernels": ["linear_relu_add"], "status": "ok", "speedup": 1.0, "previous": 1.1,
     "kept": False},
    {"kind": "swap", "skipped": "no subkernel was timed"},
    {"kind": "beam", "calls": 3},
]


@pytest.mark.slow
def test_the_report_renders_a_small_events_list(run_dir, tmp_path):  # noqa: F811  (the fixture, by name)
    run = copy_run(run_dir, tmp_path)
    # A failed end-to-end check shows its status only where the log holds a composite verdict of it.
    edit_state(run, lambda state: [r.update(e2e_status="incorrect", e2e_reason="output 0 differs")
                                   for r in state["history"]])
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in SMALL_LOG) + '{"kind": "verd')
    page = write_report(run).read_text()
    tokens = section(page, "tokens")
    assert "<td>generate</td>" in tokens and "<td>debug</td>" in tokens
    assert '<td class="num">1540</td>' in tokens
    assert "Ported from /old/run/best: reused linear (from linear); evolved linear_gelu." in page
    assert "Swap of linear_relu_add for their PyTorch code: undone (end to end got worse)." in page
    assert "Swap skipped: no subkernel was timed." in page
    first, second = section(page, "iterations").split("<tr>")[2:]
    assert ">incorrect<" in first and ">not run<" in second       # only iteration 1's composite verdict is logged


@pytest.mark.slow
def test_mkevolve_report_names_the_wrong_typed_field(run_dir, tmp_path, capsys):  # noqa: F811
    run = copy_run(run_dir, tmp_path)
    with (run / "events.jsonl").open("a") as log:
        log.write(json.dumps({"kind": "verdict", "speedup": "fast"}) + "\n")
    assert main(["report", str(run)]) == 2
    assert "verdict event: field 'speedup' should be a number" in capsys.readouterr().err


def test_eval_profile_reads_the_records_and_names_a_file_with_a_wrong_typed_field(tmp_path):
    profile = load_script("eval_profile")
    logged([RECORDS[0], RECORDS[3], VerdictEvent(status="ok")], tmp_path)          # profiled, and an old one
    verdicts = profile.read_verdicts([tmp_path / "events.jsonl"])
    assert verdicts == [RECORDS[3], VerdictEvent(status="ok")]
    summary = profile.summarize(verdicts)
    assert (summary.evaluations, summary.unprofiled, summary.wall_total_s) == (1, 1, 10.0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"kind": "verdict", "phases": {"load": None}}) + "\n")
    with pytest.raises(SystemExit, match=r"bad\.jsonl: verdict event: field 'phases\.load'"):
        profile.read_verdicts([bad])
