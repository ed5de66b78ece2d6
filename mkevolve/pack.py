"""`mkevolve pack`: flatten a solution folder into one KernelBench-style file (ModelNew and all its kernels)."""

from __future__ import annotations

import ast
import re
import symtable
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mkevolve.codebase import SOLUTION_FILE, SOLUTION_LOADER, packed_section_marker
from mkevolve.evaluate import SubkernelKind, open_solution
from mkevolve.exit_codes import ExitCode
from mkevolve.fsutil import write_atomic
from mkevolve.problem import ProblemError
from mkevolve.pysource import parse_python

_INPUT_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs", "get_input_configs"})
_DEFINITION_NAME = re.compile(r"\b(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")


@dataclass(frozen=True)
class _Edit:
    start: int      # character offsets into the section's source
    end: int
    text: str


@dataclass
class PackedFile:
    source: str
    subkernels: list[str]
    pytorch: list[str]      # subkernels that run PyTorch code, listed in the header; `check` rejects the file


# ---- positions -----------------------------------------------------------------------------------------


class _Positions:
    """Converts the AST's (line, UTF-8 byte column) positions into character offsets of the source."""

    def __init__(self, source: str):
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line - 1] + len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))

    def whole_lines(self, first: int, last: int) -> tuple[int, int]:
        return self.starts[first - 1], self.starts[min(last, len(self.lines))]


def _start_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _deletion(positions: _Positions, node: ast.stmt, path: Path) -> _Edit:
    start, end = positions.whole_lines(_start_line(node), node.end_lineno)
    line_text = positions.lines[node.end_lineno - 1]
    after = line_text.encode("utf-8")[node.end_col_offset:].decode("utf-8", errors="ignore").strip()
    if after and not after.startswith("#"):
        raise ProblemError(path, f"line {node.end_lineno}: several statements on one line; put each on its own "
                                 "line so the file can be packed")
    return _Edit(start, end, "")


def _apply(source: str, edits: list[_Edit]) -> str:
    """Apply non-overlapping edits (an edit inside a deleted range goes with it); the blank lines that
    deleted statements leave are closed up to two."""
    deleted = [(e.start, e.end) for e in edits if not e.text and e.end > e.start]
    kept = [e for e in edits if e.text == "" or not any(s <= e.start < t for s, t in deleted)]
    for edit in sorted(kept, key=lambda e: e.start, reverse=True):
        source = source[:edit.start] + edit.text + source[edit.end:]
    return re.sub(r"\n(?:[ \t]*\n){3,}", "\n\n\n", source).strip("\n")


# ---- which names refer to module-level definitions -------------------------------------------------------


def _scope_name(node: ast.AST) -> str | None:
    """The name symtable gives the scope `node` opens, or None when it opens none."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    return {ast.Lambda: "lambda", ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp",
            ast.GeneratorExp: "genexpr"}.get(type(node))


def _scope_parts(node: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """(parts evaluated in the enclosing scope, parts evaluated in the scope the node opens)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = node.args
        outer = list(args.defaults) + [d for d in args.kw_defaults if d is not None]
        every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
        if isinstance(node, ast.Lambda):
            return outer, [node.body]
        outer += node.decorator_list + [a.annotation for a in every if a.annotation is not None]
        outer += [node.returns] if node.returns is not None else []
        return outer, list(node.body)
    if isinstance(node, ast.ClassDef):
        return node.decorator_list + node.bases + [k.value for k in node.keywords], list(node.body)
    first, *rest = node.generators
    inner = [first.target, *first.ifs] + [part for g in rest for part in (g.target, g.iter, *g.ifs)]
    results = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    return [first.iter], inner + results


class _ModuleReferences:
    """Collects the Name nodes that refer to module-level bindings, scope by scope, with Python's own rules
    (symtable): a function's parameter or local that shadows a module name is left alone."""

    def __init__(self) -> None:
        self.found: list[ast.Name] = []

    @staticmethod
    def _children(table: symtable.SymbolTable) -> dict[tuple[str, int], deque]:
        index: dict[tuple[str, int], deque] = defaultdict(deque)
        for child in table.get_children():
            index[(child.get_name(), child.get_lineno())].append(child)
        return index

    def collect(self, tree: ast.Module, table: symtable.SymbolTable) -> list[ast.Name]:
        index = self._children(table)
        for stmt in tree.body:
            self._visit(stmt, table, index)
        return self.found

    def _is_module_level(self, name: str, table: symtable.SymbolTable) -> bool:
        if table.get_type() == "module":
            return True
        try:
            return table.lookup(name).is_global()
        except KeyError:
            # A scope symtable did not report (one the compiler inlines): its names are left as written.
            return False

    def _visit(self, node: ast.AST, table: symtable.SymbolTable, index: dict) -> None:
        if isinstance(node, ast.Name):
            if self._is_module_level(node.id, table):
                self.found.append(node)
            return
        scope = _scope_name(node)
        if scope is None:
            for child in ast.iter_child_nodes(node):
                self._visit(child, table, index)
            return
        outer, inner = _scope_parts(node)
        for part in outer:
            self._visit(part, table, index)
        queue = index.get((scope, node.lineno))
        inner_table, inner_index = table, index
        if queue:
            inner_table = queue.popleft()
            inner_index = self._children(inner_table)
        for part in inner:
            self._visit(part, inner_table, inner_index)


def _module_definitions(table: symtable.SymbolTable) -> set[str]:
    """Names the module binds itself (functions, classes, assignments), not by import."""
    return {s.get_name() for s in table.get_symbols()
            if (s.is_assigned() or s.is_namespace()) and not s.is_imported()}


# ---- one section ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Import:
    text: str
    binds: dict[str, str]           # name -> the dotted module path (and attribute) it stands for

    @classmethod
    def of(cls, source: str, stmt: ast.Import | ast.ImportFrom) -> _Import:
        if isinstance(stmt, ast.Import):
            binds = {(a.asname or a.name.split(".")[0]): (a.name if a.asname else a.name.split(".")[0])
                     for a in stmt.names}
        else:
            binds = {(a.asname or a.name): f"{'.' * stmt.level}{stmt.module or ''}.{a.name}" for a in stmt.names}
        return cls(text=ast.get_source_segment(source, stmt), binds=binds)


@dataclass
class _Section:
    title: str
    body: str
    imports: list[_Import]          # lifted to the top of the packed file
    defines: set[str]               # module-level names the section binds once packed
    attributes: set[str]            # every X of a `self.X` in the section


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _parse(source: str, path: Path) -> ast.Module:
    try:
        tree = parse_python(source, filename=str(path))
    except SyntaxError as err:
        raise ProblemError(path, f"syntax error at line {err.lineno}: {err.msg}") from None
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) for n in ast.walk(tree)):
        raise ProblemError(path, "uses `global` or `nonlocal`, which the packer cannot rename safely")
    return tree


def _dropped(source: str, tree: ast.Module, positions: _Positions, path: Path,
             drop: Callable[[ast.stmt], bool]) -> tuple[list[_Edit], list[_Import]]:
    """Deletions of the module-level statements `drop` selects, the docstring, the `__main__` block and the
    imports; and the imports themselves."""
    edits, imports = [], []
    for index, stmt in enumerate(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            imports.append(_Import.of(source, stmt))
            edits.append(_deletion(positions, stmt, path))
        elif (index == 0 and _is_docstring(stmt)) or _is_main_guard(stmt) or drop(stmt):
            edits.append(_deletion(positions, stmt, path))
    return edits, imports


def _subkernel_section(name: str, kind: SubkernelKind, path: Path) -> _Section:
    """A subkernel file with every module-level name it defines prefixed `<name>__`, its imports lifted out,
    and what never runs in a packed file (docstring, input functions, `__main__` block) left out."""
    source = path.read_text(encoding="utf-8")
    tree = _parse(source, path)
    positions = _Positions(source)
    table = symtable.symtable(source, str(path), "exec")

    def input_function(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.FunctionDef) and stmt.name in _INPUT_FUNCTIONS

    edits, imports = _dropped(source, tree, positions, path, input_function)
    renamed = {n: f"{name}__{n}" for n in _module_definitions(table) if n not in _INPUT_FUNCTIONS}
    for node in _ModuleReferences().collect(tree, table):
        if node.id in renamed:
            start = positions.offset(node.lineno, node.col_offset)
            edits.append(_Edit(start, positions.offset(node.end_lineno, node.end_col_offset), renamed[node.id]))
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name in renamed:
            edits.append(_definition_rename(positions, stmt, renamed[stmt.name]))
    return _Section(title=packed_section_marker(name, kind.value), body=_apply(source, edits), imports=imports,
                    defines=set(renamed.values()), attributes=_self_attributes(tree))


def _definition_rename(positions: _Positions, node: ast.stmt, new_name: str) -> _Edit:
    line_start = positions.starts[node.lineno - 1]
    match = _DEFINITION_NAME.search(positions.lines[node.lineno - 1])
    return _Edit(line_start + match.start(1), line_start + match.end(1), new_name)


def _self_attributes(tree: ast.AST) -> set[str]:
    """Every X of a `self.X` the code reads or writes."""
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "self"}


def _attribute_renames(source: str, tree: ast.Module, positions: _Positions, taken: set[str],
                       path: Path) -> list[_Edit]:
    """Renames of the top-level's `self.X` where a subkernel also has a `self.X`: the cheating check follows
    `self.X` through the whole file, so a subkernel's `self.linear = nn.Linear(...)` would make the
    top-level's call of its own `self.linear` look like a PyTorch layer."""
    mine = _self_attributes(tree)
    renames = {}
    for attr in sorted(mine & taken):
        new = f"{attr}_sub"
        while new in mine | taken:
            new += "_"
        renames[attr] = new
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr in renames:
            end = positions.offset(node.end_lineno, node.end_col_offset)
            start = end - len(node.attr)
            if source[start:end] != node.attr:
                raise ProblemError(path, f"line {node.lineno}: write `self.{node.attr}` on one line to pack it")
            edits.append(_Edit(start, end, renames[node.attr]))
    return edits


def _top_level_section(path: Path, classes: dict[str, str], taken: set[str]) -> _Section:
    """decomposed_solution.py with each `load_subkernel("name")` replaced by that subkernel's packed class,
    and its module attributes renamed where a subkernel's attributes share their names."""
    source = path.read_text(encoding="utf-8")
    tree = _parse(source, path)
    positions = _Positions(source)

    def loader(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.FunctionDef) and stmt.name == SOLUTION_LOADER

    edits, imports = _dropped(source, tree, positions, path, loader)
    edits += _attribute_renames(source, tree, positions, taken, path)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == SOLUTION_LOADER):
            target = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            if target not in classes:
                raise ProblemError(path, f"line {node.lineno}: {SOLUTION_LOADER}({target!r}) names no subkernel "
                                         "of this folder")
            edits.append(_Edit(positions.offset(node.lineno, node.col_offset),
                               positions.offset(node.end_lineno, node.end_col_offset), classes[target]))
    table = symtable.symtable(source, str(path), "exec")
    return _Section(title=packed_section_marker(None, None), body=_apply(source, edits), imports=imports,
                    defines=_module_definitions(table) - {SOLUTION_LOADER}, attributes=_self_attributes(tree))


# ---- the packed file -----------------------------------------------------------------------------------


def _merged_imports(sections: list[_Section], folder: Path) -> list[str]:
    """Every section's imports once, `from __future__` first; two sections binding one name differently is
    an error, since the packed file has one namespace."""
    bound: dict[str, str] = {}
    lines: list[str] = []
    for section in sections:
        for item in section.imports:
            for name, target in item.binds.items():
                earlier = bound.setdefault(name, target)
                if earlier != target:
                    raise ProblemError(folder, f"`{name}` is imported as {earlier} in one file and as {target} "
                                               "in another; the packed file has one namespace")
            if item.text not in lines:
                lines.append(item.text)
    return sorted(lines, key=lambda line: not line.startswith("from __future__"))


def _header(folder: Path, problem: str | None, subkernels: list[str], pytorch: list[str],
            mode: str | None = None) -> str:
    lines = [f"Packed from the solution folder {folder} by `mkevolve pack`: ModelNew and its subkernels in one file.",
             ""]
    if problem:
        lines.append(f"Problem: {problem}")
    if mode:
        lines.append(f"Verified in {mode} mode (module.{mode}()); the other mode is not verified.")
    lines.append(f"Subkernels, in the order the top-level loads them: {', '.join(subkernels)}.")
    if pytorch:
        named = ("PyTorch subkernels (they run their subproblem's PyTorch code, not a Triton kernel): "
                 f"{', '.join(pytorch)}.")
        lines += ["", named, "`mkevolve check` rejects this file as a PyTorch fallback because of them."]
    else:
        lines.append("Every subkernel is a Triton kernel.")
    return 'r"""' + "\n".join(lines) + '\n"""'


def pack_solution(folder: str | Path) -> PackedFile:
    """The folder as one file: imports, then one marked section per subkernel, then the top-level ModelNew."""
    solution = open_solution(folder)
    missing = [n for n in solution.names if solution.kind(n) is SubkernelKind.MISSING]
    if missing:
        raise ProblemError(solution.path, f"no implementation file for {', '.join(missing)}")
    sections = [_subkernel_section(n, solution.kind(n), solution.kernel_file(n)) for n in solution.names]
    classes = {n: f"{n}__ModelNew" for n in solution.names}
    for name, section in zip(solution.names, sections, strict=True):
        if classes[name] not in section.defines:
            raise ProblemError(solution.kernel_file(name), "defines no ModelNew class")
    top = _top_level_section(solution.path / SOLUTION_FILE, classes,
                             taken=set().union(*(s.attributes for s in sections)))
    clash = top.defines & set().union(*(s.defines for s in sections))
    if clash:
        raise ProblemError(solution.path / SOLUTION_FILE, f"defines {', '.join(sorted(clash))}, a name a packed "
                                                         "subkernel uses")
    pytorch = sorted(solution.pytorch, key=solution.names.index)
    problem, mode = (solution.manifest.problem, solution.manifest.mode) if solution.manifest else (None, None)
    parts = [_header(solution.path.resolve(), problem, solution.names, pytorch, mode),
             "\n".join(_merged_imports(sections + [top], solution.path))]
    parts += [f"{section.title}\n\n{section.body}" for section in sections + [top]]
    return PackedFile(source="\n\n\n".join(parts) + "\n", subkernels=solution.names, pytorch=pytorch)


def pack_command(args) -> int:
    """`mkevolve pack SOLUTION_DIR -o FILE.py`: 0 when written, 2 when the folder cannot be packed."""
    packed = pack_solution(args.solution_dir)
    output = write_atomic(Path(args.output), packed.source)
    print(f"wrote {output}: ModelNew and {len(packed.subkernels)} subkernel(s) in one file")
    if packed.pytorch:
        print(f"PyTorch subkernels (listed in the file's header): {', '.join(packed.pytorch)}; "
              "`mkevolve check` will reject the file as a PyTorch fallback")
    print(f"verify it with: python -m mkevolve check PROBLEM {output}")
    return ExitCode.OK
