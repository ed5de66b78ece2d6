"""The trusted side of one candidate process: plan its calls, start it, read back what its harness signed.

The plan decides, out of the candidate's sight, which calls are correctness trials, which are timed,
and which outputs are kept for checking. On a GPU the trials hide among the timed calls at random
places and two timed outputs (the last and one at random) are checked too, so a candidate that
counts calls, or caches on an input's address, cannot tell which of its answers will be read.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import random
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ContextManager

import torch

from mkevolve.pysource import parse_python
from mkevolve.verify.candidate_zygote import FIRST_USE_IMPORTS, forget_zygote, running_zygote, warm_dir
from mkevolve.verify.cheating import Rule, Violation
from mkevolve.verify import autotune_memory, triton_warm
from mkevolve.verify.harness import (GPU_MEMORY_TAKEN, REPORT_FILE, SETUP_FAILED, Call, CandidateRequest,
                                    ConfigRun, violation_from_json)
from mkevolve.verify.kernel_audit import (DeviceActivity, accepted_triton_kernels, activity_violations,
                                          compiled_precision_violations, triton_kernel_names)
from mkevolve.verify.reference import FIRST_SET, ReferenceSet
from mkevolve.verify.result import CANDIDATE_NOT_STARTED, Rejected, Status
from mkevolve.verify.timing import TIMED_RUNS, WARMUP_RUNS
from mkevolve.workers import background, gpu_share, wire
from mkevolve.workers.pool import log_tail
from mkevolve.workers.zygote import ChildExit, ZygoteError

# The input sets timed calls take in turn (none twice in a row), each call its set's values shifted its own way.
TIMING_SETS = ("time0", "time1", "time2")
# Checked calls among and after the trials where nothing is timed (a CPU): the last takes the first's set again,
# as timed calls take theirs, so a kernel that computes otherwise on values it has seen (in another order) is
# checked there too.
LATE_CALLS_UNTIMED = 3
LATE_CALL_SETS = TIMING_SETS[:2]
_MAX_SHIFT = 1 << 40          # shifts are drawn below this: far more than any tensor's elements
_HARNESS_ENTRY = "mkevolve.verify.harness:run_candidate"
_LOG_FILE = "candidate.log"
# Scratch folders go to memory (tmpfs) when it has room: a candidate writes every kept output there
# (224 MB for a full-size KernelBench GEMM), and new pages on a disk file system cost 0.6 s where tmpfs
# takes 0.06 s. Below this much free memory there, the system's temporary folder is used instead.
_MEMORY_FS = Path("/dev/shm")
_MEMORY_FS_MIN_FREE = 8 << 30
_READERS = 8  # threads that read and hash a candidate's outputs (0.15 s per 224 MB each otherwise)


@dataclass(frozen=True)
class OutputCheck:
    save: str                  # the output's name in the report
    input_set: str             # the reference set it must match
    call: int                  # 1-based position of the call among all calls of its config
    trial: int | None = None   # the trial number; None for a timed or late call
    shift: int = 0             # the call's inputs were the set's, shifted so (harness.Call.shift)


@dataclass
class CallPlan:
    """One config's calls in order, and which of their outputs the judge reads."""

    calls: list[Call] = field(default_factory=list)
    checks: list[OutputCheck] = field(default_factory=list)
    prefix: str = ""           # makes output names unique across the configs of one candidate process
    state_buffers: list[str] = field(default_factory=list)   # the reference's buffers compared after the calls
    written_inputs: list[int] = field(default_factory=list)  # arguments the reference writes into

    @property
    def length(self) -> int:
        return len(self.calls)

    def set_names(self) -> list[str]:
        return sorted({c.inputs for c in self.calls})

    def add(self, input_set: str, *, guard: bool, timed: bool, check: bool, trial: int | None = None,
            shift: int = 0) -> None:
        save = f"{self.prefix}out{len(self.calls)}" if check else None
        self.calls.append(Call(inputs=input_set, save=save, guard=guard, timed=timed, shift=shift))
        if check:
            self.checks.append(OutputCheck(save, input_set, len(self.calls), trial, shift))

    def keep_state(self, buffers: list[str]) -> None:
        """Have the module's buffers kept after the first call and after the last, to be compared with the
        reference's `buffers` (verify/module_state.py); none kept when that list is empty."""
        self.state_buffers = list(buffers)
        if buffers:
            self.calls[0].state, self.calls[-1].state = self.state_name("first"), self.state_name("last")

    def keep_written(self, positions: list[int]) -> None:
        """Have every kept output followed by the arguments at `positions` as the call left them: the
        reference's forward writes into them, and its expected values hold them after its outputs."""
        self.written_inputs = list(positions)
        for call in self.calls:
            call.written = list(positions)

    def state_name(self, when: str) -> str:
        return f"{self.prefix}state_{when}"


def plan_calls(trials: int, timed: bool, on_gpu: bool, rng: random.Random, prefix: str = "") -> CallPlan:
    """Trial 0 first (it compiles); then the other trials among timed or late calls at random places. Each
    timed or late call gets its set's inputs shifted by a shift of its own (harness.Call.shift): a few sets
    serve a hundred calls, yet no call sees the values of another.

    On a CPU every call runs under the dispatcher guard, since nothing is timed there; on a GPU only the
    trials do, and the profiler watches every call.
    """
    if timed:
        others = [TIMING_SETS[i % len(TIMING_SETS)] for i in range(WARMUP_RUNS + TIMED_RUNS)]
        checked = {len(others) - 1, rng.randrange(WARMUP_RUNS, len(others))}
    else:
        others = [LATE_CALL_SETS[i % len(LATE_CALL_SETS)] for i in range(LATE_CALLS_UNTIMED)]
        checked = set(range(len(others)))
    slots = sorted(rng.sample(range(len(others) + trials - 1), trials - 1))
    plan = CallPlan(prefix=prefix)
    plan.add(FIRST_SET, guard=True, timed=False, check=True, trial=0)
    trial, other = 1, 0
    for position in range(len(others) + trials - 1):
        if trial < trials and position == slots[trial - 1]:
            plan.add(f"trial{trial}", guard=True, timed=False, check=True, trial=trial)
            trial += 1
            continue
        is_timed = timed and other >= WARMUP_RUNS
        plan.add(others[other], guard=not on_gpu, timed=is_timed, check=other in checked,
                 shift=rng.randrange(1, _MAX_SHIFT))
        other += 1
    return plan


# ---- the report, read on the trusted side ----------------------------------------------------------------


# A standby's timestamps are believed (for the profile) only if its preparation began within this long before the
# request (s): a worker idle for longer still holds one, but its preparation is then no part of the wait.
_STANDBY_AGE_LIMIT_S = 3600.0


@dataclass
class CandidateReport:
    denials: list[str]
    error: Rejected | None
    violations: list[Violation]
    launches: int
    activities: list[DeviceActivity]
    times_ms: list[list[float]]
    outputs: dict[str, dict]
    skipped: list[list[int]] = field(default_factory=list)   # per config: positions of calls left out
    phases: dict[str, float] = field(default_factory=dict)   # seconds inside the candidate process
    clock: tuple[float, float] | None = None   # time.time() as the harness began and as it wrote this report
    standby_clock: tuple[float, float] | None = None  # time.time() as its standby's preparation began and ended
    peak_rss_mb: float = 0.0                                  # seen from outside, by the memory watch
    launcher_signatures: list[str] = field(default_factory=list)  # Triton launchers it built (triton_warm)
    autotune_choices: dict[str, int] = field(default_factory=dict)  # its autotuners' choices (autotune_memory)
    # (config index, argument position): arguments the first call wrote into that the reference leaves alone
    changed_inputs: list[tuple[int, int]] = field(default_factory=list)
    # its error is a CUDA out-of-memory error within its share of the GPU: other processes held the memory
    gpu_memory_taken: bool = False
    _verified: dict[str, bytearray | None] | None = field(default=None, repr=False)

    def add_process_phases(self, called_at: float, ended_at: float) -> None:
        """The seconds around the harness, seen from the trusted side: "spawn", from the request until the
        harness began (the zygote's standby child, its fork); "exit", from the report until the process had
        ended. Each is clamped to the time the whole process took.

        Where a standby was prepared ahead, two parts of the spawn say why it took what it did: "spawn.late",
        how long after the request the standby was still preparing, and "spawn.prepare", how long its
        preparation took (a standby that began when the request came is late by all of it)."""
        if self.clock is None:
            return
        whole = max(0.0, ended_at - called_at)
        self.phases["spawn"] = min(whole, max(0.0, self.clock[0] - called_at))
        self.phases["exit"] = min(whole, max(0.0, ended_at - self.clock[1]))
        if self.standby_clock is None:
            return
        began, prepared = self.standby_clock
        if called_at - _STANDBY_AGE_LIMIT_S <= began <= prepared <= self.clock[0]:   # else not believable
            self.phases["spawn.late"] = min(self.phases["spawn"], max(0.0, prepared - called_at))
            self.phases["spawn.prepare"] = prepared - began

    def output(self, name: str, scratch: Path, device: torch.device) -> list:
        """A kept output, after checking it is the very file the harness wrote."""
        entry = self.outputs.get(name)
        if not isinstance(entry, dict) or "file" not in entry:
            reason = entry.get("error") if isinstance(entry, dict) else "missing"
            raise Rejected(Status.INCORRECT, f"an output could not be read back: {reason}")
        data = self.read_outputs(scratch).get(name)
        if data is None:
            raise _forged("an output file was changed after the harness wrote it")
        try:
            return list(wire.parse_values(data, device, _output_file(scratch, entry).name))
        except wire.WireError as err:
            raise _forged(f"an output file does not follow the layout ({err})") from None

    def read_outputs(self, scratch: Path) -> dict[str, bytearray | None]:
        """Every kept output's bytes, each read once and hashed in parallel (hashlib lets go of the GIL):
        the bytes whose digest is checked are the bytes parsed; None where the digest differs."""
        if self._verified is None:
            entries = {name: e for name, e in self.outputs.items() if isinstance(e, dict) and "file" in e}
            with ThreadPoolExecutor(max_workers=_READERS) as pool:
                read = pool.map(lambda e: _read_checked(_output_file(scratch, e), e.get("sha256")),
                                entries.values())
                self._verified = dict(zip(entries, read))
        return self._verified


def _output_file(scratch: Path, entry: dict) -> Path:
    return scratch / Path(str(entry["file"])).name


def _read_checked(path: Path, digest: object) -> bytearray | None:
    data = wire.read_file(path) if path.is_file() else bytearray()
    return data if hashlib.sha256(data).hexdigest() == digest else None


_ERROR_STATUS = {"import": Status.COMPILE_ERROR, "compile": Status.COMPILE_ERROR,
                 "build": Status.RUNTIME_ERROR, "runtime": Status.RUNTIME_ERROR, GPU_MEMORY_TAKEN: Status.RUNTIME_ERROR,
                 SETUP_FAILED: Status.NOT_RUN}


def _forged(detail: str) -> Rejected:
    return Rejected(Status.CHEATING, f"[{Rule.FORGED_RESULT.value}] the candidate process's result is not "
                    f"what its harness wrote: {detail}", rule=Rule.FORGED_RESULT.value)


def parse_report(body: dict) -> CandidateReport:
    """A signed body; its fields are still checked, since candidate text flows into some of them."""
    try:
        error = body.get("error")
        failure = None
        if error is not None:
            message = str(error["message"])[:1000]
            if error["kind"] == SETUP_FAILED:      # no verdict: none of the candidate's code ran
                message = f"{CANDIDATE_NOT_STARTED}: {message}"
            failure = Rejected(_ERROR_STATUS[error["kind"]], message,
                               error["line"] if isinstance(error.get("line"), int) else None)
        return CandidateReport(
            denials=[str(d)[:500] for d in body["denials"]],
            error=failure,
            violations=[violation_from_json(v) for v in body["violations"]],
            launches=int(body["launches"]),
            activities=[DeviceActivity.from_report(name) for name in body["activities"]],
            times_ms=[[float(t) for t in config] for config in body["times_ms"]],
            outputs=dict(body["outputs"]),
            skipped=[[int(position) for position in config] for config in body["skipped"]],
            phases={str(k): float(v) for k, v in body.get("phases", {}).items()},
            launcher_signatures=triton_warm.valid_signatures(body.get("launcher_signatures")),
            autotune_choices=autotune_memory.valid_choices(body.get("autotune_choices")),
            clock=_clock(body.get("clock")),
            standby_clock=_clock(body.get("standby_clock")),
            changed_inputs=[(int(index), int(position)) for index, position in body["changed_inputs"]],
            gpu_memory_taken=error is not None and error["kind"] == GPU_MEMORY_TAKEN,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise _forged(f"the report's fields do not parse ({type(err).__name__})") from None


def _clock(reported: object) -> tuple[float, float] | None:
    """The harness's two timestamps, for the profile only (the candidate's code ran in that process)."""
    if isinstance(reported, list) and len(reported) == 2 and all(type(t) is float for t in reported):
        return reported[0], reported[1]
    return None


# ---- running the process -----------------------------------------------------------------------------------


# A solution folder holds a few files (a composite: its top-level and one per subkernel); past this many the
# preload is skipped rather than every file parsed.
_PRELOAD_SCAN_LIMIT = 200


def imported_modules(source: Path) -> list[str]:
    """The modules a Python file imports at its top level (absolute imports), in order; [] when it cannot be
    read or parsed."""
    try:
        tree = parse_python(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    names = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 0
              and node.module]
    return list(dict.fromkeys(names))


def preload_for(problem: Path, candidate_dir: Path) -> list[str]:
    """What the candidate process imports before it is confined: the problem's own imports (trusted) that the
    solution's files import too, so a solution whose kernels never touch a library does not wait for it. The
    candidate's files are only parsed, never run, and only the problem's names can come out."""
    files = sorted(candidate_dir.rglob("*.py"))
    if len(files) > _PRELOAD_SCAN_LIMIT:
        return []
    used = {name for path in files for name in imported_modules(path)}
    return [name for name in imported_modules(problem) if name in used]


# A candidate that ran out of GPU memory other processes held (harness.failure_kind) runs again after a pause
# that lets their candidates end: GPU_MEMORY_PAUSE_S, then twice that; its last try has the GPU alone (after it,
# no verdict). In a part of three full-size runs on an H100, two of level2/87's four candidates went without a
# verdict after three shared tries, with 1.8 to 2 GB of 79 free and other processes holding 0.7 to 16 GB.
GPU_MEMORY_TRIES = 3
GPU_MEMORY_PAUSE_S = 5.0


def gpu_memory_try(attempt: int) -> ContextManager:
    """How try `attempt` (from 1) of work that ran out of the GPU memory others held holds the GPU: alone on the
    last, shared before. A check's own tries (verify/correctness.py) follow the same rule."""
    return gpu_share.gpu_alone() if attempt == GPU_MEMORY_TRIES else nullcontext()


def pause_after_gpu_memory_try(attempt: int) -> float:
    """The pause after a try that ran out of memory, seconds (none after the last): others' candidates end."""
    if attempt >= GPU_MEMORY_TRIES:
        return 0.0
    time.sleep(GPU_MEMORY_PAUSE_S * attempt)
    return GPU_MEMORY_PAUSE_S * attempt


def run_candidate_process(request, references: list[ReferenceSet], plans: list[CallPlan], scratch: Path,
                          device: torch.device) -> CandidateReport:
    """Start the candidate in a fresh process, wait for it, and read its signed report; again while the GPU's
    memory was held by other processes (GPU_MEMORY_TRIES), the last time with the GPU alone: the jobs of other
    workers and runs have then ended their GPU work, and idle ones keep little (workers/worker.py)."""
    paused = 0.0
    for attempt in range(1, GPU_MEMORY_TRIES + 1):
        waited_from = time.time()
        with gpu_memory_try(attempt):
            paused += time.time() - waited_from     # the last try's wait for the GPU alone
            report = _run_once(request, references, plans, scratch, device)
        if not report.gpu_memory_taken:
            if paused:
                report.phases["gpu_memory_wait"] = paused
            return report
        if attempt < GPU_MEMORY_TRIES:
            (scratch / REPORT_FILE).unlink()
        paused += pause_after_gpu_memory_try(attempt)
    raise Rejected(Status.NOT_RUN, f"{CANDIDATE_NOT_STARTED}: in each of its {GPU_MEMORY_TRIES} tries the GPU's "
                                   f"memory was held by other processes ({report.error.reason[:300]})")


def _run_once(request, references: list[ReferenceSet], plans: list[CallPlan], scratch: Path,
              device: torch.device) -> CandidateReport:
    key = secrets.token_bytes(32)
    candidate = CandidateRequest(
        solution=str(Path(request.solution_path).resolve()),
        candidate_dir=str(Path(request.solution_path).resolve().parent),
        scratch=str(scratch), key=key.hex(), device=device.type, eval_mode=request.eval_mode,
        construct_seed=request.seed, trusted_files=list(request.trusted_files),
        preload=preload_for(Path(request.problem_path), Path(request.solution_path).resolve().parent),
        triton_cache=str(candidate_triton_cache(scratch)),
        gpu_held_alone=gpu_share.held_alone(),
        configs=[ConfigRun(init=str(ref.init_file),
                           calls=[replace(c, inputs=str(ref.inputs_file(c.inputs))) for c in plan.calls])
                 for ref, plan in zip(references, plans)],
    )
    called_at = time.time()
    ended = start_candidate(_HARNESS_ENTRY, candidate, scratch, request.timeout_s, request.memory_limit_gb * 1024)
    ended_at = time.time()
    if ended.timed_out:
        raise Rejected(Status.TIMEOUT, f"no result within the {request.timeout_s:g} s time limit; "
                       "candidate process killed")
    if ended.memory_exceeded:
        raise Rejected(Status.CRASHED, ended.describe())
    if not (scratch / REPORT_FILE).exists():
        if ended.code == 0:
            # The harness exits 0 only after writing its report: code that ended the process with 0 before
            # then pretended a success (whatever it printed on the way went to a log, not to the judge).
            raise _forged("the candidate's code ended its process with exit status 0 before the harness "
                          "wrote a report")
        raise Rejected(Status.CRASHED, f"{ended.describe()} before its harness wrote a report"
                       f"{log_tail(scratch / _LOG_FILE)}")
    report = parse_report(read_signed_report(scratch, key))
    report.peak_rss_mb = ended.peak_rss_mb
    report.add_process_phases(called_at, ended_at)
    if device.type == "cuda":
        triton_warm.learn(report.launcher_signatures, warm_dir())
    return report


def remember_autotune_choices(report: CandidateReport) -> None:
    """Keep the autotune choices of a candidate that passed every check, for later processes that run the
    same kernels (autotune_memory)."""
    autotune_memory.learn(report.autotune_choices, warm_dir())


def read_signed_report(scratch: Path, key: bytes) -> dict:
    """The body of the report in `scratch`, when the harness's signature holds; forged-result otherwise."""
    try:
        return wire.verify_report((scratch / REPORT_FILE).read_bytes(), key)
    except (wire.WireError, FileNotFoundError) as err:
        raise _forged(str(err)) from None


def warm_worker_early() -> None:
    """On a GPU, a worker's last preload (after its zygote's start, executor.verifier_preload): in the background,
    open the worker's own CUDA context and cuBLAS handle and import FIRST_USE_IMPORTS, which its first
    reference, decomposition check or baseline would otherwise wait for (the check's trials took 5 to 6.5 s
    on the H200, 4.3 s of it importing torch._dynamo)."""
    def warm_worker() -> None:
        if torch.cuda.is_available():
            ones = torch.ones(8, 8, device="cuda")
            (ones @ ones).sum().item()
        for name in FIRST_USE_IMPORTS:
            importlib.import_module(name)

    background.import_in_background("worker-warm", warm_worker)


def start_candidate(entry: str, candidate: CandidateRequest, scratch: Path, timeout_s: float,
                    memory_limit_mb: float = 16 * 1024) -> ChildExit:
    """Fork the candidate from this worker's zygote (started on first use, replaced when it dies)."""
    try:
        zygote = running_zygote()
        with gpu_share.gpu_lent():
            return zygote.run(entry, candidate.to_json(), scratch / _LOG_FILE, timeout_s, memory_limit_mb)
    except ZygoteError as err:
        forget_zygote()
        raise Rejected(Status.NOT_RUN, f"{CANDIDATE_NOT_STARTED}: {err}") from None


def scratch_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A fresh folder for one candidate process, removed with everything in it when the block ends."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=_scratch_root())


def _scratch_root() -> str | None:
    try:
        free = os.statvfs(_MEMORY_FS)
    except OSError:
        return None
    fits = free.f_bavail * free.f_frsize >= _MEMORY_FS_MIN_FREE
    return str(_MEMORY_FS) if fits and os.access(_MEMORY_FS, os.W_OK | os.X_OK) else None


def candidate_triton_cache(scratch: Path) -> Path:
    """Triton's cache for one candidate process, fresh: every compiled IR in it is that candidate's own, so
    the precision check reads exactly what it compiled; trusted processes never load from it."""
    return scratch / "triton"


def gpu_accounting(activities: list[DeviceActivity], code_files, scratch: Path,
                   pytorch_allowed: bool = False) -> list[Violation]:
    """What actually ran on the GPU: only the candidate's own Triton kernels, in full fp32 precision.

    A composite that declares PyTorch subkernels runs library kernels on purpose, and the profiler
    cannot say which module launched a kernel; there only host copies and the precision of the Triton
    kernels are checked (each Triton subkernel was judged alone, strictly, before).
    """
    sources = [Path(f).read_text(encoding="utf-8", errors="replace") for f in code_files]
    names = triton_kernel_names(sources)
    launched = accepted_triton_kernels(activities, names)
    found = activity_violations(activities, names)
    if pytorch_allowed:
        found = [v for v in found if v.rule is Rule.HOST_COPY]
    return found + compiled_precision_violations(candidate_triton_cache(scratch), launched)
