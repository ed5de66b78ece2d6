"""What actually ran on the GPU during forward, and whether the candidate was allowed to run it.

On a GPU this is the authoritative cheating check. The candidate process records every device
activity of one forward with the PyTorch profiler (CUPTI through kineto), in `ActivityRecorder`,
and reports the list; the trusted side judges it here, without importing candidate code:

- `activity_violations`: every kernel must be compiled from one of the candidate's own
  @triton.jit functions (Triton names the CUDA kernel after the Python function), except ATen's
  fill, copy and arange kernels, which the static and dispatcher rules also let forward run;
  no device-to-host copy.
- `compiled_precision_violations`: reads the TTIR Triton wrote to its cache for each kernel that
  ran and rejects lower-precision matrix math on an fp32 problem, however the source spelled it
  (`tl.core.dot`, `tl.dtype("fp" + "16")`, a precision chosen at run time, ...).

Names are evidence, not proof: a kernel is accepted by its name alone. What keeps a candidate
from loading its own binary under an accepted name is its confinement (no native libraries) and
the rule that its Triton kernels must have left their compiled IR in its own cache.
"""

from __future__ import annotations

import itertools
import json
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from mkevolve.verify.cheating.rules import KERNEL_ADVICE, Rule, Violation
from mkevolve.verify.cheating.static import parse_executed

# Taken once, when the trusted harness imports this module and before any candidate code runs:
# candidate code imported later may rebind these names (torch.profiler.profile = Fake) or patch the
# profiler's Python classes, so the recording is stopped and read through torch's C functions only
# (`_disable_profiler`, and the C methods of the events it returns).
_PROFILE = torch.profiler.profile
_CUDA_ACTIVITY = torch.profiler.ProfilerActivity.CUDA
_CUDA_DEVICE = torch.autograd.DeviceType.CUDA
_cuda_available = torch.cuda.is_available
_disable_profiler = torch.autograd.profiler._disable_profiler
_cuda_synchronize = getattr(torch._C, "_cuda_synchronize", None)  # absent from CPU builds

KINDS = ("kernel", "memcpy", "memset")
DIRECTIONS = ("HtoD", "DtoH", "DtoD", "HtoH", "")
MAX_NAME_CHARS = 4096           # longest name a report may carry; real demangled names are shorter
SHOWN_NAME_CHARS = 120          # how much of a kernel name a violation message quotes
MAX_IR_BYTES = 8 * 1024 * 1024  # a larger .ttir is not read (and the kernel is not cleared)
MAX_IR_FILES = 512              # compiled variants checked per call, autotune configs included
MAX_CACHE_ENTRIES = 8192        # cache folders looked at before giving up
TRITON_FILE_NAME_CHARS = 150    # Triton cuts a kernel's cache file names to this many characters


# ---------------------------------------------------------------------------------------------
# Device activities
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceActivity:
    """One thing the GPU did: a kernel, a memcpy or a memset, as the profiler named it."""

    name: str        # kernel name, or the profiler's memcpy/memset label
    kind: str        # "kernel" | "memcpy" | "memset"
    direction: str = ""   # memcpy only: "HtoD" | "DtoH" | "DtoD" | "HtoH" | "" (unknown)

    @classmethod
    def from_report(cls, name: object) -> "DeviceActivity":
        """One entry of a candidate's report: the profiler's name of a device event, classified here,
        on the trusted side. Raises ValueError on anything but a name of bounded length."""
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise ValueError(f"a device activity is a name of 1 to {MAX_NAME_CHARS} characters")
        return activity_from_profiler_name(name)


# kineto labels copies "Memcpy HtoD (Pageable -> Device)" and memsets "Memset (Device)" (CUPTI's
# memcpy kind, then source -> destination memory). Arrays (A) and peers (P) are device memory.
_MEMCPY = re.compile(r"^Memcpy (\w+) \((.*)\)$")
_MEMSET = re.compile(r"^Memset \(.*\)$")
_MEMCPY_KIND = re.compile(r"^([HDAP])to([HDAP])$")
_MEMORY_SIDE = {"Pageable": "H", "Pinned": "H", "Device": "D", "Array": "D", "Device Static": "D"}


def _side(letter: str) -> str:
    return "H" if letter == "H" else "D"


def _memcpy_direction(kind: str, memories: str) -> str:
    """"HtoD"-style direction from CUPTI's kind, else from the memory kinds; "" when unknown."""
    match = _MEMCPY_KIND.match(kind)
    if match:
        return f"{_side(match.group(1))}to{_side(match.group(2))}"
    source, _, destination = (part.strip() for part in memories.partition("->"))
    sides = [_MEMORY_SIDE.get(memory) for memory in (source, destination)]
    return f"{sides[0]}to{sides[1]}" if all(sides) else ""


def activity_from_profiler_name(name: str) -> DeviceActivity:
    """Classify one device event by its profiler name (names are cut to MAX_NAME_CHARS)."""
    name = name[:MAX_NAME_CHARS]
    copy = _MEMCPY.match(name)
    if copy:
        return DeviceActivity(name, "memcpy", _memcpy_direction(copy.group(1), copy.group(2)))
    if _MEMSET.match(name):
        return DeviceActivity(name, "memset")
    return DeviceActivity(name, "kernel")


def activities_from_profiler_names(names: Iterable[str]) -> list[DeviceActivity]:
    """Device events, in order, from the names of the profiler's CUDA events.

    Kernel names never look like the memcpy/memset labels: a Triton kernel is named after a
    Python identifier, and library kernels after C++ functions.
    """
    return [activity_from_profiler_name(name) for name in names if name]


class ActivityRecorder:
    """Records every GPU activity inside the block: `with ActivityRecorder() as rec: model(*x)`.

    After a block that completes, `rec.names` lists what the GPU ran (kernels, copies, memsets), in
    order, repeats included, and `rec.activities` classifies them. The device is synchronised on
    entry and exit, so work queued before the block stays out and work queued inside it is in. When
    the block raises, recording stops and both stay empty: the exception is the verdict.
    CUDA only; entering it without CUDA raises RuntimeError.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self._profiler = None

    @property
    def activities(self) -> list[DeviceActivity]:
        return activities_from_profiler_names(self.names)

    def __enter__(self) -> "ActivityRecorder":
        if not _cuda_available():
            raise RuntimeError("ActivityRecorder needs CUDA: it records GPU kernels with the CUDA "
                               "profiler, and this machine has no CUDA device")
        if self._profiler is not None:
            raise RuntimeError("this ActivityRecorder is already recording")
        self.names = []
        _cuda_synchronize()
        self._profiler = _PROFILE(activities=[_CUDA_ACTIVITY])
        self._profiler.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Stops through C functions only: the profiler's Python side may have been patched since."""
        self._profiler = None
        try:
            if exc_type is None:
                _cuda_synchronize()  # kernels still queued would otherwise miss the record
        finally:
            result = _disable_profiler()
        if exc_type is None:
            self.names = [event.name() for event in result.events() if event.device_type() == _CUDA_DEVICE]
        return False

# ---------------------------------------------------------------------------------------------
# Which kernels a candidate may run
# ---------------------------------------------------------------------------------------------

def triton_kernel_names(sources: Iterable[str]) -> set[str]:
    """The kernel names the candidate's @triton.jit functions compile to, read from their source.

    Triton names a kernel after the Python function (`fn.__name__`), autotuned or not; the
    call form `triton.jit(module.fn)` compiles a kernel named `fn`. Raises SyntaxError on
    unparsable source (the static check has rejected it already).
    """
    names = set()
    for source in sources:
        _, parsed = parse_executed(source, "<solution>")
        for written in parsed.kernels:
            name = written.rsplit(".", 1)[-1]
            if name.isidentifier():
                names.add(name)
    return names


# Plain-identifier kernel names that belong to GPU libraries (cuBLAS, cuBLASLt, cuDNN, CUTLASS,
# NCCL). A @triton.jit function with such a name could whitelist the library's kernel, so these
# names are never accepted as the candidate's. Templated and namespaced library names
# ("void cutlass::Kernel2<...>", "void at::native::...") cannot be Python identifiers at all.
_LIBRARY_NAME = re.compile(
    r"^(?:nvjet|xmma|sm\d+_|cutlass|cudnn|cublas|nccl|ampere_|volta_|turing_|maxwell_|kepler_|"
    r"pascal_|hopper_|blackwell_)|_(?:cublas|cublaslt|cudnn|cutlass)$",
    re.IGNORECASE,
)

# ATen kernels forward may run: fill (torch.zeros/ones/full, zero_), copy (clone, contiguous,
# .to(...), copy_) and arange, the same ops the static rules and the dispatcher allow. The op is
# the first functor or lambda the elementwise launcher is instantiated with, after its numeric
# template arguments; the match is anchored there so another op's kernel never passes.
# torch.cat ("CatArrayBatchedCopy") is a copy too, but it is not allowed: neither the static nor
# the dispatcher rules let forward call torch.cat, and when a problem's reference concatenates,
# the concatenation is part of the work the candidate's kernels must do.
_ATEN_HELPER = re.compile(
    r"^void (?:\w+::|\(anonymous namespace\)::)*"
    r"(?:vectorized_elementwise_kernel|unrolled_elementwise_kernel|elementwise_kernel|"
    r"elementwise_kernel_with_index)<"
    r"(?:\w+, )*"                                       # 4, / 128, 2, / int,
    r"(?:at::native::gpu_kernel_impl(?:_nocast)?<)?"
    r"at::native::(?:FillFunctor<|(?:direct|float16|bfloat16|float8)_copy_kernel_cuda\(|"
    r"arange_cuda_out\()"
)


def is_library_name(name: str) -> bool:
    """A plain kernel name that a GPU library uses (so no @triton.jit function may take it)."""
    return bool(_LIBRARY_NAME.search(name))


def is_aten_helper(name: str) -> bool:
    """ATen's fill, copy or arange kernel, which forward may run."""
    return bool(_ATEN_HELPER.match(name))


def _shown(name: str) -> str:
    return name if len(name) <= SHOWN_NAME_CHARS else name[:SHOWN_NAME_CHARS - 3] + "..."


def accepted_triton_kernels(activities: Iterable[DeviceActivity], triton_names: set[str]) -> set[str]:
    """Names of the kernels that ran and are the candidate's own Triton kernels."""
    return {a.name for a in activities
            if a.kind == "kernel" and a.name in triton_names and not is_library_name(a.name)}


def activity_violations(activities: Iterable[DeviceActivity], triton_names: set[str], *,
                        require_launch: bool = True) -> list[Violation]:
    """What one recorded forward ran that it may not, one violation per offending name.

    Rejects kernels that are neither the candidate's @triton.jit kernels nor ATen's fill/copy/
    arange, @triton.jit functions named like library kernels (launched or not), and copies to
    the host. With `require_launch`, a forward in which none of the candidate's Triton kernels
    ran is a NO_LAUNCH violation (also what a profiler that was tampered with looks like).
    """
    activities = list(activities)
    found: dict[str, Violation] = {}
    for name in sorted(triton_names):
        if is_library_name(name):
            found[name] = _reserved_name(name)
    for activity in activities:
        if activity.name not in found:
            violation = _activity_violation(activity, triton_names)
            if violation is not None:
                found[activity.name] = violation
    result = list(found.values())
    if require_launch and not accepted_triton_kernels(activities, triton_names):
        result.append(Violation(Rule.NO_LAUNCH, "the GPU ran none of your @triton.jit kernels "
                                "during forward; do the work in Triton kernels launched from forward"))
    return result


def _reserved_name(name: str) -> Violation:
    return Violation(Rule.NON_TRITON_KERNEL, f"@triton.jit function `{_shown(name)}` is named like a "
                     "GPU library kernel (cuBLAS, cuDNN, CUTLASS), so its launches cannot be told "
                     "apart from the library's; rename it")


def _activity_violation(activity: DeviceActivity, triton_names: set[str]) -> Violation | None:
    if activity.kind == "memset":
        return None
    if activity.kind == "memcpy":
        return _copy_violation(activity)
    if activity.name in triton_names or is_aten_helper(activity.name):
        return None
    return Violation(Rule.NON_TRITON_KERNEL, f"forward ran the GPU kernel `{_shown(activity.name)}`, "
                     "which is not compiled from one of your @triton.jit functions (PyTorch, cuBLAS "
                     "or cuDNN ran it); forward may only allocate, copy and launch your own Triton "
                     f"kernels; {KERNEL_ADVICE}")


def _copy_violation(activity: DeviceActivity) -> Violation | None:
    if activity.direction in ("HtoD", "DtoD", "HtoH"):
        return None
    what = ("copied device memory to the host" if activity.direction == "DtoH"
            else "made a copy whose direction the profiler did not report")
    return Violation(Rule.HOST_COPY, f"forward {what} ({activity.name}): .cpu(), .item(), "
                     ".tolist(), .numpy() or printing a CUDA tensor hand the data to the host; keep "
                     "it on the GPU and compute in your Triton kernels")


# ---------------------------------------------------------------------------------------------
# Precision, from the TTIR Triton compiled
# ---------------------------------------------------------------------------------------------
# What Triton (3.6 and 3.9 alike) writes to <cache>/<hash>/<kernel>.ttir for tl.dot:
#   %c = tt.dot %a, %b, %acc : tensor<32x32xf32> * tensor<32x32xf32> -> tensor<32x32xf32>
#   %c = tt.dot %a, %b, %acc, inputPrecision = tf32x3 : tensor<...xf32> * ...
#   %c = tt.dot %a, %b, %acc {maxNumImpreciseAcc = 1073741824 : i32} : tensor<32x32xf8E4M3FN> * ...
# IEEE is the attribute's default and is not printed (input_precision="ieee", allow_tf32=False);
# tf32 (also an unstated fp32 default), tf32x3, bf16x3 and bf16x6 are. Older Triton printed
# `allowTF32 = true|false` instead.

_ACCEPTED_FP32_PRECISIONS = frozenset({"ieee", "tf32x3"})
_FULL_PRECISION_OPERANDS = frozenset({"f32", "f64"})
_OP_LINE = re.compile(r"^\s*(?:%[^=\"]*=\s*)?(tt\.dot(?:_scaled)?)(?=[\s{(]|$)(.*)$")
_TENSOR_ELEMENT = re.compile(r"tensor<(?:[0-9?]+x)*([A-Za-z][\w]*)")
_PRECISION_ATTR = re.compile(r"\binputPrecision\s*=\s*(\w+)")
_ALLOW_TF32_ATTR = re.compile(r"\ballowTF32\s*=\s*(true|false)")
_NAMES_AND_STRINGS = re.compile(r"\"(?:[^\"\\]|\\.)*\"|[%@#!^][\w.$\-]*")
_LOW_FLOAT = re.compile(r"(?:(?<=[x<\s(,:])|^)(bf16|f16|f8E\w+|f6E\w+|f4E\w+)(?=[>\s,)}]|$)")
_NARROW_FORMAT = re.compile(r"^f[468]E")


@dataclass(frozen=True)
class _Dot:
    """One tt.dot / tt.dot_scaled in a TTIR file."""

    op: str
    precision: str           # "ieee", "tf32", "tf32x3", ...; "?" when unreadable
    operands: tuple[str, ...]  # element types of the two inputs, e.g. ("f32", "f32")


def _parse_dot(op: str, rest: str) -> _Dot:
    text = rest.split(" loc(", 1)[0]
    attributes, _, types = text.rpartition(" : ")
    operands = tuple(_TENSOR_ELEMENT.findall(types.split("->", 1)[0]))[:2]
    precision = _PRECISION_ATTR.search(attributes)
    allow_tf32 = _ALLOW_TF32_ATTR.search(attributes)
    if precision:
        stated = precision.group(1).lower()
    elif allow_tf32:
        stated = "tf32" if allow_tf32.group(1) == "true" else "ieee"
    else:
        stated = "ieee"
    return _Dot(op, stated if attributes else "?", operands)


def dots_in_ttir(text: str) -> list[_Dot]:
    """Every matrix product in a TTIR module."""
    dots = []
    for line in text.splitlines():
        match = _OP_LINE.match(line)
        if match:
            dots.append(_parse_dot(match.group(1), match.group(2)))
    return dots


def low_precision_types(text: str) -> set[str]:
    """Float types narrower than fp32 anywhere in a TTIR module's types (names are ignored)."""
    found = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue  # location aliases: file paths and variable names
        found.update(_LOW_FLOAT.findall(_NAMES_AND_STRINGS.sub(" ", line)))
    return found


def ttir_precision_findings(text: str, reference_is_fp32: bool = True) -> list[str]:
    """Why a kernel's TTIR is less precise than the reference allows; [] when it is not."""
    findings = []
    for dot in dots_in_ttir(text):
        finding = _dot_finding(dot, reference_is_fp32)
        if finding and finding not in findings:
            findings.append(finding)
    narrow = sorted(low_precision_types(text))
    if reference_is_fp32 and narrow and not findings:
        findings.append(f"handles {', '.join(narrow)} values (a conversion, load or store below "
                        "the fp32 reference's precision); keep data and math in fp32")
    return findings


def _dot_finding(dot: _Dot, reference_is_fp32: bool) -> str | None:
    if dot.op == "tt.dot_scaled":
        return "uses tl.dot_scaled, a matrix product in fp8/fp4 formats"
    if len(dot.operands) != 2 or dot.precision == "?":
        return "has a tt.dot whose operand types or precision could not be read"
    narrow = [t for t in dot.operands if _NARROW_FORMAT.match(t)]
    if narrow:
        return f"multiplies {narrow[0]} operands in tl.dot (an fp8/fp4 format)"
    if not reference_is_fp32:
        return None
    low = [t for t in dot.operands if t not in _FULL_PRECISION_OPERANDS]
    if low:
        return (f"multiplies {low[0]} operands in tl.dot, below the fp32 reference's precision; "
                'load fp32 and use tl.dot(..., input_precision="ieee") or "tf32x3"')
    if dot.precision not in _ACCEPTED_FP32_PRECISIONS:
        return (f"runs tl.dot with input precision {dot.precision}, less accurate than the fp32 "
                'reference; state input_precision="ieee" or "tf32x3"')
    return None


@dataclass
class _CompiledIR:
    """The .ttir files found for each launched kernel name, and whether the search was cut short."""

    files: dict[str, list[Path]]
    too_large: dict[str, list[Path]]
    truncated: bool = False


def _regular_file_size(path: Path) -> int | None:
    """Size of a regular file (symbolic links and devices are not followed), else None."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _find_compiled_ir(cache_dir: Path, names: set[str]) -> _CompiledIR:
    """Triton's cache holds one folder per compiled variant: <hash>/<name[:150]>.ttir."""
    # Only identifiers can be Triton kernel names, and only they are safe as file names.
    stems = {name[:TRITON_FILE_NAME_CHARS]: name for name in names if name.isidentifier()}
    found = _CompiledIR({name: [] for name in names}, {name: [] for name in names})
    if not cache_dir.is_dir():
        return found
    count = 0
    folders = list(itertools.islice(cache_dir.iterdir(), MAX_CACHE_ENTRIES + 1))
    if len(folders) > MAX_CACHE_ENTRIES:
        found.truncated = True
        return found
    for folder in sorted(folders):
        if folder.is_symlink() or not folder.is_dir():
            continue
        for stem, name in stems.items():
            path = folder / f"{stem}.ttir"
            size = _regular_file_size(path)
            if size is None:
                continue
            if size > MAX_IR_BYTES:
                found.too_large[name].append(path)
                continue
            count += 1
            if count > MAX_IR_FILES:
                found.truncated = True
                return found
            found.files[name].append(path)
    return found


def _read_text(path: Path) -> str:
    with path.open("rb") as handle:
        return handle.read(MAX_IR_BYTES + 1).decode("utf-8", errors="replace")


def _overridden(ttir: Path) -> bool:
    """Whether the compiled kernel replaced a stage with a file of its own (`ir_override`).

    Then the TTIR is not what ran: Triton parses the override file in place of the later stage.
    The metadata is the <name>.json beside the .ttir; a missing one says nothing either way.
    """
    metadata = ttir.with_suffix(".json")
    size = _regular_file_size(metadata)
    if size is None:
        return False
    if size > MAX_IR_BYTES:
        return True
    try:
        data = json.loads(_read_text(metadata))
    except json.JSONDecodeError:
        return True
    return not isinstance(data, dict) or bool(data.get("ir_override"))


def compiled_precision_violations(cache_dir: Path, launched: set[str],
                                  reference_is_fp32: bool = True) -> list[Violation]:
    """PRECISION violations read from the TTIR of every kernel that ran, one per kernel and finding.

    `cache_dir` is the candidate process's own, fresh TRITON_CACHE_DIR; `launched` names the
    kernels that ran and were accepted as the candidate's Triton kernels (see
    `accepted_triton_kernels`). Every compiled variant of a name is checked (autotune configs
    and specialisations), since the profiler does not say which one ran.

    On an fp32 problem, a tt.dot must multiply f32 (or f64) operands with input precision ieee
    or tf32x3, and no value may be held in a narrower float; fp8/fp4 products and dot_scaled
    are rejected on every problem. Files that cannot be checked (too large, too many) fail
    closed as PRECISION violations.
    """
    compiled = _find_compiled_ir(Path(cache_dir), set(launched))
    violations: list[Violation] = []
    if compiled.truncated:
        violations.append(Violation(Rule.PRECISION, "the Triton cache holds more compiled kernels "
                                    f"than the checker reads ({MAX_IR_FILES} files); their precision "
                                    "could not be checked; compile fewer variants"))
    for name in sorted(launched):
        violations.extend(_kernel_violations(name, compiled, reference_is_fp32))
    return violations


def _kernel_violations(name: str, compiled: _CompiledIR, reference_is_fp32: bool) -> list[Violation]:
    shown = _shown(name)
    if compiled.too_large[name]:
        return [Violation(Rule.PRECISION, f"the compiled IR of kernel `{shown}` is larger than "
                          f"{MAX_IR_BYTES // (1024 * 1024)} MB, so its precision could not be checked")]
    if not compiled.files[name]:
        if compiled.truncated:
            return []  # reported once, above
        # NON_TRITON_KERNEL rather than PRECISION: every kernel Triton compiles in this process
        # leaves <name>.ttir in its cache. A kernel that ran without one was not compiled by
        # Triton from the candidate's source here (a binary loaded some other way under a
        # Triton-looking name, or IR storage switched off), so what fails is the rule that every
        # kernel comes from the candidate's @triton.jit code; precision is a property of IR we have.
        return [Violation(Rule.NON_TRITON_KERNEL, f"kernel `{shown}` ran but Triton compiled no "
                          "kernel of that name in this process (no compiled IR in its cache); launch "
                          "only kernels Triton compiles from your @triton.jit functions")]
    findings: list[str] = []
    violations = []
    for path in compiled.files[name]:
        if _overridden(path):
            violations.append(Violation(Rule.NON_TRITON_KERNEL, f"kernel `{shown}` was compiled with "
                                        "ir_override, so its code came from a file rather than from "
                                        "your @triton.jit source; remove ir_override"))
        for finding in ttir_precision_findings(_read_text(path), reference_is_fp32):
            if finding not in findings:
                findings.append(finding)
    violations = list(dict.fromkeys(violations))
    violations += [Violation(Rule.PRECISION, f"kernel `{shown}` {finding}") for finding in findings]
    return violations
