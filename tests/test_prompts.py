"""The prompts state the checker's rules and tolerance from the code that enforces them, never from a copy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkevolve.config import TOLERANCE
from mkevolve.prompts import PROMPTS_DIR, environment, render
from mkevolve.pysource import parse_python
from mkevolve.verify.cheating.rules import Rule

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "mkevolve"
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")


def is_tolerance(text: str) -> bool:
    """Whether any number written in `text` is the tolerance, in whatever notation (1e-4, 1e-04, 0.0001)."""
    return any(float(number) == TOLERANCE for number in NUMBER.findall(text))


def test_every_rule_is_in_the_rules_prompt():
    prompt = render("_rules.j2")
    missing = [rule.value for rule in Rule if f"[{rule.value}]" not in prompt]
    assert not missing, f"rules the prompts do not list: {missing}"
    assert all(rule.asks.strip() for rule in Rule)


def test_the_rules_prompt_states_the_tolerance_from_config():
    tolerance = environment().globals["tolerance"]
    assert float(tolerance) == TOLERANCE
    assert f"atol = rtol = {tolerance}" in render("_rules.j2")


def test_no_prompt_template_writes_the_tolerance_itself():
    literal = [path.name for path in sorted(PROMPTS_DIR.glob("*.j2")) if is_tolerance(path.read_text())]
    assert not literal, f"templates with a literal tolerance (use {{{{ tolerance }}}}): {literal}"


def test_no_code_writes_the_tolerance_itself():
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path == PACKAGE_DIR / "config.py":  # where TOLERANCE is defined
            continue
        for node in ast.walk(parse_python(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Constant) and (node.value == TOLERANCE or
                                                   isinstance(node.value, str) and is_tolerance(node.value)):
                found.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno}")
    assert not found, f"a literal tolerance (use config.TOLERANCE): {found}"


def test_the_decompose_prompt_names_every_loop_the_purity_check_allows():
    from mkevolve.verify.decomposition.static import REINIT_ITERATORS

    text = (PROMPTS_DIR / "decompose.j2").read_text()
    rendered = environment().from_string(text[text.index("- purity:"):text.index("- standalone:")]).render()
    assert all(name in rendered for name in REINIT_ITERATORS) and "nn.init" in rendered
