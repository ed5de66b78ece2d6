"""Short text cut from long text, for reasons and error messages that must stay one line."""

from __future__ import annotations


def first_line(text: str, limit: int | None = None) -> str:
    """The first line of `text` that is not blank, stripped and cut to `limit` characters: the headline of an
    error or of a model's reply, without the traceback or the essay under it."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line[:limit]
