"""RunConfig: the one configuration record, its YAML form and the CLI flags derived from it."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config file or value that cannot be used; the message names the file and the key."""


def _opt(default, help: str, **meta):
    return field(default=default, metadata={"help": help, **meta})


@dataclass
class RunConfig:
    # The agent that writes decompositions and kernels.
    model: str = _opt("builtin", "LLM model string for litellm, 'builtin', 'replay:FILE' or 'exchange:DIR'")
    api_base: str | None = _opt(None, "base URL of the model's API (else the provider's default)")
    # Algorithm 1 and 2.
    iterations: int = _opt(5, "outer iterations T")
    budget: int = _opt(32, "LLM calls per iteration, shared among subproblems")
    beam_width: int = _opt(4, "beam width per subproblem")
    expansion: int = _opt(1, "children per beam member per step")
    refine_every: int = _opt(2, "refine the decomposition every L iterations")
    fuse: bool = _opt(False, "let the refinement step fuse subproblems")
    swap: bool = _opt(False, "swap subkernels slower than tau x torch.compile for their PyTorch code")
    tau: float = _opt(0.9, "swap threshold, as a fraction of torch.compile's speed")
    search: str = _opt("beam", "kernel search: beam or parallel", choices=("beam", "parallel"))
    decompose_attempts: int = _opt(3, "parallel decomposition attempts before the fallback")
    retries: int = _opt(2, "retries of a failed decomposition agent, each told why the last failed")
    # The verifier.
    trials: int = _opt(5, "random input sets per correctness check")
    timeout: float = _opt(300.0, "seconds one evaluation may take before its worker is killed")
    memory_limit_gb: float = _opt(16.0, "host memory (GiB) one candidate process may use before it is killed")
    eval_mode: bool = _opt(False, "compare modules in eval mode (running stats, no dropout)", flag="--eval")
    workers: int = _opt(0, "evaluation workers (0: one per GPU, or 2 on CPU); several per GPU share it")
    executor: str = _opt("local", "where evaluations run: local or ray", choices=("local", "ray"))
    llm_parallel: int = _opt(8, "LLM calls in flight at once")
    llm_timeout: float = _opt(600.0, "seconds one LLM call may take")
    # The run.
    out: str = _opt("outputs", "folder that holds run directories")
    seed: int = _opt(0, "seed for inputs, weights and the search")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def to_yaml(self) -> str:
        return yaml.safe_dump(dataclasses.asdict(self), sort_keys=False)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML config file; every key must be a RunConfig field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    unknown = sorted(set(data) - RunConfig.field_names())
    if unknown:
        raise ConfigError(f"{path}: unknown config key(s): {', '.join(unknown)}")
    return data


def _coerce(name: str, value, default, source: str):
    if default is None or value is None:
        return value
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{source}: '{name}' must be true or false, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: '{name}' must be {kind.__name__}, got {value!r}") from None


def build_config(yaml_path: str | Path | None = None, overrides: dict | None = None) -> RunConfig:
    """Defaults, then the YAML file, then explicit overrides (the CLI): later wins."""
    values: dict = {}
    if yaml_path is not None:
        values.update(load_yaml(yaml_path))
    unknown = sorted(set(overrides or {}) - RunConfig.field_names())
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)}")
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    defaults = RunConfig()
    source = str(yaml_path) if yaml_path else "config"
    for f in fields(RunConfig):
        if f.name in values:
            values[f.name] = _coerce(f.name, values[f.name], getattr(defaults, f.name), source)
    config = RunConfig(**values)
    validate(config)
    return config


def validate(config: RunConfig) -> None:
    positive = ("iterations", "budget", "beam_width", "expansion", "refine_every", "trials",
                "decompose_attempts", "llm_parallel")
    for name in positive:
        if getattr(config, name) < 1:
            raise ConfigError(f"config: '{name}' must be at least 1, got {getattr(config, name)}")
    if config.memory_limit_gb <= 0:
        raise ConfigError("config: 'memory_limit_gb' must be positive")
    if config.timeout <= 0 or config.llm_timeout <= 0:
        raise ConfigError("config: timeouts must be positive")
    if config.workers < 0 or config.retries < 0:
        raise ConfigError("config: 'workers' and 'retries' must be >= 0")
    if not 0 < config.tau <= 10:
        raise ConfigError(f"config: 'tau' must be in (0, 10], got {config.tau}")
    for f in fields(RunConfig):
        choices = f.metadata.get("choices")
        if choices and getattr(config, f.name) not in choices:
            raise ConfigError(f"config: '{f.name}' must be one of {', '.join(choices)}")


def add_config_flags(parser: argparse.ArgumentParser, names: list[str]) -> None:
    """Add one flag per named RunConfig field; defaults stay None so YAML values are not masked."""
    by_name = {f.name: f for f in fields(RunConfig)}
    defaults = RunConfig()
    for name in names:
        f = by_name[name]
        flag = f.metadata.get("flag", "--" + name.replace("_", "-"))
        help_text = f"{f.metadata['help']} (default: {getattr(defaults, name)})"
        if isinstance(getattr(defaults, name), bool):
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=help_text)
        else:
            kind = type(getattr(defaults, name)) if getattr(defaults, name) is not None else str
            parser.add_argument(flag, dest=name, type=kind, default=None, metavar=name.upper(),
                                choices=f.metadata.get("choices"), help=help_text)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    overrides = {k: v for k, v in vars(args).items() if k in RunConfig.field_names()}
    return build_config(getattr(args, "config", None), overrides)
