"""Which of a kernel's declared autotune configs won, remembered across candidate processes.

Every candidate process starts with an empty Triton cache of its own (`candidate_run.candidate_triton_cache`),
so a kernel with N autotune configs is compiled N times and benchmarked in every process that runs it: the
end-to-end check of a one-kernel solution tunes again the very kernel its search just tuned, and a warm
rerun of a problem tunes every candidate again.

A choice is keyed by everything that decides it (`choice_id`): the kernel (Triton's cache key of its source
and of the functions and globals it uses), the values of its autotune key (sizes) and its arguments'
dtypes, its declared configs, the GPU and the Triton version. The candidate process reports the choices its
autotuner made; the trusted side keeps those of candidates that passed every check (`learn`) in a store
beside the warm Triton cache; a later candidate process reads the store before it is confined
(`read_choices`), and wherever a choice is known its autotuner is handed that one config (`use_choices`):
one compile, no benchmark.

What a false choice can do: the report is filled by code the candidate can reach, so the trusted side keeps
only a hash and a config index. A forged entry can only name one of the declared configs of a kernel whose
key matches: it can make that kernel slower, or fail its launch, never change what any kernel computes
unseen, since every process still has its own outputs checked and its own calls timed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from pathlib import Path

from mkevolve.verify.triton_warm import CHOICES_FILE, WARM_DIR_ENV

MAX_CHOICES = 1024           # kept in the store, most recent first
MAX_REPORTED = 64            # taken from one candidate's report
MAX_CONFIGS = 1024           # a config index past this is not a kernel's
_ID = re.compile(r"[0-9a-f]{64}")


# ---- trusted side: the store ------------------------------------------------------------------------------


def valid_choices(reported: object, limit: int = MAX_REPORTED) -> dict[str, int]:
    """The choices of a candidate's report that are a hash and an index; anything else in the field is
    dropped (the field is a hint for later processes, never part of the verdict)."""
    if not isinstance(reported, list):
        return {}
    found = {}
    for entry in reported[:limit]:
        if not isinstance(entry, list) or len(entry) != 2:
            continue
        key, index = entry
        if isinstance(key, str) and _ID.fullmatch(key) and type(index) is int and 0 <= index < MAX_CONFIGS:
            found[key] = index
    return found


def learn(choices: dict[str, int], warm: Path) -> None:
    """Put the choices first in the store candidate processes read; called by the trusted worker."""
    if not choices:
        return
    known = read_choices(warm)
    merged = dict(choices)
    for key, index in known.items():
        merged.setdefault(key, index)
    merged = dict(list(merged.items())[:MAX_CHOICES])
    if list(merged.items()) == list(known.items()):
        return
    # Written whole and renamed into place: a reader sees the old store or the new one. Two workers that
    # learn at once may drop each other's news, which only costs a later process one autotuning.
    temporary = warm / f".{CHOICES_FILE}.{os.getpid()}"
    temporary.write_text(json.dumps([[key, index] for key, index in merged.items()]))
    temporary.replace(warm / CHOICES_FILE)


def known_choices() -> dict[str, int]:
    """In a candidate process, before it is confined: the store of its worker's warm cache."""
    warm = os.environ.get(WARM_DIR_ENV)
    return read_choices(Path(warm)) if warm else {}


def read_choices(warm: Path) -> dict[str, int]:
    try:
        stored = json.loads((warm / CHOICES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return valid_choices(stored, limit=MAX_CHOICES)


# ---- candidate process, before the confinement ------------------------------------------------------------


def use_choices(known: dict[str, int], device: str) -> list[list]:
    """Wrap Triton's autotuner in this process: a kernel whose choice is known gets that config alone;
    the choices it makes itself are listed, as [id, config index], for the report (code the candidate can
    reach fills the list, so the trusted side checks each entry)."""
    from triton.runtime.autotuner import Autotuner

    made: list[list] = []
    prune, run = Autotuner.prune_configs, Autotuner.run
    gpu = _device_name(device)      # asked now: the candidate's calls run confined
    tuning: dict[int, str] = {}      # id(autotuner) -> the choice it is making in this call

    def pruning(self, kwargs):
        # Called by Autotuner.run only for a key it has not tuned in this process, with self.nargs set.
        pruned = prune(self, kwargs)
        key = choice_id(self, kwargs, gpu)
        if key is None:
            return pruned
        index = known.get(key)
        if index is not None and index < len(self.configs) and any(c is self.configs[index] for c in pruned):
            return [self.configs[index]]
        if len(pruned) > 1:
            tuning[id(self)] = key
        return pruned

    def running(self, *args, **kwargs):
        tuning.pop(id(self), None)
        result = run(self, *args, **kwargs)
        key = tuning.pop(id(self), None)
        best = getattr(self, "best_config", None)
        index = next((i for i, config in enumerate(self.configs) if config is best), None)
        if key is not None and index is not None and len(made) < MAX_REPORTED:
            made.append([key, index])
        return result

    Autotuner.prune_configs, Autotuner.run = pruning, running
    return made


def choice_id(tuner, kwargs: dict, gpu: str) -> str | None:
    """The hash of what decides an autotuner's choice in this call on `gpu` (its name, or "cpu"; see the
    module docstring); None for a kernel whose code cannot be named."""
    import triton

    kernel = _kernel_key(tuner)
    if kernel is None:
        return None
    arguments = {**(tuner.nargs or {}), **kwargs}
    values = [_describe(arguments[name]) for name in tuner.keys if name in arguments]
    dtypes = [str(value.dtype) for value in arguments.values() if hasattr(value, "dtype")]
    parts = [kernel, repr(values), repr(dtypes), *map(str, tuner.configs), gpu, triton.__version__]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _describe(value: object) -> str:
    """A tuning-key value as text: numbers and names as written, anything else by its type and shape."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return f"{type(value).__name__}{tuple(getattr(value, 'shape', ()))}"


def _kernel_key(tuner) -> str | None:
    """Triton's cache key of the kernel (its source and what it uses); under the CPU interpreter, whose
    kernels are plain functions, a hash of the function's source."""
    fn = tuner.fn
    while hasattr(fn, "fn") and not hasattr(fn, "cache_key"):
        fn = fn.fn
    key = getattr(fn, "cache_key", None)
    if isinstance(key, str):
        return key
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def _device_name(device: str) -> str:
    if device != "cuda":
        return device
    import torch

    return torch.cuda.get_device_name()
