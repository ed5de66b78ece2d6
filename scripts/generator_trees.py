"""One problem's builtin kernel as several source trees generate it, timed on one GPU: which change to the
generator moved a problem's speed.

    python3 scripts/generator_trees.py --out results.json --problem kb/level2/7_Conv3d_ReLU.py \
        --variant 0 --trees . /tmp/mkevolve-484e900 /tmp/mkevolve-patched
    python3 scripts/generator_trees.py --generate-only --problem P --trees . OLD    # no GPU: descriptions

Each tree runs in a process of its own, with its own mkevolve imported (a tree is a checkout, or any folder
holding `mkevolve/`). There the generated ModelNew takes the reference Model's parameters (the same weights
whatever order it makes its own in), runs in fp32 with TF32 off as the verifier's reference does, is compared
with the reference (largest absolute difference) and, as eager fp32 is, with the reference run in fp64, and is
timed twice as the verifier times (`verify.timing.time_forward`: L2 flushed, median of 100), with the tile config
its autotuner chose.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path


def measure_in_this_process(tree: Path, problem_path: Path, variant: int, generate_only: bool) -> dict:
    """The row of one tree; run with `tree` first on sys.path, so `mkevolve` is that tree's."""
    sys.path.insert(0, str(tree))
    import torch

    from mkevolve.builtin.kernels import generate_kernel
    from mkevolve.problem import fp32_strict, import_file, load_problem

    import mkevolve

    generated = generate_kernel(problem_path, variant, target="cuda")
    row = {"tree": str(tree), "imported_from": str(Path(mkevolve.__file__).parent), "variant": variant,
           "description": generated.description}
    if generate_only:
        return row
    import triton

    row.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    from mkevolve.verify.timing import time_forward

    fp32_strict()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "solution.py"
        source.write_text(generated.source)
        module = import_file(source, prefix="generator_trees")
        problem = load_problem(problem_path)
        config = problem.configs[0]
        with torch.device("cuda"):
            torch.manual_seed(0)
            reference = problem.model_cls(*config.get_init_inputs())
            candidate = module.ModelNew(*config.get_init_inputs())
            candidate.load_state_dict(reference.state_dict())
            torch.manual_seed(1)
            inputs = config.get_inputs()
        with torch.no_grad():
            expected, got = reference(*inputs), candidate(*inputs)
            row["max_abs_diff"] = float((got - expected).abs().max())
            row.update(_errors_vs_fp64(reference, inputs, expected, got))
            del expected, got
            row["ms"] = [time_forward(lambda: candidate(*inputs)).median_ms for _ in range(2)]
        row["autotuned"] = [str(kernel.best_config) for kernel in vars(module).values()
                            if getattr(kernel, "best_config", None) is not None]
    return row


def _errors_vs_fp64(reference, inputs, expected, got) -> dict:
    """Largest absolute error against the reference run in fp64, of the generated kernel and of eager fp32."""
    import torch

    with torch.no_grad():
        exact = reference.double()(*[t.double() if t.is_floating_point() else t for t in inputs])
        reference.float()
    return {"error_vs_fp64": float((got.double() - exact).abs().max()),
            "eager_error_vs_fp64": float((expected.double() - exact).abs().max())}


def measure_tree(tree: Path, problem: Path, variant: int, generate_only: bool) -> dict:
    """One tree's row from a fresh process, so no module of another tree is loaded there."""
    command = [sys.executable, __file__, "--one-tree", str(tree), "--problem", str(problem),
               "--variant", str(variant)] + (["--generate-only"] if generate_only else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"tree": str(tree), "variant": variant, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", type=Path, required=True)
    parser.add_argument("--trees", type=Path, nargs="+", default=[Path(".")])
    parser.add_argument("--variant", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--generate-only", action="store_true", help="describe each tree's kernel, time nothing")
    parser.add_argument("--one-tree", type=Path, help=argparse.SUPPRESS)   # the child process's own tree
    args = parser.parse_args()
    problem = args.problem.resolve()
    if args.one_tree is not None:
        print(json.dumps(measure_in_this_process(args.one_tree.resolve(), problem, args.variant, args.generate_only)))
        return
    rows = []
    for tree in args.trees:
        rows.append(measure_tree(tree.resolve(), problem, args.variant, args.generate_only))
        print(rows[-1], flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"date": date.today().isoformat(), "python": platform.python_version(),
                                        "problem": problem.name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
