"""Per-subkernel runtime inside an end-to-end forward, from CUDA events around each submodule call."""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from mkevolve.problem import build_model, call_inputs, import_file, load_problem, make_inputs
from mkevolve.verify.correctness import fp32_strict
from mkevolve.workers.gpu_share import gpu_alone

IMPLEMENTATIONS = "subkernel_implementations"


@dataclass(frozen=True)
class SubkernelProfile:
    """Median milliseconds each subproblem's modules take in one end-to-end forward."""

    runtime_ms: dict[str, float]

    @property
    def shares(self) -> dict[str, float]:
        total = sum(self.runtime_ms.values())
        return {n: (t / total if total else 0.0) for n, t in self.runtime_ms.items()}


def _subproblem_of(module: torch.nn.Module) -> str | None:
    """The subproblem a module belongs to: the stem of its class's file in subkernel_implementations/."""
    source = getattr(type(module), "__module__", "")
    file = getattr(sys.modules.get(source), "__file__", None)
    if file and Path(file).parent.name == IMPLEMENTATIONS:
        return Path(file).stem
    return None


def profile_subkernels(problem_path: str, solution_path: str, seed: int = 0,
                       eval_mode: bool = False, runs: int = 20) -> SubkernelProfile | None:
    """Worker job. None without a GPU: interpreter times say nothing about the kernels."""
    if not torch.cuda.is_available():
        return None
    fp32_strict()
    problem = load_problem(problem_path)
    config = problem.configs[0]
    init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
    cls = import_file(solution_path, prefix="mkevolve_profiled").ModelNew
    model = build_model(Path(solution_path), cls, init, seed, torch.device("cuda"), eval_mode, "ModelNew")
    inputs = make_inputs(problem.path, config, seed + 1, torch.device("cuda"))
    pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
    for module in model.modules():
        name = _subproblem_of(module)
        if name is not None:
            _attach(module, name, pending)
    totals: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        torch.cuda.synchronize()
        pending.clear()
        with gpu_alone():
            for _ in range(runs):
                model(*inputs)
                torch.cuda.synchronize()
                per_run: dict[str, float] = defaultdict(float)
                for name, start, end in pending:
                    per_run[name] += start.elapsed_time(end)
                pending.clear()
                for name, ms in per_run.items():
                    totals[name].append(ms)
    return SubkernelProfile({n: statistics.median(v) for n, v in totals.items()})


def _attach(module: torch.nn.Module, name: str, pending: list) -> None:
    def before(_module, _args):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        module._mkevolve_start = start

    def after(_module, _args, _output):
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        pending.append((name, module._mkevolve_start, end))

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)
