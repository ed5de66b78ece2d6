"""What a person watches during a run: a live rich table on a terminal, plain log lines elsewhere."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table


class RowStatus(str, Enum):
    """A subproblem's word in the live table."""

    WAITING = "waiting"          # its search has not started this iteration
    EVOLVING = "evolving"        # its search is running
    PASSING = "passing"          # it has an accepted kernel
    FAILING = "failing"          # tried, and still without an accepted kernel
    DECLINED = "declined"        # the agent said it has no (further) kernel for it
    NEW = "new"                  # never evolved


@dataclass
class SubproblemRow:
    status: RowStatus = RowStatus.WAITING
    calls: int = 0               # LLM calls this iteration's budget gives it
    speedup: float | None = None
    done: int = 0                # candidates evaluated this iteration
    pending: int = 0             # candidates still to come this iteration
    passing: bool = False        # it has a passing kernel

    def __post_init__(self) -> None:
        self.status = RowStatus(self.status)  # a caller may give the plain word


@dataclass
class RunView:
    problem: str
    iterations: int
    iteration: int = 0
    phase: str = "starting"
    rows: dict[str, SubproblemRow] = field(default_factory=dict)
    best: str = "none yet"
    tokens: int = 0


# Wide enough that no line of a log or summary written to a pipe or file is ever folded.
PLAIN_WIDTH = 10_000
_STYLES = {RowStatus.EVOLVING: "bold yellow", RowStatus.PASSING: "green", RowStatus.FAILING: "red",
           RowStatus.DECLINED: "red"}


def make_console() -> Console:
    """rich's own Console on a terminal; for a pipe or file, one that never wraps.

    Without a terminal rich assumes 80 columns and folds long lines, splitting a run directory's path
    over two lines, so that it can be neither copied nor grepped. Tables keep their natural width."""
    console = Console()
    if console.is_terminal:
        return console
    return Console(width=PLAIN_WIDTH, soft_wrap=True)


def _speed(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}x"


def elapsed_text(seconds: float) -> str:
    """"42s", "3m 05s", "1h 02m": what a person reads at a glance."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


class RunDisplay:
    """Call `update()` after changing `view`; on a terminal it redraws, elsewhere it logs the phase.

    On a terminal the table is redrawn four times a second from another thread (so the elapsed time moves
    while a kernel compiles); rows change through `set_row`/`set_rows`, under the lock the redraw takes."""

    def __init__(self, view: RunView, console: Console | None = None):
        self.view = view
        self.console = console or make_console()
        self._live: Live | None = None
        self._last_line = ""
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def __enter__(self) -> "RunDisplay":
        if self.console.is_terminal:
            self._live = Live(console=self.console, refresh_per_second=4, get_renderable=self._table)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(*exc)
            self._live = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._start

    def set_row(self, name: str, row: SubproblemRow) -> None:
        with self._lock:
            self.view.rows[name] = row

    def set_rows(self, rows: dict[str, SubproblemRow]) -> None:
        """This iteration's subproblems, in order; rows of subproblems no longer there go."""
        with self._lock:
            self.view.rows = dict(rows)

    def update(self) -> None:
        if self._live is not None:
            self._live.refresh()
            return
        line = self.phase_line()
        if line != self._last_line:
            self.console.print(f"[{self.elapsed_s:7.1f}s] {escape(line)}", highlight=False, soft_wrap=True)
            self._last_line = line

    def phase_line(self) -> str:
        """The plain-output progress line: the phase, and the candidates of the subproblem at work."""
        v = self.view
        with self._lock:
            at_work = [row for row in v.rows.values() if row.status is RowStatus.EVOLVING]
        progress = f": {at_work[0].done} done, {at_work[0].pending} pending" if at_work else ""
        return f"iteration {v.iteration}/{v.iterations}: {v.phase}{progress} | best {v.best} | tokens {v.tokens}"

    def log(self, message: str) -> None:
        """A line that stays (decisions: split, fuse, swap, kept best)."""
        self.console.print(f"[{self.elapsed_s:7.1f}s] {escape(message)}", highlight=False, soft_wrap=True)

    def _table(self) -> Table:
        v = self.view
        table = Table(title=f"mkevolve run {v.problem}: iteration {v.iteration}/{v.iterations}, {v.phase}",
                      caption=f"elapsed {elapsed_text(self.elapsed_s)}   best end to end: {v.best}   "
                              f"tokens: {v.tokens}")
        for column in ("subproblem", "status", "candidates done", "pending", "best speedup"):
            table.add_column(column)
        with self._lock:
            rows = list(v.rows.items())
        for name, row in rows:
            style = _STYLES.get(row.status)
            table.add_row(name, row.status.value, str(row.done), str(row.pending) if row.pending else "",
                          _speed(row.speedup) if row.passing else "-", style=style)
        return table


def final_table(rows: list[tuple[str, str, str, str, str]], title: str) -> Table:
    table = Table(title=title)
    for column in ("subkernel", "verdict", "speedup", "share", "origin"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table
