"""What a run tells its user: why it fails, a provider that can answer nothing, an early stop, the live view.

Whole runs use the replay provider on fixtures/replay_run/sharp_sigmoid.py (y = sigmoid(20 x) / 2 on a tiny
input), decomposed into scale and squash_halve by a recorded reply. The stop rule, the state file's
backward compatibility, the end-to-end "did it run" field and the display are tested without a run.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from mkevolve.agents.evolve import KernelAgent
from mkevolve.busy import BusyClock
from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.display import RunDisplay, RunView, SubproblemRow, elapsed_text
from mkevolve.events import EventLog
from mkevolve.orchestrator import Orchestrator, RunOutcome, _print_failure, composite_not_run
from mkevolve.run_layout import BEST
from mkevolve.run_state import IterationRecord, RunState, Step, SubkernelRecord
from mkevolve.search.beam import Beam, Candidate, Exhausted, PromptKind
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, EvalResult, Status

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "replay_run"
PROBLEM = FIXTURES / "sharp_sigmoid.py"
COMMON = ["--beam-width", "1", "--decompose-attempts", "1", "--retries", "0", "--workers", "2", "--trials", "2"]
DECOMPOSE = {"agent": "decompose", "sample": 0, "reply_file": str(FIXTURES / "decompose_two.md")}
SCALE = {"agent": "generate", "subproblem": "scale", "reply_file": str(FIXTURES / "kernel_scale.md")}
SQUASH_HALVE = {"agent": "generate", "subproblem": "squash_halve",
                "reply_file": str(FIXTURES / "kernel_squash_halve.md")}
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU times kernels, so refine calls are made")


def script(tmp_path: Path, name: str, *replies: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({"replies": list(replies)}))  # JSON is YAML
    return path


def run(out: Path, replay: Path, *flags: str) -> int:
    return main(["run", str(PROBLEM), "--out", str(out), "--model", f"replay:{replay}", *COMMON, *flags])


def the_run_dir(out: Path) -> Path:
    (run_dir,) = (out / PROBLEM.stem).iterdir()
    return run_dir


def events(run_dir: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in rows if e["kind"] == kind]


# -- a provider that can answer no call stops the command ----------------------------------------------------


@pytest.mark.slow
def test_a_provider_error_stops_the_run_at_once_and_it_resumes(tmp_path, capsys):
    broken = script(tmp_path, "broken", DECOMPOSE, {"agent": "generate", "subproblem": "scale",
                                                    "fail": "connection_error"}, SQUASH_HALVE)
    assert run(tmp_path / "out", broken, "--iterations", "1", "--budget", "2") == 2
    captured = capsys.readouterr()
    run_dir = the_run_dir(tmp_path / "out")
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"mkevolve run: error: replay:{broken}: cannot connect to the provider (")
    assert "connection refused" in line and line.endswith(f"python -m mkevolve run --resume {run_dir}")
    state = RunState.load(run_dir)
    assert (state.step, state.iteration, state.history) == (Step.REFINED, 1, [])
    # Nothing was filed as a failed candidate, and squash_halve's reply was never asked for.
    assert not (run_dir / "iterations" / "iter_01" / "candidates").exists()
    assert [(e["failure"], e["subproblem"]) for e in events(run_dir, "provider_error")] == [("connection", "scale")]

    mended = script(tmp_path, "mended", SCALE, SQUASH_HALVE)
    assert main(["run", "--resume", str(run_dir), "--model", f"replay:{mended}"]) == 0
    state = RunState.load(run_dir)
    assert state.step is Step.FINISHED and [r.e2e_status for r in state.history] == ["ok"]
    assert (run_dir / BEST / "manifest.yaml").is_file()


def test_a_provider_error_while_decomposing_leaves_no_fallback(tmp_path, capsys):
    refused = script(tmp_path, "refused", {"agent": "decompose", "fail": "authentication_error"})
    assert run(tmp_path / "out", refused, "--iterations", "1") == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert "the provider refused the credentials (replayed failure: invalid API key (401))" in line
    assert "fallback" not in captured.out
    run_dir = the_run_dir(tmp_path / "out")
    assert RunState.load(run_dir).step is Step.STARTED and not (run_dir / "iterations").exists()


# -- a bad reply is a failed candidate, and its reason is told -----------------------------------------------


SHAPE_JOBS: list[str] = []  # subproblems whose input shapes garbage_run's prompts asked a worker for


@pytest.fixture(scope="module")
def garbage_run(tmp_path_factory) -> tuple[Path, int, str]:
    tmp_path = tmp_path_factory.mktemp("garbage")
    replies = script(tmp_path, "garbage", DECOMPOSE,
                     {"agent": "generate", "subproblem": "scale", "reply": "lorem ipsum, no kernel here"},
                     SQUASH_HALVE)
    capture = pytest.MonkeyPatch()  # capsys is per test; the run is made once for the module
    buffer = io.StringIO()
    capture.setattr("sys.stdout", buffer)
    capture.setattr(KernelAgent, "_input_shapes", lambda agent: SHAPE_JOBS.append(agent.subproblem) or ["?"])
    try:
        code = run(tmp_path / "out", replies, "--iterations", "1", "--budget", "2")
    finally:
        capture.undo()
    return the_run_dir(tmp_path / "out"), code, buffer.getvalue()


def test_a_garbage_reply_is_a_failed_candidate_not_a_fatal_error(garbage_run):
    run_dir, code, _ = garbage_run
    assert code == 0  # squash_halve's kernel and scale's PyTorch code pass end to end: a partial best/
    candidate = json.loads((run_dir / "iterations" / "iter_01" / "candidates" / "scale" / "c0000.json").read_text())
    assert candidate["result"]["status"] == "compile_error" and "lorem ipsum" in candidate["result"]["reason"]
    assert events(run_dir, "provider_error") == []


def test_prompts_take_input_shapes_from_the_decomposition_check_not_from_a_job(garbage_run):
    run_dir, _, _ = garbage_run
    assert SHAPE_JOBS == []
    beams = RunState.load(run_dir).beams
    assert beams["scale"].input_shapes == beams["squash_halve"].input_shapes == [
        "forward(float32[8, 64]), constructed with ()"]


def test_every_subproblem_outcome_is_in_state_events_and_summary(garbage_run):
    run_dir, _, stdout = garbage_run
    (record,) = RunState.load(run_dir).history
    scale = record.subkernels["scale"]
    assert scale.candidate is None and scale.candidates == 1
    assert scale.reason.startswith("none of its 1 candidate(s) had code; the last: no code:")
    assert "the reply says: lorem ipsum, no kernel here" in scale.reason
    assert record.subkernels["squash_halve"].outcome().startswith("Triton kernel c0000 (ok, ")
    assert (record.e2e_ran, record.e2e_not_run) == (True, "")
    outcomes = {e["subproblem"]: e for e in events(run_dir, "subproblem_outcome")}
    assert (outcomes["scale"]["outcome"], outcomes["scale"]["reason"]) == ("pytorch", scale.reason)
    assert outcomes["squash_halve"]["outcome"] == "triton" and outcomes["squash_halve"]["candidate"] == "c0000"
    (iteration,) = events(run_dir, "iteration")
    assert iteration["e2e_ran"] is True and iteration["candidates"] == 2
    assert f"  scale: PyTorch code: {scale.reason}" in stdout.splitlines()
    assert f"iteration 1: scale: 1 new candidate(s); {scale.reason}" in stdout


def test_the_failure_summary_names_every_subproblem_and_why_the_composite_did_not_pass(tmp_path):
    record = IterationRecord(index=3, refinement="none", subproblems=["conv", "relu"], budget={}, subkernels={
        "conv": SubkernelRecord(status="failing", origin="pytorch",
                                reason="the builtin generator has no kernel for this subproblem: Conv2d.stride "
                                       "differs between input configs"),
        "relu": SubkernelRecord(status="ok", candidate="c0002", origin="builtin")},
        e2e_status="cheating", e2e_ran=False, e2e_not_run="the static checks rejected it")
    outcome = RunOutcome(run_dir=tmp_path, passed=False, speedup=None, iterations=3, last=record,
                         failure="iteration 3: not run: the static checks rejected it")
    log = io.StringIO()
    _print_failure(outcome, RunDisplay(RunView("p.py", 3), Console(file=log, width=60)))
    assert log.getvalue().splitlines() == [
        "no end-to-end solution passed after 3 iteration(s) (iteration 3: not run: the static checks rejected it)",
        "  conv: PyTorch code: the builtin generator has no kernel for this subproblem: Conv2d.stride differs "
        "between input configs",
        "  relu: Triton kernel c0002 (ok, speedup unknown)",
        f"candidates and verdicts are in {tmp_path / 'iterations'}",
    ]


# -- whether the end-to-end check ran ------------------------------------------------------------------------


def test_a_composite_rejected_before_it_ran_says_so():
    static = EvalResult(status=Status.CHEATING, reason="decomposed_solution.py: the top-level computes")
    assert composite_not_run(static).startswith("the static checks rejected the composed solution before it ran "
                                                "(cheating): decomposed_solution.py")
    unstarted = EvalResult(status=Status.NOT_RUN, reason=f"{CANDIDATE_NOT_STARTED}: fork failed", phases={"worker_start": 0.1})
    assert composite_not_run(unstarted) == "the verifier could not start the candidate process (fork failed)"
    ran = EvalResult(status=Status.INCORRECT, reason="output mismatch", phases={"worker_start": 0.1, "load": 1.0})
    assert composite_not_run(ran) == ""


def test_a_state_file_written_before_the_new_fields_still_loads(tmp_path):
    """The fields an older version did not write: e2e_ran, e2e_not_run, asked, candidates, made, stop."""
    old_record = {"index": 1, "refinement": "none", "subproblems": ["a"], "budget": {"a": 2},
                  "subkernels": {"a": {"status": "ok", "speedup": None, "runtime_ms": None, "candidate": "c0000",
                                       "origin": "builtin", "precision": "ieee", "reason": ""}},
                  "e2e_status": "ok", "e2e_reason": "", "e2e_speedup": None, "runtime_ms": {}, "seconds": 1.0,
                  "kept": True, "pytorch": []}
    old_state = {"problem": "p.py", "run_id": "r", "iteration": 1, "step": "evaluated", "beams": {},
                 "beam_sources": {}, "evolved": ["a"], "history": [old_record], "best_iteration": 1,
                 "best_score": 1.0, "needs_total_fuse": False, "refinement": "none", "budget": {"a": 2},
                 "version": 1}
    (tmp_path / "state.json").write_text(json.dumps(old_state))
    state = RunState.load(tmp_path)
    (record,) = state.history
    assert (record.e2e_ran, record.e2e_not_run, record.asked) == (None, "", "")  # None: not known, not False
    assert record.subkernels["a"].candidates == 0 and (state.made, state.stop, state.asked) == ({}, "", "")
    state.save(tmp_path)
    assert RunState.load(tmp_path).history == state.history


# -- stop early when nothing can change ------------------------------------------------------------------------


@cpu_only
@pytest.mark.slow
def test_a_run_where_nothing_can_change_stops_and_says_so(tmp_path, capsys):
    replies = script(tmp_path, "all_pass", DECOMPOSE, SCALE, SQUASH_HALVE)
    assert run(tmp_path / "out", replies, "--iterations", "5", "--budget", "2") == 0
    out = capsys.readouterr().out
    run_dir = the_run_dir(tmp_path / "out")
    state = RunState.load(run_dir)
    # Iteration 1 writes both kernels; iteration 2 has nothing to refine without timings and no refinement.
    assert [(r.index, r.budget, sum(s.candidates for s in r.subkernels.values())) for r in state.history] == [
        (1, {"scale": 1, "squash_halve": 1}, 2), (2, {"scale": 0, "squash_halve": 0}, 0)]
    assert state.step is Step.FINISHED and state.stop.startswith("nothing can change")
    stops = [line for line in out.splitlines() if "stopped after" in line]
    assert len(stops) == 1 and stops[0].endswith(
        "stopped after iteration 2 of 5: nothing can change: no subproblem got a new candidate and the "
        "decomposition is unchanged, and no later iteration would split or fuse")
    assert [(e["iteration"], e["reason"]) for e in events(run_dir, "stopped")] == [(2, state.stop)]
    (skipped,) = events(run_dir, "refine_skipped")
    assert skipped["iteration"] == 2 and skipped["subproblems"] == ["scale", "squash_halve"]
    assert "refine skipped for scale, squash_halve: no GPU to time kernels" in out
    assert [e["agent"] for e in events(run_dir, "llm_call")] == ["decompose", "generate", "generate"]


def passing_beam() -> Beam:
    kernel = Candidate(id="c0000", subproblem="s", parent=None, kind=PromptKind.GENERATE, source="# k",
                       result=EvalResult(status=Status.OK), accepted=True)
    return Beam(width=1, members=[kernel], next_seq=1)


def declined_beam() -> Beam:
    return Beam(width=1, exhausted=Exhausted(model="builtin", reason="no kernel for: torch.cumsum"))


def stub_orchestrator(tmp_path: Path, beams: dict[str, Beam], *, iterations=5, fuse=False, needs_total_fuse=False):
    """The stop rule reads only the config and the state: no verifier or client is needed."""
    config = replace(RunConfig(), iterations=iterations, refine_every=2, fuse=fuse)
    state = RunState(problem="p.py", run_id="r", beams=beams, needs_total_fuse=needs_total_fuse)
    display = RunDisplay(RunView("p.py", iterations), Console(file=io.StringIO()))
    return Orchestrator(tmp_path / "p.py", config, tmp_path, state, SimpleNamespace(clock=None),
                        SimpleNamespace(events=EventLog(), clock=BusyClock()), display)


def quiet(index: int, names: list[str], asked: str = "", made: int = 0, refinement: str = "none") -> IterationRecord:
    return IterationRecord(index=index, refinement=refinement, subproblems=names, budget={}, asked=asked,
                           subkernels={n: SubkernelRecord(status="ok", candidates=made) for n in names})


@pytest.mark.parametrize("case, record, beams, options, stops", [
    ("nothing pending", quiet(2, ["a", "b"]), {"a": "pass", "b": "pass"}, {}, "no later iteration would"),
    ("new candidates", quiet(2, ["a", "b"], made=1), {"a": "pass", "b": "pass"}, {}, None),
    ("a refinement changed it", quiet(2, ["a", "b"], refinement="split"), {"a": "pass", "b": "pass"}, {}, None),
    ("the last iteration", quiet(5, ["a", "b"]), {"a": "pass", "b": "pass"}, {}, None),
    ("a split still to ask", quiet(1, ["a", "b"]), {"a": "pass", "b": "declined"}, {}, None),
    ("the same split again", quiet(2, ["a", "b"], asked="split b"), {"a": "pass", "b": "declined"}, {},
     "split b was asked this iteration and left it as it was"),
    ("a split but of other subproblems", quiet(2, ["a", "b"], asked="split a, b"), {"a": "pass", "b": "declined"},
     {}, None),
    ("a fuse still to ask", quiet(1, ["a", "b"]), {"a": "pass", "b": "pass"}, {"fuse": True}, None),
    ("the same fuse again", quiet(2, ["a", "b"], asked="fuse"), {"a": "pass", "b": "pass"}, {"fuse": True},
     "fuse was asked"),
    ("a total fuse to come", quiet(3, ["a", "b"]), {"a": "pass", "b": "pass"}, {"needs_total_fuse": True}, None),
    ("the same total fuse again", quiet(3, ["a", "b"], asked="total_fuse"), {"a": "pass", "b": "pass"},
     {"needs_total_fuse": True}, "total_fuse was asked"),
    ("no split past the last iteration", quiet(4, ["a", "b"]), {"a": "pass", "b": "declined"},
     {"iterations": 5}, "no later iteration would"),
])
def test_the_stop_rule(tmp_path, case, record, beams, options, stops):
    built = {name: passing_beam() if kind == "pass" else declined_beam() for name, kind in beams.items()}
    orchestrator = stub_orchestrator(tmp_path, built, **options)
    reason = orchestrator._nothing_can_change(record, SimpleNamespace(names=record.subproblems))
    if stops is None:
        assert reason is None, case
    else:
        assert reason is not None and stops in reason, case


# -- the live view and the plain log ---------------------------------------------------------------------------


def test_the_live_view_shows_the_subproblem_at_work_its_candidates_and_the_time():
    terminal = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    display = RunDisplay(RunView("gemm_chain.py", iterations=5), terminal)
    display._start -= 125  # as if the run had started two minutes ago
    display.view.iteration, display.view.phase = 2, "evolving gemm (6 calls)"
    display.set_rows({"gemm": SubproblemRow(status="evolving", calls=6, done=2, pending=4),
                      "relu": SubproblemRow(status="passing", done=1, passing=True),
                      "bias": SubproblemRow(status="waiting", pending=3)})
    text = Console(file=io.StringIO(), width=120, color_system=None)
    text.print(display._table())
    table = text.file.getvalue()
    assert "iteration 2/5, evolving gemm (6 calls)" in table and "elapsed 2m 05s" in table
    rows = {line.split()[1]: line.split()[2:] for line in table.splitlines() if re.match(r"^│ \w", line)}
    assert rows["gemm"][:6] == ["│", "evolving", "│", "2", "│", "4"]
    assert rows["relu"][:4] == ["│", "passing", "│", "1"] and "unknown" in rows["relu"]
    assert rows["bias"][:6] == ["│", "waiting", "│", "0", "│", "3"]
    with display:  # on a terminal the same table is drawn live
        display.update()
    drawn = terminal.file.getvalue()
    assert "evolving gemm (6 calls)" in drawn and "elapsed 2m 0" in drawn and "waiting" in drawn


def test_plain_output_is_one_unwrapped_line_per_progress_step(capsys):
    display = RunDisplay(RunView("p.py", iterations=2))  # stdout is not a terminal under pytest
    display.view.iteration, display.view.phase = 1, "evolving " + "a_very_long_subproblem_name_" * 8
    with display:
        display.set_row("x", SubproblemRow(status="evolving", calls=6, done=2, pending=4))
        display.update()
        display.update()  # the same line again: not repeated
        display.set_row("x", SubproblemRow(status="evolving", calls=6, done=6, pending=0))
        display.update()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line) > 200 for line in lines)
    assert lines[0].endswith(": 2 done, 4 pending | best none yet | tokens 0")
    assert lines[1].endswith(": 6 done, 0 pending | best none yet | tokens 0")


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (59.9, "59s"), (65, "1m 05s"), (3725, "1h 02m")])
def test_elapsed_time_reads_at_a_glance(seconds, text):
    assert elapsed_text(seconds) == text
