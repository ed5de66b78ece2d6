"""Strict parsing of model replies: fenced code blocks, and files under `### FILE: <path>` headers."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

_FENCE = re.compile(r"^```[^\n`]*\n(.*?)^```[ \t]*$", re.S | re.M)
_FILE_HEADER = re.compile(r"^###\s*FILE:\s*(\S+)\s*$", re.M)


class ReplyFormatError(ValueError):
    """A reply that does not carry code in the required format; the message says what is missing."""


def code_blocks(text: str) -> list[str]:
    return [m.group(1) for m in _FENCE.finditer(text)]


def extract_code(text: str) -> str:
    """The last fenced block of a reply (models often sketch first and answer last)."""
    blocks = [b for b in code_blocks(text) if b.strip()]
    if not blocks:
        raise ReplyFormatError("the reply has no fenced code block (```python ... ```)")
    return blocks[-1]


def extract_files(text: str) -> dict[str, str]:
    """Map relative path -> content for every `### FILE: path` header followed by a fenced block."""
    headers = list(_FILE_HEADER.finditer(text))
    if not headers:
        raise ReplyFormatError("the reply has no '### FILE: <path>' headers")
    files: dict[str, str] = {}
    for i, header in enumerate(headers):
        end = headers[i + 1].start() if i + 1 < len(headers) else len(text)
        blocks = code_blocks(text[header.end():end])
        path = header.group(1).strip("`")
        if not blocks:
            raise ReplyFormatError(f"'### FILE: {path}' is not followed by a fenced code block")
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts:
            raise ReplyFormatError(f"'{path}' must be a relative path inside the output folder")
        if path in files:
            raise ReplyFormatError(f"'{path}' appears twice in the reply")
        files[path] = blocks[0]
    return files
