"""Short text cut from long text, for reasons and error messages that must stay one line."""

from __future__ import annotations

from enum import Enum


def first_line(text: str, limit: int | None = None) -> str:
    """The first line of `text` that is not blank, stripped and cut to `limit` characters: the headline of an
    error or of a model's reply, without the traceback or the essay under it."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line[:limit]


def member_of(enum: type[Enum], value) -> Enum:
    """The member of `enum` spelled `value` (a status read from a file); otherwise a ValueError that lists the
    spellings allowed, since Enum's own message names the class, not what the file should have said."""
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in enum)
        raise ValueError(f"unknown status {value!r} (expected one of {allowed})") from None
