r"""Beam search against MCTS: `mkevolve run` with each search, at the same budget, over the same problems.

    PYTHONPATH=. python3 scripts/search_compare.py --problems problems/gemm_chain.py problems/attention.py \
        --model anthropic/claude-opus-4-5 --budget 16 --iterations 2 --out scripts/results/search_compare.json

For each problem, and for each search in turn (beam, then mcts, so drift over the minutes a problem takes
falls on both alike) it runs

    python -m mkevolve run PROBLEM --search SEARCH --model M --iterations I --budget B --out WORK/SEARCH

and reads the run directory with scripts/kernelbench.py's reader: whether best/ was produced and verified
correct end to end, the run's own end-to-end speedup over torch.compile (null where nothing was timed: no
GPU, or the run failed first; never a made-up number), the LLM calls that reached the model, and the wall
time. Each finished run is written to --out at once, so a stopped comparison loses at most the run in
progress, and running the same command again skips what is done. The summary per search: the fraction
correct, the geometric mean speedup over the correct runs that were timed, and the calls in total.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = ("beam", "mcts")
DEFAULT_WORK = ROOT / "outputs" / "search_compare"
DEFAULT_TIMEOUT_S = 3600.0


def load_kernelbench():
    """scripts/kernelbench.py, whose run-directory reader and process helpers this script shares. scripts/
    is not a package, so it is loaded by path, once."""
    name = "kernelbench_script"     # not "kernelbench": a library of that name may be installed
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name("kernelbench.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module      # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


kb = load_kernelbench()


# ---- rows and the summary --------------------------------------------------------------------------------


@dataclass
class Row:
    """One problem under one search. None means not known (the run failed first, nothing was timed)."""

    problem: str
    search: str
    exit_code: int | None = None        # of `mkevolve run`; None: stopped at --timeout
    best: bool = False                  # the run left a best/ folder
    correct: bool | None = None         # best/ verified correct end to end
    speedup: float | None = None        # end to end over torch.compile, the run's own figure
    llm_calls: int | None = None        # calls that reached the model (cache hits left out)
    wall_s: float | None = None
    run_dir: str | None = None
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.problem, self.search)

    @property
    def measured_speedup(self) -> float | None:
        """A speedup that counts in the geometric mean: a correct run's, and a real (positive) one."""
        return self.speedup if self.correct and self.speedup is not None and self.speedup > 0 else None


@dataclass
class SearchSummary:
    search: str
    runs: int
    correct: int
    fraction_correct: float | None      # None: no run
    measured: int                       # correct runs with a speedup
    geomean_speedup: float | None       # over the measured ones; None: none measured
    llm_calls: int                      # of the runs that counted them
    wall_s: float


def summarize(rows: list[Row]) -> dict[str, SearchSummary]:
    """Per search, in the order the searches first appear."""
    by_search: dict[str, list[Row]] = {}
    for row in rows:
        by_search.setdefault(row.search, []).append(row)
    return {search: summarize_search(search, group) for search, group in by_search.items()}


def summarize_search(search: str, rows: list[Row]) -> SearchSummary:
    correct = sum(1 for r in rows if r.correct)
    speedups = [r.measured_speedup for r in rows if r.measured_speedup is not None]
    return SearchSummary(search=search, runs=len(rows), correct=correct,
                         fraction_correct=correct / len(rows) if rows else None, measured=len(speedups),
                         geomean_speedup=kb.report.geomean(speedups),
                         llm_calls=sum(r.llm_calls for r in rows if r.llm_calls is not None),
                         wall_s=round(sum(r.wall_s for r in rows if r.wall_s is not None), 1))


def summary_line(s: SearchSummary) -> str:
    fraction = kb.report.UNKNOWN if s.fraction_correct is None else f"{s.fraction_correct:.0%}"
    return (f"{s.search}: {s.correct} of {s.runs} correct ({fraction}); geomean speedup vs torch.compile "
            f"{kb.fmt_speedup(s.geomean_speedup)} over {s.measured} timed; {s.llm_calls} LLM calls; "
            f"{s.wall_s:.0f} s")


# ---- the results file ------------------------------------------------------------------------------------


@dataclass
class Results:
    meta: dict                          # date, gpu, versions, settings
    rows: list[Row] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> "Results | None":
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = kb.rows_of(data, Row)
        data.pop("summary", None)       # derived from the rows: recomputed on every save
        return cls(meta=data, rows=rows)

    def done(self) -> set[tuple[str, str]]:
        return {row.key for row in self.rows}

    def to_json(self) -> dict:
        return {**self.meta, "summary": {k: asdict(v) for k, v in summarize(self.rows).items()},
                "rows": [asdict(r) for r in self.rows]}

    def save(self, path: Path) -> None:
        """Written whole to a temporary file and renamed, so a kill never leaves half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(temporary, path)


# ---- one run ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    model: str
    budget: int
    iterations: int
    work: Path
    run_args: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S

    def record(self) -> dict:
        return {"model": self.model, "budget": self.budget, "iterations": self.iterations,
                "run_args": list(self.run_args)}


def problem_key(path: Path) -> str:
    """The problem as given, relative to the repository where it lies inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)


def run_one(problem: Path, search: str, settings: Settings) -> Row:
    """`mkevolve run` with one search in its own process, then what its run directory says."""
    row = Row(problem=problem_key(problem), search=search)
    runs_parent = settings.work / search
    command = [sys.executable, "-m", "mkevolve", "run", str(problem), "--search", search,
               "--model", settings.model, "--iterations", str(settings.iterations),
               "--budget", str(settings.budget), "--out", str(runs_parent), *settings.run_args]
    log = settings.work / "logs" / f"{problem.stem}.{search}.log"
    step = kb.run_step(command, log, settings.timeout_s, kb.child_env())
    row.exit_code, row.wall_s = step.exit_code, round(step.seconds, 1)
    run_dir = kb.find_run_dir(step.log, runs_parent / problem.stem)
    if run_dir is None:
        row.correct, row.note = False, f"no run directory; the run said: {kb.last_line(step.log)}"
        return row
    info = kb.read_run(run_dir)
    row.run_dir, row.best = str(run_dir), (run_dir / "best").is_dir()
    row.correct, row.speedup, row.llm_calls, row.note = info.correct, info.run_speedup, info.llm_calls, info.note
    if step.exit_code is None:
        row.note = f"stopped at the {settings.timeout_s:.0f} s timeout. {row.note}".strip()
    return row


RunFn = Callable[[Path, str], Row]


def compare(problems: list[Path], searches: tuple[str, ...], results: Results, run: RunFn,
            save: Callable[[], None]) -> list[Row]:
    """Every (problem, search) not done yet, searches side by side per problem; returns the rows made."""
    made = []
    for problem in problems:
        for search in searches:
            if (problem_key(problem), search) in results.done():
                continue
            print(f"{problem_key(problem)} --search {search}", flush=True)
            row = run(problem, search)
            results.rows.append(row)
            made.append(row)
            save()
            print(f"    best={row.best} correct={kb.fmt_bool(row.correct)} "
                  f"speedup={kb.fmt_speedup(row.speedup)} calls={row.llm_calls} wall={row.wall_s} s "
                  f"{row.note}".rstrip(), flush=True)
    return made


# ---- command line ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog=__doc__.split("\n\n")[1] + "\n\n" + __doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", type=Path, required=True, help="problem files")
    parser.add_argument("--model", default="builtin", help="mkevolve run --model")
    parser.add_argument("--budget", type=int, default=8, help="mkevolve run --budget (LLM calls per iteration)")
    parser.add_argument("--iterations", type=int, default=1, help="mkevolve run --iterations")
    parser.add_argument("--searches", nargs="+", choices=("beam", "parallel", "mcts"), default=list(SEARCHES),
                        help="the searches to compare (default: beam mcts)")
    parser.add_argument("--out", type=Path, default=DEFAULT_WORK / "results.json",
                        help="the results JSON, read to resume and rewritten after each run")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="where the runs and their logs go")
    parser.add_argument("--run-args", default="", metavar="ARGS",
                        help="more flags for mkevolve run, one string after '=': --run-args='--beam-width 2'")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="seconds one run may take before it is stopped")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, run: RunFn | None = None, environment: dict | None = None) -> int:
    """`run` and `environment` stand in for the real runs and the machine's description in tests."""
    args = parse_args(argv)
    missing = [str(p) for p in args.problems if not p.is_file()]
    if missing:
        raise SystemExit(f"no such problem file: {', '.join(missing)}")
    settings = Settings(model=args.model, budget=args.budget, iterations=args.iterations,
                        work=args.work.resolve(), run_args=tuple(shlex.split(args.run_args)),
                        timeout_s=args.timeout)
    here = environment if environment is not None else kb.environment()
    results = Results.load(args.out)
    if results is None:
        results = Results(meta={**here, "settings": settings.record()})
    elif results.meta.get("settings") != settings.record() or results.meta.get("gpu") != here["gpu"]:
        raise SystemExit(f"{args.out} holds runs on {results.meta.get('gpu')} with settings "
                         f"{results.meta.get('settings')}; this is {here['gpu']} with {settings.record()}: "
                         "use another --out rather than mix two comparisons")
    results.meta.update(here)          # the date and versions of the latest runs
    started = time.monotonic()
    compare(args.problems, tuple(args.searches), results, run or (lambda p, s: run_one(p, s, settings)),
            lambda: results.save(args.out))
    results.save(args.out)
    for summary in summarize(results.rows).values():
        print(summary_line(summary))
    print(f"results: {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
