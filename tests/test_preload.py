"""The problem's installed imports load before the candidate process is confined; candidate files never do."""

import subprocess
import sys
import textwrap
from pathlib import Path

from mkevolve.verify.candidate_run import imported_modules, preload_for


def test_the_problem_file_imports_are_read_in_order_without_relative_ones(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text("import torch\nimport torch.nn as nn\nfrom transformers.models import gpt2\n"
                       "from . import sibling\nimport torch\n\ndef f():\n    import inside\n")
    assert imported_modules(problem) == ["torch", "torch.nn", "transformers.models"]
    assert imported_modules(tmp_path / "missing.py") == []


def test_only_the_problem_imports_the_solution_shares_are_preloaded(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text("import torch\nfrom transformers.models.gpt2 import modeling_gpt2\nimport colorsys\n")
    solution = tmp_path / "solution"
    (solution / "subkernel_implementations").mkdir(parents=True)
    (solution / "decomposed_solution.py").write_text("import torch\nimport evil_module\n")
    (solution / "subkernel_implementations" / "block.py").write_text(
        "import torch\nfrom transformers.models.gpt2 import modeling_gpt2\n")
    # The solution's own extra import (evil_module) never comes out: only names the problem imports.
    assert preload_for(problem, solution) == ["torch", "transformers.models.gpt2"]
    (solution / "subkernel_implementations" / "block.py").write_text("import triton\n")
    assert preload_for(problem, solution) == ["torch"]  # a Triton-only solution does not wait for transformers


def test_installed_modules_load_and_a_file_on_the_path_does_not(tmp_path):
    """In a fresh interpreter: a standard-library module not yet imported is loaded; a module that resolves to
    a file outside the installed packages (as a candidate's would) is not run."""
    (tmp_path / "planted.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        assert "colorsys" not in sys.modules
        from mkevolve.verify.harness import preload_installed
        preload_installed(["colorsys", "planted", "no_such_module_anywhere"])
        print("colorsys" in sys.modules, "planted" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
    assert not (tmp_path / "ran").exists()
