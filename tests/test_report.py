"""report.html: written at the end of every run and by `mkevolve report`, self-contained, with plots and tables."""

from __future__ import annotations

import html
import json
import re
import shlex
import shutil
from pathlib import Path
from urllib.parse import unquote

import networkx as nx
import pytest
import yaml

from mkevolve.cli import build_parser, main
from mkevolve.codebase import Decomposition
from mkevolve.matching import GRAPH_INPUT, GRAPH_OUTPUT, subproblem_graph
from mkevolve.report import NODE_RADIUS, Box, end_to_end, graph_layout, write_report
from mkevolve.run_state import IterationRecord
from mkevolve.solution import sha256_of

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
        assert f">{name}</a></td>" in table                          # each name links to its kernel file
    assert table.count("unknown (no GPU)") == 3 * len(NAMES)        # speedup, share, Amdahl
    # accuracy is measured on any device: each kernel's error against fp64 beside eager fp32's
    assert len(re.findall(r'<td class="num">[0-9.e+-]+ \(eager [0-9.e+-]+\)</td>', table)) == len(NAMES)
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


# ---- helpers for the tests below: a copy of the run, edited to show what a failing run records --------------


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy


def edit_state(run: Path, edit) -> None:
    state = json.loads((run / "state.json").read_text())
    edit(state)
    (run / "state.json").write_text(json.dumps(state))


def save_candidate(run: Path, iteration: int, name: str, cid: str, status: str, reason: str, code: bool) -> None:
    """A candidate record as the evolve agent writes it, for the subproblem as that iteration has it."""
    folder = run / "iterations" / f"iter_{iteration:02d}"
    problem = (folder / "subkernel_problems" / f"{name}.py").read_text()
    record = {"id": cid, "subproblem": name, "parent": None, "kind": "debug",
              "source": f"{cid}.py" if code else None, "result": {"status": status, "reason": reason},
              "tokens": {"prompt": 0, "completion": 0, "reasoning": 0}, "cached": False, "accepted": None,
              "problem_sha256": sha256_of(problem)}
    (folder / "candidates" / name).mkdir(parents=True, exist_ok=True)
    (folder / "candidates" / name / f"{cid}.json").write_text(json.dumps(record))
    if code:
        (folder / "candidates" / name / f"{cid}.py").write_text("# a kernel that fails\n")


def rows(table: str) -> list[str]:
    return table.split("<tr>")[2:]                                 # the header row left out


def hrefs(page: str) -> list[str]:
    return [unquote(html.unescape(h)) for h in re.findall(r'<a href="([^"]*)"', page)]


# ---- 1. failure reasons --------------------------------------------------------------------------------

UNTRUSTED = "<script>alert(1)</script>"


def test_a_subproblem_kept_as_pytorch_says_why_and_quotes_its_last_verdicts(run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    why = f"no accepted kernel among 2 candidate(s); the closest, c0009: incorrect: {UNTRUSTED}"

    def keep_linear_as_pytorch(state):
        record = state["history"][-1]
        record["subkernels"]["linear"].update(status="failing", candidate=None, origin="pytorch", reason=why)
        record["pytorch"] = ["linear"]
    edit_state(run, keep_linear_as_pytorch)
    manifest = yaml.safe_load((run / "best" / "manifest.yaml").read_text())
    manifest["subkernels"]["linear"].update(origin="pytorch", status="pytorch", candidate=None, reason=why)
    (run / "best" / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    save_candidate(run, 2, "linear", "c0008", "incorrect", "output 0: worst error 310% of the tolerance", True)
    save_candidate(run, 2, "linear", "c0009", "compile_error", f"no code: the reply says: {UNTRUSTED}", False)

    page = write_report(run).read_text()
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page   # untrusted text escaped
    table = section(page, "outcomes")
    (linear,) = [r for r in rows(table) if r.startswith("<td>linear</td>")]
    assert "kept as PyTorch" in linear and "no accepted kernel among 2 candidate(s)" in linear
    assert "c0008" in linear and "output 0: worst error 310% of the tolerance" in linear
    assert "c0009 (no code)" in linear and "compile_error" in linear
    assert 'href="iterations/iter_02/candidates/linear/c0008.py"' in linear
    for name in ("linear_gelu", "linear_relu_add"):
        (row,) = [r for r in rows(table) if r.startswith(f"<td>{name}</td>")]
        assert "accepted kernel c0000" in row
    assert "mkevolve swap" in section(page, "next-steps")            # a hand-written kernel can replace it


def test_a_failing_subproblem_without_a_solution_says_why(run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    shutil.rmtree(run / "best")

    def fail(state):
        state["best_iteration"], state["best_score"] = None, None
        for record in state["history"]:
            record.update(e2e_status="incorrect", e2e_reason="output 0: worst error 250% of the tolerance",
                          kept=False, pytorch=["linear"])
            record["subkernels"]["linear"].update(status="failing", candidate=None, origin="pytorch", reason="")
        state["beams"]["linear"]["exhausted"] = {"model": "builtin", "reason": "all 4 of its variants were tried"}
    edit_state(run, fail)
    save_candidate(run, 2, "linear", "c0008", "cheating", "forward calls torch.matmul (rule torch-compute)", True)

    page = write_report(run).read_text()
    assert "no end-to-end solution passed" in page
    (linear,) = [r for r in rows(section(page, "outcomes")) if r.startswith("<td>linear</td>")]
    assert ">failing<" in linear and "all 4 of its variants were tried" in linear
    assert "forward calls torch.matmul" in linear
    for row in rows(section(page, "iterations")):                 # the check ran: its verdict stands
        assert ">incorrect<" in row and "250% of the tolerance" in row
    steps = section(page, "next-steps")
    assert "mkevolve pack" not in steps and "mkevolve run --resume" in steps and "--model" in steps


def test_a_subproblem_whose_last_candidates_were_never_checked_says_so(run_dir, tmp_path):
    """A check the time budget left unstarted is no failure of the kernel: counted and shown apart."""
    run = copy_run(run_dir, tmp_path)

    def no_kernel(state):
        state["history"][-1]["subkernels"]["linear"].update(status="failing", candidate=None, reason="")
        state["beams"]["linear"]["exhausted"] = None
    edit_state(run, no_kernel)
    save_candidate(run, 2, "linear", "c0008", "incorrect", "output 0: worst error 310% of the tolerance", True)
    save_candidate(run, 2, "linear", "c0009", "not_run", "the candidate process could not be run: the run's "
                   "time budget was spent before a worker was free", True)

    page = write_report(run).read_text()
    (linear,) = [r for r in rows(section(page, "outcomes")) if r.startswith("<td>linear</td>")]
    assert "checked candidate(s) passed; 1 more never checked: the run&#39;s time budget was spent" in linear
    assert '<span class="muted">not_run</span>' in linear and '<span class="fail">incorrect</span>' in linear


def test_an_end_to_end_check_that_did_not_run_says_so_and_why(run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)

    def not_run(state):
        state["history"][0].update(e2e_status="crashed",
                                   e2e_reason="the candidate process could not be run: the zygote is gone")
        state["history"][1].update(e2e_status="cheating",
                                   e2e_reason="subkernel linear: forward calls torch.matmul (+1 more)")
    edit_state(run, not_run)
    # A static rejection returns before the composite runs, so the log has no composite verdict for it.
    events = [line for line in (run / "events.jsonl").read_text().splitlines()
              if not ('"composite": true' in line and "iter_02" in line)]
    (run / "events.jsonl").write_text("\n".join(events) + "\n")

    page = write_report(run).read_text()
    first, second = rows(section(page, "iterations"))
    assert ">not run<" in first and "could not start the candidate process (the zygote is gone)" in first
    assert ">not run<" in second and "static checks rejected the composed solution before it ran" in second
    assert ">crashed<" not in first and ">cheating<" not in second and ">incorrect<" not in first + second


def test_end_to_end_tells_a_check_that_ran_from_one_that_did_not():
    def record(status: str, reason: str) -> IterationRecord:
        return IterationRecord(index=1, refinement="none", subproblems=["a"], budget={"a": 1}, subkernels={},
                               e2e_status=status, e2e_reason=reason)
    ran = end_to_end(record("incorrect", "output 0 differs"), {1})
    assert ran.ran and ran.status == "incorrect"
    skipped = end_to_end(record("incorrect", "no accepted kernel yet for a"), None)   # a run from before
    assert not skipped.ran and skipped.status == "not run" and "no solution was composed" in skipped.reason
    unlogged = end_to_end(record("incorrect", "output 0 differs"), set())
    assert not unlogged.ran
    assert not end_to_end(record("", ""), None).ran                # stopped before the check


# ---- 2. links ------------------------------------------------------------------------------------------


def test_links_to_best_and_to_each_accepted_kernel_resolve_from_the_report(run_dir):
    page = (run_dir / "report.html").read_text()
    links = hrefs(page)
    assert links and all((run_dir / link).exists() for link in links), links
    assert not any(Path(link).is_absolute() or link.startswith(("http:", "https:", "file:")) for link in links)
    assert "best/" in links
    for name in NAMES:
        assert f"best/subkernel_implementations/{name}.py" in links
        assert f"iterations/iter_01/candidates/{name}/c0000.py" in links
    assert 'href="best/"' in section(page, "best-link")


# ---- 3. next steps -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_next_steps_are_real_commands_with_this_runs_paths(run_dir, tmp_path, monkeypatch):
    steps = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", section(
        (run_dir / "report.html").read_text(), "next-steps"), flags=re.S)]
    best = str((run_dir / "best").resolve())
    assert steps == [f"mkevolve pack {best} -o solution.py", f"mkevolve check {PROBLEM} solution.py",
                     f"mkevolve eval {best}"]
    for command in steps:                                          # each parses as the CLI has it
        build_parser().parse_args(shlex.split(command)[1:])
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(steps[0])[1:]) == 0                    # pack, then check: they work as written
    assert main(shlex.split(steps[1])[1:] + ["--trials", "1"]) == 0


# ---- 4. the subproblem graph ---------------------------------------------------------------------------

# The decomposition of problems/mobilenet_tiny.py: one conv2d subproblem used ten times, fed back into itself
# through the batch norms (cycles), and a long name.
MOBILENET = [(GRAPH_INPUT, "conv2d"), ("conv2d", "batchnorm2d_relu6"), ("conv2d", "batchnorm2d_add"),
             ("conv2d", "batchnorm2d"), ("conv2d", "batchnorm2d_add_adaptiveavgpool2d"),
             ("batchnorm2d_relu6", "conv2d"), ("batchnorm2d_relu6", "batchnorm2d_add"), ("batchnorm2d_add", "conv2d"),
             ("batchnorm2d", "conv2d"), ("batchnorm2d", "batchnorm2d_add_adaptiveavgpool2d"),
             ("batchnorm2d_add_adaptiveavgpool2d", "linear"), ("linear", GRAPH_OUTPUT)]


def test_box_geometry_finds_a_crossing():
    box = Box(0.0, 0.0, 1.0, 1.0)
    assert box.hits_segment((-1.0, 0.5), (2.0, 0.5)) and box.hits_segment((0.5, 0.5), (3.0, 3.0))
    assert not box.hits_segment((-1.0, 1.5), (2.0, 1.5)) and not box.hits_segment((1.5, -1.0), (3.0, 2.0))


@pytest.mark.parametrize("which", ["gemm_chain", "mobilenet_tiny", "mobilenet_tiny with a self-loop"])
def test_no_graph_label_is_crossed_by_an_edge(run_dir, which):
    if which == "gemm_chain":
        graph = subproblem_graph(Decomposition.read(run_dir / "best"))
    else:
        graph = nx.DiGraph(MOBILENET)
        graph.nodes["conv2d"]["instances"], graph.nodes["batchnorm2d_relu6"]["instances"] = 10, 7
        if "self-loop" in which:
            graph.add_edge("linear", "linear")
    layout = graph_layout(graph)
    assert set(layout.labels) == set(graph.nodes)
    assert len(layout.edges) == sum(1 for u, v in graph.edges if u != v)
    for label in layout.labels.values():
        for edge in layout.edges:
            assert not any(label.box.hits_segment(a, b) for a, b in edge.segments()), (label.node, edge)
        for node, point in layout.positions.items():
            assert label.box.distance_to(point) >= NODE_RADIUS, (label.node, node)
        for other in layout.labels.values():
            assert other is label or not label.box.overlaps(other.box), (label.node, other.node)
        assert label.box.distance_to(layout.positions[label.node]) < 1.0  # beside its own dot
    xs = {node: x for node, (x, _) in layout.positions.items()}
    assert xs[GRAPH_INPUT] < min(x for n, x in xs.items() if n != GRAPH_INPUT)
    assert xs[GRAPH_OUTPUT] > max(x for n, x in xs.items() if n != GRAPH_OUTPUT)


# ---- 5. tokens -----------------------------------------------------------------------------------------


def test_token_columns_that_are_all_zero_are_left_out(run_dir, tmp_path):
    tokens = section((run_dir / "report.html").read_text(), "tokens")
    assert "<th>calls</th>" in tokens                              # the builtin agent makes calls...
    for column in ("prompt", "completion", "reasoning", "total"):  # ...but spends no tokens
        assert f"<th>{column}</th>" not in tokens
    run = copy_run(run_dir, tmp_path)
    usage = {"generate": {"prompt": 1200, "completion": 340, "reasoning": 0}}
    with (run / "events.jsonl").open("a") as log:
        log.write(json.dumps({"kind": "llm_tokens", "model": "m", "by_agent": usage}) + "\n")
    tokens = section(write_report(run).read_text(), "tokens")
    for column in ("calls", "prompt", "completion", "total"):
        assert f"<th>{column}</th>" in tokens
    assert "<th>reasoning</th>" not in tokens
    assert '<td class="num">1540</td>' in tokens


def test_an_interrupted_run_is_told_to_resume(run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    edit_state(run, lambda state: state.update(step="evolved", iteration=3))
    steps = section(write_report(run).read_text(), "next-steps")
    assert f"mkevolve run --resume {run.resolve()}</code>" in steps and "stopped in iteration 3" in steps
