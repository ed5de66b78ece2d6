"""RunConfig: defaults, YAML, CLI overrides, unknown keys and bad values are errors."""

import pytest

from mkevolve.cli import build_parser
from mkevolve.config import ConfigError, RunConfig, build_config, config_from_args


def test_defaults_follow_the_method():
    config = RunConfig()
    assert (config.iterations, config.refine_every, config.budget, config.beam_width, config.tau) == (5, 2, 32, 4, 0.9)
    assert config.model == "builtin" and not config.fuse and not config.swap and config.trials == 5


def test_cli_overrides_yaml_overrides_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("iterations: 3\nbudget: 8\nfuse: true\n")
    args = build_parser().parse_args(["run", "p.py", "--config", str(path), "--budget", "16"])
    config = config_from_args(args)
    assert (config.iterations, config.budget, config.fuse, config.beam_width) == (3, 16, True, 4)


def test_unknown_yaml_key_is_an_error(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("iterations: 3\nbeam_widht: 2\n")
    with pytest.raises(ConfigError, match=r"run.yaml: unknown config key\(s\): beam_widht"):
        build_config(path)


@pytest.mark.parametrize("text, fragment", [
    ("iterations: many\n", "'iterations' must be int"),
    ("fuse: maybe\n", "'fuse' must be true or false"),
    ("- a list\n", "expected a mapping"),
    ("budget: 0\n", "'budget' must be at least 1"),
    ("search: greedy\n", "'search' must be one of beam, parallel"),
    ("iterations: [1\n", "not valid YAML"),
    ("precision_vs_eager: 0\n", "'precision_vs_eager' must be positive"),
])
def test_bad_values_name_the_key(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        build_config(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        build_config(tmp_path / "nope.yaml")


def test_every_flag_comes_from_a_field():
    fields = RunConfig.field_names()
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions
               if a.dest == "iterations")
    assert run.default is None and "default: 5" in run.help
    for action in build_parser()._subparsers._group_actions[0].choices["run"]._actions:
        if action.dest not in {"help", "problem", "resume", "config", "handler"}:
            assert action.dest in fields, action.dest


def test_yaml_round_trip(tmp_path):
    path = tmp_path / "saved.yaml"
    path.write_text(RunConfig(budget=7, swap=True).to_yaml())
    assert build_config(path) == RunConfig(budget=7, swap=True)
