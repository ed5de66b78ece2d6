"""Host time of one kernel launch, by the way it is launched: what a generated launcher pays per kernel.

Level 3's small models are bound by the CPU that issues their kernels (`scripts/launch_overhead.py`): a
solution issues fewer kernels than eager PyTorch yet takes longer to issue them. This script times, on one
GPU, the host side of launching one tiny kernel (a copy of 1024 floats) many times over:

- a PyTorch op (`out.copy_(x)`) and `torch.empty`, for scale;
- a `@triton.jit` kernel through `kernel[grid](...)`, with 4 and with 20 arguments (a GEMM launcher's count);
- the same under `@triton.heuristics` and under `@triton.autotune` (one config), as generated kernels are, and
  the autotuned kernel's chosen config launched through the kernel under the autotuner (`.fn`);
- generated solutions of test subproblems (`--subproblems`), per forward: their launchers and kernels whole;
- the compiled kernel called directly (`compiled[grid](...)`), skipping the argument binding and cache lookup
  that `kernel[grid]` repeats on every call; where this Triton's API differs, its error is recorded.

Usage: python scripts/launch_cost.py [--out FILE] [--launches N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # mkevolve, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the sibling scripts
from kernelbench import environment  # noqa: E402


@triton.jit
def copy_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def copy_kernel_wide(out_ptr, x_ptr, n, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
                     BLOCK: tl.constexpr):
    # 20 runtime arguments, as a GEMM with an epilogue takes; the strides are unused
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.heuristics({"BLOCK": lambda args: 1024})
@triton.jit
def copy_heuristic(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, num_warps=4)], key=["n"])
@triton.jit
def copy_autotuned(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def per_launch_us(launch, launches: int, rounds: int = 5) -> float:
    """Median over rounds of the host time per call, synchronised before each round, not inside it."""
    for _ in range(20):
        launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            launch()
        times.append((time.perf_counter() - start) / launches * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def _generated_forward_us(path: Path, calls: int) -> float:
    """Host time of one forward of the builtin generator's first CUDA variant for the subproblem at `path`."""
    import tempfile

    from mkevolve.builtin.kernels import generate_kernel
    from mkevolve.problem import call_inputs, import_file, load_problem

    problem = load_problem(path)
    config = problem.configs[0]
    source = Path(tempfile.mkdtemp()) / f"{path.stem}_generated.py"     # kept: Triton reads kernels' source
    source.write_text(generate_kernel(path, 0, "cuda").source)
    module = import_file(source, prefix="generated")
    model = module.ModelNew(*call_inputs(path, config.get_init_inputs, "get_init_inputs")).cuda()
    inputs = [t.cuda() for t in call_inputs(path, config.get_inputs, "get_inputs")]
    with torch.no_grad():
        return per_launch_us(lambda: model(*inputs), calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/launch_cost.json"))
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--subproblems", nargs="*", type=Path, default=[
        Path("tests/subproblems/linear_gelu.py"), Path("tests/subproblems/layernorm.py")])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_cost.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    n = x.numel()
    grid = (1,)
    strides = list(range(16))
    paths = {
        "torch copy_": lambda: out.copy_(x),
        "torch.empty": lambda: torch.empty(1024, device="cuda"),
        "jit, 4 args": lambda: copy_kernel[grid](out, x, n, BLOCK=1024),
        "jit, 20 args": lambda: copy_kernel_wide[grid](out, x, n, *strides, BLOCK=1024),
        "jit, grid lambda": lambda: copy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](out, x, n, BLOCK=1024),
        "heuristics": lambda: copy_heuristic[grid](out, x, n),
        "autotune, 1 config": lambda: copy_autotuned[grid](out, x, n),
    }
    copy_autotuned[grid](out, x, n)
    chosen = copy_autotuned.best_config.all_kwargs()           # the config the autotuner picked, as kwargs
    paths["autotuned, its config through .fn"] = lambda: copy_autotuned.fn[grid](out, x, n, **chosen)
    results, errors = {}, {}
    for name, launch in paths.items():
        results[name] = round(per_launch_us(launch, args.launches), 2)
        print(f"{name:36s} {results[name]:8.2f} us per launch")
    try:
        compiled = copy_kernel[grid](out, x, n, BLOCK=1024)
        direct = compiled[(1, 1, 1)]                       # a compiled kernel's grid has all three dims
        try:
            direct(out, x, n)
            call = lambda: direct(out, x, n)               # noqa: E731
        except TypeError:
            direct(out, x, n, 1024)
            call = lambda: direct(out, x, n, 1024)         # noqa: E731
        results["compiled kernel, direct"] = round(per_launch_us(call, args.launches), 2)
        torch.testing.assert_close(out, x)
        print(f"{'compiled kernel, direct':36s} {results['compiled kernel, direct']:8.2f} us per launch")
    except Exception as error:      # a Triton whose CompiledKernel API differs: recorded, not fatal
        errors["compiled kernel, direct"] = f"{type(error).__name__}: {error}"
        print("compiled kernel, direct: " + errors["compiled kernel, direct"])
    for path in args.subproblems:
        name = f"generated {path.stem}, per forward"
        try:
            results[name] = round(_generated_forward_us(path, args.launches // 10), 2)
            print(f"{name:36s} {results[name]:8.2f} us per forward")
        except Exception as error:     # recorded: one subproblem's failure does not hide the rest
            errors[name] = f"{type(error).__name__}: {error}"
            print(f"{name}: {errors[name]}")
    record = {**environment(), "cpu": platform.processor(), "launches": args.launches, "us_per_launch": results,
              "errors": errors}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
