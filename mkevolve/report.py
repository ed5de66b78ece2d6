"""report.html for a run directory: problem, result, per-subkernel table, plots (inline SVG), tokens per agent."""

from __future__ import annotations

import html
import io
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import jinja2
import matplotlib
import networkx as nx
import yaml
from matplotlib.figure import Figure

from mkevolve.codebase import PROBLEM_FILE, CodebaseError, Decomposition
from mkevolve.evaluate import amdahl_contribution
from mkevolve.fsutil import write_atomic
from mkevolve.matching import GRAPH_INPUT, GRAPH_OUTPUT, subproblem_graph
from mkevolve.orchestrator import BEST
from mkevolve.problem import ProblemError
from mkevolve.run_state import IterationRecord, RunState, StateError
from mkevolve.solution import MANIFEST, Manifest, SolutionError

REPORT_FILE = "report.html"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
UNKNOWN = "unknown (no GPU)"
_OK, _FAIL, _ABSENT = "#2e7d32", "#c62828", "#bdbdbd"


@dataclass
class SubkernelRow:
    name: str
    status: str
    speedup: str
    share: str
    amdahl: str
    origin: str
    candidate: str
    precision: str


@dataclass
class IterationRow:
    index: int
    refinement: str
    subproblems: str
    calls: int
    status: str
    reason: str
    speedup: str
    kept: bool
    seconds: str


@dataclass
class TokenRow:
    agent: str
    calls: int
    prompt: int
    completion: int
    reasoning: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass
class ReportPage:
    """Everything the template shows, already formatted."""

    title: str
    run_dir: str
    problem_path: str
    problem_source: str
    model: str
    device: str
    verdict: str
    passed: bool
    final_speedup: str
    measured: bool          # whether any speedup was measured (only on a GPU)
    best_iteration: int | None
    subkernels: list[SubkernelRow]
    iterations: list[IterationRow]
    tokens: list[TokenRow]
    speedup_svg: str
    graph_svg: str
    graph_caption: str
    notes: list[str] = field(default_factory=list)
    generated: str = ""


def _fmt_speedup(value: float | None, unknown: str = UNKNOWN) -> str:
    return unknown if value is None else f"{value:.3f}x"


def _fmt_share(value: float | None, unknown: str = UNKNOWN) -> str:
    return unknown if value is None else f"{100 * value:.1f}%"


# ---- reading the run -----------------------------------------------------------------------------------


def read_events(run_dir: Path) -> list[dict]:
    """events.jsonl as records; a line cut short by a crash is skipped."""
    path = run_dir / "events.jsonl"
    events = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def token_rows(events: list[dict]) -> list[TokenRow]:
    """Tokens per agent, summed over every client's totals (a resumed or ported run has several); calls
    are the ones that reached the model, cache hits left out."""
    rows: dict[str, TokenRow] = {}
    for event in events:
        if event.get("kind") == "llm_tokens":
            for agent, usage in (event.get("by_agent") or {}).items():
                row = rows.setdefault(agent, TokenRow(agent, 0, 0, 0, 0))
                row.prompt += usage.get("prompt", 0)
                row.completion += usage.get("completion", 0)
                row.reasoning += usage.get("reasoning", 0)
    for event in events:
        if event.get("kind") == "llm_call" and not event.get("cached"):
            agent = event.get("agent") or "unknown"
            rows.setdefault(agent, TokenRow(agent, 0, 0, 0, 0)).calls += 1
    return sorted(rows.values(), key=lambda r: (-r.total, r.agent))


def _subkernel_rows(manifest: Manifest | None, history: list[IterationRecord], unknown: str) -> list[SubkernelRow]:
    if manifest is not None:
        return [SubkernelRow(name, e.status, _fmt_speedup(e.speedup, unknown), _fmt_share(e.runtime_share, unknown),
                             _fmt_speedup(amdahl_contribution(e.runtime_share, e.speedup), unknown), e.origin,
                             e.candidate or "-", e.precision or "-")
                for name, e in manifest.subkernels.items()]
    if not history:
        return []
    return [SubkernelRow(name, r.status, _fmt_speedup(r.speedup, unknown), unknown, unknown, r.origin or "-",
                         r.candidate or "-", r.precision or "-") for name, r in history[-1].subkernels.items()]


def _iteration_rows(history: list[IterationRecord], unknown: str) -> list[IterationRow]:
    return [IterationRow(index=r.index, refinement=r.refinement, subproblems=", ".join(r.subproblems),
                         calls=sum(r.budget.values()), status=r.e2e_status or "-", reason=r.e2e_reason,
                         speedup=_fmt_speedup(r.e2e_speedup, unknown), kept=r.kept, seconds=f"{r.seconds:.1f}")
            for r in history]


def _best_decomposition(run_dir: Path, state: RunState) -> tuple[Decomposition | None, str]:
    """The decomposition of best/, else of the last iteration that has one, with a caption saying which."""
    candidates = [(run_dir / BEST, "the decomposition of best/")]
    for index in range(state.iteration, -1, -1):
        candidates.append((run_dir / "iterations" / f"iter_{index:02d}", f"the decomposition of iteration {index}"))
    for folder, caption in candidates:
        if (folder / PROBLEM_FILE).is_file():
            try:
                return Decomposition.read(folder), caption
            except CodebaseError:
                continue
    return None, "no decomposition written yet"


def _measured(events: list[dict], history: list[IterationRecord]) -> bool:
    """Whether any speedup was measured at all (only a GPU measures them)."""
    return (any(r.e2e_speedup is not None for r in history)
            or any(e.get("speedup") is not None for e in events if e.get("kind") in ("candidate", "verdict")))


def _pytorch_notes(manifest: Manifest | None) -> list[str]:
    """Each subkernel of best/ that runs its subproblem's PyTorch code, and why it has no Triton kernel."""
    if manifest is None:
        return []
    return [f"{name} runs its subproblem's PyTorch code, not a Triton kernel: "
            f"{manifest.subkernels[name].reason or 'declared so in the manifest'}."
            for name in manifest.coverage.pytorch]


def _notes(events: list[dict], device: str, measured: bool) -> list[str]:
    notes = []
    if device == "cpu":
        notes.append("There is no GPU on the machine that ran this: kernels ran under the Triton interpreter for "
                     "correctness only, so every speedup, runtime share and Amdahl contribution is unknown.")
    elif not measured:
        notes.append("No speedup was measured in this run (no GPU, or nothing passed), so speedups, runtime "
                     "shares and Amdahl contributions are unknown.")
    for event in events:
        if event.get("kind") == "port":
            reused = ", ".join(f"{r['variant']} (from {r['solution']})" for r in event.get("reused", [])) or "none"
            notes.append(f"Ported from {event.get('solution')}: reused {reused}; evolved "
                         f"{', '.join(event.get('evolved', [])) or 'none'}.")
        elif event.get("kind") == "swap":
            if event.get("skipped"):
                notes.append(f"Swap skipped: {event['skipped']}.")
            else:
                kept = "kept" if event.get("kept") else "undone (end to end got worse)"
                notes.append(f"Swap of {', '.join(event.get('subkernels', []))} for their PyTorch code: {kept}.")
    return notes


# ---- plots ---------------------------------------------------------------------------------------------


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mkevolve"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _tick_labels(history: list[IterationRecord]) -> list[str]:
    return [f"{r.index}\n{r.refinement}\n{len(r.subproblems)} subpr." for r in history]


def _verdict_grid(axes, history: list[IterationRecord]) -> None:
    """One row per subproblem (and end to end), one column per iteration: passing, failing, or not in that
    iteration's decomposition, so the plot also shows which decomposition each iteration used."""
    names = list(dict.fromkeys(n for r in history for n in r.subproblems))
    rows = ["end to end"] + names
    for x, record in enumerate(history):
        for y, row in enumerate(rows):
            if row == "end to end":
                colour = _OK if record.e2e_status == "ok" else _FAIL
            elif row not in record.subkernels:
                colour = _ABSENT
            else:
                colour = _OK if record.subkernels[row].status == "ok" else _FAIL
            axes.scatter([x], [y], s=120, color=colour, marker="s" if row == "end to end" else "o")
    axes.set_yticks(range(len(rows)), rows)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xticks(range(len(history)), _tick_labels(history))
    axes.set_xlim(-0.5, len(history) - 0.5)
    axes.set_title("verdicts (green: passes, red: fails, grey: not in that iteration's decomposition)",
                   fontsize=9)


def _speedup_lines(axes, history: list[IterationRecord]) -> None:
    xs = range(len(history))
    names = list(dict.fromkeys(n for r in history for n in r.subproblems))
    for name in names:
        values = [r.subkernels[name].speedup if name in r.subkernels else None for r in history]
        axes.plot(xs, [float("nan") if v is None else v for v in values], marker="o", linewidth=1, label=name)
    e2e = [float("nan") if r.e2e_speedup is None else r.e2e_speedup for r in history]
    axes.plot(xs, e2e, marker="s", linewidth=2.5, color="black", label="end to end")
    kept = [x for x, r in zip(xs, history) if r.kept]
    axes.scatter(kept, [e2e[x] for x in kept], s=160, facecolors="none", edgecolors="black", label="kept as best")
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_ylabel("speedup vs torch.compile")
    axes.set_xticks(list(xs), _tick_labels(history))
    axes.set_xlim(-0.5, len(history) - 0.5)
    axes.legend(fontsize=7, loc="best")
    axes.set_title("speedup per iteration (gaps: unknown or failing)", fontsize=9)


def speedup_plot(history: list[IterationRecord]) -> str:
    """End-to-end and per-subkernel speedup over the iterations (when any was measured) above a verdict grid;
    the x labels name each iteration's refinement and subproblem count."""
    if not history:
        return ""
    measured = any(r.e2e_speedup is not None or any(s.speedup is not None for s in r.subkernels.values())
                   for r in history)
    names = {n for r in history for n in r.subproblems}
    height = 1.2 + 0.35 * (len(names) + 1)
    figure = Figure(figsize=(max(5.0, 1.3 * len(history) + 3), height + (3.5 if measured else 0)))
    if measured:
        top, bottom = figure.subplots(2, 1, gridspec_kw={"height_ratios": [3.5, height]})
        _speedup_lines(top, history)
    else:
        bottom = figure.subplots(1, 1)
        figure.suptitle(f"speedup {UNKNOWN}: correctness only", fontsize=10)
    _verdict_grid(bottom, history)
    figure.tight_layout()
    return _svg(figure)


def _layers(graph: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Left to right by data flow, top to bottom within a column. Edges that go back to a node met earlier
    on a walk from the input (loops, residuals into a shared subproblem) are left out of the layering."""
    order = list(nx.dfs_preorder_nodes(graph, GRAPH_INPUT))
    order += [n for n in graph.nodes if n not in order]
    rank = {node: i for i, node in enumerate(order)}
    forward = nx.DiGraph()
    forward.add_nodes_from(order)
    forward.add_edges_from((u, v) for u, v in graph.edges if rank[u] < rank[v])
    positions = {}
    for column, generation in enumerate(nx.topological_generations(forward)):
        members = sorted(generation, key=rank.get)
        for row, node in enumerate(members):
            positions[node] = (float(column), -float(row) + (len(members) - 1) / 2)
    return positions


def _arrow(axes, source, target, start: tuple[float, float], end: tuple[float, float]) -> None:
    """An arrow between two label boxes (positions in the boxes' own coordinates, so it meets their edges):
    right edge to left edge going forward, bottom to top (or back) within a column, curved going back."""
    (x0, y0), (x1, y1) = start, end
    if x1 > x0:
        out, into, bend = (1.0, 0.5), (0.0, 0.5), 0.0
    elif x1 == x0:
        out, into, bend = ((0.6, 0.0), (0.6, 1.0), 0.0) if y1 < y0 else ((0.4, 1.0), (0.4, 0.0), 0.0)
        bend = 0.4 if abs(y1 - y0) > 1 else 0.0
    else:
        out, into, bend = (0.5, 1.0), (0.5, 1.0), -0.4
    axes.annotate("", xy=into, xycoords=target, xytext=out, textcoords=source,
                  arrowprops={"arrowstyle": "->", "color": "#555555", "shrinkA": 2, "shrinkB": 2,
                              "connectionstyle": f"arc3,rad={bend}"})


def graph_plot(decomposition: Decomposition) -> str:
    """The subproblem graph: one box per subproblem (with its instance count), an arrow per data flow."""
    graph = subproblem_graph(decomposition)
    positions = _layers(graph)
    columns = 1 + max(x for x, _ in positions.values())
    rows = max(sum(1 for x, _ in positions.values() if x == c) for c in range(int(columns)))
    figure = Figure(figsize=(max(4.0, 2.4 * columns), max(2.0, 0.9 * rows + 1)))
    axes = figure.subplots()
    boxes = {}
    for node, (x, y) in positions.items():
        sentinel = node in (GRAPH_INPUT, GRAPH_OUTPUT)
        instances = graph.nodes[node].get("instances", 1)
        label = node.strip("<>") if sentinel else node + (f"\n×{instances}" if instances > 1 else "")
        loops = " ↻" if graph.has_edge(node, node) else ""
        boxes[node] = axes.text(x, y, label + loops, ha="center", va="center", fontsize=8,
                                bbox={"boxstyle": "round,pad=0.4", "facecolor": "#eeeeee" if sentinel else "#e3f2fd",
                                      "edgecolor": "#90a4ae"})
    for source, target in graph.edges:
        if source != target:
            _arrow(axes, boxes[source], boxes[target], positions[source], positions[target])
    xs = [x for x, _ in positions.values()]
    ys = [y for _, y in positions.values()]
    axes.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    axes.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    axes.axis("off")
    return _svg(figure)


# ---- the page ------------------------------------------------------------------------------------------


def _read_manifest(run_dir: Path) -> tuple[Manifest | None, str | None]:
    """best/'s manifest, or None and, when it exists but cannot be read, why (shown on the page)."""
    if not (run_dir / BEST / MANIFEST).is_file():
        return None, None
    try:
        return Manifest.read(run_dir / BEST), None
    except SolutionError as err:
        return None, f"best/{MANIFEST} cannot be read: {err}"


def _model(run_dir: Path) -> str:
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        return f"unknown (config.yaml: {type(err).__name__})"
    return str(config.get("model", "unknown")) if isinstance(config, dict) else "unknown"


def build_page(run_dir: Path) -> ReportPage:
    state = RunState.load(run_dir)
    manifest, manifest_problem = _read_manifest(run_dir)
    events = read_events(run_dir)
    problem_path = Path(state.problem)
    source = problem_path.read_text(encoding="utf-8") if problem_path.is_file() else f"({problem_path} is gone)"
    device = manifest.device if manifest else "unknown"
    passed = state.best_iteration is not None and manifest is not None
    measured = _measured(events, state.history)
    unknown = UNKNOWN if device == "cpu" or not measured else "unknown"
    decomposition, caption = _best_decomposition(run_dir, state)
    return ReportPage(
        title=f"mkevolve: {problem_path.stem} ({state.run_id})", run_dir=str(run_dir.resolve()),
        problem_path=str(problem_path), problem_source=source, model=_model(run_dir), device=device,
        verdict=(f"end to end passes (best: iteration {state.best_iteration}); {manifest.coverage.line()}"
                 if passed else "no end-to-end solution passed"),
        passed=passed, final_speedup=_fmt_speedup(manifest.speedup, unknown) if manifest else "-", measured=measured,
        best_iteration=state.best_iteration, subkernels=_subkernel_rows(manifest, state.history, unknown),
        iterations=_iteration_rows(state.history, unknown), tokens=token_rows(events),
        speedup_svg=speedup_plot(state.history),
        graph_svg=graph_plot(decomposition) if decomposition else "", graph_caption=caption,
        notes=[n for n in [manifest_problem] if n] + _pytorch_notes(manifest) + _notes(events, device, measured),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))


def render_page(page: ReportPage) -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return environment.get_template("report.html.j2").render(page=page, svg=_trusted_svg)


def _trusted_svg(text: str):
    """Our own matplotlib output goes into the page as markup; anything else is escaped."""
    from markupsafe import Markup

    return Markup(text) if text.lstrip().startswith("<svg") else html.escape(text)


def write_report(run_dir: Path) -> Path:
    """Write (or rewrite) run_dir/report.html from the run's files; returns its path."""
    run_dir = Path(run_dir)
    return write_atomic(run_dir / REPORT_FILE, render_page(build_page(run_dir)))


def report_command(args) -> int:
    """`mkevolve report RUN_DIR`: 0 when report.html is written, 2 when RUN_DIR is not a run directory."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ProblemError(run_dir, "no such folder (expected a run directory)")
    try:
        path = write_report(run_dir)
    except StateError as err:
        raise ProblemError(run_dir, str(err).split(": ", 1)[-1]) from None
    print(f"wrote {path}")
    return 0
