"""report.html: written at the end of every run and by `mkevolve report`, self-contained, with plots and tables."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from mkevolve.cli import main
from mkevolve.report import write_report

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "gemm_chain.py"
NAMES = ("linear_gelu", "linear_relu_add", "linear")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    assert main(["run", str(PROBLEM), "--iterations", "2", "--budget", "3", "--decompose-attempts", "1",
                 "--trials", "2", "--out", str(out)]) == 0
    (run,) = (out / "gemm_chain").iterdir()
    return run


def section(page: str, element_id: str) -> str:
    """The element with that id, up to its closing tag."""
    start = page.index(f'id="{element_id}"')
    tag = page.rfind("<", 0, start)
    name = re.match(r"<(\w+)", page[tag:]).group(1)
    return page[tag:page.index(f"</{name}>", start)]


def test_every_run_writes_a_self_contained_report(run_dir):
    page = (run_dir / "report.html").read_text()
    assert "gemm_chain" in page and "end to end passes" in page
    assert not re.search(r"<(script|link|img)\b", page), "the page must not load anything"
    assert section(page, "final-speedup").endswith("unknown (no GPU)")
    assert "no GPU on the machine" in page
    table = section(page, "subkernels")
    for name in NAMES:
        assert f"<td>{name}</td>" in table
    assert table.count("unknown (no GPU)") == 3 * len(NAMES)        # speedup, share, Amdahl
    plot = section(page, "speedup-plot")
    assert "<svg" in plot and "verdicts" in plot and "end to end" in plot
    assert "3 subpr." in plot                                      # the x axis names each decomposition
    graph = section(page, "graph")
    assert "<svg" in graph and all(name in graph for name in NAMES)
    assert section(page, "iterations").count("<tr>") == 1 + 2
    tokens = section(page, "tokens")
    assert "<td>decompose</td>" in tokens and "<td>generate</td>" in tokens
    assert "class Model(nn.Module):" in page                      # the problem's source


def test_report_command_rewrites_the_page(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "report.html").unlink()
    assert main(["report", str(copy)]) == 0
    assert str(copy / "report.html") in capsys.readouterr().out
    assert "<svg" in (copy / "report.html").read_text()


def test_measured_speedups_are_plotted_and_give_the_amdahl_column(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    manifest = yaml.safe_load((copy / "best" / "manifest.yaml").read_text())
    manifest.update(device="NVIDIA H200", speedup=1.25)
    for name, (speedup, share) in zip(NAMES, [(2.0, 0.5), (1.0, 0.3), (0.5, 0.2)]):
        manifest["subkernels"][name].update(speedup=speedup, runtime_share=share, runtime_ms=share)
    (copy / "best" / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    state = json.loads((copy / "state.json").read_text())
    for record, e2e in zip(state["history"], [1.1, 1.25]):
        record["e2e_speedup"] = e2e
        for sub in record["subkernels"].values():
            sub["speedup"] = 1.5
    (copy / "state.json").write_text(json.dumps(state))
    page = write_report(copy).read_text()
    assert section(page, "final-speedup").endswith("1.250x") and "no GPU" not in page
    rows = section(page, "subkernels")
    assert "1.500x" in rows and "50.0%" in rows                    # (1 - 0.5) + 0.5 * 2.0
    assert "0.900x" in rows                                        # (1 - 0.2) + 0.2 * 0.5
    assert "speedup vs torch.compile" in section(page, "speedup-plot")


def test_report_of_a_folder_that_is_not_a_run_is_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "state.json" in capsys.readouterr().err
