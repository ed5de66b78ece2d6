"""What a person watches during a run: a live rich table on a terminal, plain log lines elsewhere."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table


@dataclass
class SubproblemRow:
    status: str = "waiting"
    calls: int = 0
    speedup: float | None = None


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


class RunDisplay:
    """Call `update()` after changing `view`; on a terminal it redraws, elsewhere it logs the phase."""

    def __init__(self, view: RunView, console: Console | None = None):
        self.view = view
        self.console = console or make_console()
        self._live: Live | None = None
        self._last_line = ""
        self._start = time.monotonic()

    def __enter__(self) -> "RunDisplay":
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(*exc)
            self._live = None

    def update(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            return
        v = self.view
        line = f"iteration {v.iteration}/{v.iterations}: {v.phase} | best {v.best} | tokens {v.tokens}"
        if line != self._last_line:
            self.console.print(f"[{time.monotonic() - self._start:7.1f}s] {escape(line)}", highlight=False,
                               soft_wrap=True)
            self._last_line = line

    def log(self, message: str) -> None:
        """A line that stays (decisions: split, fuse, swap, kept best)."""
        self.console.print(f"[{time.monotonic() - self._start:7.1f}s] {escape(message)}", highlight=False,
                           soft_wrap=True)

    def _table(self) -> Table:
        v = self.view
        table = Table(title=f"mkevolve run {v.problem}: iteration {v.iteration}/{v.iterations}, {v.phase}",
                      caption=f"best end to end: {v.best}   tokens: {v.tokens}")
        for column in ("subproblem", "status", "LLM calls", "best speedup"):
            table.add_column(column)
        for name, row in v.rows.items():
            table.add_row(name, row.status, str(row.calls), _speed(row.speedup))
        return table


def final_table(rows: list[tuple[str, str, str, str, str]], title: str) -> Table:
    table = Table(title=title)
    for column in ("subkernel", "verdict", "speedup", "share", "origin"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table
