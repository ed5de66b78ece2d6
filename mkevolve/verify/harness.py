"""What runs inside a candidate process: build one ModelNew, call it on the given inputs, sign what it saw.

The trusted side decides everything: which inputs, in which order, which outputs to keep. This side
never sees a reference output, never writes a verdict and never sends a pickle: it saves outputs as
raw bytes in its scratch folder and writes a report signed with a key that stays in this module's
local variables; the confinement (workers/harden.py) denies the frame and gc access that could reach it.

Candidate code shares this interpreter, and Python lets it change almost anything: any module's
attributes (`sys.modules` is a dict it can read), any Python class's methods (torch.Tensor's among
them), the builtins, and the torch function and dispatch modes that run code inside every tensor call.
A harness that called `out.clone()` or `wire.write_values` after the import would run whatever the
candidate put there, between the timed calls and the saved outputs. So from the import on, the
harness reaches only what it captured before: C functions and the methods of torch's immutable
`TensorBase`, called with Python-level overrides switched off, from modules that are gone from
`sys.modules` by then and that carry their own copies of the builtins (`harden.own_builtins`).
"""

from __future__ import annotations

import _thread
import importlib
import importlib.util
import json
import os
import re
import sys
import sysconfig
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from mkevolve.problem import ProblemError, fp32_strict, import_file, seed_everything
from mkevolve.verify.cheating import RuntimeGuard, Rule, Violation, output_violations
from mkevolve.verify import autotune_memory, triton_warm
from mkevolve.verify.kernel_audit import ActivityRecorder
from mkevolve.verify.timing import timing_done
from mkevolve.workers import gpu_share, harden, wire
from mkevolve.workers.pool import SHARERS_ENV

REPORT_FILE = "report.json"
GPU_MEMORY_TAKEN = "gpu_memory_taken"   # an error kind: out of GPU memory that other processes held
SETUP_FAILED = "setup"                   # an error kind: the harness failed before the candidate's code ran
_FLUSH_BYTES = 256 << 20                   # larger than any current GPU's L2 (60 MB on an H200)
# Everything the harness calls after the candidate is imported, bound before (see the docstring).
_perf_counter = time.perf_counter
_wall_clock = time.time            # the process's start and exit as the trusted side profiles them
_urandom = os.urandom              # C: the draw of a kept call cannot be steered by patching `random`
_Tensor = torch.Tensor
_TensorBase = torch._C.TensorBase          # an immutable type: its methods cannot be replaced
_clone, _detach, _cpu, _zero_ = _TensorBase.clone, _TensorBase.detach, _TensorBase.cpu, _TensorBase.zero_
_equal, _isnan, _nan_to_num = _TensorBase.equal, _TensorBase.isnan, _TensorBase.nan_to_num
_is_floating_point = _TensorBase.is_floating_point
_shape_of, _dtype_of = (_TensorBase.__dict__[name].__get__ for name in ("shape", "dtype"))   # C getters
_numel, _element_size = _TensorBase.numel, _TensorBase.element_size
_is_cuda = _TensorBase.__dict__["is_cuda"].__get__
_is_contiguous, _reshape, _narrow, _copy_, _new_empty = (_TensorBase.is_contiguous, _TensorBase.reshape,
                                                         _TensorBase.narrow, _TensorBase.copy_, _TensorBase.new_empty)
_no_torch_function, _no_torch_dispatch = torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch
_set_grad_enabled = torch._C._set_grad_enabled
_EventBase = torch._C._CudaEventBase       # C methods: record(stream), synchronize(), elapsed_time(end)
_OutOfMemoryError, _memory_reserved = torch.cuda.OutOfMemoryError, torch.cuda.memory_reserved
_event_record, _event_sync, _event_elapsed = (getattr(_EventBase, name, None)  # None in CPU builds
                                              for name in ("record", "synchronize", "elapsed_time"))
_cuda_synchronize = getattr(torch._C, "_cuda_synchronize", None)  # absent from CPU builds
# PyTorch's precision switches, read from C: a candidate that turns TF32 on, however it spells it, is seen.
_PRECISION_READERS = (torch._C._get_cublas_allow_tf32, torch._C._get_cudnn_allow_tf32,
                      torch._C._get_float32_matmul_precision)
_PRECISION_RULE = Rule.PRECISION.value
_TRUSTED_PACKAGE = __name__.partition(".")[0]   # "mkevolve": dropped from sys.modules before the import
_SUBCLASS_RULE = Rule.TENSOR_SUBCLASS.value
_start_thread, _allocate_lock = _thread.start_new_thread, _thread.allocate_lock
# nn.Module's instance-dict slot (a C descriptor: a subclass's own `__dict__` property is not consulted) and
# dict's C methods: the buffers are found without running anything the candidate's classes could override
# (named_buffers, __getattr__, a dict subclass's values).
_Module = torch.nn.Module
_module_dict = _Module.__dict__["__dict__"].__get__
_dict_get, _dict_values = dict.get, dict.values
_SAVERS = 8  # threads that write kept outputs at once
# Bytes of tensors passing through the host at once, input sets read or kept outputs saved (a larger one goes
# alone): eight 2.2 GB sets of a full-size ConvTranspose2d (KernelBench level2/19) at once took a candidate
# past its 16 GB of host memory.
_HOST_BATCH_BYTES = 4 << 30
# Bytes of kept outputs that wait on the device: past it they are saved at once (`_SavedOutputs`). An output
# larger than this (a full-size convolution's 2 GB) is saved as soon as it is made.
_WAITING_OUTPUT_BYTES = 1 << 30
# The profiler's name for a copy from the device to pageable host memory, as `.cpu()` makes one: the harness's
# own copies of outputs saved while it records are left out of what the trusted side reads as the forward's.
_HOST_COPY_NAME = "Memcpy DtoH (Device -> Pageable)"
# Bytes of arguments of checked calls after each config's first kept for the input-state comparison (on the
# device, until the profiler stops): all of them for most problems; past it, one drawn call per config.
_KEPT_ARGUMENT_BYTES = 1 << 30


@dataclass
class Call:
    """One forward call: its inputs (a value file), and what the trusted side wants of it."""

    inputs: str                  # absolute path of a value file (read before the candidate is imported)
    save: str | None = None      # keep the output under this name
    guard: bool = False          # watch it with the dispatcher guard (early, line-level feedback)
    timed: bool = False          # its time counts in the timing statistics
    state: str | None = None     # keep the model's buffers after the call under this name (verify/module_state.py)
    # Its inputs' elements moved this many places (problem.shifted_values): each timed or late call its own, so no
    # call sees the values of another and a kernel cannot hand back work kept from an earlier call. 0: as read.
    shift: int = 0
    # Positions of the arguments the reference's forward writes into: kept after the outputs when they are saved.
    written: list[int] = field(default_factory=list)


@dataclass
class ConfigRun:
    init: str                    # absolute path of the value file with the constructor's arguments
    calls: list[Call] = field(default_factory=list)


@dataclass
class CandidateRequest:
    solution: str
    candidate_dir: str
    scratch: str
    key: str                     # hex; signs the report
    device: str                  # "cuda" or "cpu"
    eval_mode: bool
    construct_seed: int
    configs: list[ConfigRun]
    triton_cache: str = ""       # Triton's cache for candidate processes, never read by a trusted one
    trusted_files: list[str] = field(default_factory=list)
    preload: list[str] = field(default_factory=list)   # the problem's imports of installed packages
    gpu_held_alone: bool = False  # its worker holds the GPU alone for the whole process: take no hold

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CandidateRequest":
        data = json.loads(text)
        data["configs"] = [ConfigRun(init=c["init"], calls=[Call(**call) for call in c["calls"]])
                           for c in data["configs"]]
        return cls(**data)


class CandidateFailure(Exception):
    """The candidate could not be imported, built or called; becomes the report's error."""

    def __init__(self, kind: str, message: str, line: int | None = None):
        super().__init__(message)
        self.kind, self.message, self.line = kind, message, line

    def report_error(self) -> dict:
        return {"kind": self.kind, "message": self.message, "line": self.line}


# The bytes of GPU memory this process may use (standby sets them); its CUDA out-of-memory errors are the
# candidate's own only when its allocation would have passed that share.
_memory_share_bytes = 0.0
_ALLOCATION = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB)")
_UNIT_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def failure_kind(err: BaseException, kind: str) -> str:
    """`kind`, or GPU_MEMORY_TAKEN for a CUDA out-of-memory error within this process's share: other
    processes on the GPU held the memory (on an H100 shared by three runs, four of one run's candidates
    failed so while their process held under 1 GB), which says nothing about the candidate. A candidate that
    forges one gains only its own check run again (candidate_run.GPU_MEMORY_TRIES in all, the last with the
    GPU alone: other jobs wait, its own timing had the GPU alone already) and no verdict."""
    if not _memory_share_bytes or not isinstance(err, _OutOfMemoryError):
        return kind
    try:
        taken = within_share(str(err), _memory_reserved(), _memory_share_bytes)
    except Exception:      # the candidate's own exception type, or a CUDA context it broke
        return kind
    return GPU_MEMORY_TAKEN if taken else kind


def within_share(message: str, reserved_bytes: int, share_bytes: float) -> bool:
    """Whether the allocation an out-of-memory `message` names, added to what the process holds, fits its
    share; False when the message names none."""
    found = _ALLOCATION.search(message)
    return found is not None and reserved_bytes + float(found[1]) * _UNIT_BYTES[found[2]] <= share_bytes


# ---- entry point (called in the forked child by the zygote) -------------------------------------------


@dataclass
class Standby:
    """What a candidate process prepares before its candidate is known."""

    recorder: ActivityRecorder | None = None   # on a GPU: the profiler, already recording
    clock: tuple[float, float] | None = None    # time.time() as its preparation began and ended (on a GPU)


def standby() -> Standby:
    """Run by the zygote's next child while the previous candidate still runs: on an H200 a CUDA context
    takes 0.3 s, warming Triton about 1 s and starting the profiler 3.6 to 3.8 s, time no candidate
    should wait for. (Those were measured before the zygote imported torch._dynamo, which the profiler's
    first start imports, 4.7 s on its own: candidate_zygote.FIRST_USE_IMPORTS.)"""
    return _prepare(on_gpu=triton_warm.gpu_process(), warm=True)


def _prepare(on_gpu: bool, warm: bool) -> Standby:
    """A GPU process's CUDA context and profiler; Triton warmed first where the zygote made its warm cache."""
    if not on_gpu:
        return Standby()
    began = _wall_clock()
    torch.cuda.init()
    sharers = max(1, int(os.environ.get(SHARERS_ENV, "1")))
    # A candidate may use its worker's part of the GPU's memory, so a runaway one fails alone.
    global _memory_share_bytes
    share = 0.9 / sharers
    torch.cuda.set_per_process_memory_fraction(share)
    _memory_share_bytes = share * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if warm:
        triton_warm.warm_process()  # before the profiler starts: its kernel is not the candidate's
    recorder = ActivityRecorder()
    recorder.__enter__()
    return Standby(recorder, (began, _wall_clock()))


def run_candidate(payload: str, prepared: Standby | None = None) -> int:
    started_at = _wall_clock()
    request = CandidateRequest.from_json(payload)
    key = bytes.fromhex(request.key)
    request.key = ""
    report: dict = {"error": None, "violations": [], "launches": 0, "outputs": {}, "times_ms": [],
                    "skipped": [], "activities": [], "denials": [], "phases": {}, "changed_inputs": []}
    try:
        _run_and_report(request, key, report, prepared, started_at)
    except _OutOfMemoryError as err:
        report["error"] = _harness_out_of_memory(err).report_error()
        write_report(request, report, key)
    return 0


def _harness_out_of_memory(err: BaseException) -> CandidateFailure:
    """The harness's own GPU work (its setup, its copies of a call's arguments and outputs) ran out of memory: a
    forward's error is caught in `_forward`, so only these get here. Within this process's share, other processes
    held the memory (GPU_MEMORY_TAKEN: tried again); past it, the memory the candidate keeps is to blame.
    Uncaught, the process ended with code 70 and no report, and the candidate was judged crashed (level2/7's and
    83's candidates on an H100 shared by three runs, 2026-12-06)."""
    return CandidateFailure(failure_kind(err, "runtime"), f"the harness ran out of GPU memory: {_describe(err)}")


def _run_and_report(request: CandidateRequest, key: bytes, report: dict, prepared: Standby | None,
                    started_at: float) -> None:
    with _phase(report, "setup"):
        prepared = prepared or standby()  # without a zygote's standby child, prepare now
        if request.device == "cuda" and prepared.recorder is None:
            # Prepared as a CPU process (a check run in a process that left CUDA_VISIBLE_DEVICES unset, where the
            # trusted side sees every GPU; its zygote made no warm cache): unprofiled, every candidate would
            # read as launching no Triton kernel.
            prepared = _prepare(on_gpu=True, warm=False)
        try:
            loaded = load_inputs(request)
        except CandidateFailure as failure:
            report["error"] = failure.report_error()
            write_report(request, report, key)
            return
        fp32_strict()  # as the reference ran: PyTorch code a solution keeps must not run in TF32
        strict = _precision_state()
        launchers = triton_warm.record_launchers() if request.device == "cuda" else []
        autotuned = autotune_memory.use_choices(autotune_memory.known_choices(), request.device)
        denials = prepare_and_confine(request)
    clock = _GpuClock() if request.device == "cuda" else None
    saved = _SavedOutputs(request.scratch, report)
    kept = _KeptArguments()             # checked calls' arguments, compared once the profiler has stopped
    try:
        with _phase(report, "import"):
            _forget_trusted_modules()
            model_cls = import_candidate(request.solution)
        for config, (init, inputs) in zip(request.configs, loaded):
            _run_config(request, model_cls, config, init, inputs, clock, report, saved, strict, kept)
        if prepared.recorder is not None:
            with _phase(report, "profiler_stop"):
                prepared.recorder.__exit__(None, None, None)
            # Autotuning alone launches thousands of identical cache-clearing fills: keep each name once.
            names = _without_own_copies(prepared.recorder.names, saved.host_copies)
            report["activities"] = list(dict.fromkeys(names))
        report["changed_inputs"] = kept.changed()
    except CandidateFailure as failure:
        report["error"] = failure.report_error()
    saved.save()
    report["outputs"] = saved.entries
    report["denials"] = denials()
    report["launcher_signatures"] = list(launchers)
    report["autotune_choices"] = list(autotuned)
    report["clock"] = [started_at, _wall_clock()]
    report["standby_clock"] = list(prepared.clock) if prepared.clock else None
    write_report(request, report, key)


def _forget_trusted_modules() -> None:
    """Drop this package's modules from sys.modules: what the harness still calls stays reachable from
    its own frames only, and a candidate that imports them gets fresh copies nobody here uses."""
    for name in [n for n in sys.modules if n == _TRUSTED_PACKAGE or n.startswith(_TRUSTED_PACKAGE + ".")]:
        del sys.modules[name]


def write_report(request: CandidateRequest, body: dict, key: bytes) -> None:
    """The only channel back: the body, signed with the key the trusted side sent, in the scratch folder."""
    with open(request.scratch + "/" + REPORT_FILE, "wb") as out:
        out.write(wire.sign_report(body, key))


def prepare_and_confine(request: CandidateRequest):
    """Everything that needs more than the confinement allows happens first: caches, locks, then the hook."""
    scratch = Path(request.scratch)
    triton_cache = Path(request.triton_cache)
    triton_warm.copy_warm_cache(triton_cache)
    os.environ["TRITON_CACHE_DIR"] = str(triton_cache)
    os.environ["HOME"] = os.environ["TMPDIR"] = str(scratch)
    os.chdir(scratch)  # relative paths the candidate writes land in its scratch folder
    if request.device == "cuda":
        if request.gpu_held_alone:
            gpu_share.give_up_locks()       # a hold would wait for the worker's, which waits for this process
        gpu_share.hold_for_process_life()   # opens the lock files now, before the confinement
        gpu_share.lend_while_triton_compiles()
    elif os.environ.get("TRITON_INTERPRET") == "1":
        from mkevolve.workers.interpreter import make_autotune_interpretable

        make_autotune_interpretable()
    preload_installed(request.preload)
    return harden.confine(harden.Confinement(
        candidate_dir=Path(request.candidate_dir), scratch_dir=scratch, triton_cache_dir=triton_cache))


def preload_installed(names: list[str]) -> None:
    """Import the problem's installed packages before the confinement: what a library does while it loads
    (transformers probing the system's libraries with a subprocess) is the library's, not the candidate's.
    Only modules found among the installed packages and the standard library load here, never a file a
    candidate could have written; one that fails to load is left for the problem's own import to report."""
    installed = [Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib", "stdlib")]
    for name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name.partition(".")[0])
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec and spec.origin not in (None, "built-in", "frozen") else None
        if origin is None or not any(Path(origin).resolve().is_relative_to(root) for root in installed):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported by the problem's own import, in the confinement
            continue


def import_candidate(path: str) -> type:
    try:
        module = import_file(path, prefix="mkevolve_candidate")
    except ProblemError as err:
        raise CandidateFailure("import", err.reason) from None
    cls = getattr(module, "ModelNew", None)
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise CandidateFailure("import", "the solution defines no ModelNew(nn.Module) class")
    return cls


# ---- one configuration: build, then the calls in the order the trusted side chose ------------------------


def load_inputs(request: CandidateRequest) -> list[tuple[list, dict[str, list]]]:
    """Every config's constructor arguments and inputs, on the request's device. No code of the candidate has
    run yet, so running out of GPU memory here is never its doing: other processes held the memory
    (GPU_MEMORY_TAKEN: tried again), or the inputs alone pass this process's share (SETUP_FAILED)."""
    try:
        return [load_config(config, request.device) for config in request.configs]
    except _OutOfMemoryError as err:
        raise CandidateFailure(failure_kind(err, SETUP_FAILED),
                               f"loading the inputs ran out of GPU memory: {_describe(err)}") from None


def load_config(config: ConfigRun, device: str) -> tuple[list, dict[str, list]]:
    """The constructor's arguments and every input set of one config, read while nothing foreign runs
    (so a thread pool is safe here), several at once: reading and copying to the GPU let go of the GIL."""
    init = wire.read_values(Path(config.init))
    paths = list(dict.fromkeys(c.inputs for c in config.calls))
    inputs = {}
    with ThreadPoolExecutor(max_workers=_SAVERS) as pool:
        for batch in _host_batches({path: os.path.getsize(path) for path in paths}):
            inputs.update(zip(batch, pool.map(lambda path: wire.read_values(Path(path), device), batch)))
    return init, inputs


@dataclass
class CalledArguments:
    """A checked call's arguments (copies of `given`), as the forward left them. Compared after the profiler
    stops, so the comparison's kernels are not taken for the candidate's."""

    config: int              # index of the call's input config
    given: list
    args: list
    written: list[int]       # positions the reference writes into: compared with its values instead
    shift: int = 0           # the call's arguments were `given` shifted so (Call.shift)

    def changed(self) -> list[int]:
        """Positions of plain tensors the forward wrote into, where the reference leaves them as they were.
        TensorBase's C methods with torch function and dispatch modes off: no candidate code runs here."""
        before_call = _shifted_copies(self.given, self.shift) if self.shift else self.given
        with _no_torch_function(), _no_torch_dispatch():
            return [i for i, (after, before) in enumerate(zip(self.args, before_call))
                    if i not in self.written and type(before) is _Tensor and not _same_bits(after, before)]


def _same_bits(after, before) -> bool:
    """`after` may have been given another shape or dtype in place (`x.data = ...`): compared first."""
    if type(after) is not _Tensor or _shape_of(after) != _shape_of(before) or _dtype_of(after) != _dtype_of(before):
        return False
    if _equal(after, before):
        return True
    return (_is_floating_point(before) and _equal(_isnan(after), _isnan(before))
            and _equal(_nan_to_num(after, 0.0), _nan_to_num(before, 0.0)))


class _KeptArguments:
    """The arguments of every config's first call, and of its later checked calls (trials at random places)
    while they add up to _KEPT_ARGUMENT_BYTES; and of one more call per config, drawn among all its other calls
    as they come (a reservoir of one: the k-th replaces the kept one with chance 1/k, drawn after the forward
    returned). Which calls are checked is in this process, where a candidate can read it; which call is drawn
    is not known to anyone before the call ends. So a forward that writes into its argument in the calls that
    are only timed, or from its second call on in a full-size set (KernelBench level2/19: 2.2 GB, past the
    budget at once), is caught as often as the draw falls on one of its writing calls: nearly always when it
    writes in most of them. Two calls' arguments stay on the device at least."""

    def __init__(self):
        self.calls: list[CalledArguments] = []
        self.later_bytes = 0
        self._drawn: dict[int, tuple[int, int]] = {}   # config -> (its drawn call's index in calls, calls seen)

    def add(self, config: int, given: list, args: list, written: list[int], first: bool, checked: bool,
            shift: int = 0) -> None:
        called = CalledArguments(config, given, args, written, shift)
        if first:
            self.calls.append(called)
            return
        if checked:   # sized only here: the timed-only calls, a hundred a config, go straight to the draw
            size = sum(_numel(v) * _element_size(v) for v in args if type(v) is _Tensor)
            if self.later_bytes + size <= _KEPT_ARGUMENT_BYTES:
                self.later_bytes += size
                self.calls.append(called)
                return
        if config not in self._drawn:
            self._drawn[config] = (len(self.calls), 1)
            self.calls.append(called)
            return
        index, seen = self._drawn[config]
        seen += 1
        if _draw_below(seen) == 0:
            self.calls[index] = called    # the call kept before is let go, and its copies with it
        self._drawn[config] = (index, seen)

    def changed(self) -> list[list[int]]:
        """[config, position] of each argument written into where the reference leaves it, once each."""
        found = {(call.config, position): None for call in self.calls for position in call.changed()}
        return [list(key) for key in found]


def _draw_below(n: int) -> int:
    """A uniform draw from 0 .. n - 1 out of the OS's randomness (a 64-bit draw: its bias is negligible)."""
    return int.from_bytes(_urandom(8), "little") % n


def _run_config(request: CandidateRequest, model_cls: type, config: ConfigRun, init: list,
                inputs: dict[str, list], clock: "_GpuClock | None", report: dict, saved: "_SavedOutputs",
                strict: tuple, kept: _KeptArguments) -> None:
    device = torch.device(request.device)
    with _phase(report, "build"):
        model = build(model_cls, init, request, device)
    report["times_ms"].append([])  # this config's timed calls, in order
    report["skipped"].append([])   # the calls timing_done left out, by position: the state's replay skips them
    # The first call compiles and autotunes beside other workers' jobs; the rest have the GPU alone.
    first, rest = config.calls[:1], config.calls[1:]
    with _phase(report, "first_call"):
        try:
            _run_calls(request, model, first, inputs, clock, report, saved, strict, kept)
        finally:
            gpu_share.resume_after_compiles()
    if clock is None:
        with _phase(report, "other_calls"):
            _run_calls(request, model, rest, inputs, clock, report, saved, strict, kept, start=1)
        return
    alone = gpu_share.gpu_alone()
    with _phase(report, "gpu_wait"):  # until every other job on this GPU has let go of it
        alone.__enter__()
    try:
        with _phase(report, "other_calls"):
            _run_calls(request, model, rest, inputs, clock, report, saved, strict, kept, start=1)
    finally:
        alone.__exit__(None, None, None)


def _run_calls(request: CandidateRequest, model, calls: list[Call], inputs: dict[str, list],
               clock: "_GpuClock | None", report: dict, saved: "_SavedOutputs", strict: tuple,
               kept: _KeptArguments, start: int = 0) -> None:
    """`strict`: the precision switches as set before the import; a call that runs with others (set at
    import, in __init__ or in a forward) is reported. `start`: the first call's position in its config.
    `kept`: where checked calls' arguments go, as the forward left them."""
    for position, call in enumerate(calls, start):
        if call.timed and call.save is None and call.state is None and timing_done(report["times_ms"][-1]):
            report["skipped"][-1].append(position)
            continue  # the median is settled: the trials and the checked calls among the rest still run
        args = _shifted_copies(inputs[call.inputs], call.shift)
        guard = (RuntimeGuard(solution_file=request.solution, trusted_files=request.trusted_files)
                 if call.guard else None)
        _check_precision(strict, "before a forward", report)
        out, ms = _forward(model, args, guard, clock, request.solution)
        _check_precision(strict, "by a forward", report)
        if call.guard:
            report["launches"] = max(report["launches"], guard.launches)
            report["violations"] += [_violation_json(v) for v in guard.violations]
            report["violations"] += [_violation_json(v) for v in output_violations(out, args)]
        if call.timed and ms is not None:
            report["times_ms"][-1].append(ms)
        if call.save:
            # A snapshot: a candidate that returns one buffer every call must not rewrite what was kept.
            # The arguments the reference writes into follow, as the trusted side's expected values do.
            saved.keep(call.save, _snapshot(out, report, already_checked=call.guard)
                       + _copies([args[i] for i in call.written]))
        kept.add(len(report["times_ms"]) - 1, inputs[call.inputs], args, call.written, first=position == 0,
                 checked=call.save is not None, shift=call.shift)
        if call.state:
            saved.keep(call.state, _copies(_module_buffers(model)))


def _precision_state() -> tuple:
    return tuple(read() for read in _PRECISION_READERS)


def _check_precision(strict: tuple, when: str, report: dict) -> None:
    """Runs around every call, timed ones included: the report is only touched when a switch moved."""
    if _precision_state() == strict:
        return
    violation = {"rule": _PRECISION_RULE, "line": None, "message": f"PyTorch's fp32 precision settings (TF32) "
                 f"were changed {when}; leave torch.backends as they are"}
    if violation not in report["violations"]:
        report["violations"].append(violation)


def _shifted_copies(values: list, shift: int) -> list:
    """problem.shifted_values from TensorBase's C methods with torch function and dispatch modes off: no
    candidate code runs here, and the GPU runs ATen's copy kernels only, as for `_copies` (what shift 0 gives)."""
    with _no_torch_function(), _no_torch_dispatch():
        return [_shifted(v, shift) if type(v) is _Tensor else v for v in values]


def _shifted(v, shift: int):
    n = _numel(v)
    step = shift % n if n else 0
    if not step or not _is_floating_point(v) or not _is_contiguous(v):
        return _clone(v)
    source, copy = _reshape(v, (-1,)), _new_empty(v, _shape_of(v))
    target = _reshape(copy, (-1,))
    _copy_(_narrow(target, 0, 0, n - step), _narrow(source, 0, step, n - step))
    _copy_(_narrow(target, 0, n - step, step), _narrow(source, 0, 0, step))
    return copy


def _copies(values: list) -> list:
    """Fresh copies of plain tensors (so a call that writes into its inputs harms no other), made by
    TensorBase.clone with torch function and dispatch modes off: no candidate code runs here."""
    with _no_torch_function(), _no_torch_dispatch():
        return [_clone(v) if type(v) is _Tensor else v for v in values]


def _snapshot(out: list, report: dict, already_checked: bool) -> list:
    """Copies of a call's outputs, as `_copies`. A tensor subclass is not copied (its methods are the
    candidate's code) and is reported, unless the guard's output rules already did."""
    for index, value in enumerate(out):
        if isinstance(value, _Tensor) and type(value) is not _Tensor and not already_checked:
            report["violations"].append({"rule": _SUBCLASS_RULE, "line": None, "message":
                                         f"output {index} is a torch.Tensor subclass, not a plain tensor; "
                                         "return the tensor your kernel wrote"})
    return _copies([v for v in out if not isinstance(v, _Tensor) or type(v) is _Tensor])


def _module_buffers(model) -> list:
    """Every plain tensor registered as a buffer in the model or its submodules, each once, read from the
    modules' own attribute dicts. A tensor kept anywhere else is not the module's state: state_dict() would
    not save it either."""
    found, seen, modules = [], set(), [model]
    while modules:
        module = modules.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        attributes = _module_dict(module)
        buffers, children = _dict_get(attributes, "_buffers"), _dict_get(attributes, "_modules")
        if type(buffers) is dict:        # nn.Module's own: a dict of another class is not its state
            for value in _dict_values(buffers):
                if type(value) is _Tensor and id(value) not in seen:
                    seen.add(id(value))
                    found.append(value)
        if type(children) is dict:       # type() and issubclass only: no __class__ the candidate defines is read
            modules.extend(child for child in _dict_values(children) if issubclass(type(child), _Module))
    return found


def build(model_cls: type, init: list, request: CandidateRequest, device: torch.device) -> torch.nn.Module:
    seed_everything(request.construct_seed)
    try:
        model = model_cls(*init).to(device)
    except Exception as err:
        raise CandidateFailure(failure_kind(err, "build"), f"ModelNew(*get_init_inputs()) raised {_describe(err)}",
                               _solution_line(request.solution, err)) from None
    return model.eval() if request.eval_mode else model


def _forward(model, args: list, guard: RuntimeGuard | None, clock: "_GpuClock | None",
             solution: str) -> tuple[list, float | None]:
    """One call, timed on a GPU. The outputs are flattened before the clock stops, so nothing the
    candidate left behind runs after the timing and before the snapshot."""
    try:
        _set_grad_enabled(False)
        if guard is not None:
            guard.__enter__()
        try:
            if clock is None:
                return _flatten(model(*args)), None
            clock.start()
            out = _flatten(model(*args))
            return out, clock.stop()
        finally:
            if guard is not None:
                guard.__exit__(None, None, None)
    except Exception as err:
        kind = "compile" if _is_compile_error(err) else failure_kind(err, "runtime")
        located = _kernel_compile_error(err, solution)
        if located is not None:
            raise CandidateFailure(kind, *located) from None
        raise CandidateFailure(kind, _describe(err), _solution_line(solution, err)) from None


def _flatten(out) -> list:
    """A forward's result as a flat list: a value, or a tuple/list of them (nested allowed), or a dict (a
    model-output record) by its values, as the reference's is flattened (problem.flatten_outputs). Exact
    tuples and lists only, a subclass's iteration being candidate code; a dict's values are read by dict's own
    C method, whatever its class overrides."""
    if type(out) is tuple or type(out) is list:
        return [x for item in out for x in _flatten(item)]
    if issubclass(type(out), dict):
        return [x for value in _dict_values(out) for x in _flatten(value)]
    return [out]


class _phase:
    """Seconds this process spent in `name`, for the evaluation's profile (added up over configs).
    A class of this module rather than a contextlib generator: contextlib's classes can be patched."""

    def __init__(self, report: dict, name: str):
        self.report, self.name = report, name

    def __enter__(self) -> None:
        self.start = _perf_counter()

    def __exit__(self, *exc) -> bool:
        phases = self.report["phases"]
        phases[self.name] = phases.get(self.name, 0.0) + _perf_counter() - self.start
        return False


class _GpuClock:
    """Per-call GPU time: L2 flushed before, the whole device synchronised before the begin and the end
    event (so work on any stream counts, and only once it is called), events recorded on the default
    stream by torch's C methods."""

    def __init__(self):
        self.flush = torch.empty(_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        self.stream = torch.cuda.default_stream()

    def start(self) -> None:
        with _no_torch_function(), _no_torch_dispatch():
            _zero_(self.flush)
        self.begin, self.end = _EventBase(enable_timing=True), _EventBase(enable_timing=True)
        # An idle device when the clock starts: work the candidate puts on a stream of its own, which
        # waits for nothing, cannot start under the flush (or the input copies) before the begin event.
        _cuda_synchronize()
        _event_record(self.begin, self.stream)

    def stop(self) -> float:
        _cuda_synchronize()
        _event_record(self.end, self.stream)
        _event_sync(self.end)
        return _event_elapsed(self.begin, self.end)


# ---- what goes back ------------------------------------------------------------------------------------


class _SavedOutputs:
    """Kept outputs on their way to the scratch folder. They wait on the device, where nothing is copied
    between the timed calls, until more than _WAITING_OUTPUT_BYTES wait; those are then saved at once. A
    full-size convolution keeps seven 2 GB outputs: kept to the end, they made a 16 GB process, and other
    workers' candidates beside it ran out of GPU memory. The copies to the host run while the profiler
    records, so they are counted (`host_copies`) and left out of the forward's activities.

    Saving is two steps. The copies to the host read the GPU under this process's hold. The writes and
    hashes, seconds for full-size outputs, need no GPU: a save between calls leaves them to threads while
    the calls go on, and waits for them only before its next copies (one batch on the host at a time);
    the last save waits for them with the GPU hold given up. Writing between calls with the hold given up,
    then taking the GPU back alone, had made saves 235 s of twelve candidates' time on a shared H100; in
    threads they took 137 s (scripts/results/eval_profile_h100_2026-12-06_background_saves.json).
    Threads from `_thread` itself, bound at import: concurrent.futures is Python code the candidate can
    patch, and it would hand the outputs to whatever it was patched with."""

    def __init__(self, scratch: str, report: dict):
        self.scratch, self.report = scratch, report
        self.waiting: dict[str, list] = {}
        self.sizes: dict[str, int] = {}      # bytes of each waiting output's tensors
        self.entries: dict[str, dict | None] = {}  # by name, in the order kept: None while being written
        self.host_copies = 0                 # device tensors copied to the host so far, one profiled copy each
        self.writes = _Threads()             # the last batch's writes, running while the calls go on

    @property
    def waiting_bytes(self) -> int:
        return sum(self.sizes.values())

    def keep(self, name: str, values: list) -> None:
        self.waiting[name], self.sizes[name] = values, _tensor_bytes(values)
        if self.waiting_bytes > _WAITING_OUTPUT_BYTES:
            self.save(wait=False)

    def save(self, wait: bool = True) -> None:
        """Every waiting output copied to the host and written, in batches of at most _SAVERS outputs and
        _HOST_BATCH_BYTES; with wait=False the last batch is still being written on return."""
        self.host_copies += sum(1 for values in self.waiting.values() for v in values
                                if type(v) is _Tensor and _is_cuda(v) and _numel(v) > 0)
        waiting = self.waiting
        with _phase(self.report, "save"):
            for batch in _host_batches(self.sizes):
                self._finish_writes()
                self.entries.update(dict.fromkeys(batch))
                host: dict[str, list] = {}
                copies = _Threads()
                copies.start(batch, lambda name: host.__setitem__(name, _to_host(waiting[name])))
                self._note_failures(copies.join())
                self.writes.start([n for n in batch if n in host],
                                  lambda name: self.entries.__setitem__(name, _write(self.scratch, name, host[name])))
            if wait:
                with gpu_share.gpu_yielded():
                    self._finish_writes()
        self.waiting, self.sizes = {}, {}

    def _finish_writes(self) -> None:
        self._note_failures(self.writes.join())

    def _note_failures(self, failed: dict[str, str]) -> None:
        for name, error in failed.items():  # reported as this output's error; the trusted side rejects it
            self.entries[name] = {"error": f"{error} while saving"}


class _Threads:
    """work(name) for each name, each in a thread of its own; join() waits for all that were started and
    returns the exception type of each that raised."""

    def __init__(self):
        self.running: list = []     # one lock per thread, released as it ends
        self.failed: dict[str, str] = {}

    def start(self, names: list[str], work) -> None:
        for name in names:
            finished = _allocate_lock()
            finished.acquire()
            _start_thread(_run_one, (work, name, self.failed, finished))
            self.running.append(finished)

    def join(self) -> dict[str, str]:
        for finished in self.running:
            finished.acquire()
        failed, self.running, self.failed = self.failed, [], {}
        return failed


def _without_own_copies(names: list[str], copies: int) -> list[str]:
    """The profiler's names less `copies` of the harness's own copies to the host. A copy the candidate's code
    makes is one more, and is still there for the trusted side to reject. (Each one the harness counted did
    run: a copy that failed leaves its output unreadable, and the candidate is rejected for that.)"""
    kept = []
    for name in names:
        if copies and name == _HOST_COPY_NAME:
            copies -= 1
        else:
            kept.append(name)
    return kept


def _tensor_bytes(values: list) -> int:
    return sum(_numel(v) * _element_size(v) for v in values if type(v) is _Tensor)


def _host_batches(sizes: dict[str, int]) -> list[list[str]]:
    """The names in order, in groups of at most _SAVERS whose sizes (bytes) add up to at most
    _HOST_BATCH_BYTES (a larger one is a group of its own)."""
    batches: list[list[str]] = []
    total = 0
    for name, size in sizes.items():
        if not batches or len(batches[-1]) == _SAVERS or total + size > _HOST_BATCH_BYTES:
            batches.append([])
            total = 0
        batches[-1].append(name)
        total += size
    return batches


def _run_one(work, name: str, failed: dict[str, str], finished) -> None:
    try:
        work(name)
    except Exception as err:
        failed[name] = type(err).__name__
    finally:
        finished.release()


def _to_host(values: list) -> list:
    with _no_torch_function(), _no_torch_dispatch():
        return [_cpu(_detach(v)) if type(v) is _Tensor else v for v in values]


def _write(scratch: str, name: str, host: list) -> dict:
    file_name = f"{name}.out"
    try:
        digest = wire.write_values(scratch + "/" + file_name, host)
    except wire.WireError as err:
        return {"error": str(err)}
    return {"file": file_name, "sha256": digest}


def _violation_json(v: Violation) -> dict:
    return {"rule": v.rule.value, "message": v.message, "line": v.line}


def _describe(err: BaseException, limit: int = 400) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {(lines[0] if lines else '')[:limit]}".rstrip(": ")


_COMPILE_TIME_ERRORS = ("NameError", "SyntaxError", "AttributeError", "TypeError", "CompilationError",
                        "UnsupportedLanguageConstruct")


def _is_compile_error(err: Exception) -> bool:
    """Triton's compiler errors, and their interpreter equivalents (which wrap the same mistakes)."""
    name, module = type(err).__name__, type(err).__module__
    if module.startswith("triton.compiler") or name in {"CompilationError", "CompileTimeAssertionFailure"}:
        return True
    return name == "InterpreterError" and any(kind in str(err) for kind in _COMPILE_TIME_ERRORS)


def _solution_line(solution_path: str, err: BaseException) -> int | None:
    """The deepest line of the solution file in the exception's traceback."""
    target = str(Path(solution_path).resolve())
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__)
             if str(Path(f.filename).resolve()) == target]
    return lines[-1] if lines else None


def _kernel_compile_error(err: BaseException, solution_path: str) -> tuple[str, int | None] | None:
    """Triton's compile error as the kernel author needs it: its own message (str(err) opens with the
    source excerpt) and the solution's line it points at, where the traceback only reaches the launch in
    forward. Triton counts lines from the kernel's `def`, whose text is the first line of `err.src`."""
    src, lineno = getattr(err, "src", None), getattr(getattr(err, "node", None), "lineno", None)
    if not isinstance(src, str) or not isinstance(lineno, int) or not src.strip():
        return None
    detail = getattr(err, "error_message", None)
    detail = str(detail).strip().splitlines()[-1] if detail else "the kernel does not compile"
    with open(solution_path, encoding="utf-8", errors="replace") as stream:
        lines = stream.read().splitlines()
    definition = src.strip().splitlines()[0].strip()
    start = next((n for n, text in enumerate(lines, 1) if text.strip() == definition), None)
    if start is None or not 0 < start + lineno - 1 <= len(lines):
        return f"{type(err).__name__}: {detail} (line {lineno} of the kernel)"[:600], None
    line = start + lineno - 1
    return f"{type(err).__name__} at line {line} (`{lines[line - 1].strip()[:160]}`): {detail}"[:600], line


def violation_from_json(data: dict) -> Violation:
    """The trusted side's reading of one reported violation; unknown rules are not trusted."""
    return Violation(Rule(data["rule"]), str(data["message"])[:1000],
                     data["line"] if isinstance(data.get("line"), int) else None)


harden.own_builtins(globals())
