"""The decomposition prompt: guidance for a normalisation before a GEMM, and a retry prompt that shows the
rejected attempts' files with line numbers, so that a reason's "line 33" can be found."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mkevolve.agents.attempts import Attempt, Feedback, prompt_variables
from mkevolve.agents.decompose import (REJECTED_FILE_LINES, REJECTED_TOTAL_LINES, decompose,
                                       rejected_attempts)
from mkevolve.codebase import Decomposition
from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import make_client
from mkevolve.prompts import render
from mkevolve.workers.pool import WorkerPool

FIXTURES = Path(__file__).parent / "fixtures"
PROBLEM = FIXTURES / "decompositions" / "problem.py"
REPLAY = FIXTURES / "replay"
# The line of math_in_top_level.md's top-level that the purity check rejects, as the retry prompt numbers it.
TORCH_IN_FORWARD = "33 |         h = torch.relu(self.block1(x))"


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2) as workers:
        yield workers


def _replay(tmp_path: Path, entries: list[dict], **values):
    """A replay client over recorded replies (.md files), and the config that names it."""
    rows = [{"reply_file": str(REPLAY / entry.pop("reply")), **entry} for entry in entries]
    path = tmp_path / "replies.yaml"
    path.write_text(yaml.safe_dump({"replies": rows}))
    config = RunConfig(trials=2, timeout=120.0, model=f"replay:{path}", **values)
    return config, make_client(config)


def test_the_prompt_says_a_norm_before_a_gemm_can_be_its_prologue(tmp_path, pool):
    """The recorded reply answers only a prompt that carries the guidance."""
    config, client = _replay(tmp_path, [{"reply": "good.md", "agent": "decompose",
                                         "prompt_contains": "A normalisation before a GEMM"}],
                             decompose_attempts=1, retries=0)
    decomposition, report = decompose(PROBLEM, config, client, pool)
    assert report.passed and not decomposition.fallback
    prompt = render("decompose.j2", **prompt_variables(PROBLEM, []))
    assert "as its prologue" in prompt and "its own subproblem before the GEMM" in prompt


def test_a_retry_prompt_shows_the_rejected_files_numbered_where_the_reason_points(tmp_path, pool):
    config, client = _replay(tmp_path, [
        {"reply": "math_in_top_level.md", "agent": "decompose"},
        # Matches only a prompt that shows the rejected top-level's line 33, numbered.
        {"reply": "good.md", "agent": "decompose", "prompt_contains": TORCH_IN_FORWARD},
    ], decompose_attempts=1, retries=1)
    events = EventLog()
    decomposition, report = decompose(PROBLEM, config, client, pool, events)
    first, second = events.of_kind("decomposition_attempt")
    assert any(r.startswith("purity: line 33:") for r in first["reasons"]), first["reasons"]
    assert second["passed"] and report.passed and not decomposition.fallback


def _attempt(round_index: int, sample: int, files: dict[str, str]) -> Attempt:
    return Attempt(round_index, sample, Decomposition.from_files(files))


def _top_level(lines: int) -> str:
    return "\n".join(["import torch", "class Model: pass"] + [f"# line {n}" for n in range(3, lines + 1)])


def _retry_prompt(feedback: list[Feedback], history: list[Attempt]) -> str:
    variables = prompt_variables(PROBLEM, feedback)
    variables["feedback"] = rejected_attempts(feedback, history)
    return render("decompose.j2", rejected_file_lines=REJECTED_FILE_LINES, **variables)


def test_each_subproblem_file_is_shown_and_a_long_file_is_cut_with_a_note():
    long = REJECTED_FILE_LINES + 50
    files = {"decomposed_problem.py": _top_level(long), "subkernel_problems/scale.py": "x = 1\ny = 2\n"}
    prompt = _retry_prompt([Feedback(0, 0, ("purity: line 310: no",))], [_attempt(0, 0, files)])
    assert f"{REJECTED_FILE_LINES} | # line {REJECTED_FILE_LINES}" in prompt
    assert f"# line {REJECTED_FILE_LINES + 1}" not in prompt
    assert "... (50 more lines not shown)" in prompt
    assert "`subkernel_problems/scale.py`:\n```\n1 | x = 1\n2 | y = 2\n```" in prompt


def test_identical_files_are_shown_once_and_the_total_stays_bounded():
    # Each attempt lists a top-level of one line less than a file's limit, and a one-line file they share:
    # the room holds the shared file once and the top-levels of all attempts but one.
    count = REJECTED_TOTAL_LINES // REJECTED_FILE_LINES + 1
    shared = "z = 3\n"
    top_lines = REJECTED_FILE_LINES - 2
    history = [_attempt(0, i, {"decomposed_problem.py": _top_level(top_lines) + f"\n# attempt {i}",
                               "subkernel_problems/shared.py": shared}) for i in range(count)]
    feedback = [Feedback(0, i, (f"reason {i}",)) for i in reversed(range(count))]  # newest first
    shown = rejected_attempts(feedback, history)
    newest, oldest = shown[0], shown[-1]
    assert [f.same_as for f in newest.files] == ["", ""]
    assert all(a.files[1].same_as == newest.label for a in shown[1:])
    assert oldest.files[0].omitted and not any(f.omitted for a in shown[:-1] for f in a.files)
    prompt = _retry_prompt(feedback, history)
    assert f"`subkernel_problems/shared.py`: the same as in attempt {newest.label}." in prompt
    assert "not shown (this prompt's room for rejected files is used up)" in prompt


def test_an_unparsed_reply_and_the_other_agents_prompts_show_reasons_only():
    prompt = _retry_prompt([Feedback(0, 0, ("reply format: no files",))], [Attempt(0, 0)])
    assert "reply format: no files" in prompt and "Its files" not in prompt
    # Split, Fuse and TotalFuse extend this template and pass plain feedback, without files.
    plain = render("decompose.j2", **prompt_variables(PROBLEM, [Feedback(0, 0, ("why",))]))
    assert "- why" in plain and "Its files" not in plain
