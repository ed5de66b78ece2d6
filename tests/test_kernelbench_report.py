"""scripts/kernelbench_report.py: the benchmark of record's table, summary and plot from a results JSON, with
failed rows and missing fields shown as such and never filled in."""

from __future__ import annotations

import importlib.util
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_report():
    """scripts/ is not a package: import the file by path, under the name scripts/kernelbench.py uses for it."""
    name = "kernelbench_report"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module      # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


report = load_report()

GEMM = "level2/12_Gemm_Multiply_LeakyReLU.py"
CONV = "level2/71_Conv2d_Divide_LeakyReLU.py"
FAILED = "level2/3_ConvTranspose3d_Sum_LayerNorm_AvgPool_GELU.py"
MLP = "level3/2_ShallowWideMLP.py"

# Two correct, timed level 2 rows (2x and 0.5x: geomean 1.00x), a failed one that carries a speedup anyway (counted,
# the geomean would be 2.00x), and a level 3 row whose run is done but whose timing is not, with fields missing.
ROWS = [
    {"problem": CONV, "finished": True, "correct": True, "all_triton": True, "speedup_vs_compile": 2.0,
     "speedup_vs_eager": 3.0, "err_solution": 3.5e-7, "err_eager": 2.9e-7, "wall_s": 267.5, "llm_calls": 9},
    {"problem": GEMM, "finished": True, "correct": True, "all_triton": False, "speedup_vs_compile": 0.5,
     "speedup_vs_eager": 0.75, "err_solution": 1e-5, "err_eager": 4e-6, "wall_s": 80.0, "llm_calls": 8,
     "a_field_from_the_future": 1},
    {"problem": FAILED, "finished": True, "correct": False, "speedup_vs_compile": 8.0, "wall_s": 150.0,
     "note": "no correct end-to-end solution: shape mismatch"},
    {"problem": MLP, "finished": False, "exit_code": 0, "correct": True},
]
META = {"date": "2026-12-01", "gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3",
        "settings": {"model": "builtin", "iterations": 1, "budget": 8, "run_args": [], "rounds": 5},
        "note": "Partial: 4 of 6 problems."}


@pytest.fixture
def kernelbench(tmp_path) -> Path:
    """A benchmark of 4 level 2 and 2 level 3 problems: the totals the summary counts against."""
    for key in (CONV, GEMM, FAILED, "level2/99_Other.py", MLP, "level3/5_AlexNet.py"):
        (tmp_path / "kb" / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "kb" / key).write_text("# a problem\n")
    return tmp_path / "kb"


@pytest.fixture
def results(tmp_path) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**META, "rows": ROWS}))
    return path


def cells(table: str, key: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {key.removesuffix('.py')} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_table_has_each_rows_cells_with_unknown_for_missing_values(results, kernelbench):
    table = report.markdown(report.Report.load(results, kernelbench))
    assert cells(table, CONV) == [CONV.removesuffix(".py"), "2", "yes", "yes", "2.00x", "3.00x", "3.5e-07",
                                  "2.9e-07", "268", "9"]
    assert cells(table, GEMM)[2:6] == ["yes", "no", "0.50x", "0.75x"]
    assert cells(table, FAILED) == [FAILED.removesuffix(".py"), "2", "no", "unknown", "8.00x", "unknown",
                                    "unknown", "unknown", "150", "unknown"]
    assert cells(table, MLP)[1:] == ["3", "yes", "unknown", "unknown", "unknown", "unknown", "unknown", "unknown",
                                     "unknown"]
    # Ordered by level, then by the problem's number, not as strings (3 before 12 before 71).
    order = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| level")]
    assert order == [k.removesuffix(".py") for k in (FAILED, GEMM, CONV, MLP)]


def test_summary_counts_and_geomean_over_correct_rows_only(results, kernelbench):
    table = report.markdown(report.Report.load(results, kernelbench))
    assert ("- All levels: 4 of 6 problems run; correct end to end: 3 of 4; all subkernels in Triton: 1 of 4; "
            "geometric mean speedup vs torch.compile over the 2 timed correct problems: 1.00x "
            "(vs eager: 1.50x).") in table
    assert "- Level 2: 3 of 4 problems run; correct end to end: 2 of 3;" in table
    assert "- Level 3: 1 of 2 problems run; correct end to end: 1 of 1;" in table
    assert "over the 0 timed correct problems: unknown (vs eager: unknown)." in table


def test_summary_counts_the_correct_problems_at_most_as_far_from_fp64_as_eager(results, kernelbench):
    """The failed row has no errors and the level 3 row none measured: only the two level 2 rows count, both above
    eager's error (3.5e-7 against 2.9e-7, 1e-5 against 4e-6)."""
    table = report.markdown(report.Report.load(results, kernelbench))
    assert ("Error against fp64 at most eager fp32's: 0 of the 2 correct problems with both measured (the largest "
            "2.50 times it).") in table
    assert "Error against fp64 at most eager fp32's: 0 of the 0 correct problems with both measured." in table


def test_header_facts_and_notes_come_from_the_file(results, kernelbench):
    table = report.markdown(report.Report.load(results, kernelbench))
    first = table.splitlines()[0]
    assert "NVIDIA H200, 2026-12-01" in first and "torch 2.11.0, triton 3.6.0, python 3.12.3" in first
    assert "`mkevolve run --model builtin --iterations 1 --budget 8`" in first and "5 alternating rounds" in first
    assert "Note: Partial: 4 of 6 problems." in table
    assert f"- {FAILED.removesuffix('.py')}: no correct end-to-end solution: shape mismatch" in table
    assert f"- {MLP.removesuffix('.py')}: timing still to do" in table
    assert f"- {CONV.removesuffix('.py')}:" not in table


def test_a_stopped_run_is_not_said_to_wait_for_its_timing():
    stopped = report.ProblemRow.from_json({"problem": MLP, "finished": False, "exit_code": None,
                                           "note": "mkevolve run stopped at the part's time limit after 530 s in "
                                                   "1 part(s); the next part resumes it"})
    assert report.row_note(stopped) == stopped.note


def test_totals_are_unknown_without_a_kernelbench_folder(results, tmp_path):
    table = report.markdown(report.Report.load(results, tmp_path / "missing"))
    assert "- All levels: 4 of unknown problems run;" in table
    assert "- Level 3: 1 of unknown problems run;" in table


def test_a_level_with_no_rows_gets_one_short_line(tmp_path, kernelbench):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"rows": [ROWS[0]]}))      # no header facts at all
    table = report.markdown(report.Report.load(path, kernelbench))
    assert "- Level 3: 0 of 2 problems run." in table
    assert table.startswith("KernelBench on unknown, unknown; torch unknown")


def test_markdown_goes_to_stdout_without_a_file(results, kernelbench, capsys):
    assert report.main([str(results), "--kernelbench", str(kernelbench)]) == 0
    assert "| level2/71_Conv2d_Divide_LeakyReLU | 2 | yes |" in capsys.readouterr().out


def test_without_matplotlib_the_markdown_is_written_and_the_plot_skipped(results, kernelbench, tmp_path,
                                                                          monkeypatch, capsys):
    monkeypatch.setattr(report, "has_matplotlib", lambda: False)
    markdown, svg = tmp_path / "docs" / "kb.md", tmp_path / "docs" / "kb.svg"
    assert report.main([str(results), "--markdown", str(markdown), "--svg", str(svg),
                        "--kernelbench", str(kernelbench)]) == 0
    assert markdown.is_file() and not svg.exists()
    assert "plot skipped: matplotlib is not installed" in capsys.readouterr().err


def test_svg_is_valid_xml_marks_failures_and_is_reproducible(results, kernelbench, tmp_path):
    pytest.importorskip("matplotlib")
    svg = tmp_path / "plot.svg"
    report.main([str(results), "--markdown", str(tmp_path / "kb.md"), "--svg", str(svg),
                 "--kernelbench", str(kernelbench)])
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    text = svg.read_text()
    assert "failed" in text and "unknown" in text and "level 3" in text     # matplotlib keeps each text as a comment
    first = svg.read_bytes()
    report.main([str(results), "--markdown", str(tmp_path / "kb.md"), "--svg", str(svg),
                 "--kernelbench", str(kernelbench)])
    assert svg.read_bytes() == first         # no date, fixed ids: re-rendering the same data changes no byte


@pytest.mark.parametrize("results, table", [("kernelbench_h200.json", "kernelbench_h200.md"),
                                            ("kernelbench_h100.json", "kernelbench_h100.md")])
def test_committed_results_match_the_committed_table(results, table):
    """Each table in docs/ is rendered from its results file in scripts/results/: their rows must agree."""
    rendered = report.markdown(report.Report.load(ROOT / "scripts" / "results" / results))
    committed = (ROOT / "docs" / table).read_text()
    rows = [line for line in rendered.splitlines() if line.startswith("| level")]
    assert rows and rows == [line for line in committed.splitlines() if line.startswith("| level")]
