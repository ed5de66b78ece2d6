"""The prompt templates: a jinja2 environment over the repository's `prompts/` folder."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    # StrictUndefined: a variable the caller forgot is an error, never an empty hole in a prompt.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROMPTS_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(template_name: str, **variables) -> str:
    return environment().get_template(template_name).render(**variables)
