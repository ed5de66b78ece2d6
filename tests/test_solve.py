"""`mkevolve solve`: the monolithic baselines, through the library call and through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.replay_kernels.fakes import PROBLEM, FakeVerifier

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.llm.client import RetryPolicy, make_client
from mkevolve.problem import ProblemError
from mkevolve.solve import solve
from mkevolve.verify.result import EvalResult, Status

FIXTURES = PROBLEM.parent
SCRIPT = FIXTURES / "beam_script.yaml"


def test_solve_writes_the_best_kernel_candidates_and_token_count(tmp_path):
    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1, budget=4)
    out = tmp_path / "run"
    outcome = solve(PROBLEM, config, out, verifier=FakeVerifier())

    assert outcome.best.id == "c0003"
    assert (out / "solution.py").read_text() == outcome.best.source
    assert "# fixture: refined" in outcome.best.source
    assert sorted(p.name for p in (out / "candidates" / "relu_shift").iterdir()) == [
        f"c000{i}.{ext}" for i in range(4) for ext in ("json", "py")]
    tokens = json.loads((out / "tokens.json").read_text())
    assert tokens["total"] == {"prompt": 5900, "completion": 1130, "reasoning": 130} and tokens["calls"] == 4
    assert json.loads((out / "beam.json").read_text())["members"][0]["id"] == "c0003"
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events].count("llm_call") == 4 and events[-1]["kind"] == "llm_tokens"
    assert "beam_width: 1" in (out / "config.yaml").read_text()
    assert (out / "llm_cache").is_dir()


def test_solve_again_in_the_same_folder_pays_nothing(tmp_path):
    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1, budget=4)
    solve(PROBLEM, config, tmp_path, verifier=FakeVerifier())
    again = solve(PROBLEM, config, tmp_path, verifier=FakeVerifier())
    assert again.best.id == "c0003"
    assert again.tokens.calls == 0 and again.tokens.cached_calls == 4


def test_parallel_sampling_baseline(tmp_path):
    script = tmp_path / "samples.yaml"
    script.write_text("replies:\n" + "".join(f"  - {{agent: generate, reply_file: {FIXTURES / name}}}\n"
                                             for name in ("cheating.md", "debugged.md", "broken.md")))
    config = RunConfig(model=f"replay:{script}", beam_width=4, budget=3, search="parallel")
    verifier = FakeVerifier()
    outcome = solve(PROBLEM, config, tmp_path / "run", verifier=verifier)
    assert verifier.batches == [1, 1, 1] and outcome.best.kind == "generate"  # each reply checked as it is in
    assert "# fixture: debugged" in (tmp_path / "run" / "solution.py").read_text()
    assert all(m.parent is None for m in outcome.beam.members)


def test_a_problem_the_verifier_cannot_use_is_the_users_error(tmp_path):
    script = tmp_path / "one.yaml"
    script.write_text(f"replies:\n  - {{reply_file: {FIXTURES / 'debugged.md'}}}\n")
    config = RunConfig(model=f"replay:{script}", beam_width=1, budget=1)
    verdicts = {"debugged": EvalResult(status=Status.BAD_PROBLEM, reason="Model.forward raised")}
    verifier = FakeVerifier(verdicts)
    with pytest.raises(ProblemError, match="Model.forward raised"):
        solve(PROBLEM, config, tmp_path / "run", verifier=verifier)


def _solve_dir(outputs: Path) -> Path:
    """The one folder `solve --out OUTPUTS` wrote: OUTPUTS/<problem>/solve-<search>-<time>/."""
    (folder,) = (outputs / PROBLEM.stem).glob("solve-beam-*")
    return folder


@pytest.mark.slow
def test_cli_solves_with_the_real_verifier(tmp_path, capsys):
    code = main(["solve", str(PROBLEM), "--model", f"replay:{SCRIPT}", "--budget", "2", "--beam-width", "1",
                 "--workers", "1", "--out", str(tmp_path / "outputs")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    out = _solve_dir(tmp_path / "outputs")
    assert "solved: c0001" in printed and "2 LLM call(s)" in printed
    assert "# fixture: debugged" in (out / "solution.py").read_text()
    assert json.loads((out / "candidates" / "relu_shift" / "c0000.json").read_text())["result"]["status"] == \
        "compile_error"


def test_cli_exits_1_when_no_kernel_passes_and_leaves_no_solution(tmp_path, capsys, monkeypatch):
    script = tmp_path / "prose.yaml"
    script.write_text(f"replies:\n  - {{reply_file: {FIXTURES / 'no_code.md'}}}\n"
                      f"  - {{reply_file: {FIXTURES / 'no_code.md'}}}\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "solution.py").write_text("# left by an earlier run\n")
    monkeypatch.setattr("mkevolve.solve.default_out_dir", lambda config, problem: out)
    code = main(["solve", str(PROBLEM), "--model", f"replay:{script}", "--budget", "2", "--workers", "1"])
    assert code == 1
    assert f"no kernel passed every check; candidates are in {out / 'candidates'}" in capsys.readouterr().out
    assert not (out / "solution.py").exists()
    assert len(list((out / "candidates" / "relu_shift").glob("*.json"))) == 2


def test_cli_rejects_an_unusable_model_in_one_line_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "outputs"
    code = main(["solve", str(PROBLEM), "--model", f"replay:{tmp_path / 'absent.yaml'}", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "absent.yaml does not exist" in err
    assert not out.exists()


def test_cli_rejects_a_missing_problem(tmp_path, capsys):
    code = main(["solve", str(tmp_path / "nope.py"), "--out", str(tmp_path / "outputs")])
    assert code == 2 and "no such file" in capsys.readouterr().err


def test_a_given_client_is_used_as_it_is(tmp_path):
    config = RunConfig(model=f"replay:{SCRIPT}", beam_width=1, budget=1)
    client = make_client(config, retry=RetryPolicy(attempts=1))
    outcome = solve(PROBLEM, config, tmp_path, verifier=FakeVerifier(), client=client)
    assert outcome.best is None and client.provider_calls == 1 and client.cache is None
    assert not Path(tmp_path / "solution.py").exists()


@pytest.mark.slow
def test_cli_solves_offline_with_the_builtin_agent(tmp_path, capsys):
    kernels = pytest.importorskip("mkevolve.builtin.kernels")
    if not hasattr(kernels, "generate_kernel"):
        pytest.skip("the builtin kernel generator is not present")
    code = main(["solve", str(PROBLEM), "--model", "builtin", "--budget", "2", "--beam-width", "2",
                 "--workers", "1", "--out", str(tmp_path / "outputs")])
    assert code == 0, capsys.readouterr().out
    out = _solve_dir(tmp_path / "outputs")
    assert "@triton.jit" in (out / "solution.py").read_text()
    first = json.loads((out / "candidates" / "relu_shift" / "c0000.json").read_text())
    assert first["kind"] == "generate" and first["result"]["status"] == "ok"
    tokens = json.loads((out / "tokens.json").read_text())
    assert tokens["total"] == {"prompt": 0, "completion": 0, "reasoning": 0} and tokens["calls"] == 2
