"""The modular kernel codebase: a decomposition in memory and on disk, its solution side, and top-level sources."""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from mkevolve.fsutil import write_atomic
from mkevolve.pysource import parse_python

PROBLEM_FILE = "decomposed_problem.py"
SOLUTION_FILE = "decomposed_solution.py"
PROBLEMS_DIR = "subkernel_problems"
KERNELS_DIR = "subkernel_implementations"
LOADER = "load_subproblem"
SOLUTION_LOADER = "load_subkernel"
# The first words of the docstring of every top-level that wraps the original module whole.
FALLBACK_MARKER = "Fallback top-level"

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_INPUT_FUNCTIONS = ("get_inputs", "get_init_inputs", "get_input_configs")

# The top-levels load each subproblem and each subkernel from the folder next to them, so a copied folder
# still loads.
_LOADER_TEMPLATE = '''def {function}(name):
    """The {cls} class of {folder}/<name>.py, found next to this file."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent / "{folder}" / f"{{name}}.py"
    spec = importlib.util.spec_from_file_location(f"{{__name__}}__{{name}}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.{cls}
'''
_PROBLEM_LOADER = _LOADER_TEMPLATE.format(function=LOADER, cls="Model", folder=PROBLEMS_DIR)
_SOLUTION_LOADER = _LOADER_TEMPLATE.format(function=SOLUTION_LOADER, cls="ModelNew", folder=KERNELS_DIR)


class CodebaseError(ValueError):
    """Files that do not form a decomposition (missing top-level, bad names, stray paths)."""


def problem_loader_source() -> str:
    """The canonical `load_subproblem` function every top-level carries (shown to models in prompts)."""
    return _PROBLEM_LOADER


def is_valid_name(name: str) -> bool:
    """File-safe and importable: lower-case letters, digits and underscores, starting with a letter."""
    return bool(_NAME.match(name)) and not keyword.iskeyword(name)


def safe_name(text: str, default: str = "subproblem") -> str:
    """A valid subproblem name derived from any text; the same text always gives the same name."""
    slug = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    if not slug:
        slug = default
    if not slug[0].isalpha():
        slug = f"m_{slug}"
    slug = slug[:64].rstrip("_")
    return f"{slug}_" if keyword.iskeyword(slug) else slug


def class_alias(name: str) -> str:
    """The CamelCase name a top-level binds a subproblem's Model class to."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Subproblem"


@dataclass(frozen=True)
class InstanceConfig:
    """One instantiation as the checks saw it: the attribute holding it, its constructor arguments, its inputs."""

    attribute: str
    init_args: str
    inputs: tuple[str, ...] = ()


@dataclass
class SubproblemSpec:
    """One subproblem file: a KernelBench-form module the top-level instantiates `instances` times."""

    name: str
    source: str
    instances: int = 1
    configs: list[InstanceConfig] = field(default_factory=list)
    input_shapes: list[str] = field(default_factory=list)  # how the checks saw the file called, for prompts

    @property
    def path(self) -> str:
        return f"{PROBLEMS_DIR}/{self.name}.py"


@dataclass
class Decomposition:
    """A top-level module (source of decomposed_problem.py) and the subproblems it chains."""

    top_level: str
    subproblems: list[SubproblemSpec]
    fallback: bool = False

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.subproblems]

    @property
    def total_instances(self) -> int:
        return sum(s.instances for s in self.subproblems)

    def subproblem(self, name: str) -> SubproblemSpec:
        for spec in self.subproblems:
            if spec.name == name:
                return spec
        raise KeyError(f"no subproblem named '{name}' (have: {', '.join(self.names)})")

    def files(self) -> dict[str, str]:
        """Relative path -> source, exactly as `write` lays them out."""
        files = {PROBLEM_FILE: self.top_level}
        files.update({spec.path: spec.source for spec in self.subproblems})
        return files

    def with_configs(self, observed: dict[str, list[InstanceConfig]],
                     input_shapes: dict[str, list[str]] | None = None) -> Decomposition:
        """A copy whose instance counts, configs and input shapes are the ones the checks observed."""
        input_shapes = input_shapes or {}
        specs = [replace(s, instances=len(observed.get(s.name, [])) or s.instances,
                         configs=list(observed.get(s.name, s.configs)),
                         input_shapes=list(input_shapes.get(s.name, s.input_shapes))) for s in self.subproblems]
        return replace(self, subproblems=specs)

    def write(self, folder: str | Path) -> None:
        """Write every file atomically; subproblem files of an earlier decomposition in `folder` are removed."""
        folder = Path(folder)
        for relative, source in self.files().items():
            write_atomic(folder / relative, source)
        keep = {f"{name}.py" for name in self.names}
        for stale in (folder / PROBLEMS_DIR).glob("*.py"):
            if stale.name not in keep:
                stale.unlink()

    @classmethod
    def read(cls, folder: str | Path) -> Decomposition:
        folder = Path(folder)
        top = folder / PROBLEM_FILE
        if not top.is_file():
            raise CodebaseError(f"{folder}: no {PROBLEM_FILE}")
        files = {PROBLEM_FILE: top.read_text(encoding="utf-8")}
        for path in sorted((folder / PROBLEMS_DIR).glob("*.py")):
            files[f"{PROBLEMS_DIR}/{path.name}"] = path.read_text(encoding="utf-8")
        return cls.from_files(files)

    @classmethod
    def from_files(cls, files: dict[str, str], previous: Decomposition | None = None) -> Decomposition:
        """Build from relative path -> source (a parsed reply); subproblems the top-level loads but the
        files lack are taken from `previous`. Subproblem files nothing loads are kept so the checks name them."""
        files = {PurePosixPath(p).as_posix(): source for p, source in files.items()}  # "./x.py" is "x.py"
        unknown = [p for p in files if p != PROBLEM_FILE and not _is_subproblem_path(p)]
        if unknown:
            raise CodebaseError(f"unexpected file(s) {', '.join(unknown)}: a decomposition has only "
                                f"{PROBLEM_FILE} and {PROBLEMS_DIR}/<name>.py")
        if PROBLEM_FILE not in files:
            raise CodebaseError(f"no {PROBLEM_FILE} among the files")
        given = {Path(p).stem: source for p, source in files.items() if p != PROBLEM_FILE}
        bad = [name for name in given if not is_valid_name(name)]
        if bad:
            raise CodebaseError(f"invalid subproblem name(s) {', '.join(bad)}: use lower-case letters, "
                                "digits and underscores, starting with a letter")
        top_level = normalize_top_level(files[PROBLEM_FILE])
        earlier = {s.name: s.source for s in previous.subproblems} if previous else {}
        order = [n for n in referenced_subproblems(top_level) if n in given or n in earlier]
        order += sorted(n for n in given if n not in order)
        specs = [SubproblemSpec(name=n, source=given.get(n, earlier.get(n, "")),
                                instances=instances_in_source(given.get(n, earlier.get(n, ""))))
                 for n in order]
        return cls(top_level=top_level, subproblems=specs, fallback=is_fallback_source(top_level))


def _is_subproblem_path(path: str) -> bool:
    parts = Path(path).parts
    return len(parts) == 2 and parts[0] == PROBLEMS_DIR and parts[1].endswith(".py")


def is_fallback_source(top_level: str) -> bool:
    try:
        doc = ast.get_docstring(parse_python(top_level)) or ""
    except SyntaxError:
        return False
    return doc.startswith(FALLBACK_MARKER)


def referenced_subproblems(top_level: str) -> list[str]:
    """Names passed as string literals to load_subproblem, in order of first use (empty if unparsable)."""
    try:
        tree = parse_python(top_level)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == LOADER
                and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and node.args[0].value not in names):
            names.append(node.args[0].value)
    return names


def instances_in_source(source: str) -> int:
    """Entries of a literal `get_input_configs()` list; 1 for a file without one (or one built by code)."""
    try:
        tree = parse_python(source)
    except SyntaxError:
        return 1
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_input_configs":
            for stmt in node.body:
                if isinstance(stmt, ast.Return) and isinstance(stmt.value, (ast.List, ast.Tuple)):
                    return max(1, len(stmt.value.elts))
    return 1


def _function_span(source: str, name: str) -> tuple[int, int] | None:
    """First and last line (1-based) of a module-level function, decorators included."""
    try:
        tree = parse_python(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return start, node.end_lineno
    return None


def _replace_function(source: str, name: str, new_source: str) -> str | None:
    span = _function_span(source, name)
    if span is None:
        return None
    lines = source.splitlines(keepends=True)
    return "".join(lines[:span[0] - 1]) + new_source + "".join(lines[span[1]:])


def normalize_top_level(source: str) -> str:
    """The same top-level with its load_subproblem replaced by the canonical one (when it has one)."""
    return _replace_function(source, LOADER, _PROBLEM_LOADER) or source


def solution_top_level(top_level: str) -> str:
    """decomposed_solution.py from decomposed_problem.py: loads ModelNew from subkernel_implementations
    and defines ModelNew with the same constructor."""
    swapped = _replace_function(top_level, LOADER, _SOLUTION_LOADER)
    if swapped is None:
        raise CodebaseError(f"the top-level has no module-level {LOADER} function to swap for kernels")
    renames = {"Model": "ModelNew", LOADER: SOLUTION_LOADER}
    # Renaming whole NAME tokens leaves strings, comments and attribute-free text alone; positions are kept,
    # so the layout survives.
    tokens = [tok._replace(string=renames.get(tok.string, tok.string)) if tok.type == tokenize.NAME else tok
              for tok in tokenize.generate_tokens(io.StringIO(swapped).readline)]
    return tokenize.untokenize(tokens)


def write_solution(folder: str | Path, decomposition: Decomposition, kernels: dict[str, str]) -> None:
    """Write decomposed_solution.py and one subkernel_implementations/<name>.py per subproblem."""
    missing = [n for n in decomposition.names if n not in kernels]
    extra = [n for n in kernels if n not in decomposition.names]
    if missing or extra:
        raise CodebaseError(f"kernels must match the subproblems exactly (missing: {', '.join(missing) or '-'}; "
                            f"unknown: {', '.join(extra) or '-'})")
    folder = Path(folder)
    write_atomic(folder / SOLUTION_FILE, solution_top_level(decomposition.top_level))
    for name in decomposition.names:
        write_atomic(folder / KERNELS_DIR / f"{name}.py", kernels[name])
    for stale in (folder / KERNELS_DIR).glob("*.py"):
        if stale.stem not in kernels:
            stale.unlink()


# ---- Top-level sources generated from a problem file ----------------------------------------------


@dataclass(frozen=True)
class ProblemSkeleton:
    """What a top-level reuses from the problem file: imports, constants, input functions, signatures."""

    name: str
    imports: tuple[str, ...]
    constants: tuple[str, ...]
    input_functions: tuple[str, ...]
    init_params: str        # the parameter list of Model.__init__ without self, as source
    init_call: str          # those parameters passed on, as call arguments
    forward_params: str
    forward_call: str
    init_arg_names: tuple[str, ...]

    @classmethod
    def from_source(cls, name: str, source: str) -> ProblemSkeleton:
        tree = parse_python(source)
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        if model is None:
            raise CodebaseError(f"{name}: defines no class Model")
        methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
        init_args = _without_self(methods["__init__"].args) if "__init__" in methods else ast.arguments(
            posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        if "forward" not in methods:
            raise CodebaseError(f"{name}: Model defines no forward")
        forward_args = _without_self(methods["forward"].args)
        return cls(
            name=name,
            imports=tuple(ast.get_source_segment(source, n) for n in tree.body
                          if isinstance(n, (ast.Import, ast.ImportFrom))),
            constants=tuple(ast.get_source_segment(source, n) for n in tree.body
                            if isinstance(n, (ast.Assign, ast.AnnAssign))),
            input_functions=tuple(ast.get_source_segment(source, n) for n in tree.body
                                  if isinstance(n, ast.FunctionDef) and n.name in _INPUT_FUNCTIONS),
            init_params=ast.unparse(init_args), init_call=_call_arguments(init_args),
            forward_params=ast.unparse(forward_args), forward_call=_call_arguments(forward_args),
            init_arg_names=tuple(a.arg for a in init_args.posonlyargs + init_args.args + init_args.kwonlyargs),
        )

    def render(self, docstring: str, bindings: list[tuple[str, str]], init_lines: list[str],
               forward_lines: list[str]) -> str:
        """A complete top-level source: `bindings` are (class alias, subproblem name) pairs."""
        parts = [f'"""{docstring}"""', ""]
        parts += list(dict.fromkeys(("import torch", "import torch.nn as nn") + self.imports))
        if self.constants:
            parts += [""] + list(self.constants)
        parts += ["", "", _PROBLEM_LOADER.rstrip(), "", ""]
        parts += [f'{alias} = {LOADER}("{name}")' for alias, name in bindings]
        init_sig = ", ".join(p for p in ("self", self.init_params) if p)
        forward_sig = ", ".join(p for p in ("self", self.forward_params) if p)
        parts += ["", "", "class Model(nn.Module):", f"    def __init__({init_sig}):",
                  "        super().__init__()"]
        parts += [f"        {line}" for line in init_lines]
        parts += ["", f"    def forward({forward_sig}):"]
        parts += [f"        {line}" for line in forward_lines]
        for function in self.input_functions:
            parts += ["", "", function]
        return "\n".join(parts) + "\n"


def _without_self(args: ast.arguments) -> ast.arguments:
    """A method's parameters without its first one; defaults align to the end, so they stay as they are."""
    posonly, plain = (args.posonlyargs[1:], args.args) if args.posonlyargs else ([], args.args[1:])
    return ast.arguments(posonlyargs=posonly, args=plain, vararg=args.vararg, kwonlyargs=args.kwonlyargs,
                         kw_defaults=args.kw_defaults, kwarg=args.kwarg, defaults=args.defaults)


def _call_arguments(args: ast.arguments) -> str:
    parts = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    parts += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return ", ".join(parts)


def wrap_original(problem_name: str, problem_source: str) -> Decomposition:
    """The fallback: a top-level whose only subproblem is the original problem file, unchanged."""
    skeleton = ProblemSkeleton.from_source(problem_name, problem_source)
    name = safe_name(problem_name, default="original")
    alias = class_alias(name)
    docstring = f"{FALLBACK_MARKER} for {problem_name}: the original module is its only subproblem."
    top_level = skeleton.render(docstring, [(alias, name)],
                                [f"self.{name} = {alias}({skeleton.init_call})"],
                                [f"return self.{name}({skeleton.forward_call})"])
    spec = SubproblemSpec(name=name, source=problem_source, instances=instances_in_source(problem_source))
    return Decomposition(top_level=top_level, subproblems=[spec], fallback=True)


# ---- a packed file (`mkevolve pack`): one section per subkernel, each opened by a marker comment --------
# pack writes the markers and the verifier reads them back to say which subkernel a violation falls in.

_PACK_MARKER = "# ==== mkevolve pack: "
_PACK_SECTION = re.compile(
    r"^# ==== mkevolve pack: (?:subkernel (?P<name>\w+) \((?P<kind>\w+)\)|top-level ModelNew) ====$")


def packed_section_marker(subkernel: str | None, kind: str | None) -> str:
    """The comment line that opens a section of a packed file: one subkernel (and its kind), or the top-level."""
    if subkernel is None:
        return f"{_PACK_MARKER}top-level ModelNew ===="
    return f"{_PACK_MARKER}subkernel {subkernel} ({kind}) ===="


def packed_sections(source: str) -> list[tuple[int, str, str | None]]:
    """(first line, subkernel or "the top-level ModelNew", kind) of each section of a packed file."""
    sections = []
    for number, text in enumerate(source.splitlines(), start=1):
        found = _PACK_SECTION.match(text)
        if found:
            sections.append((number, found.group("name") or "the top-level ModelNew", found.group("kind")))
    return sections
