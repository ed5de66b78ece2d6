"""The prompt templates: a jinja2 environment over the repository's `prompts/` folder.

The folder stays at the top of the repository; a built wheel carries it inside the package as
`mkevolve/prompt_templates/` (see pyproject.toml), found here through importlib.resources. An editable
install (`pip install -e .`) runs the repository's mkevolve/ folder, which has no such copy: it reads
the repository's `prompts/` directly.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import jinja2

from mkevolve.config import EAGER_ERROR_SLACK, TOLERANCE
from mkevolve.verify.cheating.rules import Rule
from mkevolve.verify.decomposition.static import REINIT_ITERATORS

PACKAGED_DIR = "prompt_templates"


def _prompts_dir() -> Path:
    packaged = files("mkevolve") / PACKAGED_DIR
    if packaged.is_dir():
        # Installed from a wheel: a plain folder under site-packages (pip always unpacks wheels).
        return Path(str(packaged))
    return Path(__file__).resolve().parents[1] / "prompts"  # editable install or source checkout


PROMPTS_DIR = _prompts_dir()


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    # StrictUndefined: a variable the caller forgot is an error, never an empty hole in a prompt.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROMPTS_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    # The default tolerance, from the one place the verifier takes it too (a looser --atol/--rtol
    # is the user's choice; the prompts keep asking for the strict one).
    env.globals["tolerance"] = f"{TOLERANCE:.0e}".replace("e-0", "e-")  # "1e-4"
    env.globals["eager_error_slack"] = f"{EAGER_ERROR_SLACK:g}"
    # The rules the checker enforces, each with its id and what it asks: _rules.j2 lists them all.
    env.globals["rules"] = list(Rule)
    # What a top-level's __init__ may loop over to re-initialise its subproblems (the purity check's list).
    env.globals["reinit_iterators"] = sorted(REINIT_ITERATORS)
    # A model that knows the versions writes their API (`input_precision=` rather than `allow_tf32=`).
    env.globals["versions"] = _versions()
    env.filters["excerpt"] = excerpt
    env.filters["numbered"] = numbered
    return env


def _versions() -> str:
    import torch
    import triton

    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    return f"Triton {triton.__version__}, PyTorch {torch.__version__}{cuda}"


def excerpt(code: str, line: int, context: int = 3) -> str:
    """The lines around `line` of `code`, numbered, the line itself marked: where a verdict points."""
    lines = code.splitlines()
    first, last = max(1, line - context), min(len(lines), line + context)
    width = len(str(last))
    return "\n".join(f"{'>' if n == line else ' '} {n:>{width}} | {lines[n - 1]}" for n in range(first, last + 1))


def numbered(code: str, limit: int | None = None) -> str:
    """`code` with its lines numbered from 1, the first `limit` of them when given, and a last line saying
    how many were left out: a verdict's "line 33" can be found without counting, and a long file stays bounded."""
    lines = code.rstrip().splitlines()
    shown = lines if limit is None else lines[:limit]
    width = len(str(len(shown)))
    text = "\n".join(f"{n:>{width}} | {line}".rstrip() for n, line in enumerate(shown, start=1))
    cut = len(lines) - len(shown)
    return text + (f"\n... ({cut} more line{'s' * (cut != 1)} not shown)" if cut else "")


def render(template_name: str, **variables) -> str:
    return environment().get_template(template_name).render(**variables)
