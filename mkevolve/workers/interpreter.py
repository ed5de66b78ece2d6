"""Make `triton.autotune` usable under the Triton CPU interpreter (TRITON_INTERPRET=1).

With more than one config, the autotuner times every config through the active driver's
benchmarker. On a machine without a GPU there is no driver, so the first launch fails with
"0 active drivers" and an honest solution is rejected for being tunable.

The candidate process calls `make_autotune_interpretable()` before it imports candidate code.
Under the interpreter it makes every `triton.autotune` pass its own `do_bench`: each config
runs once, through the autotuner's own call (so reset_to_zero / restore_value hooks and
per-config pre_hooks behave as on a GPU), and all get the same time, so the autotuner keeps
the first config, as it would with a single config.

Why run every config instead of only the first: a GPU benchmark runs them all, and a config
that crashes fails the launch there; running each once keeps that verdict on CPU. Only the
first config's output is compared with the reference (on a GPU it is the fastest one's).
Timings are meaningless in the interpreter, so nothing is timed.

Only the public `do_bench=` argument of `triton.autotune` is used (Triton 3.1 and later; checked with
3.6 and 3.9). Without the interpreter nothing changes.
"""

from __future__ import annotations

import functools
import inspect
import os

# Triton's own spelling of a true environment flag (knobs.getenv_bool).
_TRUE = frozenset({"1", "true", "yes", "on", "y"})
# Deprecated autotune arguments that install a CUDA benchmarker of their own.
_GPU_BENCH_ARGUMENTS = {"warmup": None, "rep": None, "use_cuda_graph": False}
_MARK = "__mkevolve_interpretable__"


class InterpreterSetupError(RuntimeError):
    """The installed Triton has no `do_bench` argument to hand its autotuner."""


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter, read the way Triton reads it."""
    try:
        from triton import knobs
    except ImportError:  # a Triton older than its knobs module reads the variable directly
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE
    return bool(knobs.runtime.interpret)


def run_once(kernel_call, quantiles=None, **_ignored):
    """A `do_bench` that runs the config once and reports a time of zero for every quantile.

    Equal times make the autotuner keep the first config; an exception from the kernel goes
    to the autotuner, which treats it exactly as it would a failed GPU benchmark.
    """
    kernel_call()
    return [0.0] * len(quantiles) if quantiles else 0.0


def make_autotune_interpretable() -> bool:
    """Under the interpreter, route every `triton.autotune` through `run_once`; idempotent.

    Returns True when the interpreter is on (the decorator is then wrapped), False otherwise,
    when Triton is left exactly as it was. Call it before the candidate's module is imported:
    `triton.autotune` is looked up when the decorator runs.
    """
    if not interpreting():
        return False
    import triton
    import triton.runtime
    import triton.runtime.autotuner as autotuner

    original = autotuner.autotune
    if getattr(original, _MARK, False):
        return True
    wrapped = _interpretable(original)
    # Every public spelling of the decorator names the same function; replace each.
    for module in (triton, triton.runtime, autotuner):
        if getattr(module, "autotune", None) is original:
            module.autotune = wrapped
    return True


def _interpretable(original):
    signature = inspect.signature(original)
    if "do_bench" not in signature.parameters:
        raise InterpreterSetupError(
            "this Triton's autotune has no do_bench argument (Triton 3.1 added it); "
            "multi-config autotune cannot run in the interpreter with this Triton")

    @functools.wraps(original)
    def autotune(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        # A solution's own benchmarker (or the deprecated CUDA-timing arguments) needs a GPU.
        for name, default in _GPU_BENCH_ARGUMENTS.items():
            if name in signature.parameters:
                bound.arguments[name] = default
        bound.arguments["do_bench"] = run_once
        return original(*bound.args, **bound.kwargs)

    setattr(autotune, _MARK, True)
    return autotune
