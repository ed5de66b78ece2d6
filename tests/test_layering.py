"""Imports go one way: a module imports from its own layer and the layers below it, never from one above.

    cli -> commands -> orchestrator -> agents -> search, llm, builtin, verify -> workers, codebase, problem, config

Every import statement counts, including one inside a function: a lazy import hides a cycle, it does not
remove it. Modules named in strings ("module:function" handlers, worker jobs) are not imports and not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from mkevolve.pysource import parse_python

SOURCE_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "mkevolve"

# Lowest first. A package's entry covers every module under it; the root package's entry covers only
# mkevolve/__init__.py. A new module fails the test until it is given a layer here.
LAYERS: list[tuple[str, list[str]]] = [
    # What everything reads and writes: the config, problem, codebase and solution files, the run folder,
    # the worker processes, and helpers that import nothing above them.
    ("base", ["mkevolve.config", "mkevolve.problem", "mkevolve.problem_error", "mkevolve.codebase", "mkevolve.solution",
              "mkevolve.run_layout", "mkevolve.workers", "mkevolve.matching",
              "mkevolve.budget", "mkevolve.busy", "mkevolve.display", "mkevolve.events", "mkevolve.event_records",
              "mkevolve.exit_codes", "mkevolve.fsutil", "mkevolve.gpu_peaks", "mkevolve.pysource",
              "mkevolve.text"]),
    # The services an agent uses: checking code, asking a model (with the prompts it is shown), the builtin
    # offline agent's decomposer and kernel generator, and keeping a search's best candidates.
    ("services", ["mkevolve.verify", "mkevolve.llm", "mkevolve.builtin", "mkevolve.prompts", "mkevolve.search"]),
    # One step of the algorithm each: decompose, split, fuse, evolve a kernel, judge one.
    ("agents", ["mkevolve.agents"]),
    # The run loop (and `run`, its command), its checkpoint (run_state: it holds the search's beams), and the
    # report it writes at the end of every run.
    ("orchestrator", ["mkevolve.orchestrator", "mkevolve.end_to_end_ahead", "mkevolve.run_state", "mkevolve.report"]),
    # The subcommands, one module each; pack, port and swap build on eval's module. `check`, `decompose` and
    # `run` keep their handlers lower, beside what they run (verify.verifier, agents.decompose, orchestrator).
    ("commands", ["mkevolve.evaluate", "mkevolve.swap", "mkevolve.port", "mkevolve.pack", "mkevolve.solve",
                  "mkevolve.capture", "mkevolve.integration"]),
    # The command line and the package's own entry points.
    ("cli", ["mkevolve.cli", "mkevolve.__main__", "mkevolve"]),
]
LAYER_OF = {module: index for index, (_, modules) in enumerate(LAYERS) for module in modules}

# Back-edges known and not yet fixed, each as (importer, imported) with a comment saying why it stays. Any
# other back-edge fails. Empty: the ones found (orchestrator -> report, report -> evaluate, search.solve ->
# agents.evolve) were fixed by moving what they shared down or the module up, not by lazy imports.
ALLOWED_BACK_EDGES: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = SOURCE_ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_from(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module a `from ... import` reads from; `from . import x` in a/b/c.py reads from a.b."""
    if not node.level:
        return node.module
    package = module_name(path).split(".")[:None if path.name == "__init__.py" else -1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: Path) -> set[str]:
    """Every mkevolve module `path` imports, at any depth: `from a import b` names a.b when b is a module."""
    found = set()
    for node in ast.walk(parse_python(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(node, path)
            found.update(f"{source}.{a.name}" if is_module(f"{source}.{a.name}") else source for a in node.names)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def layer_of(module: str) -> int:
    """The layer of the module's own entry, else of the nearest package above it (not the root package)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in LAYER_OF and (n == len(parts) or name != PACKAGE):
            return LAYER_OF[name]
    raise AssertionError(f"{module} has no layer: give it one in LAYERS in {__file__}")


def import_edges() -> set[tuple[str, str]]:
    return {(module_name(path), imported)
            for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py")) for imported in imported_modules(path)}


def back_edges() -> set[tuple[str, str]]:
    return {(a, b) for a, b in import_edges() if layer_of(b) > layer_of(a)}


def describe(edges) -> str:
    return "\n".join(f"  {a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
                     for a, b in sorted(edges))


def test_every_module_has_a_layer():
    for path in (SOURCE_ROOT / PACKAGE).rglob("*.py"):
        layer_of(module_name(path))


def test_no_import_goes_up_a_layer():
    new = back_edges() - ALLOWED_BACK_EDGES
    assert not new, "imports from a higher layer (move what is shared down instead):\n" + describe(new)


def test_no_import_cycles():
    # Within a layer too: two modules that import each other are one module split in two, or a name that
    # belongs lower down (report and orchestrator shared the best/ folder's name that way).
    cycles = list(nx.simple_cycles(nx.DiGraph(import_edges())))
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c + c[:1]) for c in cycles)


def test_the_allow_list_holds_only_live_back_edges():
    # A fixed back-edge leaves the list, so that it cannot come back unnoticed.
    gone = ALLOWED_BACK_EDGES - back_edges()
    assert not gone, "no longer back-edges; delete them from ALLOWED_BACK_EDGES:\n" + describe(gone)


def test_the_import_scan_sees_lazy_and_relative_imports():
    # The lazy import in cli's _version and a relative one in the builtin kernel generator.
    assert ("mkevolve.cli", "mkevolve") in import_edges()
    assert ("mkevolve.builtin.kernels.generate", "mkevolve.builtin.kernels.plan") in import_edges()
