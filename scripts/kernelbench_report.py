r"""The benchmark of record, reported: a Markdown table and an SVG plot from scripts/kernelbench.py's results JSON.

    python scripts/kernelbench_report.py scripts/results/kernelbench_h200.json \
        --markdown docs/kernelbench_h200.md --svg docs/kernelbench_h200.svg

It reads whatever rows the file holds, one problem or all 37. A value the file lacks (the run failed before
it, the problem was not timed, an older version of the script did not record it) is shown as "unknown", never
filled in. How many problems the benchmark has, per level, comes from the KernelBench folder (--kernelbench,
else the folder the results name, else ../shared/kernelbench); without one the totals are "unknown".

matplotlib draws the plot; without it the Markdown is still written and the plot is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNKNOWN = "unknown"
# Where scripts/kernelbench.py looks for the benchmark: inside the checkout (a copy on the GPU machine) or beside it.
DEFAULT_KERNELBENCH = (ROOT / "shared" / "kernelbench", ROOT.parent / "shared" / "kernelbench")


# ---- reading the results file ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProblemRow:
    """The fields of one results row that the report shows; None where the file does not know the value."""

    problem: str                            # "level2/63_Gemm_ReLU_Divide.py"
    finished: bool | None = None            # False: the run or its timing is still to finish
    exit_code: int | None = None            # of `mkevolve run`; None unfinished: a part's limit stopped it
    correct: bool | None = None             # best/ passed the end-to-end check
    all_triton: bool | None = None          # every subkernel is a Triton kernel
    speedup_vs_compile: float | None = None
    speedup_vs_eager: float | None = None
    err_solution: float | None = None       # max |solution - fp64 reference|
    err_eager: float | None = None          # max |eager fp32 - fp64 reference|
    wall_s: float | None = None
    llm_calls: int | None = None
    note: str = ""

    @classmethod
    def from_json(cls, raw: dict) -> "ProblemRow":
        # Unknown keys are dropped and missing ones keep their None: rows written by any version of the script load.
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        values.setdefault("problem", UNKNOWN)
        values["note"] = values.get("note") or ""
        return cls(**values)

    @property
    def level(self) -> int | None:
        return level_of(self.problem)

    @property
    def name(self) -> str:
        return self.problem.removesuffix(".py")

    @property
    def error_ratio(self) -> float | None:
        """A correct solution's error against fp64 over eager fp32's (both measured, eager's above zero)."""
        if self.correct is not True or self.err_solution is None or not self.err_eager:
            return None
        return self.err_solution / self.err_eager

    def timed_speedup(self, attr: str = "speedup_vs_compile") -> float | None:
        """A speedup that counts in the geometric mean: only a correct solution's, and only a real (positive) one."""
        value = getattr(self, attr)
        return value if self.correct is True and value is not None and value > 0 else None


@dataclass(frozen=True)
class Report:
    meta: dict                              # date, gpu, versions, settings, note: everything but the rows
    rows: list[ProblemRow]
    totals: dict[int, int] | None           # problems per level in the benchmark; None: folder not found

    @classmethod
    def load(cls, results: Path, kernelbench: Path | None = None) -> "Report":
        data = json.loads(results.read_text(encoding="utf-8"))
        rows = sorted((ProblemRow.from_json(r) for r in data.pop("rows", [])), key=lambda r: problem_order(r.problem))
        folder = find_kernelbench(kernelbench, data.get("kernelbench"))
        return cls(meta=data, rows=rows, totals=count_problems(folder) if folder else None)

    def levels(self) -> list[int]:
        known = set(self.totals or {}) | {r.level for r in self.rows if r.level is not None}
        return sorted(known)


def level_of(problem: str) -> int | None:
    found = re.match(r"level(\d+)/", problem)
    return int(found.group(1)) if found else None


def problem_order(key: str) -> tuple:
    """level2/7_X before level2/11_Y: by level, then by the problem's number (as scripts/kernelbench.py orders)."""
    folder, _, name = key.rpartition("/")
    number = re.match(r"\d+", name)
    return (folder, int(number.group()) if number else math.inf, name)


def find_kernelbench(given: Path | None, recorded: str | None) -> Path | None:
    """The folder named on the command line, else the one the results were run on, else the default places."""
    if given is not None:
        return given if given.is_dir() else None
    candidates = ([Path(recorded)] if recorded else []) + list(DEFAULT_KERNELBENCH)
    return next((p for p in candidates if p.is_dir()), None)


def count_problems(folder: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for path in folder.glob("level*/*.py"):
        level = level_of(f"{path.parent.name}/")
        if level is not None:
            counts[level] = counts.get(level, 0) + 1
    return counts


# ---- numbers as text -------------------------------------------------------------------------------------


def fmt_bool(value: bool | None) -> str:
    return UNKNOWN if value is None else ("yes" if value else "no")


def fmt_speedup(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.2f}x"


def fmt_err(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.1e}"


def fmt_number(value: float | None, digits: int = 0) -> str:
    return UNKNOWN if value is None else f"{value:.{digits}f}"


def geomean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


# ---- summary ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    label: str                              # "All levels", "Level 2"
    total: int | None                       # problems in the benchmark; None: unknown
    run: int                                # rows in the results file
    correct: int
    all_triton: int                         # correct and every subkernel in Triton
    vs_compile: list[float]                 # speedups of the correct, timed problems
    vs_eager: list[float]
    error_ratios: list[float]               # error against fp64 over eager fp32's, of the correct problems with both

    def line(self) -> str:
        total = UNKNOWN if self.total is None else str(self.total)
        if not self.run:        # "correct: 0 of 0" and a geomean of nothing would only be noise
            return f"{self.label}: 0 of {total} problems run."
        return (f"{self.label}: {self.run} of {total} problems run; correct end to end: {self.correct} of "
                f"{self.run}; all subkernels in Triton: {self.all_triton} of {self.run}; geometric mean speedup "
                f"vs torch.compile over the {len(self.vs_compile)} timed correct problems: "
                f"{fmt_speedup(geomean(self.vs_compile))} (vs eager: {fmt_speedup(geomean(self.vs_eager))}). "
                f"Error against fp64 at most eager fp32's: {sum(r <= 1 for r in self.error_ratios)} of the "
                f"{len(self.error_ratios)} correct problems with both measured"
                + (f" (the largest {max(self.error_ratios):.2f} times it)." if self.error_ratios else "."))


def summarize(label: str, rows: list[ProblemRow], total: int | None) -> Summary:
    return Summary(label=label, total=total, run=len(rows), correct=sum(r.correct is True for r in rows),
                   all_triton=sum(r.correct is True and r.all_triton is True for r in rows),
                   vs_compile=[v for r in rows if (v := r.timed_speedup("speedup_vs_compile")) is not None],
                   vs_eager=[v for r in rows if (v := r.timed_speedup("speedup_vs_eager")) is not None],
                   error_ratios=[r.error_ratio for r in rows if r.error_ratio is not None])


def summaries(report: Report) -> list[Summary]:
    totals = report.totals
    overall = summarize("All levels", report.rows, sum(totals.values()) if totals is not None else None)
    per_level = [summarize(f"Level {level}", [r for r in report.rows if r.level == level],
                           totals.get(level, 0) if totals is not None else None) for level in report.levels()]
    return [overall, *per_level]


# ---- Markdown --------------------------------------------------------------------------------------------

COLUMNS = ("problem", "level", "correct", "all Triton", "vs torch.compile", "vs eager", "error vs fp64",
           "eager fp32 error", "wall s", "LLM calls")
ALIGN = ("---", "---:", "---", "---", "---:", "---:", "---:", "---:", "---:", "---:")


def header_lines(meta: dict) -> list[str]:
    # Every fact the header names defaults to "unknown": an older or partial file still renders.
    fact = {key: UNKNOWN for key in ("gpu", "date", "torch", "triton", "python")} | meta
    setting = {key: UNKNOWN for key in ("model", "iterations", "budget", "rounds")} | (meta.get("settings") or {})
    run_args = "".join(f" {a}" for a in setting.get("run_args") or [])
    lines = [f"KernelBench on {fact['gpu']}, {fact['date']}; torch {fact['torch']}, triton {fact['triton']}, "
             f"python {fact['python']}; `mkevolve run --model {setting['model']} --iterations {setting['iterations']} "
             f"--budget {setting['budget']}{run_args}`; eager, torch.compile and the solution timed in one process "
             f"in {setting['rounds']} alternating rounds."]
    if meta.get("note"):
        lines += ["", f"Note: {meta['note']}"]
    return lines


def table_row(row: ProblemRow) -> str:
    cells = (row.name, fmt_number(row.level), fmt_bool(row.correct), fmt_bool(row.all_triton),
             fmt_speedup(row.speedup_vs_compile), fmt_speedup(row.speedup_vs_eager), fmt_err(row.err_solution),
             fmt_err(row.err_eager), fmt_number(row.wall_s), fmt_number(row.llm_calls))
    return "| " + " | ".join(cells) + " |"


def row_note(row: ProblemRow) -> str:
    # An unfinished row has its run stopped or its timing to do: say so, or its "unknown" speedups look like a
    # failure. (The note of a stopped run says that the next part resumes it.)
    pending = "timing still to do" if row.finished is False and row.exit_code is not None else ""
    return "; ".join(filter(None, (pending, row.note)))


def markdown(report: Report) -> str:
    lines = [*header_lines(report.meta), "", *(f"- {s.line()}" for s in summaries(report)), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "|".join(ALIGN) + "|",
             *(table_row(r) for r in report.rows)]
    notes = [f"- {r.name}: {note}" for r in report.rows if (note := row_note(r))]
    if notes:           # why a value is unknown or a run failed, so no "unknown" is left unexplained
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


# ---- SVG plot --------------------------------------------------------------------------------------------


def short_label(key: str, width: int = 30) -> str:
    """'level2/63_Gemm_ReLU_Divide.py' -> 'L2/63 Gemm_ReLU_Divide', cut to `width` characters."""
    label = key.removesuffix(".py").replace("level", "L", 1).replace("_", " ", 1)
    return label if len(label) <= width else label[:width - 1] + "…"


def log2_ticks(low: float, high: float) -> list[float]:
    """Powers of two over the range: '0.5x, 1x, 2x' says more here than matplotlib's 10^-1."""
    return [2.0 ** e for e in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)]


def plot_svg(report: Report, path: Path) -> None:
    """One bar per problem, speedup vs torch.compile on a log axis, coloured by level; a line at 1.0 (parity).
    A failed problem is marked 'failed' in red, a correct one without a timing 'unknown' in grey, and a
    partial solution (some subkernels still PyTorch) has a hatched bar. matplotlib is imported here only,
    so the rest of the report works without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter

    rows = report.rows
    colours = {level: plt.get_cmap("tab10")(i) for i, level in enumerate(report.levels())}
    # A fixed hash salt and no date keep the SVG byte-identical for the same data, so a re-render is no diff.
    with plt.rc_context({"svg.hashsalt": "kernelbench", "hatch.linewidth": 0.6}):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * len(rows) + 2.5), 5.5))
        draw_bars(ax, rows, colours)
        values = [v for r in rows if (v := r.timed_speedup()) is not None]
        # At least 0.5x to 2x, so a figure near parity still has three labelled ticks to read it against.
        low, high = min(min(values + [1.0]) / 1.6, 0.45), max(max(values + [1.0]) * 1.6, 2.2)
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        ax.yaxis.set_major_locator(FixedLocator(log2_ticks(low, high)))
        ax.yaxis.set_major_formatter(lambda value, _: f"{value:g}x")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xticks(range(len(rows)), [short_label(r.problem) for r in rows], rotation=70, ha="right", fontsize=7)
        ax.set_xlim(-0.6, max(len(rows), 1) - 0.4)
        ax.set_ylabel("speedup vs torch.compile (log scale)")
        ax.set_title(plot_title(report), fontsize=9)
        ax.legend(handles=legend_handles(rows, colours), fontsize=8)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="svg", metadata={"Date": None})
        plt.close(fig)


def draw_bars(ax, rows: list[ProblemRow], colours: dict) -> None:
    """Bars grow from 1.0, up for a speedup and down for a slowdown: on a log axis a bar from the bottom edge
    would make its length depend on where the axis happens to start."""
    for i, row in enumerate(rows):
        value = row.timed_speedup()
        if value is not None:
            ax.bar(i, value - 1.0, 0.7, bottom=1.0, color=colours.get(row.level, "grey"), edgecolor="black",
                   linewidth=0.4, hatch="//" if row.all_triton is False else None)
        elif row.correct is False:
            ax.plot(i, 1.0, marker="x", color="red", markersize=8, markeredgewidth=2)
            ax.text(i, 1.1, "failed", rotation=90, ha="center", va="bottom", fontsize=7, color="red")
        else:
            ax.plot(i, 1.0, marker="o", color="grey", markersize=5, fillstyle="none")
            ax.text(i, 1.1, UNKNOWN, rotation=90, ha="center", va="bottom", fontsize=7, color="grey")
    # A dotted line between levels, so the groups read apart even where colours are hard to tell.
    for i in range(1, len(rows)):
        if rows[i].level != rows[i - 1].level:
            ax.axvline(i - 0.5, color="grey", linestyle=":", linewidth=0.8)


def legend_handles(rows: list[ProblemRow], colours: dict) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    present = {r.level for r in rows}
    handles = [Patch(color=c, label=f"level {level}") for level, c in colours.items() if level in present]
    if any(r.correct is True and r.all_triton is False for r in rows):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="partial: some PyTorch"))
    if any(r.correct is False for r in rows):
        handles.append(Line2D([], [], marker="x", color="red", linestyle="none", markeredgewidth=2, label="failed"))
    if any(r.timed_speedup() is None and r.correct is not False for r in rows):
        handles.append(Line2D([], [], marker="o", color="grey", linestyle="none", fillstyle="none",
                              label="not timed"))
    return handles


def plot_title(report: Report) -> str:
    overall = summaries(report)[0]
    total = UNKNOWN if overall.total is None else overall.total
    return (f"mkevolve on KernelBench, {report.meta.get('gpu', UNKNOWN)}, {report.meta.get('date', UNKNOWN)}\n"
            f"{overall.run} of {total} problems run, {overall.correct} correct, geomean "
            f"{fmt_speedup(geomean(overall.vs_compile))} vs torch.compile")


# ---- writing ---------------------------------------------------------------------------------------------


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_report(results: Path, markdown_path: Path | None, svg_path: Path | None,
                 kernelbench: Path | None = None) -> Report:
    """Markdown to `markdown_path` (stdout when None), the plot to `svg_path` when given and matplotlib is there."""
    report = Report.load(results, kernelbench)
    text = markdown(report)
    if markdown_path is None:
        sys.stdout.write(text)
    else:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        # The file is generated: say from what, so a fix goes into the data or this script, not the copy.
        origin = f"<!-- written by scripts/kernelbench_report.py from {results.as_posix()}; do not edit by hand -->\n"
        markdown_path.write_text(origin + text, encoding="utf-8")
        print(f"wrote {markdown_path}", file=sys.stderr)
    if svg_path is not None and not has_matplotlib():
        print(f"plot skipped: matplotlib is not installed, so {svg_path} was not written", file=sys.stderr)
    elif svg_path is not None:
        plot_svg(report, svg_path)
        print(f"wrote {svg_path}", file=sys.stderr)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="the results JSON of scripts/kernelbench.py")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="write the table here (default: stdout)")
    parser.add_argument("--svg", type=Path, metavar="FILE", help="write the plot here (needs matplotlib)")
    parser.add_argument("--kernelbench", type=Path, metavar="DIR",
                        help="the KernelBench folder, for the number of problems per level")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    write_report(args.results, args.markdown, args.svg, args.kernelbench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
