"""One vocabulary of flags across commands: --out, -o, --config, YAML keys equal to flag names,
--X/--no-X, choices and positional help, per-command help, --resume against PROBLEM, --executor ray."""

import argparse
import errno
import importlib.util
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from mkevolve import orchestrator
from mkevolve.cli import build_parser, main
from mkevolve.config import ConfigError, RunConfig, build_config, config_from_args, load_yaml
from mkevolve.orchestrator import RunOutcome
from mkevolve.run_state import RunState

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "gemm_chain.py"
OTHER_PROBLEM = ROOT / "problems" / "conv_block.py"

SETTINGS_COMMANDS = ["check", "decompose", "solve", "run", "eval", "swap", "port"]
FOLDER_COMMANDS = ["decompose", "solve", "run", "port"]
# Enough positionals for each command to parse.
POSITIONALS = {"check": ["p.py", "s.py"], "decompose": ["p.py"], "solve": ["p.py"], "run": ["p.py"],
               "eval": ["best"], "swap": ["best", "k", "pytorch"], "port": ["best", "v.py"],
               "pack": ["best", "-o", "f.py"], "report": ["run"]}


def _commands() -> dict[str, argparse.ArgumentParser]:
    return build_parser()._subparsers._group_actions[0].choices


def _option(command: str, flag: str) -> argparse.Action:
    parser = _commands()[command]
    return next(a for a in parser._actions if flag in a.option_strings)


def _help(command: str, capsys) -> str:
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out


# ---- 1, 2: --out is a parent folder everywhere; -o is one file -----------------------------------------


@pytest.mark.parametrize("command", FOLDER_COMMANDS)
def test_every_folder_writing_command_takes_out_as_a_parent_with_its_default(command):
    action = _option(command, "--out")
    assert action.dest == "out" and action.default is None  # None: a YAML `out:` is not masked
    assert "parent folder" in action.help and "OUT/<" in action.help and "(default: outputs)" in action.help


@pytest.mark.parametrize("command", ["decompose", "solve"])
def test_dir_is_gone(command, tmp_path, capsys):
    assert main([command, str(PROBLEM), "--dir", str(tmp_path / "x")]) == 2
    assert "unrecognized arguments: --dir" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_pack_writes_one_file_with_o():
    args = build_parser().parse_args(["pack", "best", "-o", "flat.py"])
    assert args.output == "flat.py"
    assert not any("--out" in a.option_strings or "--config" in a.option_strings for a in _commands()["pack"]._actions)


# ---- 3: --config on every command with run settings, flags over the file ------------------------------


@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_config_file_on_every_settings_command_and_flags_win(command, tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("trials: 7\nseed: 4\neval: true\n")
    args = build_parser().parse_args([command, *POSITIONALS[command], "--config", str(path), "--trials", "3"])
    config = config_from_args(args)
    assert (config.trials, config.seed, config.eval_mode) == (3, 4, True)


@pytest.mark.parametrize("command", ["pack", "report"])
def test_commands_without_settings_take_no_config(command):
    assert build_parser().parse_known_args([command, *POSITIONALS[command], "--config", "x.yaml"])[1] == \
        ["--config", "x.yaml"]


def test_every_flag_name_is_its_yaml_key(tmp_path):
    """Each flag of each command, written as a YAML key (with _ or -), sets the same setting."""
    values = {bool: True, int: 3, float: 0.5, str: "parallel"}
    for command in SETTINGS_COMMANDS:
        for action in _commands()[command]._actions:
            if action.dest not in RunConfig.field_names():
                continue
            flag = next(s for s in action.option_strings if not s.startswith("--no-"))
            default = getattr(RunConfig(), action.dest)
            kind = str if default is None else type(default)  # api_base's None stands for a string
            value = list(action.choices)[-1] if action.choices else values[kind]
            for key in (flag[2:], flag[2:].replace("-", "_")):
                path = tmp_path / "one.yaml"
                path.write_text(f"{key}: {value}\n")
                assert load_yaml(path) == {action.dest: value}, (command, key)


def test_eval_is_the_key_and_the_old_eval_mode_key_is_an_alias(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("eval: true\n")
    assert build_config(path).eval_mode is True
    path.write_text("eval_mode: true\n")  # what every config.yaml written before the rename says
    assert build_config(path).eval_mode is True
    path.write_text("eval_mode: true\neval: false\n")
    with pytest.raises(ConfigError, match="'eval_mode' and 'eval' name the same setting"):
        build_config(path)
    saved = RunConfig(eval_mode=True).to_yaml()
    assert "eval: true" in saved and "eval_mode" not in saved


def test_a_key_written_twice_with_dash_and_underscore_is_an_error(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("beam_width: 2\nbeam-width: 3\n")
    with pytest.raises(ConfigError, match="'beam_width' and 'beam-width' name the same setting"):
        load_yaml(path)


def test_a_bad_value_names_the_public_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("eval: perhaps\n")
    with pytest.raises(ConfigError, match=r"run.yaml: 'eval' must be true or false"):
        build_config(path)


# ---- 4: every boolean setting can be switched off on the command line ---------------------------------


@pytest.mark.parametrize("name", [f.name for f in fields(RunConfig) if isinstance(f.default, bool)])
def test_a_yaml_true_is_switched_off_with_no_flag(name, tmp_path):
    flag = next(s for s in _option_for_dest("run", name).option_strings if not s.startswith("--no-"))
    path = tmp_path / "run.yaml"
    path.write_text(f"{flag[2:]}: true\n")
    on = config_from_args(build_parser().parse_args(["run", "p.py", "--config", str(path)]))
    off = config_from_args(build_parser().parse_args(["run", "p.py", "--config", str(path), "--no-" + flag[2:]]))
    assert getattr(on, name) is True and getattr(off, name) is False


def _option_for_dest(command: str, dest: str) -> argparse.Action:
    return next(a for a in _commands()[command]._actions if a.dest == dest)


# ---- 5, 6: choices, positional help, per-command help ---------------------------------------------------


def test_fixed_choices_are_shown_in_help(capsys):
    text = _help("run", capsys)
    assert "--search {beam,parallel,mcts}" in text and "--executor {local,ray}" in text
    assert "--fuse, --no-fuse" in text and "--swap, --no-swap" in text and "--eval, --no-eval" in text


def test_every_positional_has_help():
    for command, parser in _commands().items():
        for action in parser._actions:
            if not action.option_strings and action.dest != "help":
                assert action.help and len(action.help) > 10, (command, action.dest)


def test_budget_help_says_what_it_means_for_each_command():
    assert "per iteration" in _option("run", "--budget").help
    solve = _option("solve", "--budget").help
    assert "in total" in solve and "per iteration" not in solve and "subproblems" not in solve
    assert "one iteration" in _option("port", "--budget").help
    assert "per subproblem" not in _option("solve", "--beam-width").help
    assert "decomposition" in _option("decompose", "--out").help and "solve-" in _option("solve", "--out").help


# ---- 7: run PROBLEM --resume DIR must name the run's own problem --------------------------------------


def _run_dir(tmp_path: Path, problem: Path) -> Path:
    run_dir = tmp_path / "outputs" / problem.stem / "20250101-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(RunConfig(iterations=2).to_yaml().replace("eval:", "eval_mode:"))
    RunState(problem=str(problem.resolve()), run_id=run_dir.name).save(run_dir)
    return run_dir


@pytest.fixture
def resumed(monkeypatch) -> list:
    """Stands in for the run itself: records what it was given, and passes."""
    calls = []

    def fake_execute_run(problem_path, config, run_dir, state):
        calls.append((Path(problem_path), config))
        return RunOutcome(run_dir=Path(run_dir), passed=True, speedup=None, iterations=config.iterations), 0

    monkeypatch.setattr(orchestrator, "execute_run", fake_execute_run)
    return calls


def test_resume_with_another_problem_is_refused_naming_both(tmp_path, capsys, resumed):
    run_dir = _run_dir(tmp_path, PROBLEM)
    before = (run_dir / "config.yaml").read_text()
    assert main(["run", str(OTHER_PROBLEM), "--resume", str(run_dir), "--iterations", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mkevolve run: error: ")
    assert str(OTHER_PROBLEM) in err and str(PROBLEM.resolve()) in err
    assert not resumed and (run_dir / "config.yaml").read_text() == before  # nothing changed


def test_resume_with_its_own_problem_continues(tmp_path, resumed):
    run_dir = _run_dir(tmp_path, PROBLEM)
    assert main(["run", str(PROBLEM), "--resume", str(run_dir), "--iterations", "4"]) == 0
    assert resumed[0][0] == PROBLEM.resolve() and resumed[0][1].iterations == 4


def test_resume_with_a_copy_of_its_problem_continues(tmp_path, resumed):
    run_dir = _run_dir(tmp_path, PROBLEM)
    copy = tmp_path / "elsewhere" / PROBLEM.name
    copy.parent.mkdir()
    shutil.copy(PROBLEM, copy)
    assert main(["run", str(copy), "--resume", str(run_dir)]) == 0 and len(resumed) == 1


def test_resume_reads_an_old_config_and_layers_config_then_flags(tmp_path, resumed):
    run_dir = _run_dir(tmp_path, PROBLEM)
    settings = tmp_path / "more.yaml"
    settings.write_text("iterations: 6\nbudget: 9\neval: true\n")
    assert main(["run", "--resume", str(run_dir), "--config", str(settings), "--budget", "5"]) == 0
    config = resumed[0][1]
    assert (config.iterations, config.budget, config.eval_mode) == (6, 5, True)
    assert build_config(run_dir / "config.yaml") == config  # saved, with the new key


def test_a_full_disk_stops_the_run_with_one_line_and_a_failure_status(tmp_path, capsys, monkeypatch):
    def full_disk(problem_path, config, run_dir, state):
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "state.json"))

    monkeypatch.setattr(orchestrator, "execute_run", full_disk)
    assert main(["run", str(PROBLEM), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mkevolve run: error: ")
    assert "state.json: no space left on device" in err


# ---- 8: --executor ray without Ray ----------------------------------------------------------------------


@pytest.fixture
def no_ray(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr("mkevolve.config.importlib.util.find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))


def test_executor_ray_without_ray_is_one_line_and_leaves_nothing(tmp_path, capsys, no_ray, resumed):
    out = tmp_path / "outputs"
    assert main(["run", str(PROBLEM), "--executor", "ray", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mkevolve run: error: --executor ray needs Ray" in err
    assert not out.exists() and not resumed


def test_executor_ray_from_yaml_fails_the_same_before_decompose_writes(tmp_path, capsys, no_ray):
    settings = tmp_path / "ray.yaml"
    settings.write_text("executor: ray\n")
    out = tmp_path / "outputs"
    assert main(["decompose", str(PROBLEM), "--config", str(settings), "--out", str(out)]) == 2
    assert "--executor ray needs Ray" in capsys.readouterr().err and not out.exists()


def test_executor_ray_on_resume_changes_nothing(tmp_path, capsys, no_ray, resumed):
    run_dir = _run_dir(tmp_path, PROBLEM)
    before = (run_dir / "config.yaml").read_text()
    assert main(["run", "--resume", str(run_dir), "--executor", "ray"]) == 2
    assert "needs Ray" in capsys.readouterr().err
    assert (run_dir / "config.yaml").read_text() == before and not resumed


@pytest.mark.slow
def test_a_model_that_cannot_work_stops_run_before_it_makes_a_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("MKEVOLVE_API_KEY", raising=False)
    out = tmp_path / "outputs"
    for model in ("openai/gpt-4o", f"replay:{tmp_path / 'missing.yaml'}"):
        assert main(["run", str(PROBLEM), "--model", model, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mkevolve run: error: ")
    assert not out.exists()
