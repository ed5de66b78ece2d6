"""Load and validate KernelBench-form problem files; every failure is one line naming the file."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from mkevolve.problem_error import ProblemError  # noqa: F401  (raised here; imported from here by most)
from mkevolve.pysource import parse_python


@dataclass(frozen=True)
class InputConfig:
    """One instantiation of a problem's Model: how it is built and what it is called with."""

    get_init_inputs: Callable[[], Any]
    get_inputs: Callable[[], Any]


@dataclass
class Problem:
    path: Path
    source: str
    module: ModuleType
    model_cls: type[nn.Module]
    configs: list[InputConfig]

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


_counter = itertools.count()


def read_source(path: str | Path) -> str:
    """The file's text, after the checks that need no execution."""
    path = Path(path)
    if not path.exists():
        raise ProblemError(path, "no such file")
    if path.is_dir():
        raise ProblemError(path, "is a folder, expected a Python file")
    try:
        source = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProblemError(path, f"not UTF-8 text (byte {err.start})") from None
    if not source.strip():
        raise ProblemError(path, "file is empty")
    try:
        parse_python(source, filename=str(path))
    except SyntaxError as err:
        raise ProblemError(path, f"syntax error at line {err.lineno}: {err.msg}") from None
    return source


def import_file(path: str | Path, prefix: str = "mkevolve_user") -> ModuleType:
    """Execute a Python file as a fresh module with a unique name; sibling imports stay local."""
    path = Path(path).resolve()
    read_source(path)
    name = f"{prefix}_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look a module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise ProblemError(path, f"syntax error at line {err.lineno}: {err.msg}") from None
    except Exception as err:
        sys.modules.pop(name, None)
        raise ProblemError(path, f"import failed: {type(err).__name__}: {err}") from None
    return module


def load_problem(path: str | Path) -> Problem:
    """Import a problem file and check its shape: Model, get_inputs, get_init_inputs, configs."""
    path = Path(path)
    source = read_source(path)
    module = import_file(path, prefix="mkevolve_problem")
    model_cls = getattr(module, "Model", None)
    if model_cls is None:
        raise ProblemError(path, "defines no class named Model")
    if not (isinstance(model_cls, type) and issubclass(model_cls, nn.Module)):
        raise ProblemError(path, "Model is not a subclass of torch.nn.Module")
    return Problem(path=path, source=source, module=module, model_cls=model_cls,
                   configs=_input_configs(path, module))


def _input_configs(path: Path, module: ModuleType) -> list[InputConfig]:
    if hasattr(module, "get_input_configs"):
        try:
            raw = module.get_input_configs()
        except Exception as err:
            raise ProblemError(path, f"get_input_configs() raised {type(err).__name__}: {err}") from None
        if not isinstance(raw, (list, tuple)) or not raw:
            raise ProblemError(path, "get_input_configs() must return a non-empty list of dicts")
        configs = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict) or not all(
                callable(entry.get(k)) for k in ("get_init_inputs", "get_inputs")
            ):
                raise ProblemError(path, f"get_input_configs()[{i}] must be a dict with callables "
                                         "'get_init_inputs' and 'get_inputs'")
            configs.append(InputConfig(entry["get_init_inputs"], entry["get_inputs"]))
        return configs
    missing = [n for n in ("get_inputs", "get_init_inputs") if not callable(getattr(module, n, None))]
    if missing:
        raise ProblemError(path, f"missing function(s): {', '.join(missing)}")
    return [InputConfig(module.get_init_inputs, module.get_inputs)]


def fp32_strict() -> None:
    """How every reference runs, and every candidate process: fp32 with TF32 off for matmuls and cuDNN.
    PyTorch's own default lets cuDNN convolutions use TF32 (10 mantissa bits), enough for a deep network's
    PyTorch code to fail the end-to-end check against itself."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def call_inputs(path: Path, fn: Callable[[], Any], what: str) -> list:
    """Call get_inputs / get_init_inputs and insist on a list or tuple."""
    try:
        value = fn()
    except Exception as err:
        raise ProblemError(path, f"{what}() raised {type(err).__name__}: {err}") from None
    if not isinstance(value, (list, tuple)):
        raise ProblemError(path, f"{what}() must return a list or tuple, got {type(value).__name__}")
    return list(value)


def describe_inputs(problem: Problem) -> list[str]:
    """How the problem is called, for prompts: per input config, its forward inputs and constructor arguments
    as dtype[shape] (other values by repr), drawn on the meta device so no (possibly huge) tensor is made."""
    calls = []
    for config in problem.configs:
        with torch.device("meta"):
            calls.append((call_inputs(problem.path, config.get_inputs, "get_inputs"),
                          call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")))
    return describe_calls(calls)


def describe_calls(calls: list[tuple[list, list]]) -> list[str]:
    """describe_inputs' lines from (forward inputs, constructor arguments) already made, one pair per config."""
    prefixes = [f"config {index}: " if len(calls) > 1 else "" for index in range(len(calls))]
    return [f"{prefix}forward({_describe(inputs)}), constructed with ({_describe(init)})"
            for prefix, (inputs, init) in zip(prefixes, calls)]


def _describe(values: list) -> str:
    parts = []
    for value in values:
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            parts.append(f"{str(value.dtype).removeprefix('torch.')}[{', '.join(map(str, value.shape))}]")
        else:
            parts.append(repr(value)[:60])
    return ", ".join(parts)


def to_device(values: list, device: torch.device) -> list:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def build_model(path: Path, cls: type[nn.Module], init_inputs: list, seed: int,
                device: torch.device, eval_mode: bool, what: str = "Model") -> nn.Module:
    """Seed, construct, move: the same seed gives Model and ModelNew the same weights."""
    seed_everything(seed)
    try:
        model = cls(*init_inputs)
    except Exception as err:
        raise ProblemError(path, f"{what}(*get_init_inputs()) raised {type(err).__name__}: {err}") from None
    model = model.to(device)
    return model.eval() if eval_mode else model


def make_inputs(path: Path, config: InputConfig, seed: int, device: torch.device, made_there: bool = False) -> list:
    """get_inputs() under `seed`, its tensors moved to `device`. With `made_there`, its tensor factories make
    them on `device` itself: on a GPU a full-size set (2 GB) is drawn in milliseconds where the CPU took seconds,
    with other values (the GPU's random stream), so only for checks that give two models the same inputs; on
    the meta device, shapes and dtypes without values. A get_inputs that cannot run so (one that reads a value
    back) runs as without it."""
    if made_there and device.type != "cpu":
        seed_everything(seed)
        try:
            with torch.device(device):
                return to_device(call_inputs(path, config.get_inputs, "get_inputs"), device)
        except Exception:  # noqa: BLE001  (only a shortcut: made on the CPU below, where an error is reported)
            pass
    seed_everything(seed)
    return to_device(call_inputs(path, config.get_inputs, "get_inputs"), device)


def check_reference(problem: Problem, device: torch.device, eval_mode: bool, seed: int = 0) -> None:
    """Construct every config and call forward twice on the same inputs; the outputs must agree.

    A forward that draws random numbers (active dropout, rand_like) or keeps state between calls
    gives a different answer the second time, and no kernel can be checked against it.
    """
    for config in problem.configs:
        init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
        model = build_model(problem.path, problem.model_cls, init, seed, device, eval_mode)
        inputs = make_inputs(problem.path, config, seed + 1, device, made_there=True)
        try:
            with torch.no_grad():
                first = flatten_outputs(model(*clone_values(inputs)))
                second = flatten_outputs(model(*clone_values(inputs)))
        except Exception as err:
            raise ProblemError(problem.path, f"Model.forward raised {type(err).__name__}: {err}") from None
        if not same_outputs(first, second, _REPEAT_TOL):
            hint = ""
            if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
                   for m in model.modules()):
                hint = "; active dropout is the cause: compare in eval mode with --eval"
            raise ProblemError(problem.path, "the reference is non-deterministic (two calls on the same "
                                             f"inputs and weights differ), so it cannot be verified{hint}")
        _check_shifted_inputs(problem, model, inputs)


def _check_shifted_inputs(problem: Problem, model: nn.Module, inputs: list) -> None:
    """Timed calls get their inputs' values in another order (shifted_values), so that no two calls share
    inputs: a Model that cannot run on them (one that needs a positive-definite matrix) cannot be timed."""
    try:
        with torch.no_grad():
            model(*shifted_values(inputs, 1))
    except Exception as err:
        raise ProblemError(problem.path, f"Model.forward raised {type(err).__name__} on its inputs' values in another "
                                         f"order ({err}); timed calls get them so, so that no two calls share "
                                         "inputs: inputs whose values must keep a structure (a positive-definite "
                                         "matrix, sorted values) are not supported") from None


def clone_values(values: list) -> list:
    """Fresh copies of the tensors among forward's arguments, so a call that writes into them harms no other."""
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def shifted_values(values: list, shift: int) -> list:
    """Copies of forward's arguments with every floating-point tensor's elements moved `shift` places toward the
    front of its flattened order, wrapping: element i of the copy is element (i + shift) % n of the original.
    The same values in another order, so a timed call costs what any call costs, yet no two calls share inputs.
    Other tensors, tensors not contiguous, and any tensor at shift 0 are plain copies, as `clone_values` makes
    (the harness makes the same ones from C)."""
    def shifted(v: torch.Tensor) -> torch.Tensor:
        step = shift % v.numel() if v.numel() else 0
        if not step or not v.is_floating_point() or not v.is_contiguous():
            return v.clone()
        return torch.roll(v.reshape(-1), -step).reshape(v.shape)

    return [shifted(v) if isinstance(v, torch.Tensor) else v for v in values]


def flatten_outputs(out: Any) -> list:
    """A forward's result as a flat list: a tensor, or a tuple/list of them (nested allowed); a mapping (a
    model-output record) by its values."""
    if isinstance(out, Mapping):
        return [x for value in out.values() for x in flatten_outputs(value)]
    if isinstance(out, (tuple, list)):
        return [x for item in out for x in flatten_outputs(item)]
    return [out]


# Two calls of a reference may differ by rounding (atomics in cuDNN's transposed convolutions on a GPU);
# ten times below the verifier's tolerance that is noise, above it the reference draws random numbers.
_REPEAT_TOL = 1e-5


def same_outputs(expected: list, got: list, tolerance: float) -> bool:
    """Whether two flattened outputs agree: tensors of equal shape within atol = rtol = `tolerance` (relative to
    `expected`), anything else equal."""
    if len(expected) != len(got):
        return False
    for x, y in zip(expected, got):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or not torch.allclose(y, x, rtol=tolerance, atol=tolerance, equal_nan=True):
                return False
        elif x != y:
            return False
    return True
