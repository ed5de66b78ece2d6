"""`mkevolve pack`: one KernelBench file that `check` accepts when all Triton, and rejects naming a PyTorch part."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from mkevolve.cli import main
from mkevolve.codebase import packed_section_marker
from mkevolve.pack import pack_solution
from mkevolve.problem import import_file
from mkevolve.solution import pytorch_alternative
from mkevolve.verify.verifier import declared_pytorch_fallback

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "gemm_chain.py"

# Module-level names that a parameter, a local, a comprehension and a class attribute shadow: packing must
# prefix the module's own names and leave the shadowing ones alone.
SHADOWING = '''"""Synthetic subkernel file for the packer (never verified)."""

import torch
import torch.nn as nn

BLOCK = 16


def helper(BLOCK):
    return BLOCK + 1


def module_blocks():
    return [BLOCK for _ in range(2)] + [helper(b) for b in (BLOCK,)]


class ModelNew(nn.Module):
    BLOCK = 4

    def forward(self, x):
        helper = 3
        return helper + BLOCK + self.BLOCK


def get_inputs():
    return [torch.randn(2)]


if __name__ == "__main__":
    print(helper(BLOCK))
'''


@pytest.fixture(scope="module")
def best(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["run", str(PROBLEM), "--iterations", "1", "--budget", "3", "--decompose-attempts", "1",
                 "--trials", "2", "--out", str(out)]) == 0
    (run,) = (out / "gemm_chain").iterdir()
    return run / "best"


def check_json(capsys, packed: Path) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["check", str(PROBLEM), str(packed), "--json", "--trials", "2"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_pack_of_an_all_triton_solution_passes_check(best, tmp_path, capsys):
    packed = tmp_path / "elsewhere" / "gemm_chain_packed.py"
    assert main(["pack", str(best), "-o", str(packed)]) == 0
    source = packed.read_text()
    assert "class ModelNew(" in source and "def get_inputs(" in source
    assert "load_subkernel" not in source and "subkernel_implementations" not in source
    assert "Every subkernel is a Triton kernel." in source
    for name in ("linear_gelu", "linear_relu_add", "linear"):
        assert f"# ==== mkevolve pack: subkernel {name} (triton) ====" in source
        assert f"class {name}__ModelNew(" in source
    code, result = check_json(capsys, packed)
    assert code == 0 and result["status"] == "ok" and result["launches"] == 3


def test_pack_with_a_pytorch_subkernel_is_rejected_naming_it(best, tmp_path, capsys):
    folder = tmp_path / "best"
    shutil.copytree(best, folder)
    subproblem = (folder / "subkernel_problems" / "linear_relu_add.py").read_text()
    (folder / "subkernel_implementations" / "linear_relu_add.py").write_text(pytorch_alternative(subproblem))
    packed = tmp_path / "packed.py"
    capsys.readouterr()
    assert main(["pack", str(folder), "-o", str(packed)]) == 0
    assert "PyTorch subkernels (listed in the file's header): linear_relu_add" in capsys.readouterr().out
    header = packed.read_text().split('"""')[1]
    assert "PyTorch subkernels (they run their subproblem's PyTorch code, not a Triton kernel): linear_relu_add." \
        in header
    code, result = check_json(capsys, packed)
    assert code == 1 and result["status"] == "cheating"
    assert "a PyTorch fallback: linear_relu_add runs PyTorch code, not a Triton kernel" in result["reason"]


def test_pack_prefixes_module_names_and_leaves_shadowing_names_alone(best, tmp_path):
    folder = tmp_path / "best"
    shutil.copytree(best, folder)
    for name in ("linear_gelu", "linear_relu_add"):
        (folder / "subkernel_implementations" / f"{name}.py").write_text(SHADOWING)
    packed = pack_solution(folder)
    assert packed.pytorch == [] and packed.subkernels == ["linear_gelu", "linear_relu_add", "linear"]
    assert "if __name__" not in packed.source and "torch.randn(2)" not in packed.source
    path = tmp_path / "packed.py"
    path.write_text(packed.source)
    namespace = vars(import_file(path, prefix="packed"))
    for prefix in ("linear_gelu__", "linear_relu_add__"):
        assert namespace[prefix + "BLOCK"] == 16
        assert namespace[prefix + "helper"](1) == 2
        assert namespace[prefix + "module_blocks"]() == [16, 16, 17]
        assert namespace[prefix + "ModelNew"]().forward(None) == 3 + 16 + 4
    assert "get_inputs" in namespace and "linear_gelu__get_inputs" not in namespace


def test_pack_of_a_folder_that_is_not_a_solution_is_bad_input(tmp_path, capsys):
    assert main(["pack", str(tmp_path), "-o", str(tmp_path / "x.py")]) == 2
    assert "solution folder" in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()


def test_manifest_is_not_needed_to_pack(best, tmp_path):
    folder = tmp_path / "best"
    shutil.copytree(best, folder)
    problem = yaml.safe_load((folder / "manifest.yaml").read_text())["problem"]
    (folder / "manifest.yaml").unlink()
    packed = pack_solution(folder)
    assert problem not in packed.source and "class ModelNew(" in packed.source


def test_a_declared_pytorch_section_is_a_fallback_even_when_no_op_is_flagged():
    body = "import torch\n\n\ndef add(x, y):\n    return x + y\n"
    packed = f"{packed_section_marker('add', 'pytorch')}\n\n{body}"
    verdict = declared_pytorch_fallback(packed)
    assert verdict.status.value == "cheating" and "add runs PyTorch code" in verdict.reason
    assert declared_pytorch_fallback(body) is None
    assert declared_pytorch_fallback(packed.replace("(pytorch)", "(triton)")) is None
