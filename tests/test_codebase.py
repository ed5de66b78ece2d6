"""The codebase layout: write/read round trips, names, reply files, the solution side, the fallback top-level."""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from mkevolve.codebase import (
    FALLBACK_MARKER,
    KERNELS_DIR,
    PROBLEM_FILE,
    PROBLEMS_DIR,
    SOLUTION_FILE,
    CodebaseError,
    Decomposition,
    instances_in_source,
    is_valid_name,
    referenced_subproblems,
    safe_name,
    wrap_original,
    write_solution,
)

FIXTURES = Path(__file__).parent / "fixtures" / "decompositions"
GOOD = FIXTURES / "good"


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_read_gives_top_level_subproblems_and_instances():
    decomposition = Decomposition.read(GOOD)
    assert decomposition.names == ["linear_relu", "scale"]  # in the order the top-level loads them
    assert decomposition.subproblem("linear_relu").instances == 2  # its get_input_configs has two entries
    assert decomposition.subproblem("scale").instances == 1
    assert decomposition.total_instances == 3
    assert not decomposition.fallback


def test_write_then_read_round_trips_and_drops_stale_files(tmp_path):
    decomposition = Decomposition.read(GOOD)
    (tmp_path / PROBLEMS_DIR).mkdir()
    (tmp_path / PROBLEMS_DIR / "old_block.py").write_text("stale = True\n")
    decomposition.write(tmp_path)
    assert sorted(p.name for p in (tmp_path / PROBLEMS_DIR).iterdir()) == ["linear_relu.py", "scale.py"]
    again = Decomposition.read(tmp_path)
    assert again.files() == decomposition.files()
    assert set(again.files()) == {PROBLEM_FILE, f"{PROBLEMS_DIR}/linear_relu.py", f"{PROBLEMS_DIR}/scale.py"}


def test_read_of_a_folder_without_top_level_is_an_error(tmp_path):
    with pytest.raises(CodebaseError, match="no decomposed_problem.py"):
        Decomposition.read(tmp_path)


def test_names_are_file_safe_and_stable():
    assert is_valid_name("conv2d_relu")
    for bad in ("Conv", "2conv", "conv-relu", "class", "", "a" * 65, "x.py"):
        assert not is_valid_name(bad)
    assert safe_name("19_ConvTranspose2d GELU!") == "m_19_convtranspose2d_gelu"
    assert safe_name("19_ConvTranspose2d GELU!") == safe_name("19_ConvTranspose2d GELU!")
    assert safe_name("class") == "class_"
    assert all(is_valid_name(safe_name(text)) for text in ("Model", "--", "a b c", "3", "lambda"))


def test_from_files_keeps_unchanged_subproblems_of_the_previous_decomposition():
    previous = Decomposition.read(GOOD)
    top = previous.top_level.replace('Scale = load_subproblem("scale")', 'Scale = load_subproblem("scale2")')
    scale = previous.subproblem("scale").source
    files = {PROBLEM_FILE: top, f"{PROBLEMS_DIR}/scale2.py": scale}
    merged = Decomposition.from_files(files, previous=previous)
    assert merged.names == ["linear_relu", "scale2"]  # 'scale' is no longer loaded, so it is gone
    assert merged.subproblem("linear_relu").source == previous.subproblem("linear_relu").source


@pytest.mark.parametrize("files, message", [
    ({f"{PROBLEMS_DIR}/a.py": "x = 1\n"}, "no decomposed_problem.py"),
    ({PROBLEM_FILE: "x = 1\n", "notes.txt": "hi"}, "unexpected file"),
    ({PROBLEM_FILE: "x = 1\n", f"{PROBLEMS_DIR}/Bad-Name.py": "x = 1\n"}, "invalid subproblem name"),
])
def test_from_files_rejects_what_is_not_a_decomposition(files, message):
    with pytest.raises(CodebaseError, match=message):
        Decomposition.from_files(files)


def test_from_files_replaces_a_rewritten_loader_with_the_canonical_one():
    good = Decomposition.read(GOOD)
    mangled = good.top_level.replace('/ "subkernel_problems" /', '/ "elsewhere" /')
    assert mangled != good.top_level
    assert Decomposition.from_files({PROBLEM_FILE: mangled}).top_level == good.top_level


def test_referenced_subproblems_and_instance_counts():
    top = Decomposition.read(GOOD).top_level
    assert referenced_subproblems(top) == ["linear_relu", "scale"]
    assert referenced_subproblems("def broken(:\n") == []
    assert instances_in_source((GOOD / PROBLEMS_DIR / "linear_relu.py").read_text()) == 2
    assert instances_in_source("def get_inputs():\n    return []\n") == 1


def test_solution_folder_loads_kernels_relative_to_itself(tmp_path):
    decomposition = Decomposition.read(GOOD)
    # Stand-in kernels: the subproblems' own code under the name ModelNew (the layout is what is tested).
    kernels = {s.name: s.source.replace("class Model(", "class ModelNew(") for s in decomposition.subproblems}
    built = tmp_path / "built"
    decomposition.write(built)
    write_solution(built, decomposition, kernels)
    assert sorted(p.name for p in (built / KERNELS_DIR).iterdir()) == ["linear_relu.py", "scale.py"]
    solution_source = (built / SOLUTION_FILE).read_text()
    assert "class ModelNew(nn.Module)" in solution_source and "class Model(" not in solution_source
    assert str(tmp_path) not in solution_source  # no absolute paths
    moved = tmp_path / "elsewhere" / "best"
    shutil.copytree(built, moved)
    shutil.rmtree(built)
    problem = _import(moved / PROBLEM_FILE, "codebase_test_problem")
    solution = _import(moved / SOLUTION_FILE, "codebase_test_solution")
    torch.manual_seed(0)
    reference = problem.Model(8)
    torch.manual_seed(0)
    candidate = solution.ModelNew(8)
    x = torch.randn(2, 8)
    assert torch.equal(reference(x), candidate(x))
    assert type(candidate.block1).__name__ == "ModelNew"


def test_write_solution_needs_one_kernel_per_subproblem(tmp_path):
    decomposition = Decomposition.read(GOOD)
    with pytest.raises(CodebaseError, match="missing: scale"):
        write_solution(tmp_path, decomposition, {"linear_relu": "class ModelNew: pass\n"})


def test_wrap_original_keeps_the_constructor_and_forward_signatures(tmp_path):
    source = (FIXTURES / "problem.py").read_text().replace(
        "def __init__(self, dim):", "def __init__(self, dim, *, gain=1.0):")
    fallback = wrap_original("my problem", source)
    assert fallback.fallback and fallback.names == ["my_problem"]
    assert fallback.subproblems[0].source == source
    assert "def __init__(self, dim, *, gain=1.0):" in fallback.top_level
    assert "MyProblem(dim, gain=gain)" in fallback.top_level
    fallback.write(tmp_path)
    again = Decomposition.read(tmp_path)
    assert again.fallback and (ast_doc := again.top_level.split('"""')[1]).startswith(FALLBACK_MARKER), ast_doc
