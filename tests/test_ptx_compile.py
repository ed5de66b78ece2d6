"""Every variant the builtin generator writes for a GPU compiles for an H200 (sm_90) on this machine, and
divides and takes square roots as PyTorch does (IEEE rounding): tests/ptx_compile.py compiles, nothing runs.
The CPU interpreter runs the same kernels without ever lowering them, so without this a kernel that Triton
cannot compile for a GPU, or one that divides approximately, shows only on a GPU machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia.compiler")

ROOT = Path(__file__).resolve().parents[1]
SUBPROBLEMS = sorted(p for p in (ROOT / "tests" / "subproblems").glob("*.py") if p.stem != "fold")


@pytest.mark.slow
def test_every_generated_gpu_kernel_compiles_for_sm90_and_divides_as_pytorch_does(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(tmp_path / "triton"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tests.ptx_compile", *map(str, SUBPROBLEMS)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    failed = {variant: r["error"].strip().splitlines()[-1] for variant, r in results.items() if r["error"]}
    assert not failed, failed
    approximate = {f"{variant} {kernel}": found for variant, r in results.items()
                   for kernel, found in r["kernels"].items() if found}
    assert not approximate, approximate
    assert all(r["kernels"] for r in results.values())
    assert {variant.split(":")[0] for variant in results} == {p.name for p in SUBPROBLEMS}
