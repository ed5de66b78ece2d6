"""Runtime cheating rules: RuntimeGuard watches one forward (launches, torch compute, layers, dtypes, threads)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Iterable
from types import FrameType, ModuleType

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mkevolve.verify.cheating.rules import (
    KERNEL_ADVICE,
    Rule,
    Violation,
    is_less_precise,
)

# ATen ops forward may run outside kernels: allocation, views, metadata and plain copies.
_ALLOWED_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "arange", "scalar_tensor", "lift_fresh", "lift_fresh_copy", "fill_", "zero_", "resize_",
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "permute", "transpose",
    "t", "expand", "unsqueeze", "squeeze", "select", "slice", "narrow", "alias", "detach",
    "split", "split_with_sizes", "unbind", "chunk", "unfold", "view_as_real", "view_as_complex",
    "movedim", "swapaxes", "clone", "copy_", "_to_copy", "contiguous", "_copy_from",
    "_copy_from_and_resize", "_local_scalar_dense", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "stride", "size", "numel", "dim",
    "_has_compatible_shallow_copy_type", "is_pinned",
})
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
_THIS_FILE = os.path.realpath(__file__)


@functools.lru_cache(maxsize=4096)
def _real(path: str) -> str:
    return os.path.realpath(path)


def _package_dir(module: ModuleType) -> str:
    return os.path.dirname(os.path.realpath(module.__file__)) + os.sep


def _launcher_classes() -> list[type]:
    """The classes whose `run` every Triton launch ends in (autotune and heuristics included)."""
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # a Triton build without the interpreter launches through JITFunction only
        return classes
    return classes + [InterpretedFunction]


def _is_torch_layer(module: nn.Module) -> bool:
    """A module whose forward is PyTorch's own code (nn.Linear, a compiled module, ...)."""
    forward_module = getattr(type(module).forward, "__module__", "") or ""
    return forward_module.startswith("torch.") and not isinstance(module, _CONTAINERS)


class _ComputeRecorder(TorchDispatchMode):
    """Sees every ATen op while active and reports it to the guard."""

    def __init__(self, guard: "RuntimeGuard"):
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.guard._before_op(func)
        result = func(*args, **(kwargs or {}))
        self.guard._after_op(func, result)
        return result


class RuntimeGuard:
    """Watches one forward: Triton launches, PyTorch compute, torch.nn layers, dtypes, threads.

    Use as `with guard: out = model(*inputs)`. After the block `launches` counts the Triton
    launches and `violations` lists what broke the rules, in the order seen. A block that
    completes without any launch gets a NO_LAUNCH violation, put first, in `__exit__`; one that
    raises does not (the exception is the verdict). Everything installed is removed on exit,
    also when forward raises; guards nest, and a guard may be reused for another block (its
    counts restart).

    `trusted_files` are files allowed to compute with PyTorch (a composite's declared PyTorch
    alternatives): ops, layers and dtypes they ask for are not violations.
    """

    def __init__(self, solution_file: str | None = None, reference_dtype: torch.dtype = torch.float32,
                 trusted_files: Iterable[str] = ()):
        self.solution_file = os.path.realpath(solution_file) if solution_file else None
        self.reference_dtype = reference_dtype
        self.trusted_files = frozenset(os.path.realpath(path) for path in trusted_files)
        self.launches = 0
        self.violations: list[Violation] = []
        self._inside_launch = 0
        self._reported: set[tuple] = set()
        self._stack: contextlib.ExitStack | None = None
        self._torch_dir = _package_dir(torch)
        self._triton_dir = ""

    # -- context protocol -------------------------------------------------------------------

    def __enter__(self) -> "RuntimeGuard":
        if self._stack is not None:
            raise RuntimeError("this RuntimeGuard is already active; nest a new guard instead")
        import triton

        self.launches, self.violations, self._reported, self._inside_launch = 0, [], set(), 0
        self._triton_dir = _package_dir(triton)
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self._counting_launches())
            stack.enter_context(self._watching_modules())
            stack.enter_context(self._watching_threads())
            stack.enter_context(_ComputeRecorder(self))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        stack, self._stack = self._stack, None
        stack.close()
        if exc_type is None and self.launches == 0:
            # First in the list: with no kernel run at all, the other findings are its consequences.
            self.violations.insert(0, Violation(
                Rule.NO_LAUNCH, "forward finished without launching any Triton kernel; the work "
                "must be done by your @triton.jit kernels, launched as kernel[grid](...)"))
        return False

    # -- launches -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _counting_launches(self):
        originals = {cls: cls.__dict__.get("run") for cls in _launcher_classes()}
        for cls in originals:
            cls.run = self._counted(cls.run)
        try:
            yield
        finally:
            for cls, run in originals.items():
                if run is None:
                    del cls.run
                else:
                    cls.run = run

    def _counted(self, run):
        guard = self

        @functools.wraps(run)
        def counted_run(kernel, *args, **kwargs):
            if kwargs.get("warmup"):
                return run(kernel, *args, **kwargs)
            guard._on_launch(kernel)
            guard._inside_launch += 1
            try:
                return run(kernel, *args, **kwargs)
            finally:
                guard._inside_launch -= 1

        return counted_run

    def _on_launch(self, kernel) -> None:
        self.launches += 1
        if getattr(kernel, "pre_run_hooks", None):
            name = getattr(kernel, "__name__", "kernel")
            self._record(Rule.MONKEYPATCH, f"kernel `{name}` has pre-run hooks, host code that runs "
                         "inside the launch out of sight of the checks; do that work in forward",
                         key=("hooks", name))

    # -- torch compute --------------------------------------------------------------------------

    def _before_op(self, func) -> None:
        if self._inside_launch:
            return
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        namespace = getattr(func, "namespace", "")
        if namespace == "aten" and name in _ALLOWED_ATEN:
            return
        if self._issued_by_trusted_code():
            return
        self._record(Rule.TORCH_COMPUTE, f"PyTorch ran `{namespace}.{name}` in forward outside a Triton "
                     "kernel (forward may only allocate, view, copy and launch); "
                     f"{KERNEL_ADVICE}", key=("op", namespace, name))

    def _after_op(self, func, result) -> None:
        if self._inside_launch:
            return
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.Tensor) and is_less_precise(leaf.dtype, self.reference_dtype):
                if self._issued_by_trusted_code():
                    return
                self._record(Rule.PRECISION, f"forward made a {leaf.dtype} tensor (by `{func}`) on a "
                             f"{self.reference_dtype} problem: a precision downgrade; keep data and "
                             "math in the reference dtype", key=("dtype", leaf.dtype))

    def _issued_by_trusted_code(self) -> bool:
        """True when Triton's own code (an autotuner's benchmark buffers) or a trusted file asked."""
        frame = self._first_foreign_frame()
        if frame is None:
            return False
        path = _real(frame.f_code.co_filename)
        return path.startswith(self._triton_dir) or path in self.trusted_files

    def _first_foreign_frame(self) -> FrameType | None:
        """The innermost frame outside torch and this module: the code that asked for the op."""
        frame = sys._getframe(1)
        while frame is not None:
            path = _real(frame.f_code.co_filename)
            if path != _THIS_FILE and not path.startswith(self._torch_dir):
                return frame
            frame = frame.f_back
        return None

    # -- torch.nn layers ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _watching_modules(self):
        handle = nn.modules.module.register_module_forward_hook(self._on_module_forward)
        try:
            yield
        finally:
            handle.remove()

    def _on_module_forward(self, module: nn.Module, args, output) -> None:
        if self._inside_launch or not _is_torch_layer(module) or self._issued_by_trusted_code():
            return
        kind = type(module).__name__
        self._record(Rule.TORCH_COMPUTE, f"forward ran the torch.nn layer {kind}; keep layers in "
                     "__init__ for their weights, but compute with the weights in a Triton kernel",
                     key=("layer", kind))

    # -- threads --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _watching_threads(self):
        before = set(threading.enumerate())
        started: set[threading.Thread] = set()
        original_start = threading.Thread.start
        guard = self

        @functools.wraps(original_start)
        def recording_start(thread, *args, **kwargs):
            started.add(thread)
            # With a known solution file, only threads its code starts count: torch or triton
            # may keep helper threads of their own.
            if guard.solution_file is None or guard._solution_line() is not None:
                guard._record(Rule.THREADS, f"forward started thread `{thread.name}`; work on other "
                              "threads escapes the launch checks and the timer; run everything on the "
                              "calling thread", key=("thread", id(thread)))
            return original_start(thread, *args, **kwargs)

        threading.Thread.start = recording_start
        try:
            yield
        finally:
            threading.Thread.start = original_start
            for thread in set(threading.enumerate()) - before - started:
                self._record(Rule.THREADS, f"thread `{thread.name}` appeared during forward and is "
                             "still alive; run everything on the calling thread",
                             key=("thread", id(thread)))

    # -- recording ------------------------------------------------------------------------------

    def _record(self, rule: Rule, message: str, key: tuple) -> None:
        """Add a violation once per key, at the solution line that is running now."""
        if key in self._reported:
            return
        self._reported.add(key)
        self.violations.append(Violation(rule, message, self._solution_line()))

    def _solution_line(self) -> int | None:
        """The line of the solution file that is running now, from the Python stack."""
        if self.solution_file is None:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if _real(frame.f_code.co_filename) == self.solution_file:
                return frame.f_lineno
            frame = frame.f_back
        return None


