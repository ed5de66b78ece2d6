"""scripts/eval_profile.py and scripts/kernelbench.py: the profile's numbers, and the benchmark's resume,
time-limit rule, run-directory reader, timing function (CPU: errors yes, speedups null) and rendering."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from script_loader import load_script

from mkevolve.run_state import IterationRecord, RunState, Step, SubkernelRecord
from mkevolve.solution import Manifest, SubkernelEntry

ROOT = Path(__file__).resolve().parents[1]
SMALL = Path(__file__).resolve().parent / "fixtures" / "kernelbench_small"
GEMM = "level2/63_Gemm_ReLU_Divide.py"


profile_script = load_script("eval_profile")
kb = load_script("kernelbench")
throughput = load_script("throughput")
run_alone = load_script("run_alone")
bench_wire = load_script("bench_wire")
launch_overhead = load_script("launch_overhead")


# ---- eval_profile ----------------------------------------------------------------------------------------

# Two evaluations: 10 s (1 s of it waiting) and 4 s (none waiting), 14 s of wall time together.
FIRST = {"kind": "verdict", "status": "ok", "wall_s": 10.0,
         "phases": {"worker_start": 1.0, "load": 0.5, "reference": 0.5, "candidate": 6.0,
                    "candidate.setup": 1.0, "candidate.first_call": 4.0, "judge": 1.0}}
SECOND = {"kind": "verdict", "status": "ok", "wall_s": 4.0, "composite": True,
          "phases": {"worker_start": 0.0, "load": 0.5, "reference": 0.5, "candidate": 2.0,
                     "candidate.setup": 0.5, "candidate.first_call": 1.0, "judge": 0.5, "baseline": 0.5}}


def write_events(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"kind": "verdict", "wall_s"')  # cut short
    return path


def test_profile_of_synthetic_events(tmp_path):
    events = write_events(tmp_path / "events.jsonl", [{"kind": "llm_call", "wall_s": 99.0}, FIRST, SECOND])
    out = tmp_path / "profile.json"
    assert profile_script.main([str(tmp_path), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["evaluations"], data["unprofiled"], data["wall_total_s"]) == (2, 0, 14.0)
    assert data["wall_median_s"] == pytest.approx(7.0) and data["wall_p90_s"] == pytest.approx(9.4)
    rows = {r["phase"]: r for r in data["rows"]}
    assert [r["phase"] for r in data["rows"]] == [
        "worker_start", "load", "reference", "baseline", "candidate", "candidate.setup", "candidate.first_call",
        "candidate.unaccounted", "judge", "waiting"]
    candidate = rows["candidate"]
    assert (candidate["count"], candidate["total_s"]) == (2, 8.0)
    assert candidate["median_s"] == pytest.approx(4.0)
    assert candidate["p90_s"] == pytest.approx(5.6)          # 2 + 0.9 * (6 - 2)
    assert candidate["share"] == pytest.approx(8 / 14)
    assert rows["waiting"]["total_s"] == pytest.approx(1.0)   # 10 - 9 and 4 - 4
    assert rows["waiting"]["p90_s"] == pytest.approx(0.9)
    assert rows["candidate.unaccounted"]["total_s"] == pytest.approx(1.5)   # 6 - 5 and 2 - 1.5
    assert (rows["baseline"]["count"], rows["baseline"]["share"]) == (1, pytest.approx(0.5 / 14))
    table = profile_script.render_table(profile_script.summarize(profile_script.read_verdicts([events])))
    assert "  candidate.first_call" in table and "waiting" in table
    assert profile_script.main([str(events), "--composite", "only", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["wall_total_s"] == 4.0


def test_the_parts_of_spawn_are_listed_under_it_and_not_counted_twice(tmp_path):
    phases = {**FIRST["phases"], "candidate.spawn": 0.5, "candidate.spawn.late": 0.4, "candidate.spawn.prepare": 5.0}
    events = write_events(tmp_path / "events.jsonl", [{**FIRST, "phases": phases}])
    profile = profile_script.summarize(profile_script.read_verdicts([events]))
    rows = {r.phase: r for r in profile.rows}
    assert rows["candidate.unaccounted"].total_s == pytest.approx(0.5)   # 6 - (1 + 4 + 0.5): not the parts
    order = [r.phase for r in profile.rows]
    assert order.index("candidate.spawn") + 1 == order.index("candidate.spawn.late")
    assert "\n    candidate.spawn.prepare" in profile_script.render_table(profile)


def test_profile_by_problem_puts_the_longest_first(tmp_path):
    slow = {**FIRST, "problem": "/runs/iter_01/subkernel_problems/conv2d.py"}
    fast = {**SECOND, "problem": "/kb/level2/23_Conv3d_GroupNorm_Mean.py"}
    write_events(tmp_path / "events.jsonl", [fast, slow, {**slow, "wall_s": 12.0}])
    out = tmp_path / "by_problem.json"
    assert profile_script.main([str(tmp_path), "--by-problem", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert list(data) == ["conv2d", "23_Conv3d_GroupNorm_Mean"]          # 22 s of evaluations before 4 s
    assert (data["conv2d"]["evaluations"], data["conv2d"]["wall_total_s"]) == (2, 22.0)
    assert data["23_Conv3d_GroupNorm_Mean"]["evaluations"] == 1


def test_profile_with_missing_phases(tmp_path):
    crashed = {"kind": "verdict", "status": "crashed", "wall_s": 2.0, "phases": {"worker_start": 0.5}}
    old = {"kind": "verdict", "status": "ok", "speedup": None}        # written before wall_s and phases
    profile = profile_script.summarize([FIRST, crashed, old])
    assert (profile.evaluations, profile.unprofiled, profile.wall_total_s) == (2, 1, 12.0)
    rows = {r.phase: r for r in profile.rows}
    assert rows["worker_start"].count == 2 and rows["candidate"].count == 1
    assert rows["waiting"].total_s == pytest.approx(1.0 + 1.5)
    assert "1 verdict event(s) without wall_s or phases" in profile_script.render_table(profile)


# ---- kernelbench: resume and the time limit -------------------------------------------------------------


def results_with(rows: list) -> "kb.Results":
    return kb.Results(meta={"parts": []}, rows={r.problem: r for r in rows})


def test_resume_skips_finished_problems(tmp_path):
    results = results_with([kb.Row("level2/a.py", finished=True, wall_s=30.0)])
    path = tmp_path / "results.json"
    results.save(path)
    calls = []

    def solve(key, row, deadline, whole_part, lane):
        calls.append((key, row, whole_part))
        return kb.Row(key, finished=True, wall_s=20.0)

    reloaded = kb.Results.load(path)
    started = kb.run_part(["level2/a.py", "level2/b.py"], reloaded, 540, solve, lambda: reloaded.save(path))
    assert started == ["level2/b.py"] and calls == [("level2/b.py", None, True)]
    assert set(kb.Results.load(path).rows) == {"level2/a.py", "level2/b.py"}


def test_resume_times_a_problem_whose_run_finished():
    """A row left with finished=False (run done, timing cut) is handed back to be finished, not rerun."""
    pending = kb.Row("level2/a.py", run_dir="/runs/a", exit_code=0, correct=True, run_s=100.0)
    results = results_with([pending])
    seen = []
    kb.run_part(["level2/a.py"], results, 540, lambda k, row, d, whole, lane: seen.append(row) or
                kb.Row(k, finished=True), lambda: None)
    assert seen == [pending]


def test_time_limit_rule():
    assert kb.fits(0, [], 10)                      # no history: start
    assert kb.fits(100, [50, 100, 900], 200)       # median 100: 100 + 100 <= 200
    assert not kb.fits(101, [50, 100, 900], 200)

    clock = [0.0]
    results = results_with([kb.Row(f"done{i}", finished=True, wall_s=100.0) for i in range(3)])

    def solve(key, row, deadline, whole_part, lane):
        assert deadline == 250                     # the part's start (0) plus the limit
        clock[0] += 100                            # each problem takes 100 s
        return kb.Row(key, finished=True, wall_s=100.0)

    started = kb.run_part(["p1", "p2", "p3", "p4"], results, 250, solve, lambda: None, now=lambda: clock[0])
    assert started == ["p1", "p2"]                 # p3 would start at 200 s and end at 300 s > 250 s


def test_first_problem_of_a_part_always_starts_and_a_cut_run_stops_the_part():
    results = results_with([kb.Row("slow", finished=True, wall_s=1000.0)])
    seen = []

    def solve(key, row, deadline, whole_part, lane):
        seen.append((key, whole_part))
        return None                                # cut at the deadline: retried in the next part

    assert kb.run_part(["p1", "p2"], results, 100, solve, lambda: None) == ["p1"]
    assert seen == [("p1", True)] and "p1" not in results.rows


def test_lanes_solve_problems_at_once_and_each_lanes_first_problem_is_a_whole_part():
    results = results_with([])
    both_in = threading.Barrier(2, timeout=10)     # breaks (and fails solve) unless two run at the same time
    seen = []

    def solve(key, row, deadline, whole_part, lane):
        if key in ("p1", "p2"):
            both_in.wait()
        seen.append((key, whole_part))
        lanes_of[key] = lane
        return kb.Row(key, finished=True, wall_s=1.0)

    lanes_of = {}
    started = kb.run_part(["p1", "p2", "p3"], results, 540, solve, lambda: None, lanes=2)
    assert sorted(started) == ["p1", "p2", "p3"] and set(results.rows) == {"p1", "p2", "p3"}
    assert sorted(seen)[:2] == [("p1", True), ("p2", True)] and ("p3", False) in seen
    assert {lanes_of["p1"], lanes_of["p2"]} == {0, 1}      # the two at once ran in different lanes


def test_a_lanes_child_sees_only_its_gpu_and_takes_that_gpus_lock(monkeypatch):
    from mkevolve.workers.gpu_share import LOCK_ENV, lock_path

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    env = kb.child_env(1)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env[LOCK_ENV] == lock_path(1)
    assert kb.child_env()[LOCK_ENV] == lock_path(0)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert kb.child_env(1)["TRITON_INTERPRET"] == "1"


def test_a_cut_in_one_lane_stops_the_other_lanes_from_taking_more():
    results = results_with([])
    p1_cut = threading.Event()
    both_in = threading.Barrier(2, timeout=10)
    seen = []

    def solve(key, row, deadline, whole_part, lane):
        seen.append(key)
        both_in.wait()
        if key == "p1":
            p1_cut.set()
            return None                             # cut at the deadline
        assert p1_cut.wait(10)
        time.sleep(0.5)                             # p1's lane records its cut meanwhile
        return kb.Row(key, finished=True, wall_s=1.0)

    kb.run_part(["p1", "p2", "p3", "p4"], results, 540, solve, lambda: None, lanes=2)
    assert sorted(seen) == ["p1", "p2"] and set(results.rows) == {"p2"}


# ---- throughput ------------------------------------------------------------------------------------------


def test_throughput_of_two_runs_against_the_targets(tmp_path):
    # Run a: 0 to 60 s, 3 verdicts (one composite), one 50 s iteration with 5 s overhead. Run b: 30 to 120 s,
    # 3 verdicts and a check that never ran its candidate (not counted), no iteration finished. Together: 6
    # verdicts in 120 s on 1 GPU.
    run_a = [{"t": 1000.0, "kind": "decomposed"}, {"t": 1020.0, "kind": "verdict"}, {"t": 1030.0, "kind": "verdict"},
             {"t": 1055.0, "kind": "verdict", "composite": True},
             {"t": 1060.0, "kind": "iteration", "seconds": 50.0, "overhead_s": 5.0}]
    run_b = [{"t": 1030.0, "kind": "decomposed"}] + [{"t": 1030.0 + 30 * i, "kind": "verdict"} for i in (1, 2, 3)]
    run_b.append({"t": 1100.0, "kind": "verdict", "status": "not_run",
                  "reason": "the candidate process could not be run: the run's time budget was spent"})
    (tmp_path / "a").mkdir()
    write_events(tmp_path / "a" / "events.jsonl", run_a)
    write_events(tmp_path / "b.jsonl", run_b)
    (tmp_path / "util.csv").write_text("0\n35\n100\n0\nutilization.gpu\n")   # a stray header is skipped
    measured = throughput.measure([tmp_path / "a", tmp_path / "b.jsonl"], tmp_path / "util.csv", gpus=1,
                                  runs_per_gpu=2)
    assert sorted(r.wall_s for r in measured.runs) == [60.0, 90.0] and measured.median_run_s == 75.0
    assert [r.composite_verdicts for r in measured.runs] == [1, 0]
    assert measured.span_s == 120.0 and measured.candidates_per_gpu_minute == 3.0
    assert (measured.gpu_samples, measured.gpu_busy_share, measured.gpu_mean_utilisation) == (4, 0.5, 33.75)
    assert measured.overhead_share == 0.1
    lines = "\n".join(measured.lines())
    assert "75.0 s (target <= 30 s) (2 runs per GPU; the target is for one alone)" in lines
    assert "3.00 (target >= 20)" in lines and "50.0% of 4 samples" in lines


def test_a_runs_wall_counts_from_its_process_start(tmp_path):
    # The run_started event comes 12 s into the process (imports, configuration): the wall starts before it.
    write_events(tmp_path / "events.jsonl", [{"t": 112.0, "kind": "run_started", "startup_s": 12.0},
                                              {"t": 150.0, "kind": "verdict"},
                                              {"t": 160.0, "kind": "run_finished", "closing_s": 4.0}])
    (run,) = throughput.measure([tmp_path], None, gpus=1, runs_per_gpu=1).runs
    assert run.wall_s == 60.0


def test_a_run_alone_reads_its_startup_closing_and_evaluations(tmp_path):
    events = write_events(tmp_path / "events.jsonl", [{"t": 1.0, "kind": "run_started", "startup_s": 3.5}, FIRST,
                                                       SECOND, {"t": 9.0, "kind": "run_finished", "closing_s": 0.8}])
    run = run_alone.AloneRun(workers=2, caches="cold", exit_code=0, process_s=20.0)
    run_alone.read_events(run, events)
    assert (run.startup_s, run.closing_s, run.verdicts) == (3.5, 0.8, 2)
    assert run.median_evaluation_s == 7.0 and run.phases["candidate.first_call"] == 2.5


def test_a_run_alone_says_when_it_reached_each_step_and_where_its_decomposition_check_went(tmp_path):
    check = {"passed": True, "wall_s": 7.2, "phases": {"equivalence.trials": 5.0, "equivalence": 6.2}}
    events = write_events(tmp_path / "events.jsonl", [
        {"t": 100.0, "kind": "run_started", "startup_s": 6.0},
        {"t": 105.0, "kind": "llm_call", "agent": "decompose"},
        {"t": 112.0, "kind": "decomposition", "iteration": 0, "checks": check},
        {"t": 112.5, "kind": "budget"}, {"t": 112.6, "kind": "llm_call", "agent": "generate"},
        {**FIRST, "t": 130.0}, {**SECOND, "t": 135.0}, {"t": 135.1, "kind": "checkpoint", "step": "evolved"},
        {"t": 142.0, "kind": "run_finished", "closing_s": 1.0}])
    run = run_alone.AloneRun(workers=4, caches="warm", exit_code=0, process_s=49.0)
    run_alone.read_events(run, events)
    assert run.milestones == {"decomposed": 12.5, "first_reply": 12.6, "first_verdict": 30.0, "searched": 35.1,
                              "finished": 42.0}
    assert run.check_phases == check["phases"]


def test_a_run_alone_keeps_every_cache_under_its_own_folder(tmp_path):
    env = run_alone.cache_env(tmp_path / "caches")
    assert set(env) == {"MKEVOLVE_CACHE", "TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"}
    assert all(Path(folder).is_dir() and Path(folder).parent == tmp_path / "caches" for folder in env.values())


def test_throughput_without_samples_or_iterations_is_unknown(tmp_path):
    write_events(tmp_path / "events.jsonl", [{"t": 5.0, "kind": "verdict"}])
    measured = throughput.measure([tmp_path], None, gpus=2, runs_per_gpu=1)
    assert measured.gpu_busy_share is None and measured.overhead_share is None
    assert measured.candidates_per_gpu_minute is None           # one event: no span to divide by
    assert "GPU busy: unknown" in "\n".join(measured.lines())


def test_a_parts_gpu_samples_are_summarised(tmp_path):
    fake_smi = [sys.executable, "-c", "print('0'); print('40'); print('100'); print('0')"]
    sampler = kb.UtilisationSampler(tmp_path / "util.csv", command=fake_smi)
    sampler.proc.wait(timeout=30)
    summary = sampler.stop()
    assert summary["gpu_samples"] == 4 and summary["gpu_busy_share"] == 0.5 and summary["gpu_mean_utilisation"] == 35.0
    missing = kb.UtilisationSampler(tmp_path / "none.csv", command=["no-such-sampler-here"]).stop()
    assert missing["gpu_samples"] == 0 and missing["gpu_busy_share"] is None


def test_a_part_counts_only_the_verdicts_within_its_own_time(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_events(run / "events.jsonl", [{"t": 50.0, "kind": "verdict"}, {"t": 150.0, "kind": "verdict"},
                                        {"t": 160.0, "kind": "iteration"}, {"t": 170.0, "kind": "verdict"}])
    rows = [kb.Row("level2/a.py", run_dir=str(run)), kb.Row("level2/b.py")]   # b never got a run directory
    assert kb.part_verdicts(rows, since=100.0, until=200.0) == 2


# ---- kernelbench: reading a run directory ----------------------------------------------------------------


def fake_run(folder: Path, pytorch: list[str], correct: bool = True) -> Path:
    """A run directory as `mkevolve run` leaves one: state.json, best/manifest.yaml, events.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    names = ["linear", "relu_truediv"]
    record = IterationRecord(index=1, refinement="none", subproblems=names, budget={n: 4 for n in names},
                             subkernels={n: SubkernelRecord(status="ok") for n in names},
                             e2e_status="ok" if correct else "incorrect",
                             e2e_reason="" if correct else "output 0 differs at 3 places", e2e_speedup=None,
                             pytorch=pytorch)
    RunState(problem="p.py", run_id="r", iteration=1, step=Step.FINISHED, history=[record],
             best_iteration=1 if correct else None).save(folder)
    if correct:
        (folder / "best").mkdir()
        Manifest(problem="p.py", device="cpu", status="ok", speedup=1.5, iteration=1,
                 subkernels={n: SubkernelEntry(origin="pytorch" if n in pytorch else "builtin")
                             for n in names}).write(folder / "best")
    tokens = {"kind": "llm_tokens", "total": {"prompt": 10, "completion": 5, "reasoning": 1}}
    events = [{"kind": "llm_call", "cached": False}] * 3 + [{**tokens, "calls": 6}, {**tokens, "calls": 2}]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def test_read_run_of_a_partial_solution(tmp_path):
    info = kb.read_run(fake_run(tmp_path / "run", pytorch=["relu_truediv"]))
    assert info.correct and info.all_triton is False and info.subkernels == 2
    assert info.pytorch_subkernels == ["relu_truediv"] and info.run_speedup == 1.5
    assert (info.llm_calls, info.tokens) == (8, 32)        # two clients' totals added up


def test_a_run_whose_candidates_got_no_verdict_says_how_many(tmp_path):
    """A row measured after a smaller search than asked for (other runs held the GPU's memory) says so."""
    run = fake_run(tmp_path / "run", pytorch=[])
    reason = "the candidate process could not be run: in each of its 3 tries the GPU's memory was held"
    with (run / "events.jsonl").open("a") as events:
        withdrawn = {"kind": "verdict", "status": "not_run", "composite": True,   # an end-to-end check ahead
                     "reason": "the candidate process could not be run: it was withdrawn while it waited"}
        for event in [withdrawn, {"kind": "verdict", "status": "not_run", "reason": reason},
                      {"kind": "candidate", "id": "c0000", "status": "not_run"},
                      {"kind": "candidate", "id": "c0001", "status": "ok"},
                      {"kind": "candidate", "id": "c0002", "status": "not_run"}]:
            events.write(json.dumps(event) + "\n")
    info = kb.read_run(run)
    assert info.no_verdict == 2 and info.note.startswith("2 candidate(s) of the search got no verdict")
    assert reason in info.note and "withdrawn" not in info.note
    assert kb.read_run(fake_run(tmp_path / "clean", pytorch=[])).no_verdict == 0


def test_read_run_without_best(tmp_path):
    run = fake_run(tmp_path / "run", pytorch=[], correct=False)
    (run / "events.jsonl").write_text('{"kind": "llm_call", "cached": false, "prompt_tokens": 7}\n'
                                      '{"kind": "llm_call", "cached": true, "prompt_tokens": 7}\n')
    info = kb.read_run(run)
    assert not info.correct and info.all_triton is None
    assert "output 0 differs" in info.note
    assert (info.llm_calls, info.tokens) == (1, 7)         # no totals event: the paid calls counted


# ---- kernelbench: a run that a part's limit stopped -------------------------------------------------------


def stopped_run(folder: Path) -> Path:
    """A run directory as a stopped `mkevolve run` leaves one: its checkpoint, no best/."""
    folder.mkdir(parents=True, exist_ok=True)
    RunState(problem="p.py", run_id="r", iteration=1, step=Step.EVOLVED).save(folder)
    return folder


def scripted_steps(monkeypatch, run_dir: Path, outcomes: list[int | None],
                   budget_spent: frozenset[int] = frozenset()) -> list[list[str]]:
    """Replace run_step: the n-th `mkevolve run` ends with outcomes[n] (None: stopped at the deadline) after
    100 s, leaving `run_dir` stopped, or finished with best/ when it exits 0, its searches cut by the time
    budget when n is in `budget_spent`; returns the commands seen."""
    commands = []

    def step(command, log, timeout_s, env=None):
        code = outcomes[len(commands)]
        commands.append(command)
        stopped_run(run_dir) if code is None else fake_run(run_dir, pytorch=[])
        if len(commands) - 1 in budget_spent:
            with (run_dir / "events.jsonl").open("a") as events:
                events.write(json.dumps({"kind": "time_budget_spent", "iteration": 1}) + "\n")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"run directory: {run_dir}\n")
        return kb.Step(code, 100.0, log)

    monkeypatch.setattr(kb, "run_step", step)
    monkeypatch.setattr(kb, "pack_and_measure", lambda row, *args: setattr(row, "measure_s", 5.0) or False)
    return commands


def kb_settings(tmp_path: Path):
    return kb.Settings(kernelbench=tmp_path / "kb", work=tmp_path / "work", model="builtin", iterations=1,
                       budget=8, run_args=[], rounds=1)


def test_a_run_stopped_at_the_limit_is_resumed_by_the_next_part(tmp_path, monkeypatch):
    run_dir = tmp_path / "work" / "runs" / "level2" / "p" / "r1"
    commands = scripted_steps(monkeypatch, run_dir, [None, 0])
    deadline = time.monotonic() + 600
    row = kb.solve_problem("level2/p.py", None, deadline, True, kb_settings(tmp_path), None)
    assert not row.finished and row.exit_code is None and row.run_parts == 1 and kb.resumable(row)
    assert "the next part resumes it" in row.note and "--resume" not in commands[0]
    row = kb.solve_problem("level2/p.py", row, deadline, True, kb_settings(tmp_path), None)
    assert commands[1][-2:] == ["--resume", str(run_dir)]
    assert row.finished and row.correct and row.exit_code == 0 and row.note == ""
    assert (row.run_parts, row.run_s, row.wall_s) == (2, 200.0, 205.0)        # both parts' run time


def test_a_run_stopped_in_every_part_is_recorded_over_the_limit(tmp_path, monkeypatch):
    run_dir = tmp_path / "work" / "runs" / "level2" / "p" / "r1"
    commands = scripted_steps(monkeypatch, run_dir, [None] * kb.MAX_RUN_PARTS)
    row = None
    for _ in range(kb.MAX_RUN_PARTS):
        assert row is None or not row.finished
        row = kb.solve_problem("level2/p.py", row, time.monotonic() + 600, True, kb_settings(tmp_path), None)
    assert len(commands) == kb.MAX_RUN_PARTS and row.finished and not row.correct and not kb.resumable(row)
    assert f"in each of {kb.MAX_RUN_PARTS} parts, {100 * kb.MAX_RUN_PARTS} s in all" in row.note


def test_each_run_gets_the_part_s_time_left_less_the_reserve_and_a_cut_search_is_noted(tmp_path, monkeypatch):
    run_dir = tmp_path / "work" / "runs" / "level2" / "p" / "r1"
    commands = scripted_steps(monkeypatch, run_dir, [None, 0], budget_spent=frozenset({1}))
    settings = dataclasses.replace(kb_settings(tmp_path), run_reserve_s=200.0)
    row = kb.solve_problem("level2/p.py", None, time.monotonic() + 530.5, True, settings, None)
    assert commands[0][-2:] == ["--time-budget", "330"] and row.time_budget_s == 330.0
    assert not row.time_budget_spent and "searches cut" not in row.note
    row = kb.solve_problem("level2/p.py", row, time.monotonic() + 100, True, settings, None)
    assert commands[1][-4:] == ["--resume", str(run_dir), "--time-budget", str(int(kb.MIN_RUN_BUDGET_S))]
    assert row.finished and row.time_budget_spent and "searches cut at the run's time budget of 60 s" in row.note


def test_no_reserve_means_no_time_budget():
    assert kb.run_time_budget(500.0, 0.0) is None and kb.run_time_budget(500.7, 200.0) == 300.0


def test_a_stopped_run_whose_directory_is_gone_starts_afresh(tmp_path, monkeypatch):
    commands = scripted_steps(monkeypatch, tmp_path / "work" / "runs" / "level2" / "p" / "r2", [0])
    gone = kb.Row("level2/p.py", run_dir=str(tmp_path / "elsewhere"), run_parts=1, run_s=100.0)
    row = kb.solve_problem("level2/p.py", gone, time.monotonic() + 600, True, kb_settings(tmp_path), None)
    assert "--resume" not in commands[0] and row.finished and (row.run_parts, row.run_s) == (1, 100.0)


# ---- kernelbench: timing and rendering -------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path: no timing without CUDA")
def test_measure_on_cpu_gives_errors_but_no_speedups():
    result = kb.measure(SMALL / GEMM, SMALL / "packed" / "level2_63_Gemm_ReLU_Divide.py", rounds=1)
    assert result.device == "cpu" and result.note == "no CUDA: not timed"
    assert result.speedup_vs_compile is None and result.speedup_vs_eager is None and result.solution_ms is None
    assert 0 < result.err_eager < 1e-5 and 0 <= result.err_solution < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path: nothing is timed without CUDA")
def test_launch_overhead_without_cuda_says_unknown_and_takes_pairs_only(capsys):
    assert launch_overhead.main([str(SMALL / GEMM), str(SMALL / "packed" / "level2_63_Gemm_ReLU_Divide.py")]) == 0
    assert "unknown" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        launch_overhead.main([str(SMALL / GEMM)])


def test_launch_overhead_summary_lists_the_costliest_launchers_first():
    cost = launch_overhead.ProblemCost("level2/x.py", "x_packed.py", [
        launch_overhead.SideCost("eager", wall_ms=1.0, issue_ms=0.2, kernel_ms=0.9, launches=4),
        launch_overhead.SideCost("solution", wall_ms=2.0, issue_ms=1.5, kernel_ms=None, launches=None,
                                 module_issue_ms={"cheap": 0.1, "dear": 0.9})])
    text = launch_overhead.summary(cost)
    assert "GPU unknown" in text and text.index("dear") < text.index("cheap")


def test_render_writes_unknown_and_an_svg(tmp_path):
    measured = kb.Row(GEMM, finished=True, correct=True, all_triton=True, speedup_vs_compile=1.25,
                      speedup_vs_eager=2.0, err_solution=3e-7, err_eager=2e-7, wall_s=61.0, llm_calls=8)
    unknown = kb.Row("level3/2_ShallowWideMLP.py", finished=True, correct=True, all_triton=False)
    results = kb.Results(meta={"date": "2026-12-01", "gpu": "cpu", "settings": {"model": "builtin"}},
                         rows={r.problem: r for r in (measured, unknown)})
    results.save(tmp_path / "results.json")
    assert kb.main(["--render", str(tmp_path / "results.json"), "--render-to", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "kernelbench.md").read_text()
    gemm_line = next(line for line in table.splitlines() if line.startswith("| level2/63"))
    mlp_line = next(line for line in table.splitlines() if line.startswith("| level3/2_"))
    assert "1.25x" in gemm_line and "2.00x" in gemm_line and "3.0e-07" in gemm_line
    assert mlp_line.count("unknown") == 6 and " 0 " not in mlp_line and "| no |" in mlp_line
    assert "geometric mean speedup vs torch.compile over the 1 timed correct problems: 1.25x" in table
    svg = (tmp_path / "out" / "kernelbench_speedup.svg").read_text()
    assert "<svg" in svg and "unknown" in svg


# ---- kernelbench: one real problem, end to end -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kernelbench_end_to_end_on_a_shrunk_problem(tmp_path):
    """A shrunk level 2 problem through `mkevolve run`, pack and timing (about 70 s on a CPU); the second
    call finds it finished and starts nothing."""
    args = [GEMM, "--kernelbench", str(SMALL), "--work", str(tmp_path), "--budget", "2", "--rounds", "1"]
    assert kb.main(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    [row] = data["rows"]
    assert row["problem"] == GEMM and row["finished"] and row["correct"] and row["all_triton"]
    assert row["exit_code"] == 0 and row["llm_calls"] >= 1 and row["run_s"] > 0
    assert row["time_budget_s"] > 0 and row["time_budget_spent"] is False   # the default reserve; not needed
    assert row["err_solution"] is not None and row["err_eager"] is not None
    if not torch.cuda.is_available():
        assert row["speedup_vs_compile"] is None and row["speedup_vs_eager"] is None
    assert (tmp_path / "packed" / "level2_63_Gemm_ReLU_Divide.py").is_file()
    part = data["parts"][-1]
    assert part["verdicts"] >= 2 and part["verdicts_per_gpu_minute"] > 0     # a kernel's and the composite's
    assert ("gpu_busy_share" in part) == torch.cuda.is_available()
    assert kb.main(args) == 0
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["parts"][-1]["problems"] == [] and again["rows"] == data["rows"]


# ---- real_models --------------------------------------------------------------------------------------------


def test_real_models_writes_loadable_model_files_and_summarises_reports(tmp_path):
    real = load_script("real_models")
    settings = real.Settings(model="gpt2", top=1, budget=1, small=True, work=tmp_path, results=tmp_path / "r.json")
    text = real.write_model_file(settings).read_text()
    assert "n_layer=2" in text and "resid_pdrop=0.0" in text and "use_cache=False" in text
    assert "torch.randint(0, 128, (2, 16))" in text
    resnet = real.Settings(model="resnet18", top=1, budget=1, small=False, work=tmp_path, results=settings.results)
    assert "torch.randn(16, 3, 224, 224)" in real.write_model_file(resnet).read_text()
    report = {"end_to_end": {"speedup_vs_eager": 1.06, "speedup_vs_compile": None, "amdahl": 1.07,
                             "max_abs_error": 4e-6},
              "regions": [{"verdict": "used"}, {"verdict": "kept: slower"}]}
    assert real.summary(report) == ("1 of 2 regions used; 1.060x vs eager, unknown vs torch.compile, "
                                    "Amdahl 1.070x; max abs error 4e-06")
    assert real.summary({"exit_code": 2, "error": "bad"}) == "failed: bad"
    real.save_results(settings.results, {"gpt2": {"top": 1}})
    assert real.load_results(settings.results) == {"gpt2": {"top": 1}}


# ---- bench_wire ------------------------------------------------------------------------------------------


def test_bench_wire_reports_a_write_beside_its_two_parts(tmp_path):
    out = tmp_path / "wire.json"
    assert bench_wire.main(["--mb", "1", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"date", "machine", "torch", "folder", "rows"} <= set(result)
    (row,) = result["rows"]
    assert row["mb"] == 1 and row["write_values_s"] > 0 and row["raw_write_s"] > 0 and row["sha256_s"] > 0
    assert not list(Path(result["folder"]).glob("bench_wire.mkv"))     # its file is removed



# ---- precision_cost --------------------------------------------------------------------------------------

precision_cost = load_script("precision_cost")


def test_the_precision_cost_of_a_small_problem_is_measured_whole_and_a_large_one_sampled(tmp_path, monkeypatch):
    problem = SMALL / GEMM
    cost = precision_cost.measure(problem, torch.device("cpu"), tmp_path / "a")
    assert cost.measured and not cost.sampled and 0 < cost.eager_error_vs_fp64 < 1e-4
    assert cost.fp64_output_mib > 0 and cost.fp64_reference_s > 0 and cost.peak_gpu_mib is None
    monkeypatch.setattr(precision_cost.reference, "FP64_REFERENCE_BYTES", 0)  # every output is "too large"
    sampled = precision_cost.measure(problem, torch.device("cpu"), tmp_path / "b")
    assert sampled.measured and sampled.sampled and 0 < sampled.eager_error_vs_fp64 < 1e-4


# ---- generator_trees -------------------------------------------------------------------------------------

generator_trees = load_script("generator_trees")


def test_each_tree_s_kernel_comes_from_that_tree_s_own_generator(tmp_path):
    """The installed package must not stand in for a tree given on the command line (an editable install's
    finder would, ahead of sys.path)."""
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "mkevolve", tree / "mkevolve", ignore=shutil.ignore_patterns("__pycache__"))
    rows = [generator_trees.measure_tree(t, SMALL / GEMM, 0, generate_only=True) for t in (ROOT, tree)]
    assert [row["imported_from"] for row in rows] == [str(ROOT / "mkevolve"), str(tree / "mkevolve")]
    assert rows[0]["description"] == rows[1]["description"] != ""
