"""scripts/search_compare.py: the summary per search, the results file and its resume, with fake rows (no
real runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "tests" / "fixtures" / "replay_run"
MACHINE = {"date": "2026-12-01", "gpu": "cpu", "torch": "2.5.0", "triton": "3.1.0", "python": "3.11.9"}


sc = load_script("search_compare")


def rows() -> list:
    Row = sc.Row
    return [
        Row("a.py", "beam", exit_code=0, best=True, correct=True, speedup=2.0, llm_calls=8, wall_s=10.0),
        Row("a.py", "mcts", exit_code=0, best=True, correct=True, speedup=4.0, llm_calls=6, wall_s=12.0),
        Row("b.py", "beam", exit_code=0, best=True, correct=True, speedup=0.5, llm_calls=8, wall_s=20.0),
        Row("b.py", "mcts", exit_code=0, best=True, correct=True, speedup=None, llm_calls=None, wall_s=21.0),
        Row("c.py", "beam", exit_code=1, best=False, correct=False, speedup=None, llm_calls=8, wall_s=30.0),
        Row("c.py", "mcts", exit_code=1, best=True, correct=False, speedup=3.0, llm_calls=7, wall_s=None),
    ]


def test_summary_counts_correct_runs_and_takes_the_geomean_of_the_timed_correct_ones():
    summary = sc.summarize(rows())
    assert list(summary) == ["beam", "mcts"]
    beam, mcts = summary["beam"], summary["mcts"]
    assert (beam.runs, beam.correct, beam.fraction_correct) == (3, 2, pytest.approx(2 / 3))
    assert (beam.measured, beam.geomean_speedup) == (2, pytest.approx(1.0))          # sqrt(2.0 * 0.5)
    assert (beam.llm_calls, beam.wall_s) == (24, 60.0)
    # b.py was not timed (unknown, not 0) and c.py's speedup belongs to an incorrect run: neither counts.
    assert (mcts.runs, mcts.correct, mcts.measured, mcts.geomean_speedup) == (3, 2, 1, pytest.approx(4.0))
    assert (mcts.llm_calls, mcts.wall_s) == (13, 33.0)
    assert "2 of 3 correct (67%)" in sc.summary_line(beam) and "1.00x over 2 timed" in sc.summary_line(beam)


def test_a_search_with_nothing_timed_has_an_unknown_geomean():
    untimed = [sc.Row("a.py", "mcts", correct=True), sc.Row("b.py", "mcts", correct=False)]
    (summary,) = sc.summarize(untimed).values()
    assert summary.geomean_speedup is None and summary.measured == 0 and summary.fraction_correct == 0.5
    assert "unknown over 0 timed" in sc.summary_line(summary)
    assert sc.summarize([]) == {}


def test_main_writes_rows_summary_and_machine_then_resumes_without_rerunning(tmp_path):
    problems = [PROBLEMS / "sharp_sigmoid.py", PROBLEMS / "kernel_scale.md"]   # any files will do: nothing runs
    made = []

    def fake_run(problem: Path, search: str):
        made.append((problem.name, search))
        timed = search == "mcts"
        return sc.Row(sc.problem_key(problem), search, exit_code=0, best=True, correct=True,
                      speedup=1.5 if timed else None, llm_calls=4, wall_s=1.0)

    out = tmp_path / "results.json"
    argv = ["--problems", *map(str, problems), "--budget", "4", "--out", str(out), "--work", str(tmp_path)]
    assert sc.main(argv, run=fake_run, environment=MACHINE) == 0
    assert made == [("sharp_sigmoid.py", "beam"), ("sharp_sigmoid.py", "mcts"), ("kernel_scale.md", "beam"),
                    ("kernel_scale.md", "mcts")]
    data = json.loads(out.read_text())
    assert {k: data[k] for k in MACHINE} == MACHINE
    assert data["settings"] == {"model": "builtin", "budget": 4, "iterations": 1, "run_args": []}
    assert [(r["problem"], r["search"]) for r in data["rows"]] == [
        ("tests/fixtures/replay_run/sharp_sigmoid.py", "beam"), ("tests/fixtures/replay_run/sharp_sigmoid.py", "mcts"),
        ("tests/fixtures/replay_run/kernel_scale.md", "beam"), ("tests/fixtures/replay_run/kernel_scale.md", "mcts")]
    assert data["summary"]["beam"]["geomean_speedup"] is None                        # unknown, never 0
    assert math.isclose(data["summary"]["mcts"]["geomean_speedup"], 1.5)
    assert data["summary"]["mcts"]["fraction_correct"] == 1.0 and data["summary"]["beam"]["llm_calls"] == 8

    assert sc.main(argv, run=fake_run, environment=MACHINE) == 0                     # all done: nothing runs
    assert len(made) == 4 and json.loads(out.read_text())["rows"] == data["rows"]
    with pytest.raises(SystemExit, match="another --out"):
        sc.main([*argv[:3], "--budget", "8", *argv[5:]], run=fake_run, environment=MACHINE)
