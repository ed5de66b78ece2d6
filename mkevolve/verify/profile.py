"""Per-subkernel runtime inside an end-to-end forward, from CUDA events around each submodule call.

The solution runs in a candidate process like any candidate (candidate_run.py); the trusted worker
that asked only reads back the signed milliseconds, so a profiled solution cannot reach the worker
that later judges others.
"""

from __future__ import annotations

import secrets
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from mkevolve.problem import load_problem
from mkevolve.verify import autotune_memory, harness
from mkevolve.verify.candidate_run import (candidate_triton_cache, read_signed_report, scratch_folder,
                                          start_candidate)
from mkevolve.verify.reference import ReferenceSet, cache_root, reference_set
from mkevolve.verify.result import Rejected
from mkevolve.workers.gpu_share import gpu_alone

IMPLEMENTATIONS = "subkernel_implementations"
_WARMUP_RUNS = 3
_INPUT_SET = "time0"


@dataclass(frozen=True)
class SubkernelProfile:
    """Median milliseconds each subproblem's modules take in one end-to-end forward."""

    runtime_ms: dict[str, float]

    @property
    def shares(self) -> dict[str, float]:
        total = sum(self.runtime_ms.values())
        return {n: (t / total if total else 0.0) for n, t in self.runtime_ms.items()}


def profile_subkernels(problem_path: str, solution_path: str, seed: int = 0, eval_mode: bool = False,
                       runs: int = 20, timeout_s: float = 300.0) -> SubkernelProfile | None:
    """Trusted worker job. None without a GPU (interpreter times say nothing) or when the run failed."""
    if not torch.cuda.is_available():
        return None
    problem = load_problem(problem_path)
    reference = reference_set(cache_root(), problem, 0, seed, eval_mode, torch.device("cuda"))
    with reference.in_use():
        reference.ensure([_INPUT_SET])
        return _profile(reference, solution_path, seed, eval_mode, runs, timeout_s)


def _profile(reference: ReferenceSet, solution_path: str, seed: int, eval_mode: bool, runs: int,
             timeout_s: float) -> SubkernelProfile | None:
    key = secrets.token_bytes(32)
    request = harness.CandidateRequest(
        solution=str(Path(solution_path).resolve()), candidate_dir=str(Path(solution_path).resolve().parent),
        scratch="", key=key.hex(), device="cuda", eval_mode=eval_mode, construct_seed=seed,
        triton_cache="",
        configs=[harness.ConfigRun(str(reference.init_file),
                                   [harness.Call(str(reference.inputs_file(_INPUT_SET)))] * runs)])
    with scratch_folder("mkevolve-profile-") as scratch:
        request.scratch, request.triton_cache = scratch, str(candidate_triton_cache(Path(scratch)))
        try:
            start_candidate("mkevolve.verify.profile:profile_in_candidate", request, Path(scratch), timeout_s)
            body = read_signed_report(Path(scratch), key)
            runtime = {str(n): float(ms) for n, ms in body["runtime_ms"].items()}
        except (Rejected, KeyError, TypeError, ValueError, AttributeError):
            return None
    return SubkernelProfile(runtime)


# ---- in the candidate process ------------------------------------------------------------------------------


def profile_in_candidate(payload: str, prepared: harness.Standby | None = None) -> int:
    """The profile's side of a candidate process (`prepared`, the profiler a standby child started, just
    keeps recording: this run only reads CUDA events)."""
    request = harness.CandidateRequest.from_json(payload)
    key = bytes.fromhex(request.key)
    request.key = ""
    config = request.configs[0]
    init, inputs = harness.load_config(config, request.device)
    autotune_memory.use_choices(autotune_memory.known_choices(), request.device)   # tuned by the checks
    harness.prepare_and_confine(request)
    body: dict = {"runtime_ms": {}}
    try:
        model = harness.build(harness.import_candidate(request.solution), init, request, torch.device("cuda"))
        body["runtime_ms"] = _time_subkernels(model, inputs[config.calls[0].inputs], len(config.calls))
    except harness.CandidateFailure as failure:
        body["error"] = failure.message
    harness.write_report(request, body, key)
    return 0


def _time_subkernels(model: torch.nn.Module, inputs: list, runs: int) -> dict[str, float]:
    pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
    for module in model.modules():
        name = _subproblem_of(module)
        if name is not None:
            _attach(module, name, pending)
    totals: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        for _ in range(_WARMUP_RUNS):
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
    return {n: statistics.median(v) for n, v in totals.items()}


def _subproblem_of(module: torch.nn.Module) -> str | None:
    """The subproblem a module belongs to: the stem of its class's file in subkernel_implementations/."""
    source = getattr(type(module), "__module__", "")
    file = getattr(sys.modules.get(source), "__file__", None)
    if file and Path(file).parent.name == IMPLEMENTATIONS:
        return Path(file).stem
    return None


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
