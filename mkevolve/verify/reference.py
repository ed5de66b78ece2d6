"""Reference inputs and outputs, computed by a trusted process and kept on disk for every later candidate.

For each (problem, seed, mode, input config, device) there is one folder:

    <cache>/references/<key>/init.mkv            the constructor's arguments
    <cache>/references/<key>/<set>.in.mkv        one input set ("trial0", "time1", ...)
    <cache>/references/<key>/<set>.ref.mkv       the reference Model's outputs on it, or
    <cache>/references/<key>/<set>.ref.recompute where they are too large to keep (RECOMPUTED_OUTPUT_BYTES)
    <cache>/references/<key>/state.json          what the first forward writes into: buffers and inputs

Input sets are drawn with seeds derived from a secret salt kept beside the cache, so a candidate
cannot reproduce them in `__init__` and precompute its answers; the weights still come from the run's
seed, which ModelNew needs to build the same parameters. The candidate process can read neither the
salt nor this folder: its harness loads the input files it is called with before the candidate's code is
imported, and the reference outputs never leave the trusted side. An input the reference's forward writes
into (`x.mul_(2)`) is part of what it computes: its value after the call is kept after the outputs.

Everything here can be computed again, so the cache is bounded by the disk it is on: before a set is
written, folders that no check is using are evicted, least recently used first, until the set fits with
DISK_RESERVE_BYTES to spare; when even that is not enough it waits for other checks to let go of theirs,
and after SPACE_WAIT_S stops with a ReferenceSpaceError that says how much was needed and where. A check
holds its folders (`in_use`) from computing the sets to timing the baseline, so an eviction never takes
files from under it; a folder evicted between two checks is computed again by the next one. Outputs
larger than RECOMPUTED_OUTPUT_BYTES are not written at all: the trusted process computes them again from
the stored inputs when a check reads them. Writing a set is disk work: the worker lends its GPU hold
meanwhile, and draws the next set's inputs on the CPU while a thread writes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterator

import torch

from mkevolve.fsutil import write_atomic
from mkevolve.problem import (Problem, build_model, call_inputs, clone_values, flatten_outputs,
                              make_inputs, shifted_values, to_device)
from mkevolve.verify.timing import default_cache_dir
from mkevolve.workers import wire
from mkevolve.workers.gpu_share import gpu_lent, gpu_yielded, lock_file

_SALT_FILE = "salt"
# Reference outputs, and the inputs that timed calls take shifted, that a trusted worker keeps between
# candidates (bytes, on the device they are compared on): the checked outputs of a full-size KernelBench GEMM
# are 224 MB, read again for every candidate otherwise. Least recently used first out.
EXPECTED_CACHE_BYTES = 1 << 30
_expected: OrderedDict[tuple, list] = OrderedDict()
_expected_bytes: dict[tuple, int] = {}
# Disk left free under the cache (bytes). Full-size problems write gigabytes per input set: a KernelBench
# SqueezeNet fire module's reference output is 4.3 GB, and a check uses 8 sets.
DISK_RESERVE_BYTES = 4 << 30
# Reference outputs larger than this (bytes) are computed again by the trusted process whenever a check reads
# them, from the set's stored inputs, instead of being kept: on the GPU the forward takes milliseconds where
# reading gigabytes back takes seconds, and the disk holds the inputs alone (a full-size SqueezeNet fire
# module: 0.1 GB of input against 4.3 GB of output per set).
RECOMPUTED_OUTPUT_BYTES = EXPECTED_CACHE_BYTES
# How long a set that does not fit waits for other checks to let go of their folders (s). Four full-size runs
# on one H200's 64 GB disk held 58 GB of references at once; a check that gave up at once left its run
# (KernelBench level2/35) without a solution, where the other checks were done within minutes.
SPACE_WAIT_S = 300.0
_SPACE_POLL_S = 2.0
_RECOMPUTE_MARK = ".ref.recompute"
# The reference Model of the last folder whose outputs this process computed again, by (folder, device):
# one at a time, since a full-size model can hold gigabytes of weights.
_recompute_models: dict[tuple[str, str], torch.nn.Module] = {}
# Sets' outputs from the reference Model run in fp64, by (folder, device, set), least recently used first:
# what the measured precision rule compares with. A worker that takes candidates of several subproblems in
# turn keeps each one's; together they hold at most FP64_REFERENCE_BYTES.
_fp64_references: OrderedDict[tuple[str, str, str], "Fp64Reference | None"] = OrderedDict()
FP64_REFERENCE_BYTES = EXPECTED_CACHE_BYTES
# A set whose fp64 outputs alone pass FP64_REFERENCE_BYTES keeps them at this many positions per output tensor
# (16 bytes each: the position and the value), drawn at random by the trusted process. Eight of the 37 shared
# KernelBench problems are such (1.9 to 8.6 GB in fp64), and went unmeasured before. A kernel that computes
# coarsely on one output in 100,000 is still seen at 4M positions (the chance of missing it: e^-42).
FP64_SAMPLED_POSITIONS = 1 << 22
# Elements compared at once in `largest_error`: its fp64 temporaries stay at 0.5 GB where outputs run to GBs.
_ERROR_CHUNK = 1 << 26
_USED_FILE = ".used"          # its mtime: when a check last started on the folder
_LOCK_FILE = ".lock"          # held by the process computing the folder's missing sets
_READERS_FILE = ".readers"    # held shared by every check using the folder, alone by an eviction
_EVICTED_PREFIX = ".evicted-"  # a folder renamed out of the way, being deleted
_STATE_FILE = "state.json"
# Part of every folder's key: folders of an older layout (a state file of buffers alone, no written inputs
# after the outputs) are never read, and are evicted like any unused folder.
_LAYOUT = 2
FIRST_SET = "trial0"          # the input set of every check's first call (candidate_run.plan_calls)


class ReferenceSpaceError(OSError):
    """The disk under the reference cache cannot hold one more input set, even after evicting stale ones."""


@dataclass(frozen=True)
class Fp64Reference:
    """The reference Model run in fp64 on one set's inputs (upcast): what fp32's own rounding is measured
    against. The outputs are as `expected` lists them (the written inputs last): whole, or, for outputs too large
    to keep, flattened and taken at `positions` alone."""

    outputs: list
    eager_error: float        # the fp32 reference's largest error against them, over every element
    largest: float            # their largest magnitude, over every element: the scale of an ulp
    positions: list | None = None   # per output, the flat positions its kept values are at (None: all of them)

    def error(self, values: list) -> float:
        """The largest |value - exact| of a candidate's outputs, where the exact values are kept."""
        if self.positions is None:
            return largest_error(values, self.outputs)
        return largest_error([_at_positions(v, p) for v, p in zip(values, self.positions)], self.outputs)

    @property
    def nbytes(self) -> int:
        return _nbytes(self.outputs) + _nbytes(self.positions or [])


def largest_error(values: list, exact: list) -> float:
    """The largest |value - exact| over the floating-point tensors, on exact's device; NaN where both are NaN
    counts as none."""
    errors = [_largest_difference(v, e) for v, e in zip(values, exact)
              if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    return max(errors, default=0.0)


def _largest_difference(value: torch.Tensor, exact: torch.Tensor) -> float:
    return max(float((part.to(whole.device, torch.float64) - whole.double()).abs().nan_to_num(nan=0.0).max())
               for part, whole in zip(_flat_chunks(value), _flat_chunks(exact)))


def _largest_magnitude(value: torch.Tensor) -> float:
    """The largest finite |value| (NaN and infinities count as none), 0 for an empty tensor."""
    return max((float(part.double().abs().nan_to_num(nan=0.0, posinf=0.0).max()) for part in _flat_chunks(value)),
               default=0.0)


def _flat_chunks(value: torch.Tensor) -> Iterator[torch.Tensor]:
    flat = value.reshape(-1)
    return (flat[start:start + _ERROR_CHUNK] for start in range(0, flat.numel(), _ERROR_CHUNK))


def _sampled_positions(value) -> torch.Tensor | None:
    """FP64_SAMPLED_POSITIONS flat positions in a floating-point tensor, from a secret seed: drawn in the trusted
    process, whose memory no candidate process reads, so no kernel can know which of its outputs are measured."""
    if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel()):
        return None
    generator = torch.Generator(device=value.device)
    generator.manual_seed(secrets.randbits(63))
    return torch.randint(value.numel(), (min(value.numel(), FP64_SAMPLED_POSITIONS),), generator=generator,
                         device=value.device)


def _at_positions(value, positions: torch.Tensor | None):
    return value if positions is None else value.reshape(-1)[positions.to(value.device)]


@dataclass(frozen=True)
class ReferenceSet:
    """The cached reference of one input config; files are created on first use of each set."""

    folder: Path
    problem: Problem
    config_index: int
    seed: int
    eval_mode: bool
    device: torch.device

    @property
    def init_file(self) -> Path:
        return self.folder / "init.mkv"

    def inputs_file(self, name: str) -> Path:
        return self.folder / f"{name}.in.mkv"

    def outputs_file(self, name: str) -> Path:
        return self.folder / f"{name}.ref.mkv"

    def recompute_mark(self, name: str) -> Path:
        return self.folder / f"{name}{_RECOMPUTE_MARK}"

    @property
    def state_file(self) -> Path:
        return self.folder / _STATE_FILE

    def mutated_buffers(self) -> list[str]:
        """The names of the reference Model's floating-point buffers that its first forward, on a fresh model,
        changes (batch norm's running statistics in training): the state verify/module_state.py compares.
        Recorded when FIRST_SET is computed; read after `ensure`."""
        return json.loads(self.state_file.read_text())["buffers"]

    def written_inputs(self) -> list[int]:
        """The positions of the forward's tensor arguments that the reference writes into (an in-place
        `x.relu_()` on an argument), found on FIRST_SET; their values after each call follow the outputs in
        `expected`. Read after `ensure`."""
        return json.loads(self.state_file.read_text())["inputs"]

    def _done(self, name: str) -> bool:
        return self.outputs_file(name).exists() or self.recompute_mark(name).exists()

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """Keep the folder from eviction while a check reads or writes it (a shared flock, released when the
        file closes or this process dies). When an eviction won the race, the file locked here is no longer
        the folder's (it was renamed away with it): the folder is made again and held anew."""
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                readers = open(self.folder / _READERS_FILE, "a")
            except FileNotFoundError:
                continue                        # evicted between the mkdir and the open
            with readers:
                fcntl.flock(readers, fcntl.LOCK_SH)
                if _same_file(readers, self.folder / _READERS_FILE):
                    yield
                    return

    def ensure(self, names: list[str], inputs_only: Collection[str] = ()) -> None:
        """Compute whatever input sets are missing, with one reference Model built for all of them. The sets
        named in `inputs_only` get their inputs alone, marked to be computed again if ever read: the calls
        that take them take them shifted, and their outputs are computed per check (`expected`)."""
        config = self.problem.configs[self.config_index]
        init = call_inputs(self.problem.path, config.get_init_inputs, "get_init_inputs")
        (self.folder / _USED_FILE).touch()
        if not self.init_file.exists():
            _write_atomic_values(self.init_file, init)
        if all(self._done(name) for name in names) and self.state_file.exists():
            return
        # Once even when several workers ask at the same moment (the first candidates of a beam step
        # all need the same sets): the first takes the folder's lock and computes, the others wait and
        # find the files. Released when the file closes, or when this process dies.
        with open(self.folder / _LOCK_FILE, "a") as lock:
            lock_file(lock)
            self._compute([name for name in names if not self._done(name)], config, set(inputs_only))

    def build_model(self, device: torch.device | None = None) -> torch.nn.Module:
        """This config's reference Model: its init arguments, the check's seed and mode, on the check's device
        unless told another (the same weights on any: they are made on the CPU first)."""
        config = self.problem.configs[self.config_index]
        init = call_inputs(self.problem.path, config.get_init_inputs, "get_init_inputs")
        return build_model(self.problem.path, self.problem.model_cls, init, self.seed, device or self.device,
                           self.eval_mode)

    def _compute(self, missing: list[str], config, inputs_only: set[str]) -> None:
        if not self.state_file.exists() and FIRST_SET not in missing:
            missing = [FIRST_SET, *missing]     # a folder from before the state was recorded: its files again
        if not missing:
            return
        model = self.build_model()
        names = sorted(missing, key=lambda name: name != FIRST_SET)   # the first set on the fresh model
        drawn = self._draw(names[0], config)
        with ThreadPoolExecutor(max_workers=1) as writer:
            for index, name in enumerate(names):
                inputs = to_device(drawn, self.device)
                if name == FIRST_SET:
                    outputs = self._first_outputs(model, inputs)
                else:
                    outputs = [] if name in inputs_only else self._forward(model, inputs)
                keep_outputs = _nbytes(outputs) <= RECOMPUTED_OUTPUT_BYTES and name not in inputs_only
                inputs, outputs = _on_host(inputs), _on_host(outputs) if keep_outputs else []
                # Seconds of disk and hashing for a full-size set, none of it on the GPU; the next set's
                # inputs are drawn on the CPU meanwhile (KernelBench level2/19: 2.2 GB per set, 2.6 s to draw).
                with gpu_lent():
                    written = writer.submit(self._write_set, name, inputs, outputs, keep_outputs)
                    drawn = self._draw(names[index + 1], config) if index + 1 < len(names) else []
                    written.result()

    def _draw(self, name: str, config) -> list:
        """One set's inputs from the problem's get_inputs with the set's seed, on the CPU (where get_inputs
        makes them; the same values as drawing them for the device)."""
        return make_inputs(self.problem.path, config, self._input_seed(name), torch.device("cpu"))

    def _first_outputs(self, model: torch.nn.Module, inputs: list) -> list:
        """The first set's outputs on the fresh model; records which buffers and inputs its forward writes
        into (state.json), and appends those inputs as they are after the call."""
        before = _floating_buffers(model)
        args = clone_values(inputs)
        with torch.no_grad():
            outputs = flatten_outputs(model(*args))
        buffers = [key for key, value in _floating_buffers(model).items()
                   if key in before and not torch.equal(value, before[key])]
        written = [i for i, (arg, given) in enumerate(zip(args, inputs)) if not same_values(arg, given)]
        write_atomic(self.state_file, json.dumps({"buffers": buffers, "inputs": written}))
        return outputs + [args[i] for i in written]

    def _write_set(self, name: str, inputs: list, outputs: list, keep_outputs: bool) -> None:
        make_room(self.folder, _nbytes(inputs) + _nbytes(outputs), f"{self.problem.path.name} set {name}")
        _write_atomic_values(self.inputs_file(name), inputs)
        if keep_outputs:
            _write_atomic_values(self.outputs_file(name), outputs)
        else:
            self.recompute_mark(name).touch()   # last: the set is complete once it exists

    def expected(self, name: str, shift: int = 0) -> list:
        """The reference outputs of one input set, kept in this (trusted) process for later candidates; with a
        shift, on the set's inputs shifted so (a timed or late call's, problem.shifted_values), computed anew."""
        if shift:
            shifted = shifted_values(_read_kept(self.inputs_file(name), self.device), shift)   # copies already
            return self._forward(self._recompute_model(), shifted, copy=False)
        path = self.outputs_file(name)
        if not self._done(name):
            # Seen once among two workers checking the same problem (the isolation batch, 2026-12-05): a set
            # whose outputs were gone by the time the judge read them, cause not found. Everything here can be
            # computed again, so the set is, under the folder's lock, rather than the check crashing.
            self.ensure([name])
        if not path.exists() and self.recompute_mark(name).exists():
            return self._recompute(name)
        return _read_kept(path, self.device)

    def _recompute(self, name: str) -> list:
        """The outputs of a set kept without them: the reference Model again, on the inputs the candidate got."""
        return self._forward(self._recompute_model(), wire.read_values(self.inputs_file(name), self.device))

    def _recompute_model(self) -> torch.nn.Module:
        key = (str(self.folder), str(self.device))
        model = _recompute_models.get(key)
        if model is None:
            _recompute_models.clear()
            model = _recompute_models[key] = self.build_model()
        return model

    def fp64(self, name: str) -> Fp64Reference | None:
        """One set's fp64 reference, computed once in this (trusted) process by a fresh Model: a
        forward's outputs seldom depend on the calls before it (a training batch norm's running statistics
        change, its outputs use the batch's own; a reference that draws random numbers is refused up front),
        and where they do, eager's error against it is as large as anyone's, and so is the limit.
        None where it cannot be measured: no floating-point output, or a Model that does not run in fp64 (one
        that makes fp32 tensors of its own). Outputs past FP64_REFERENCE_BYTES in fp64 are kept at
        FP64_SAMPLED_POSITIONS secret positions alone; eager's error and the largest magnitude are measured over
        all of them first."""
        key = (str(self.folder), str(self.device), name)
        if key in _fp64_references:
            _fp64_references.move_to_end(key)
            return _fp64_references[key]
        expected = self.expected(name)      # computed again where the set keeps no outputs (RECOMPUTED_OUTPUT_BYTES)
        floating = [v for v in expected if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if not floating:
            return None
        sampled = 2 * _nbytes(floating) > FP64_REFERENCE_BYTES
        _forget_fp64_until_free(16 * FP64_SAMPLED_POSITIONS * len(floating) if sampled else 2 * _nbytes(floating))
        _fp64_references[key] = self._compute_fp64(name, expected, sampled)
        # The forward in fp64 peaked at 5.5 to 26 GB on a GPU for the full-size problems it samples
        # (scripts/results/precision_cost_sampled_h200_2026-12-06.json), which PyTorch's allocator would keep
        # until the job ends while other runs' candidates on the GPU ran out of memory: give it back now.
        torch.cuda.empty_cache()
        return _fp64_references[key]

    def _compute_fp64(self, name: str, expected: list, sampled: bool) -> Fp64Reference | None:
        try:
            exact = self._forward_fp64(name)
        except RuntimeError:    # a Model that makes fp32 tensors of its own has no fp64 form
            return None
        if [getattr(v, "shape", None) for v in exact] != [getattr(v, "shape", None) for v in expected]:
            return None
        largest = max(_largest_magnitude(v) for v in exact if isinstance(v, torch.Tensor) and v.is_floating_point())
        eager_error = largest_error(expected, exact)
        if not sampled:
            return Fp64Reference(exact, eager_error, largest)
        positions = [_sampled_positions(v) for v in exact]
        return Fp64Reference([_at_positions(v, p) for v, p in zip(exact, positions)], eager_error, largest, positions)

    def _forward_fp64(self, name: str) -> list:
        """The outputs of one call of a fresh Model in fp64 on the set's inputs upcast, on the check's device.
        Where other processes hold the GPU's memory, on the CPU instead: slower, as exact. Left unmeasured, any
        kernel would pass the rule while the GPU is full."""
        try:
            return self._forward_fp64_on(name, self.device)
        except torch.cuda.OutOfMemoryError:
            return self._forward_fp64_on(name, torch.device("cpu"))

    def _forward_fp64_on(self, name: str, device: torch.device) -> list:
        inputs = [v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                  for v in wire.read_values(self.inputs_file(name), device)]
        return self._forward(self.build_model(device).double(), inputs)

    def _forward(self, model: torch.nn.Module, inputs: list, copy: bool = True) -> list:
        """The outputs of one call on copies of `inputs` (on `inputs` themselves where told not to copy: the
        caller's own copies), then the inputs it writes into, as they are after it."""
        args = clone_values(inputs) if copy else list(inputs)
        with torch.no_grad():
            outputs = flatten_outputs(model(*args))
        return outputs + [args[i] for i in self.written_inputs()]

    def _input_seed(self, name: str) -> int:
        text = f"{self.seed}/{self.eval_mode}/{self.config_index}/{name}".encode()
        digest = hashlib.sha256(_salt(self.folder.parent) + text).digest()
        return int.from_bytes(digest[:8], "big") % (2**63)


def cache_root(override: str | None = None) -> Path:
    """Where references live: the given folder, else beside the torch.compile baselines."""
    return Path(override) if override else default_cache_dir().parent


def _cache_key(*parts: object) -> str:
    return hashlib.sha256("/".join(str(part) for part in parts).encode()).hexdigest()[:24]


def reference_set(cache_root: Path, problem: Problem, config_index: int, seed: int, eval_mode: bool,
                  device: torch.device) -> ReferenceSet:
    key = _cache_key(problem.source_hash, seed, eval_mode, config_index, device.type, torch.__version__, _LAYOUT)
    folder = Path(cache_root) / "references" / key
    folder.mkdir(parents=True, exist_ok=True)
    return ReferenceSet(folder, problem, config_index, seed, eval_mode, device)


def determinism_mark(cache_root: Path, problem: Problem, seed: int, eval_mode: bool, device: torch.device) -> Path:
    """Made by a trusted worker once the problem's reference ran twice alike with this seed and mode, on this
    kind of device and torch version (a candidate process cannot write the cache). Never evicted: a few bytes
    per problem, and a changed problem has another source hash."""
    return Path(cache_root) / "deterministic" / _cache_key(problem.source_hash, seed, eval_mode, device.type,
                                                             torch.__version__)


def _salt(references_dir: Path) -> bytes:
    """This machine's secret for input seeds: made once, private to the user (mode 0600)."""
    path = references_dir / _SALT_FILE
    if not path.exists():
        tmp = references_dir / f".{_SALT_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)  # the first writer wins; later ones read its salt
        except FileExistsError:
            pass
        os.unlink(tmp)
    return path.read_bytes()


def make_room(folder: Path, needed: int, what: str) -> None:
    """Evict reference folders beside `folder` that no check is using, least recently used first, until
    `needed` bytes fit with the reserve to spare. While they do not and other checks hold folders, wait for
    those (up to SPACE_WAIT_S, the GPU given up meanwhile); then a ReferenceSpaceError naming `what`."""
    deadline = time.monotonic() + SPACE_WAIT_S
    while not _evict_until_it_fits(folder, needed):
        held = _folders_by_last_use(folder.parent, keep=folder)
        if not held or time.monotonic() >= deadline:
            gib, free = 1 << 30, _free_bytes(folder)
            raise ReferenceSpaceError(
                f"reference cache {folder.parent}: {needed / gib:.1f} GiB needed for {what}, {free / gib:.1f} "
                f"GiB free ({DISK_RESERVE_BYTES / gib:.0f} GiB kept free); point MKEVOLVE_CACHE at a larger disk")
        with gpu_yielded():    # the checks holding folders may need the GPU to finish
            time.sleep(_SPACE_POLL_S)


def _evict_until_it_fits(folder: Path, needed: int) -> bool:
    for other in _folders_by_last_use(folder.parent, keep=folder):
        if _free_bytes(folder) - needed >= DISK_RESERVE_BYTES:
            return True
        _evict(other)
    return _free_bytes(folder) - needed >= DISK_RESERVE_BYTES


def _folders_by_last_use(references_dir: Path, keep: Path) -> list[Path]:
    """Every folder but `keep`, least recently used first (the remains of an interrupted eviction are removed)."""
    used = []
    for folder in references_dir.iterdir():
        if folder.name.startswith(_EVICTED_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)
        elif folder != keep and folder.is_dir():
            used.append((_last_used(folder), folder))
    return [folder for _, folder in sorted(used)]


def _last_used(folder: Path) -> float:
    for path in (folder / _USED_FILE, folder):
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            continue
    return 0.0                                  # evicted by another process meanwhile


def _evict(folder: Path) -> None:
    """Remove a folder unless a check is using it or a process is computing its sets (both checked without
    waiting: a busy folder is skipped, never waited for). It is first renamed out of the way, in one step, so
    a check arriving meanwhile makes a fresh folder instead of writing into one being deleted."""
    doomed = folder.with_name(f"{_EVICTED_PREFIX}{folder.name}.{os.getpid()}")
    try:
        with open(folder / _LOCK_FILE, "a") as lock, open(folder / _READERS_FILE, "a") as readers:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(readers, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(folder, doomed)
    except (BlockingIOError, FileNotFoundError):
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _same_file(opened, path: Path) -> bool:
    try:
        return os.fstat(opened.fileno()).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


def _free_bytes(folder: Path) -> int:
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize


def _floating_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in model.named_buffers() if value.is_floating_point()}


def same_values(after, before) -> bool:
    """Whether a forward left an argument as it was: any value but a tensor counts as left; a tensor must hold
    the same bits (NaN where NaN was)."""
    if not isinstance(before, torch.Tensor):
        return True
    if torch.equal(after, before):
        return True
    return (before.is_floating_point() and torch.equal(after.isnan(), before.isnan())
            and torch.equal(after.nan_to_num(0.0), before.nan_to_num(0.0)))


def _on_host(values: list) -> list:
    return [v.cpu() if isinstance(v, torch.Tensor) else v for v in values]


def _read_kept(path: Path, device: torch.device) -> list:
    """A value file's contents, kept in this (trusted) process for later candidates while the kept files add up
    to EXPECTED_CACHE_BYTES (least recently used dropped first): a set's outputs, or the inputs that timed calls
    take shifted. The values are shared: callers copy before they write."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, str(device))
    if stat.st_size > EXPECTED_CACHE_BYTES:
        return wire.read_values(path, device)
    if key not in _expected:
        _expected[key] = wire.read_values(path, device)
        _expected_bytes[key] = stat.st_size
        while sum(_expected_bytes.values()) > EXPECTED_CACHE_BYTES and len(_expected) > 1:
            oldest = next(iter(_expected))
            del _expected[oldest], _expected_bytes[oldest]
    _expected.move_to_end(key)
    return _expected[key]


def forget_kept() -> None:
    """Let go of everything this (trusted) process keeps between checks: reference outputs and shifted inputs,
    fp64 references and the reference Model kept for recomputing. A check that ran out of GPU memory runs again
    with its memory back (verify/correctness.py); all of it is read or computed again where needed."""
    _expected.clear()
    _expected_bytes.clear()
    _fp64_references.clear()
    _recompute_models.clear()


def _nbytes(values) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _forget_fp64_until_free(needed: int) -> None:
    """Drop the least recently used fp64 references until `needed` more bytes fit in FP64_REFERENCE_BYTES."""
    def held() -> int:
        return sum(exact.nbytes for exact in _fp64_references.values() if exact is not None)

    while _fp64_references and held() + needed > FP64_REFERENCE_BYTES:
        _fp64_references.popitem(last=False)


def _write_atomic_values(path: Path, values) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    wire.write_values(tmp, values)
    os.replace(tmp, path)

