r"""The benchmark of record: `mkevolve run` over a KernelBench folder, one problem after another, in parts.

On the GPU machine, from the repository root, one part per command (a part fits a 10-minute command). Keep
the results file in the working tree, not under the git-ignored outputs/, and bring it back after each part:
the next part may run on a fresh machine, and the file is what it resumes from.

    PYTHONPATH=. python3 scripts/kernelbench.py --time-limit 540 \
        --results scripts/results/kernelbench_h200.json && cp scripts/results/kernelbench_h200.json $OUT/
    # again, with the returned file in scripts/results/, until it prints "all 37 problems finished"
    python3 scripts/kernelbench_report.py scripts/results/kernelbench_h200.json \
        --markdown docs/kernelbench_h200.md --svg docs/kernelbench_h200.svg     # the README's Results

For each problem it runs

    python -m mkevolve run PROBLEM --model builtin --iterations 1 --budget 8 --out WORK/runs/<level>

then reads the run directory (best/manifest.yaml, state.json, events.jsonl), packs best/ into one
KernelBench-style file (`python -m mkevolve pack`) and times it in a fresh process against the problem's
own Model, eager and under torch.compile (`--measure`, the function `measure` below). Every finished
problem is written to the results file at once, so a part that stops (time limit, kill) loses at most the
problem in progress, and running the same command again skips what is done.

Parts: a part stops starting problems when the next one would not fit in --time-limit, judged from the
median time of the problems finished so far (this part's and earlier parts'). The first problem of a part
always starts. Each run gets `--time-budget`: the part's time left less --run-reserve (200 s), so its
searches stop asking for kernels while there is still time to finish the check in progress, compose best/
(subproblems without a kernel keep their PyTorch code), check it end to end and time it; a row whose
searches were cut says so (time_budget_spent), as does one whose search had candidates without a verdict
(no_verdict: their check never ran, with lanes mostly because other runs held the GPU's memory). A step
that runs into the limit anyway is stopped. A stopped `mkevolve run` is resumed by the next part
(`mkevolve run --resume`: subproblems already evolved and candidates already checked are kept), up to
MAX_RUN_PARTS parts in all, after which the problem is recorded as over the limit; its run_s adds up the
parts. A stopped timing is retried at the start of the next part, unless it already had a whole part to
itself. A run directory gone with its machine starts the problem afresh. Each part's record keeps its
wall time, the verdicts its runs reached in it (and per GPU-minute) and, with CUDA, the GPUs' utilisation
sampled every 0.5 s by nvidia-smi: the share of samples in which a kernel ran, and the mean.

Lanes: with --lanes N, N problems run at once, lane i on visible GPU i mod (number of GPUs), each run and
its timing given that one GPU. Problems on one GPU share its untimed work; every timed section, the runs'
own and this script's rounds, takes that GPU's lock alone (mkevolve/workers/gpu_share.py), so no timing
overlaps another problem's kernels. On the H200 machine (16 cores, 128 GiB, 64 GB of disk) 3 or 4 lanes
of level 2 ran well; 6 full-size level 3 models at once lost the machine. Lanes share the disk too: the
verifier's reference sets of 4 full-size level 3 convolution models reached 51 to 60 GB within 7 minutes.
The cache evicts what no check holds (mkevolve/verify/reference.py), which kept that last part running;
but 4 such models on one GPU also ran one of them out of GPU memory, and none finished an iteration in
530 s. Give full-size convolution models one or two lanes per GPU.

Timing (CUDA only): eager, torch.compile and the packed solution in one process, on the same inputs and
weights, in --rounds alternating rounds (the order rotates each round) of the verifier's `time_forward`
(10 warm-ups, 100 timed runs or at least 20 adding up to 1 s, L2 flushed, CUDA events); each side's time
is the median of its round medians, so drift over the minutes a problem takes falls on all three alike.
Without CUDA nothing is timed and the speedups are null, never a made-up number; the errors against an
fp64 reference (the same Model and weights in float64) are measured on any device.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import date
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
# ../shared/kernelbench beside the checkout; a copy of the tree on the GPU machine may carry it inside, as shared/.
DEFAULT_KERNELBENCH = next((p for p in (ROOT / "shared" / "kernelbench", ROOT.parent / "shared" / "kernelbench")
                            if p.is_dir()), ROOT.parent / "shared" / "kernelbench")
DEFAULT_WORK = ROOT / "outputs" / "kernelbench"
DEFAULT_ROUNDS = 5
KILL_GRACE_S = 15            # after SIGINT, seconds a run gets to stop its workers before SIGKILL
MAX_RUN_PARTS = 3            # parts one `mkevolve run` may span (resumed at the start of each next part)
# --run-reserve: seconds of the part kept, after a run's --time-budget, for what follows its searches: the check
# in progress then (one full-size evaluation: up to about 100 s), composing best/ and its end-to-end check (one
# more), packing, and this script's timing (35 to 80 s on the H200)
DEFAULT_RUN_RESERVE_S = 200.0
MIN_RUN_BUDGET_S = 60.0      # a run given less than this would end before its first kernel was checked


# ---- rows and the results file ---------------------------------------------------------------------------


@dataclass
class Row:
    """One problem's outcome. None means not known (not measured, no CUDA, the run failed first)."""

    problem: str                          # relative to the KernelBench folder: "level2/63_Gemm_ReLU_Divide.py"
    finished: bool = False                # False: run done, timing still to do (the next part does it)
    run_dir: str | None = None
    exit_code: int | None = None          # of `mkevolve run`: 0 best/ holds a verified solution
    correct: bool | None = None           # best/ passed the end-to-end check
    all_triton: bool | None = None        # every subkernel of best/ is a Triton kernel
    subkernels: int | None = None
    pytorch_subkernels: list[str] = field(default_factory=list)
    speedup_vs_compile: float | None = None   # compile_ms / solution_ms, this script's timing
    speedup_vs_eager: float | None = None     # eager_ms / solution_ms
    eager_ms: float | None = None
    compile_ms: float | None = None
    solution_ms: float | None = None
    err_solution: float | None = None     # max |solution - fp64 reference|, fp32 inputs and weights
    err_eager: float | None = None        # max |eager fp32 - fp64 reference|: the error fp32 itself makes
    run_speedup: float | None = None      # the run's own end-to-end figure (the verifier's, vs torch.compile)
    llm_calls: int | None = None          # calls that reached the model (cache hits left out)
    tokens: int | None = None             # prompt + completion + reasoning
    run_s: float | None = None            # wall time of `mkevolve run`, seconds (over all its parts)
    run_parts: int | None = None          # parts the run spanned: more than 1 when a part's limit stopped it
    time_budget_s: float | None = None    # the --time-budget the run's last part gave it (--run-reserve)
    time_budget_spent: bool | None = None  # its searches stopped asking for kernels at that budget
    no_verdict: int | None = None         # the search's candidates that got no verdict (their check never ran)
    measure_s: float | None = None        # wall time of pack + timing, seconds
    wall_s: float | None = None           # run_s + measure_s
    anchor_eager_ms: float | None = None  # anchors_h200.tsv, for a sanity check of our eager/compile times
    anchor_compile_ms: float | None = None
    note: str = ""                        # why something is unknown or failed


def rows_of(data: dict, row_type: type) -> list:
    """A results file's rows, taken out of `data`, as `row_type`; fields this version does not know are
    dropped (a file written by a later version still loads)."""
    known = {f.name for f in fields(row_type)}
    return [row_type(**{k: v for k, v in r.items() if k in known}) for r in data.pop("rows", [])]


@dataclass
class Results:
    meta: dict
    rows: dict[str, Row]

    @classmethod
    def load(cls, path: Path) -> "Results | None":
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(meta=data, rows={row.problem: row for row in rows_of(data, Row)})

    def save(self, path: Path) -> None:
        """Written whole to a temporary file and renamed, so a kill never leaves half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**self.meta, "rows": [asdict(self.rows[k]) for k in sorted(self.rows, key=problem_order)]}
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, path)

    def durations(self) -> list[float]:
        return [r.wall_s for r in self.rows.values() if r.finished and r.wall_s is not None]


def environment() -> dict:
    import torch
    import triton

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"date": date.today().isoformat(), "gpu": gpu, "torch": str(torch.__version__),
            "triton": triton.__version__, "python": platform.python_version()}


def problem_order(key: str) -> tuple:
    """level2/7_X before level2/11_Y: by level, then by the problem's number."""
    level, _, name = key.rpartition("/")
    number = re.match(r"\d+", name)
    return (level, int(number.group()) if number else math.inf, name)


def read_anchors(kernelbench: Path) -> dict[str, dict[str, float]]:
    """anchors_h200.tsv: file, eager_ms, compile_ms, floor_ms, gflop, MB (H200, fp32, TF32 off)."""
    path = kernelbench / "anchors_h200.tsv"
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        rows = csv.DictReader(f, delimiter="\t")
        return {r["file"]: {k: float(v) for k, v in r.items() if k != "file"} for r in rows}


# ---- reading a run directory -----------------------------------------------------------------------------


@dataclass
class RunInfo:
    correct: bool = False
    all_triton: bool | None = None
    subkernels: int | None = None
    pytorch_subkernels: list[str] = field(default_factory=list)
    run_speedup: float | None = None
    llm_calls: int | None = None
    tokens: int | None = None
    time_budget_spent: bool | None = None
    no_verdict: int | None = None
    note: str = ""


def run_events(run_dir: Path) -> list[dict]:
    """A run's events; none where it wrote no events.jsonl."""
    from mkevolve.events import read_event_lines

    path = run_dir / "events.jsonl"
    return read_event_lines(path) if path.is_file() else []


def read_run(run_dir: Path) -> RunInfo:
    """What a finished (or stopped) run left: best/manifest.yaml first, state.json where it has none."""
    from mkevolve.run_state import RunState, StateError
    from mkevolve.solution import Manifest, SolutionError

    info = RunInfo()
    try:
        state = RunState.load(run_dir)
    except StateError as err:
        state, info.note = None, str(err)
    best = run_dir / "best"
    try:
        manifest = Manifest.read(best)
    except SolutionError:
        manifest = None
    if manifest is not None and manifest.status == "ok":
        coverage = manifest.coverage
        info.correct, info.run_speedup = True, manifest.speedup
        info.subkernels, info.pytorch_subkernels = len(coverage.names), coverage.pytorch
        info.all_triton = coverage.complete
    elif state is not None and state.best_iteration is not None:
        record = next(h for h in state.history if h.index == state.best_iteration)
        info.correct, info.run_speedup = True, record.e2e_speedup
        info.subkernels, info.pytorch_subkernels = len(record.subproblems), list(record.pytorch)
        info.all_triton = not record.pytorch
    elif state is not None:
        last = state.history[-1] if state.history else None
        info.note = f"no correct end-to-end solution: {last.e2e_reason if last else 'no iteration finished'}"
    events = run_events(run_dir)
    info.llm_calls, info.tokens = read_llm_use(run_dir, events)
    info.time_budget_spent = any(e.get("kind") == "time_budget_spent" for e in events)
    info.no_verdict = sum(1 for e in events if e.get("kind") == "candidate" and e.get("status") == "not_run")
    if info.no_verdict:
        # a smaller search than asked for: with several runs on a GPU, mostly its memory held by the others
        first = next((e.get("reason") or "" for e in events
                      if e.get("kind") == "verdict" and e.get("status") == "not_run" and not e.get("composite")), "")
        info.note = (f"{info.note} {info.no_verdict} candidate(s) of the search got no verdict"
                     f"{' (' + first[:160] + ')' if first else ''}").strip()
    return info


def read_llm_use(run_dir: Path, events: list[dict]) -> tuple[int | None, int | None]:
    """(LLM calls, tokens): tokens.json where a command wrote one, else the events' token totals (one
    `llm_tokens` event per client: a resumed run has several), else the `llm_call` events counted."""
    tokens_file = run_dir / "tokens.json"
    if tokens_file.is_file():
        data = json.loads(tokens_file.read_text())
        return data.get("calls"), sum((data.get("total") or {}).values())
    if not events:
        return None, None
    totals = [e for e in events if e.get("kind") == "llm_tokens"]
    if totals:
        return (sum(e.get("calls", 0) for e in totals),
                sum(sum((e.get("total") or {}).values()) for e in totals))
    calls = [e for e in events if e.get("kind") == "llm_call" and not e.get("cached")]
    return len(calls), sum(e.get("prompt_tokens", 0) + e.get("completion_tokens", 0)
                           + e.get("reasoning_tokens", 0) for e in calls)


# ---- timing one packed solution --------------------------------------------------------------------------


@dataclass
class Measurement:
    device: str
    eager_ms: float | None = None
    compile_ms: float | None = None
    solution_ms: float | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_eager: float | None = None
    err_solution: float | None = None
    err_eager: float | None = None
    rounds_ms: list[dict[str, float]] = field(default_factory=list)   # per round: side -> median ms
    note: str = ""


# What a Measurement hands to its Row.
MEASURED = ("eager_ms", "compile_ms", "solution_ms", "speedup_vs_compile", "speedup_vs_eager", "err_solution",
            "err_eager")


@dataclass
class Sides:
    """A problem's Model and a packed solution's ModelNew, built with the same weights, and one set of inputs."""
    problem: object                       # mkevolve.problem.Problem
    init: list
    inputs: list
    eager: object                         # the problem's Model
    ours: object                          # the solution's ModelNew
    device: object                        # torch.device


def build_sides(problem_path: Path, solution_path: Path, *, eval_mode: bool = False, seed: int = 0) -> Sides:
    """Weights are made identical the verifier's way: the same seed before each build. fp32 with TF32 off,
    as in the verifier; on the GPU when there is one."""
    import torch

    from mkevolve.problem import build_model, call_inputs, fp32_strict, import_file, load_problem, make_inputs
    from mkevolve.workers.interpreter import make_autotune_interpretable

    fp32_strict()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    make_autotune_interpretable()         # does nothing unless TRITON_INTERPRET=1 (CPU)
    problem = load_problem(problem_path)
    config = problem.configs[0]           # KernelBench problems have one
    init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
    inputs = make_inputs(problem.path, config, seed + 1, device)
    solution_cls = import_file(solution_path, prefix="kernelbench_solution").ModelNew
    eager = build_model(problem.path, problem.model_cls, init, seed, device, eval_mode)
    ours = build_model(Path(solution_path), solution_cls, init, seed, device, eval_mode, what="ModelNew")
    return Sides(problem=problem, init=init, inputs=inputs, eager=eager, ours=ours, device=device)


def measure(problem_path: Path, solution_path: Path, *, eval_mode: bool = False, seed: int = 0,
            rounds: int = DEFAULT_ROUNDS) -> Measurement:
    """Errors against fp64 on any device; on CUDA also eager, torch.compile and the solution timed in
    alternating rounds."""
    import torch

    from mkevolve.problem import build_model, clone_values, flatten_outputs
    from mkevolve.verify.reference import largest_error
    from mkevolve.workers.gpu_share import gpu_alone

    sides = build_sides(problem_path, solution_path, eval_mode=eval_mode, seed=seed)
    problem, init, inputs, eager, ours, device = (sides.problem, sides.init, sides.inputs, sides.eager, sides.ours,
                                                  sides.device)
    with torch.no_grad(), gpu_alone():
        # The solution's first call compiles its kernels and lets their autotuners time each tile config: with
        # the GPU to itself, as the rounds have it, or other lanes' kernels decide which tile it keeps.
        ours(*clone_values(inputs))
    reference = build_model(problem.path, problem.model_cls, init, seed, device, eval_mode).double()
    inputs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        expected = flatten_outputs(reference(*inputs64))
        result = Measurement(device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                             err_eager=largest_error(flatten_outputs(eager(*clone_values(inputs))), expected),
                             err_solution=largest_error(flatten_outputs(ours(*clone_values(inputs))), expected))
    del reference, inputs64, expected     # fp64 takes twice the fp32 model's memory: free it before timing
    if device.type != "cuda":
        result.note = "no CUDA: not timed"
        return result
    torch.cuda.empty_cache()
    models = {"eager": eager, "compile": torch.compile(eager), "solution": ours}
    forwards = {name: (lambda m=m: m(*inputs)) for name, m in models.items()}
    with torch.no_grad():
        for forward in forwards.values():
            forward()               # compile now (Inductor), sharing the GPU, not in a round that has it alone
    result.rounds_ms = alternate_rounds(forwards, rounds)
    result.eager_ms, result.compile_ms, result.solution_ms = (
        statistics.median(r[name] for r in result.rounds_ms) for name in ("eager", "compile", "solution"))
    result.speedup_vs_compile = result.compile_ms / result.solution_ms
    result.speedup_vs_eager = result.eager_ms / result.solution_ms
    return result


def alternate_rounds(forwards: dict[str, Callable[[], object]], rounds: int) -> list[dict[str, float]]:
    """Median ms of each forward per round, the order rotated each round so no side always goes first."""
    from mkevolve.verify.timing import time_forward
    from mkevolve.workers.gpu_share import gpu_alone

    names = list(forwards)
    results = []
    for index in range(rounds):
        order = names[index % len(names):] + names[:index % len(names)]
        with gpu_alone():           # other lanes' runs and timings wait (the lock of MKEVOLVE_GPU_LOCK, if set)
            results.append({name: time_forward(forwards[name]).median_ms for name in order})
    return results


# ---- one problem: run, read, pack, time ------------------------------------------------------------------


@dataclass
class Settings:
    kernelbench: Path
    work: Path
    model: str
    iterations: int
    budget: int
    run_args: list[str]
    rounds: int
    run_reserve_s: float = 0.0    # 0: runs get no --time-budget (a scheduling choice, not in record())

    @property
    def eval_mode(self) -> bool:
        return "--eval" in self.run_args

    def record(self) -> dict:
        return {"model": self.model, "iterations": self.iterations, "budget": self.budget,
                "run_args": self.run_args, "rounds": self.rounds}


@dataclass
class Step:
    exit_code: int | None     # None: killed at the deadline
    seconds: float
    log: Path


def run_step(command: list[str], log: Path, timeout_s: float, env: dict | None = None) -> Step:
    """Run a command in its own process group, output to `log`; at the deadline SIGINT the group (a run
    stops its workers on Ctrl-C), then SIGKILL what is left."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    return Step(code, time.monotonic() - started, log)


def child_env(gpu: int | None = None) -> dict:
    """The repository on the path (the GPU machine runs from a checkout), the Triton interpreter where there is
    no GPU (it must be set before Triton decorates a kernel), and the GPU's lock where there is one: `gpu`'s
    alone when given (the child then sees only that GPU), else GPU 0's."""
    import torch

    from mkevolve.workers.gpu_share import LOCK_ENV, lock_path

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    elif gpu is not None:
        # The run's workers and this script's timing see only this GPU and share its lock: with --lanes,
        # timed runs of one problem never overlap another problem's work on the same GPU.
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env[LOCK_ENV] = lock_path(gpu)
    else:
        env[LOCK_ENV] = lock_path(0)
    return env


def lane_gpus() -> list[int]:
    """Physical indices of the GPUs the lanes take in turn; empty without CUDA."""
    import torch

    from mkevolve.workers.executor import visible_gpus

    return visible_gpus() if torch.cuda.is_available() else []


def last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def find_run_dir(log: Path, parent: Path) -> Path | None:
    """The run prints 'run directory: PATH' first; if that line is missing, the newest run under `parent`."""
    found = re.search(r"^run directory: (.+)$", log.read_text(errors="replace"), flags=re.M)
    if found and Path(found.group(1).strip()).is_dir():
        return Path(found.group(1).strip())
    runs = sorted(parent.glob("*/state.json"), key=lambda p: p.stat().st_mtime)
    return runs[-1].parent if runs else None


def resumable(row: Row | None) -> bool:
    """A run that a part's limit stopped, whose run directory is still here to be resumed."""
    return (row is not None and not row.finished and row.exit_code is None and row.run_dir is not None
            and (Path(row.run_dir) / "state.json").is_file())


def solve_problem(key: str, row: Row | None, deadline: float, whole_part: bool, settings: Settings,
                  gpu: int | None) -> Row:
    """Run (or resume, or leave alone when an earlier part did it) and time one problem. The Row has
    finished=False when the next part has work left on it: resuming the run the deadline stopped, or the
    timing."""
    stopped = resumable(row)
    if row is not None and row.run_dir and not stopped and not (Path(row.run_dir) / "best").is_dir():
        row = None          # its run directory is gone (a fresh GPU machine): run the problem again
    if row is None or stopped or (row.run_dir is None and row.exit_code is None):
        row = run_problem(key, row if stopped else None, deadline, settings, gpu)
        if not row.finished and row.exit_code is None:
            return row      # stopped at the deadline: the next part resumes the run
        ran_now = True
    else:
        ran_now = False
    if row.correct and row.exit_code is not None and row.measure_s is None:
        timed_out = pack_and_measure(row, settings.kernelbench / key, settings, deadline, gpu)
        if timed_out and (ran_now or not whole_part):
            return row          # finished=False: the next part times it, with the whole part to itself
        if timed_out:
            row.note = f"{row.note} timing stopped at the part's time limit".strip()
    row.wall_s = round((row.run_s or 0) + (row.measure_s or 0), 1)
    row.finished = True
    return row


def run_problem(key: str, stopped: Row | None, deadline: float, settings: Settings, gpu: int | None) -> Row:
    """`mkevolve run` on one problem, or `--resume` of the run a part's limit `stopped`; the Row it leaves.
    Stopped at the deadline: finished=False while parts are left to resume it, else finished=True."""
    level, stem = Path(key).parent.name, Path(key).stem
    runs_parent = settings.work / "runs" / level
    if stopped is not None:
        row, command = stopped, [sys.executable, "-m", "mkevolve", "run", "--resume", stopped.run_dir]
    else:
        row = Row(problem=key)
        command = [sys.executable, "-m", "mkevolve", "run", str(settings.kernelbench / key), "--model", settings.model,
                   "--iterations", str(settings.iterations), "--budget", str(settings.budget),
                   "--out", str(runs_parent), *settings.run_args]
    row.time_budget_s = run_time_budget(deadline - time.monotonic(), settings.run_reserve_s)
    if row.time_budget_s is not None:
        command += ["--time-budget", f"{row.time_budget_s:g}"]
    step = run_step(command, settings.work / "logs" / f"{level}_{stem}.run.log", deadline - time.monotonic(),
                    child_env(gpu))
    row.exit_code, row.run_parts = step.exit_code, (row.run_parts or 0) + 1
    row.run_s = round((row.run_s or 0) + step.seconds, 1)
    run_dir = find_run_dir(step.log, runs_parent / stem)
    row.run_dir = str(run_dir) if run_dir else None
    if run_dir is None:
        row.correct, row.note = False, f"no run directory; the run said: {last_line(step.log)}"
        return row
    for name, value in asdict(read_run(run_dir)).items():
        setattr(row, name, value)
    if row.time_budget_spent:
        row.note = f"{row.note} searches cut at the run's time budget of {row.time_budget_s:g} s".strip()
    if step.exit_code is None:
        if row.run_parts < MAX_RUN_PARTS:
            row.note = (f"mkevolve run stopped at the part's time limit after {row.run_s:.0f} s in "
                        f"{row.run_parts} part(s); the next part resumes it")
            return row
        row.note = (f"mkevolve run stopped at the part's time limit in each of {row.run_parts} parts, "
                    f"{row.run_s:.0f} s in all. {row.note}").strip()
        row.finished = True     # over the limit: not resumed again
    return row


def run_time_budget(time_left_s: float, reserve_s: float) -> float | None:
    """The --time-budget of a run with `time_left_s` of its part left: what the reserve leaves, at least
    MIN_RUN_BUDGET_S, in whole seconds; None with no reserve (the run goes on until the part's limit)."""
    if reserve_s <= 0:
        return None
    return float(max(MIN_RUN_BUDGET_S, math.floor(time_left_s - reserve_s)))


def pack_and_measure(row: Row, problem_path: Path, settings: Settings, deadline: float, gpu: int | None) -> bool:
    """Pack best/ into one file and time it in a fresh process (a crash there costs this row its timing,
    not the benchmark; and the GPU memory is returned). True when the deadline cut it."""
    name = row.problem.replace("/", "_").removesuffix(".py")
    packed = settings.work / "packed" / f"{name}.py"
    packed.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = child_env(gpu)
    step = run_step([sys.executable, "-m", "mkevolve", "pack", str(Path(row.run_dir) / "best"), "-o", str(packed)],
                    settings.work / "logs" / f"{name}.pack.log", deadline - time.monotonic(), env)
    if step.exit_code is None:
        return True
    if step.exit_code != 0:
        row.note, row.measure_s = f"pack failed: {last_line(step.log)}", round(time.monotonic() - started, 1)
        return False
    out = settings.work / "measurements" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", str(problem_path), str(packed),
               "--measure-out", str(out), "--rounds", str(settings.rounds)]
    command += ["--eval-mode"] if settings.eval_mode else []
    step = run_step(command, settings.work / "logs" / f"{name}.measure.log", deadline - time.monotonic(), env)
    if step.exit_code is None:
        return True
    row.measure_s = round(time.monotonic() - started, 1)
    if step.exit_code != 0 or not out.is_file():
        row.note = f"timing failed: {last_line(step.log)}"
        return False
    measured = json.loads(out.read_text())
    for field_name in MEASURED:
        setattr(row, field_name, measured[field_name])
    if measured["note"]:
        row.note = f"{row.note} {measured['note']}".strip()
    return False


# ---- parts -----------------------------------------------------------------------------------------------


def fits(elapsed_s: float, durations_s: list[float], limit_s: float) -> bool:
    """Whether a problem of median duration still ends inside the limit; with no history, assume it does."""
    return not durations_s or elapsed_s + statistics.median(durations_s) <= limit_s


SolveFn = Callable[[str, "Row | None", float, bool, int], "Row | None"]     # ..., whole_part, lane


def run_part(problems: list[str], results: Results, limit_s: float, solve: SolveFn, save: Callable[[], None],
             now: Callable[[], float] = time.monotonic, lanes: int = 1) -> list[str]:
    """Solve unfinished problems in order, `lanes` at a time, until the next would not fit or a step was cut
    at the deadline; returns the problems started. Each lane's first problem always starts. `solve` is told
    which lane (0 to lanes - 1) it runs in."""
    start = now()
    queue = [k for k in problems if not (k in results.rows and results.rows[k].finished)]
    started: list[str] = []
    lock = threading.Lock()          # guards queue, started, results and the file
    cut = threading.Event()          # a step ran into the deadline: the others would too

    def take(first_in_lane: bool) -> str | None:
        with lock:
            if cut.is_set() or not queue:
                return None
            elapsed = now() - start
            if not first_in_lane and not fits(elapsed, results.durations(), limit_s):
                median = statistics.median(results.durations())
                print(f"[{elapsed:5.0f} s] no more problems in this lane: a problem takes {median:.0f} s "
                      f"(median), the limit is {limit_s:.0f} s", flush=True)
                return None
            key = queue.pop(0)
            started.append(key)
            print(f"[{elapsed:5.0f} s] {key}", flush=True)
            return key

    def lane(index: int) -> None:
        first = True
        while (key := take(first)) is not None:
            row = solve(key, results.rows.get(key), start + limit_s, first, index)
            first = False
            with lock:
                if row is not None:
                    results.rows[key] = row
                    save()
                    print(f"        {key}: {summary_line(row)}", flush=True)
                if row is None or not row.finished:
                    print(f"        {key}: stopped at the time limit; the next part goes on from here", flush=True)
                    cut.set()

    threads = [threading.Thread(target=lane, args=(i,), name=f"lane{i}") for i in range(max(1, lanes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return started


def summary_line(row: Row) -> str:
    waiting = "waiting for the next part to resume its run" if row.exit_code is None else "waiting for its timing"
    state = waiting if not row.finished else (
        f"correct={fmt_bool(row.correct)} all_triton={fmt_bool(row.all_triton)} "
        f"vs_compile={fmt_speedup(row.speedup_vs_compile)} vs_eager={fmt_speedup(row.speedup_vs_eager)} "
        f"err={fmt_err(row.err_solution)} (eager {fmt_err(row.err_eager)}) wall={fmt_number(row.wall_s)} s")
    return f"{state} {row.note}".rstrip()


def select_problems(kernelbench: Path, names: list[str]) -> list[str]:
    """Keys relative to the folder: every level*/*.py by default, else the ones named (relative or absolute)."""
    if not names:
        return sorted((str(p.relative_to(kernelbench)) for p in kernelbench.glob("level*/*.py")), key=problem_order)
    keys = []
    for name in names:
        path = Path(name) if Path(name).is_absolute() else kernelbench / name
        if not path.is_file():
            raise SystemExit(f"{name}: no such problem in {kernelbench}")
        keys.append(str(path.resolve().relative_to(kernelbench.resolve())))
    return keys


# ---- siblings: scripts/kernelbench_report.py and scripts/throughput.py ----------------------------------


def load_sibling(name: str):
    """scripts/<name>.py as a module. scripts/ is not a package, and this file is itself imported by path
    (the tests), so its siblings are loaded by path too, once each."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module      # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


report = load_sibling("kernelbench_report")       # the table and the plot
throughput = load_sibling("throughput")          # the GPU's utilisation samples, read
# The progress lines of a part show a value the way the table will.
fmt_bool, fmt_speedup, fmt_err, fmt_number = report.fmt_bool, report.fmt_speedup, report.fmt_err, report.fmt_number


def render(results_path: Path, folder: Path, kernelbench: Path | None = None) -> None:
    """kernelbench.md and kernelbench_speedup.svg in `folder` (the plot skipped, with a note, without matplotlib)."""
    report.write_report(results_path, folder / "kernelbench.md", folder / "kernelbench_speedup.svg", kernelbench)


# ---- a part's throughput ---------------------------------------------------------------------------------

UTILISATION_INTERVAL_MS = 500
UTILISATION_COMMAND = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                       "-lms", str(UTILISATION_INTERVAL_MS)]


class UtilisationSampler:
    """GPU utilisation sampled over a part into a file, one percentage per line and GPU: how busy the part
    kept the GPUs (a sample is the share of its period in which any kernel ran)."""

    def __init__(self, path: Path, command: list[str] = UTILISATION_COMMAND):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        with path.open("w") as out:
            try:
                self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL)
            except FileNotFoundError:
                self.proc = None        # no nvidia-smi: the part records no samples

    def stop(self) -> dict:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        samples = throughput.read_utilisation(self.path)
        busy, mean = throughput.busy_and_mean(samples)
        return {"gpu_samples": len(samples), "gpu_sample_interval_s": UTILISATION_INTERVAL_MS / 1000,
                "gpu_busy_share": None if busy is None else round(busy, 4),
                "gpu_mean_utilisation": None if mean is None else round(mean, 2)}


def part_verdicts(rows: list[Row], since: float, until: float) -> int:
    """Verdicts (every evaluation, end-to-end checks included) the runs of `rows` reached between the two
    wall-clock times: a resumed run's earlier parts are not this part's work."""
    return sum(1 for row in rows if row.run_dir for e in run_events(Path(row.run_dir))
               if e.get("kind") == "verdict" and since <= e.get("t", -1) <= until)


# ---- command line ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog=__doc__.split("\n\n")[1] + "\n\n" + __doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", help="problem files relative to --kernelbench "
                        "(level2/63_Gemm_ReLU_Divide.py); default: every level*/*.py there")
    parser.add_argument("--kernelbench", type=Path, default=DEFAULT_KERNELBENCH, help="the KernelBench folder")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK,
                        help="where runs, packed solutions, timings and logs go")
    parser.add_argument("--results", type=Path, help="the results JSON, read to resume and rewritten after "
                        "each problem (default: WORK/results.json)")
    parser.add_argument("--time-limit", type=float, default=540.0, metavar="SECONDS",
                        help="length of this part: no problem starts that would not fit, judged from the median "
                             "so far, and a step still running at the limit is stopped")
    parser.add_argument("--model", default="builtin", help="mkevolve run --model")
    parser.add_argument("--iterations", type=int, default=1, help="mkevolve run --iterations")
    parser.add_argument("--budget", type=int, default=8, help="mkevolve run --budget (LLM calls per iteration)")
    parser.add_argument("--run-args", default="", metavar="ARGS",
                        help="more flags for mkevolve run, one string after '=': --run-args='--eval --workers 4'")
    parser.add_argument("--run-reserve", type=float, default=DEFAULT_RUN_RESERVE_S, metavar="SECONDS",
                        help="give each run --time-budget: the part's time left less this much, kept for ending "
                             "the run with a verified best/ and timing it; 0: no time budget, a run the part's "
                             "limit stops is resumed by the next part")
    parser.add_argument("--lanes", type=int, default=1,
                        help="problems run at once, spread over the visible GPUs; on one GPU their timed sections "
                             "take turns (the GPU lock)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help="alternating timing rounds of eager, torch.compile and the solution")
    parser.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                        help="write a Markdown table and an SVG plot from a results file, and run nothing "
                             "(scripts/kernelbench_report.py has more options)")
    parser.add_argument("--render-to", type=Path, metavar="DIR",
                        help="folder for --render's kernelbench.md and kernelbench_speedup.svg "
                             "(default: the results file's folder)")
    parser.add_argument("--measure", nargs=2, type=Path, metavar=("PROBLEM", "SOLUTION"),
                        help="time one packed solution against its problem, print the JSON, and run nothing else")
    parser.add_argument("--measure-out", type=Path, metavar="FILE", help="with --measure: also write the JSON here")
    parser.add_argument("--eval-mode", action="store_true", help="with --measure: compare in eval mode")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        render(args.render, args.render_to or args.render.parent, args.kernelbench.resolve())
        return 0
    if args.measure:
        measured = asdict(measure(*args.measure, eval_mode=args.eval_mode, rounds=args.rounds))
        print(json.dumps(measured, indent=1))
        if args.measure_out:
            args.measure_out.write_text(json.dumps(measured, indent=1))
        return 0

    settings = Settings(kernelbench=args.kernelbench.resolve(), work=args.work.resolve(), model=args.model,
                        iterations=args.iterations, budget=args.budget, run_args=shlex.split(args.run_args),
                        rounds=args.rounds, run_reserve_s=args.run_reserve)
    results_path = args.results or settings.work / "results.json"
    here = environment()
    results = Results.load(results_path)
    if results is None:
        results = Results(meta={**here, "kernelbench": str(settings.kernelbench), "settings": settings.record(),
                                "parts": []}, rows={})
    elif results.meta.get("gpu") != here["gpu"] or results.meta.get("settings") != settings.record():
        raise SystemExit(f"{results_path} holds results on {results.meta.get('gpu')} with settings "
                         f"{results.meta.get('settings')}; this is {here['gpu']} with {settings.record()}. "
                         "Mixing them would make one table of two benchmarks: use another --results.")
    results.meta.update(here)          # the date and versions of the latest part
    anchors = read_anchors(settings.kernelbench)
    problems = select_problems(settings.kernelbench, args.problems)

    gpus = lane_gpus()

    def solve(key: str, row: Row | None, deadline: float, whole_part: bool, lane: int) -> Row | None:
        row = solve_problem(key, row, deadline, whole_part, settings, gpus[lane % len(gpus)] if gpus else None)
        if row is not None and key in anchors:
            row.anchor_eager_ms, row.anchor_compile_ms = anchors[key]["eager_ms"], anchors[key]["compile_ms"]
        return row

    part_started, wall_started = time.monotonic(), time.time()
    sampler = UtilisationSampler(settings.work / "logs" / f"gpu-utilisation-{int(wall_started)}.csv") if gpus else None
    try:
        started = run_part(problems, results, args.time_limit, solve, lambda: results.save(results_path),
                           lanes=args.lanes)
    finally:                            # an interrupted part leaves no sampler running
        sampled = sampler.stop() if sampler is not None else {}
    wall_s = time.monotonic() - part_started
    verdicts = part_verdicts([results.rows[k] for k in started if k in results.rows], wall_started, time.time())
    part = {"date": here["date"], "gpu": here["gpu"], "problems": started, "lanes": args.lanes, "gpus": len(gpus),
            "run_reserve_s": args.run_reserve, "wall_s": round(wall_s, 1), "verdicts": verdicts,
            "verdicts_per_gpu_minute": round(verdicts / (wall_s / 60 * max(1, len(gpus))), 2) if wall_s else None,
            **sampled}
    results.meta.setdefault("parts", []).append(part)
    results.save(results_path)
    left = [k for k in problems if k not in results.rows or not results.rows[k].finished]
    print(f"results: {results_path}")
    print(f"all {len(problems)} problems finished" if not left else
          f"{len(problems) - len(left)} of {len(problems)} problems finished; run the same command again for the "
          f"next part ({len(left)} left)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
