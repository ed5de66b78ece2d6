"""`mkevolve port`: matching subproblems across decompositions, and porting MobileNet to its MaxPool variant."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from mkevolve.cli import main
from mkevolve.codebase import Decomposition, SubproblemSpec
from mkevolve.config import RunConfig
from mkevolve.llm.parse import extract_files
from mkevolve.matching import (
    GRAPH_INPUT,
    GRAPH_OUTPUT,
    match_subproblems,
    normalised_source,
    subproblem_graph,
)
from mkevolve.port import PortStatus, port_solution

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "port"
VARIANT = ROOT / "problems" / "mobilenet_tiny_maxpool.py"
POOL = "batchnorm2d_add_adaptivemaxpool2d"
UNCHANGED = ["conv2d", "batchnorm2d_relu6", "batchnorm2d_add", "batchnorm2d", "linear"]


def base_solution(folder: Path) -> Path:
    """The fixture solution of problems/mobilenet_tiny.py, copied, its manifest naming the problem's real path."""
    shutil.copytree(FIXTURES / "base", folder)
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())
    manifest["problem"] = str(ROOT / "problems" / "mobilenet_tiny.py")
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return folder


def variant_decomposition() -> Decomposition:
    return Decomposition.from_files(extract_files((FIXTURES / "variant_decomposition.md").read_text()))


# ---- matching ------------------------------------------------------------------------------------------


RELU = '''"""{doc}"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, {param}):
        super().__init__()
        self.{attr} = {param}

    def forward(self, {x}):
        {y} = torch.relu({x}) * {scale}
        return {y}


def get_inputs():
    return [torch.randn({batch}, 8)]


def get_init_inputs():
    return [{scale}]
'''


def relu_source(**names) -> str:
    defaults = {"doc": "relu", "param": "scale", "attr": "scale", "x": "x", "y": "y", "scale": 2.0, "batch": 4}
    return RELU.format(**{**defaults, **names})


def test_normalised_source_ignores_names_numbers_docstrings_and_inputs():
    plain = normalised_source(relu_source())
    assert normalised_source(relu_source(doc="other", param="k", attr="factor", x="inp", y="out", scale=3.5,
                                         batch=64)) == plain
    assert normalised_source(relu_source().replace("torch.relu", "torch.sigmoid")) != plain
    avg = (FIXTURES / "base" / "subkernel_problems" / "batchnorm2d_add_adaptiveavgpool2d.py").read_text()
    assert normalised_source(avg.replace("AdaptiveAvgPool2d", "AdaptiveMaxPool2d")) != normalised_source(avg)


def test_the_maxpool_variant_matches_every_subproblem_but_the_pooling_one():
    solution = Decomposition.read(FIXTURES / "base")
    matches = match_subproblems(solution, variant_decomposition())
    assert {m.variant: m.solution for m in matches} == {**{n: n for n in UNCHANGED}, POOL: None}
    assert "batchnorm2d_add_adaptiveavgpool2d" in next(m for m in matches if m.variant == POOL).reason
    graph = subproblem_graph(solution)
    assert graph.has_edge(GRAPH_INPUT, "conv2d") and graph.has_edge("linear", GRAPH_OUTPUT)
    assert graph.has_edge("batchnorm2d_add_adaptiveavgpool2d", "linear")
    assert graph.nodes["conv2d"]["instances"] == 10


def _chain(names: list[str], sources: dict[str, str]) -> Decomposition:
    """A top-level calling `names` in sequence (each its own subproblem), as the builtin writes them."""
    loads = "\n".join(f'{n.title().replace("_", "")} = load_subproblem("{n}")' for n in names)
    inits = "\n".join(f"        self.{n} = {n.title().replace('_', '')}(2.0)" for n in names)
    calls = "\n".join(f"        x = self.{n}(x)" for n in names)
    top = (f"import torch\nimport torch.nn as nn\n\n\ndef load_subproblem(name):\n    pass\n\n\n{loads}\n\n\n"
           f"class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n{inits}\n\n"
           f"    def forward(self, x):\n{calls}\n        return x\n")
    return Decomposition(top_level=top, subproblems=[SubproblemSpec(n, sources[n]) for n in names])


def test_equal_sources_are_told_apart_by_their_place_in_the_graph():
    sigmoid = relu_source().replace("torch.relu", "torch.sigmoid")
    solution = _chain(["relu_first", "middle", "relu_last"],
                      {"relu_first": relu_source(), "middle": sigmoid, "relu_last": relu_source()})
    variant = _chain(["head", "body", "tail"], {"head": relu_source(x="a"), "body": sigmoid,
                                                 "tail": relu_source(y="b")})
    matched = {m.variant: m.solution for m in match_subproblems(solution, variant)}
    assert matched == {"head": "relu_first", "body": "middle", "tail": "relu_last"}


# ---- the port itself -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    work = tmp_path_factory.mktemp("port")
    solution = base_solution(work / "mobilenet_best")
    config = RunConfig(model=f"replay:{FIXTURES / 'port.yaml'}", budget=1, decompose_attempts=1, trials=2,
                       out=str(work / "runs"))
    return solution, port_solution(solution, VARIANT, config)


def test_port_reuses_every_unchanged_subkernel_and_evolves_only_the_pooling_one(ported):
    _, outcome = ported
    assert outcome.passed
    assert outcome.reused == UNCHANGED and outcome.evolved == [POOL]
    assert outcome.decompose_calls == 1 and outcome.evolve_calls == 1 and outcome.llm_calls == 2
    events = [json.loads(line) for line in (outcome.run_dir / "events.jsonl").read_text().splitlines()]
    calls = [e for e in events if e["kind"] == "llm_call"]
    assert [(c["agent"], c["subproblem"], c["error"]) for c in calls] == [("decompose", None, None),
                                                                       ("generate", POOL, None)]


def test_port_writes_a_normal_run_directory_that_records_the_reuse(ported):
    solution, outcome = ported
    run = outcome.run_dir
    state = json.loads((run / "state.json").read_text())
    assert state["step"] == "finished" and state["history"][0]["refinement"] == "port"
    assert state["history"][0]["budget"] == {**{n: 0 for n in UNCHANGED}, POOL: 1}
    manifest = yaml.safe_load((run / "best" / "manifest.yaml").read_text())
    assert manifest["status"] == "ok" and manifest["problem"] == str(VARIANT)
    for name in UNCHANGED:
        assert manifest["subkernels"][name]["reused_from"] == f"{solution.resolve()} ({name})"
        kernel = (run / "best" / "subkernel_implementations" / f"{name}.py").read_text()
        assert kernel == (solution / "subkernel_implementations" / f"{name}.py").read_text()
        record = json.loads((run / "iterations" / "iter_00" / "candidates" / name / "c0000.json").read_text())
        assert record["result"]["status"] == "ok" and record["ported_from"]["subkernel"] == name
    assert manifest["subkernels"][POOL]["origin"].startswith("replay:")
    (port_event,) = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
                     if json.loads(line)["kind"] == "port"]
    assert [r["variant"] for r in port_event["reused"]] == UNCHANGED and port_event["evolved"] == [POOL]
    statuses = {p.name: p.status for p in outcome.subproblems}
    assert statuses[POOL] is PortStatus.NEW and statuses["conv2d"] is PortStatus.REUSED
    assert (run / "report.html").is_file()


def test_port_command_rejects_a_folder_without_its_decomposition(tmp_path, capsys):
    solution = base_solution(tmp_path / "best")
    (solution / "decomposed_problem.py").unlink()
    assert main(["port", str(solution), str(VARIANT), "--model", f"replay:{FIXTURES / 'port.yaml'}"]) == 2
    assert "decomposed_problem.py" in capsys.readouterr().err
