"""Compile the builtin generator's kernels for an NVIDIA GPU on a machine without one.

Each subproblem's generated ModelNew runs its forward on CPU tensors, with Triton's active driver replaced by
one that only names a target (sm_90, an H200's) and with every launch turned into a compile: Triton builds the
kernel down to PTX and a cubin (its bundled ptxas), and nothing runs, so the outputs are garbage and only the
compiled code is looked at. Autotuned kernels compile every config (the "benchmark" calls each once).

Run in a process of its own (it replaces the driver and JITFunction.run for the whole process), without
TRITON_INTERPRET:

    python -m tests.ptx_compile SUBPROBLEM.py[:VARIANT] ...

prints one JSON object: {"<file>:<variant>": {"kernels": {name: [approximate PTX instructions]}, "error": str}}.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from mkevolve.builtin.kernels import generate_kernel, variant_count
from mkevolve.problem import call_inputs, import_file, load_problem

TARGET = GPUTarget("cuda", 90, 32)
# fp32 division and square root that round less closely than PyTorch's IEEE ones (rsqrt.approx is kept on
# purpose: pointwise_ops.divide), with the register each writes
APPROXIMATE = re.compile(r"\b(div\.full\.f32|div\.approx\.f32|sqrt\.approx\.\S*f32)\s+(%\w+)")


def approximate_results(ptx: str) -> list[str]:
    """The approximate instructions in `ptx` whose result is used as it is. A reciprocal that a fused
    multiply-add corrects (the Newton step of pointwise_ops' `_div`) rounds as closely as IEEE division."""
    found = []
    for match in APPROXIMATE.finditer(ptx):
        instruction, register = match.groups()
        corrected = re.search(rf"\bfma\.rn\.(?:ftz\.)?f32\s+%\w+,[^;]*{re.escape(register)}\b", ptx[match.end():])
        if not (instruction == "div.full.f32" and corrected):
            found.append(instruction)
    return found


class CompileOnlyDriver(DriverBase):
    """A CUDA target without a device: enough for Triton to compile, nothing to launch on."""

    @classmethod
    def is_active(cls) -> bool:
        return True

    def get_current_target(self):
        return TARGET

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def get_benchmarker(self):
        def call_once(kernel_call, quantiles=None, **_):
            kernel_call()          # compiles this config (see compile_only)
            return [1.0, 1.0, 1.0] if quantiles else 1.0
        return call_once


_compiled: dict[str, list[str]] = {}
_run = JITFunction.run


def compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    found = approximate_results(kernel.asm["ptx"]) if kernel is not None else []
    _compiled.setdefault(self.__name__, [])
    _compiled[self.__name__] = sorted(set(_compiled[self.__name__]) | set(found))
    return kernel


def compile_variant(path: Path, variant: int, folder: Path) -> dict:
    _compiled.clear()
    try:
        source = generate_kernel(path, variant, target="cuda").source
        module_path = folder / f"{path.stem}_v{variant}.py"
        module_path.write_text(source)
        module = import_file(module_path, prefix="ptx_compile")
        problem = load_problem(path)
        for config in problem.configs:
            model = module.ModelNew(*call_inputs(problem.path, config.get_init_inputs, "get_init_inputs"))
            with torch.no_grad():
                model(*call_inputs(problem.path, config.get_inputs, "get_inputs"))
        error = ""
    except Exception:  # noqa: BLE001 - reported to the test, which names the subproblem
        error = traceback.format_exc()[-2000:]
    return {"kernels": dict(_compiled), "error": error}


def main(specs: list[str]) -> None:
    driver.set_active(CompileOnlyDriver())
    JITFunction.run = compile_only
    results = {}
    with tempfile.TemporaryDirectory(prefix="ptx-compile-") as folder:
        for spec in specs:
            file, _, variant = spec.partition(":")
            path = Path(file)
            variants = [int(variant)] if variant else range(variant_count(path, target="cuda"))
            for v in variants:
                results[f"{path.name}:{v}"] = compile_variant(path, v, Path(folder))
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
