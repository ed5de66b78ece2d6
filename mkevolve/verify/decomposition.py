"""Decomposition checks: structure, top-level purity, standalone subproblems, equivalence, shape/init coverage.

The static checks read the files; everything that executes them runs in a worker (`run_checks`). Each
failure carries a reason written for the model that produced the decomposition.
"""

from __future__ import annotations

import ast
import inspect
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mkevolve.codebase import (
    LOADER,
    PROBLEM_FILE,
    PROBLEMS_DIR,
    Decomposition,
    InstanceConfig,
    is_valid_name,
    referenced_subproblems,
)
from mkevolve.config import TOLERANCE, RunConfig
from mkevolve.problem import (
    ProblemError,
    build_model,
    call_inputs,
    flatten_outputs,
    import_file,
    load_problem,
    make_inputs,
    seed_everything,
)
from mkevolve.verify.correctness import fp32_strict
from mkevolve.workers.executor import Executor
from mkevolve.pysource import parse_python
from mkevolve.workers.pool import Job, JobOutcome

STRUCTURE, PURITY, STANDALONE = "structure", "purity", "standalone"
EQUIVALENCE, FORWARD_COVERAGE, INIT_COVERAGE = "equivalence", "forward_coverage", "init_coverage"
CHECKS = (STRUCTURE, PURITY, STANDALONE, EQUIVALENCE, FORWARD_COVERAGE, INIT_COVERAGE)
ATOL = RTOL = TOLERANCE  # fixed: a decomposition must match its original as strictly as the default

# Tensor methods and torch functions a top-level may use: views, reshapes and shape queries.
VIEW_METHODS = frozenset({"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute",
                          "transpose", "t", "contiguous", "expand", "expand_as", "view_as", "reshape_as",
                          "chunk", "split", "unbind", "narrow", "movedim"})
SHAPE_METHODS = frozenset({"size", "dim", "numel"})
VIEW_FUNCTIONS = frozenset({"reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "permute",
                            "transpose", "chunk", "split", "unbind", "narrow", "movedim"})
SHAPE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device"})
VIEW_ATTRIBUTES = frozenset({"T", "mT"})
FORWARD_BUILTINS = frozenset({"len", "range", "int", "tuple", "list", "zip", "enumerate", "isinstance"})
INIT_BUILTINS = FORWARD_BUILTINS | frozenset({"min", "max", "float", "bool", "str", "dict", "abs", "round",
                                              "sum", "sorted", "reversed", "super"})
# ATen ops the top-level may run outside subproblem modules: they move no data through arithmetic.
VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "permute", "transpose", "t",
                      "unsqueeze", "squeeze", "expand", "flatten", "unflatten", "select", "slice", "split",
                      "split_with_sizes", "unbind", "chunk", "narrow", "alias", "detach", "clone",
                      "contiguous", "as_strided", "view_as", "movedim", "numpy_T", "lift_fresh"})


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    reason: str = ""


@dataclass
class CheckReport:
    """Every check's verdict, and the subproblem instances the top-level made (name -> instances)."""

    passed: bool
    checks: list[CheckResult]
    instances: dict[str, list[InstanceConfig]] = field(default_factory=dict)
    wall_s: float = 0.0

    @classmethod
    def from_checks(cls, checks: list[CheckResult], instances: dict[str, list[InstanceConfig]] | None = None,
                    wall_s: float = 0.0) -> CheckReport:
        return cls(passed=all(c.passed for c in checks), checks=checks, instances=instances or {},
                   wall_s=wall_s)

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def reasons(self) -> list[str]:
        """One line per failed check that ran (checks skipped because of another are left out)."""
        return [f"{c.name}: {c.reason}" for c in self.failures() if not c.reason.startswith(_NOT_RUN)]

    def verdict(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "wall_s": round(self.wall_s, 3),
                "checks": [{"name": c.name, "passed": c.passed, "reason": c.reason} for c in self.checks]}


_NOT_RUN = "not run"


def _not_run(names: tuple[str, ...], because: str) -> list[CheckResult]:
    return [CheckResult(n, False, f"{_NOT_RUN}: {because}") for n in names]


# ---- Orchestrator side ----------------------------------------------------------------------------


def checks_job(problem_path: str | Path, folder: str | Path, config: RunConfig) -> Job:
    kwargs = {"problem_path": str(Path(problem_path).resolve()), "folder": str(Path(folder).resolve()),
              "seed": config.seed, "trials": config.trials, "eval_mode": config.eval_mode}
    return Job("mkevolve.verify.decomposition:run_checks", kwargs, config.timeout)


def report_from_outcome(outcome: JobOutcome) -> CheckReport:
    """The worker's report, or one failed check saying why the worker gave none."""
    if isinstance(outcome.value, CheckReport):
        outcome.value.wall_s = outcome.wall_s
        return outcome.value
    if outcome.ok:
        reason = f"the checker failed: {outcome.value}"
    else:
        reason = f"the checks did not finish: {outcome.reason}"
    return CheckReport.from_checks([CheckResult(EQUIVALENCE, False, reason)], wall_s=outcome.wall_s)


def check_decomposition(problem_path: str | Path, decomposition: Decomposition, pool: Executor,
                        config: RunConfig) -> CheckReport:
    """Write the decomposition to a scratch folder and run every check on it in a worker."""
    folder = Path(tempfile.mkdtemp(prefix="mkevolve-decomposition-"))
    try:
        decomposition.write(folder)
        return report_from_outcome(pool.run_many([checks_job(problem_path, folder, config)])[0])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- Static checks (no code runs) ----------------------------------------------------------------


def structure_problems(files: dict[str, str]) -> list[str]:
    """What keeps the files from being a decomposition at all."""
    top = files.get(PROBLEM_FILE)
    if top is None:
        return [f"there is no {PROBLEM_FILE}"]
    try:
        tree = parse_python(top)
    except SyntaxError as err:
        return [f"{PROBLEM_FILE} line {err.lineno}: syntax error: {err.msg}"]
    problems = []
    defined = _module_level_names(tree)
    if "Model" not in defined:
        problems.append(f"{PROBLEM_FILE} defines no class Model")
    if LOADER not in defined:
        problems.append(f"{PROBLEM_FILE} has no module-level {LOADER}(name) function; copy the one shown")
    missing_inputs = [n for n in ("get_inputs", "get_init_inputs") if n not in defined]
    if missing_inputs and "get_input_configs" not in defined:
        problems.append(f"{PROBLEM_FILE} must keep the original's {' and '.join(missing_inputs)}")
    loaded = referenced_subproblems(top)
    present = {Path(p).stem: s for p, s in files.items() if p.startswith(f"{PROBLEMS_DIR}/")}
    if not loaded:
        problems.append(f'{PROBLEM_FILE} loads no subproblem: bind each with X = {LOADER}("name")')
    problems += [f"invalid subproblem name '{n}': lower-case letters, digits, underscores, starting with a "
                 "letter" for n in list(dict.fromkeys(loaded + list(present))) if not is_valid_name(n)]
    problems += [f'{PROBLEM_FILE} loads "{n}" but there is no {PROBLEMS_DIR}/{n}.py' for n in loaded
                 if n not in present]
    problems += [f"{PROBLEMS_DIR}/{n}.py is never loaded by {PROBLEM_FILE}; remove it or use it"
                 for n in present if n not in loaded]
    for name, source in present.items():
        problems += _subproblem_file_problems(name, source)
    return problems


def _module_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _subproblem_file_problems(name: str, source: str) -> list[str]:
    where = f"{PROBLEMS_DIR}/{name}.py"
    try:
        tree = parse_python(source)
    except SyntaxError as err:
        return [f"{where} line {err.lineno}: syntax error: {err.msg}"]
    defined = _module_level_names(tree)
    problems = [] if "Model" in defined else [f"{where} defines no class Model"]
    if "get_input_configs" not in defined and not {"get_inputs", "get_init_inputs"} <= defined:
        problems.append(f"{where} needs get_inputs() and get_init_inputs(), or get_input_configs()")
    return problems


def top_level_violations(source: str) -> list[str]:
    """Ways the top-level's Model does more than build subproblem modules, call them and reshape results."""
    tree = parse_python(source)
    torch_names = _torch_bound_names(tree)
    aliases = {t.id for node in tree.body if isinstance(node, ast.Assign) and _is_loader_call(node.value)
               for t in node.targets if isinstance(t, ast.Name)}
    violations = [f"line {node.lineno}: defines class {node.name}; the top-level may define only Model"
                  for node in tree.body if isinstance(node, ast.ClassDef) and node.name != "Model"]
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return violations + ["defines no class Model"]
    methods = [n for n in model.body if isinstance(n, ast.FunctionDef)]
    init = next((m for m in methods if m.name == "__init__"), None)
    submodules: set[str] = set()
    if init is not None:
        scan = _InitScan(aliases, torch_names)
        scan.visit(init)
        violations += scan.violations
        submodules = scan.submodules
    method_names = {m.name for m in methods}
    for method in methods:
        if method is not init:
            violations += _ForwardScan(method, submodules, method_names, torch_names).run()
    for node in model.body:
        if not isinstance(node, (ast.FunctionDef, ast.Expr, ast.Pass)):
            violations.append(f"line {node.lineno}: class-level statement `{_short(node)}`; keep Model to "
                              "methods")
    return violations


def _torch_bound_names(tree: ast.Module) -> set[str]:
    """Names bound to torch or anything imported from it (torch, nn, F, Parameter, ...)."""
    names = {"torch", "nn", "F"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("torch"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            names.update(a.asname or a.name for a in node.names)
    return names


def _is_loader_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == LOADER


def _short(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node).replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class _InitScan(ast.NodeVisitor):
    """__init__ may compute sizes in Python and build subproblem modules; it builds nothing else."""

    def __init__(self, aliases: set[str], torch_names: set[str]):
        self.aliases = aliases
        self.torch_names = torch_names
        self.violations: list[str] = []
        self.submodules: set[str] = set()

    def visit_Assign(self, node: ast.Assign) -> None:
        if self._builds_subproblem(node.value):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and _root_name(target) == "self":
                    self.submodules.add(target.attr)
        self.generic_visit(node)

    def _builds_subproblem(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.aliases

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if _is_loader_call(node) or _is_loader_call(func):
            self.violations.append(f"line {node.lineno}: __init__ calls {LOADER}; bind every subproblem class "
                                   f'at module level (Name = {LOADER}("name")) and build it from that name')
            self.generic_visit(node)
            return
        allowed = (
            self._builds_subproblem(node)
            or (isinstance(func, ast.Name) and func.id in INIT_BUILTINS)
            or (isinstance(func, ast.Attribute) and func.attr == "__init__" and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name) and func.value.func.id == "super")
            or (isinstance(func, ast.Attribute) and _root_name(func) not in self.torch_names | {"self"}
                and _root_name(func) is not None and func.attr not in {"register_buffer", "register_parameter",
                                                                         "add_module", "register_module"})
        )
        if not allowed:
            self.violations.append(
                f"line {node.lineno}: __init__ calls `{_short(node)}`; the top-level may only build subproblem "
                "modules (no torch.nn layers, nn.ModuleList/Sequential, nn.Parameter, buffers or tensors)")
        self.generic_visit(node)


class _ForwardScan:
    """forward (and any other method) may call subproblem modules, reshape and view; it does no math."""

    def __init__(self, method: ast.FunctionDef, submodules: set[str], method_names: set[str],
                 torch_names: set[str]):
        self.method = method
        self.submodules = submodules
        self.method_names = method_names
        self.torch_names = torch_names
        args = method.args
        self.tensors = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self"}
        if args.vararg:
            self.tensors.add(args.vararg.arg)
        self.violations: list[str] = []

    def run(self) -> list[str]:
        self._statements(self.method.body)
        return self.violations

    def _statements(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self._check(stmt)
            self._bind(stmt)
            for child in ("body", "orelse", "finalbody"):
                self._statements(getattr(stmt, child, []) or [])
            for handler in getattr(stmt, "handlers", []) or []:
                self._statements(handler.body)

    def _own_expressions(self, stmt: ast.stmt) -> list[ast.AST]:
        """The expressions of a statement itself, without those of nested statement blocks."""
        nested = {id(s) for child in ("body", "orelse", "finalbody") for s in getattr(stmt, child, []) or []}
        return [n for n in ast.iter_child_nodes(stmt) if id(n) not in nested and not isinstance(n, ast.stmt)]

    def _check(self, stmt: ast.stmt) -> None:
        where = f"line {stmt.lineno}"
        if isinstance(stmt, ast.AugAssign) and (self._tensorish(stmt.target) or self._tensorish(stmt.value)):
            self.violations.append(f"{where}: `{_short(stmt)}` does math on tensors in {self.method.name}; "
                                   "move it into a subproblem")
        for expr in self._own_expressions(stmt):
            for node in ast.walk(expr):
                message = self._violation(node)
                if message:
                    self.violations.append(f"line {getattr(node, 'lineno', stmt.lineno)}: {message}")

    def _violation(self, node: ast.AST) -> str | None:
        method = self.method.name
        if isinstance(node, ast.BinOp) and (self._tensorish(node.left) or self._tensorish(node.right)):
            return f"`{_short(node)}` does math on tensors in {method}; move it into a subproblem"
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not) and self._tensorish(node.operand):
            return f"`{_short(node)}` does math on tensors in {method}; move it into a subproblem"
        if isinstance(node, ast.Compare) and any(self._tensorish(x) for x in [node.left, *node.comparators]):
            return f"`{_short(node)}` compares tensors in {method}; move it into a subproblem"
        if isinstance(node, ast.Call) and not self._allowed_call(node):
            return (f"`{_short(node)}` in {method}: the top-level may only call subproblem modules "
                    "(self.<name>(...)) and reshape or view their results; move this into a subproblem")
        return None

    def _allowed_call(self, node: ast.Call) -> bool:
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in FORWARD_BUILTINS
        if not isinstance(func, ast.Attribute):
            return False
        if isinstance(func.value, ast.Name) and func.value.id == "self":
            return func.attr in self.submodules or func.attr in self.method_names
        if isinstance(func.value, ast.Name) and func.value.id in self.torch_names:
            return func.value.id == "torch" and func.attr in VIEW_FUNCTIONS
        return func.attr in VIEW_METHODS | SHAPE_METHODS

    def _tensorish(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.tensors
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(self._tensorish(e) for e in node.elts)
        if isinstance(node, ast.Starred):
            return self._tensorish(node.value)
        if isinstance(node, ast.Subscript):
            return self._tensorish(node.value)
        if isinstance(node, ast.Attribute):
            if node.attr in SHAPE_ATTRIBUTES:
                return False
            return node.attr in VIEW_ATTRIBUTES and self._tensorish(node.value)
        if isinstance(node, ast.IfExp):
            return self._tensorish(node.body) or self._tensorish(node.orelse)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if isinstance(func.value, ast.Name) and func.value.id == "self":
                return func.attr in self.submodules
            if func.attr in SHAPE_METHODS:
                return False
            if isinstance(func.value, ast.Name) and func.value.id == "torch":
                return func.attr in VIEW_FUNCTIONS
            return func.attr in VIEW_METHODS and self._tensorish(func.value)
        return False

    def _bind(self, stmt: ast.stmt) -> None:
        targets: list[ast.AST] = []
        value = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        elif isinstance(stmt, ast.For):
            targets, value = [stmt.target], stmt.iter
        if value is None or not self._tensorish(value):
            return
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name):
                    self.tensors.add(node.id)


# ---- Worker side ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Signature:
    """Arguments bound to a signature (defaults applied), each described by shape/dtype or value."""

    items: tuple[tuple[str, Any], ...]

    def render(self) -> str:
        return ", ".join(f"{k}={_render(v)}" for k, v in self.items) or "(no arguments)"


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype).replace("torch.", ""))
    if isinstance(value, (list, tuple, torch.Size)):
        return ("seq", tuple(_describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _describe(v)) for k, v in value.items())))
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return ("value", repr(value))
    if isinstance(value, (int, float)):
        return ("number", float(value))
    if isinstance(value, (torch.dtype, torch.device)):
        return ("value", str(value))
    return ("object", type(value).__qualname__)


def _render(described: Any) -> str:
    kind, payload = described[0], described[1]
    if kind == "tensor":
        return f"{described[2]}[{', '.join(map(str, payload))}]"
    if kind == "seq":
        return "(" + ", ".join(_render(v) for v in payload) + ("," if len(payload) == 1 else "") + ")"
    if kind == "dict":
        return "{" + ", ".join(f"{k}: {_render(v)}" for k, v in payload) + "}"
    if kind == "number":
        return str(int(payload)) if float(payload).is_integer() else repr(payload)
    return str(payload)


def _bind(function, args: tuple, kwargs: dict, skip_self: bool) -> _Signature | None:
    """None when the arguments do not fit the signature at all."""
    signature = inspect.signature(function)
    try:
        bound = signature.bind(None, *args, **kwargs) if skip_self else signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    items = list(bound.arguments.items())[1 if skip_self else 0:]
    return _Signature(tuple((k, _describe(v)) for k, v in items))


@dataclass
class _SubproblemFacts:
    """A subproblem as its own file describes it: one (init, inputs) signature pair per config."""

    name: str
    configs: list[tuple[_Signature | None, _Signature | None]]
    has_config_list: bool


@dataclass
class _Instance:
    name: str
    module: Any
    init: _Signature | None
    calls: list[_Signature | None] = field(default_factory=list)
    attribute: str = "?"


def run_checks(problem_path: str, folder: str, seed: int = 0, trials: int = 3,
               eval_mode: bool = False) -> CheckReport:
    """Runs in a worker: every check on the decomposition in `folder` against the problem file."""
    start = time.monotonic()
    folder_path = Path(folder)
    files = {PROBLEM_FILE: _read(folder_path / PROBLEM_FILE)} if (folder_path / PROBLEM_FILE).is_file() else {}
    for path in sorted((folder_path / PROBLEMS_DIR).glob("*.py")):
        files[f"{PROBLEMS_DIR}/{path.name}"] = _read(path)
    problems = structure_problems(files)
    if problems:
        checks = [CheckResult(STRUCTURE, False, "; ".join(problems))]
        return CheckReport.from_checks(checks + _not_run(CHECKS[1:], "the structure check failed"),
                                       wall_s=time.monotonic() - start)
    run = _Run(Path(problem_path), folder_path, seed, trials, eval_mode)
    checks = run.all_checks(top_level_violations(files[PROBLEM_FILE]))
    return CheckReport.from_checks(checks, run.instance_configs(), wall_s=time.monotonic() - start)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class _Run:
    """One check run in a worker: loads the problem, the subproblems and the top-level, then compares."""

    def __init__(self, problem_path: Path, folder: Path, seed: int, trials: int, eval_mode: bool):
        self.problem_path = problem_path
        self.folder = folder
        self.seed = seed
        self.trials = max(1, trials)
        self.eval_mode = eval_mode
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.instances: list[_Instance] = []
        self.top_level_ops: list[str] = []
        self.runtime_impurities: list[str] = []
        fp32_strict()

    def all_checks(self, static_impurities: list[str]) -> list[CheckResult]:
        try:
            problem = load_problem(self.problem_path)
        except ProblemError as err:
            return [CheckResult(STRUCTURE, False, f"the original problem does not load: {err.reason}")] + \
                _not_run(CHECKS[1:], "the original problem does not load")
        facts, standalone = self._standalone()
        try:
            top = import_file(self.folder / PROBLEM_FILE, prefix="mkevolve_top_level")
        except ProblemError as err:
            return [CheckResult(STRUCTURE, False, f"{PROBLEM_FILE} does not import: {err.reason}"),
                    _purity(static_impurities, []), standalone] + \
                _not_run(CHECKS[3:], f"{PROBLEM_FILE} does not import")
        equivalence = self._equivalence(problem, top)
        coverage = self._coverage(facts) if self.instances else _not_run(
            (FORWARD_COVERAGE, INIT_COVERAGE), "the top-level built no subproblem module")
        return [CheckResult(STRUCTURE, True), _purity(static_impurities, self._runtime_impurities()),
                standalone, equivalence, *coverage]

    # -- standalone ----------------------------------------------------------------------------------

    def _standalone(self) -> tuple[dict[str, _SubproblemFacts], CheckResult]:
        facts, failures = {}, []
        for name in referenced_subproblems(_read(self.folder / PROBLEM_FILE)):
            path = self.folder / PROBLEMS_DIR / f"{name}.py"
            try:
                sub = load_problem(path)
                facts[name] = self._facts(name, sub)
            except ProblemError as err:
                failures.append(f"{name}: {err.reason}")
                continue
            failure = self._run_standalone(sub)
            if failure:
                failures.append(f"{name}: {failure}")
        if failures:
            return facts, CheckResult(STANDALONE, False, "; ".join(failures))
        return facts, CheckResult(STANDALONE, True)

    def _facts(self, name: str, sub) -> _SubproblemFacts:
        configs = []
        for config in sub.configs:
            init = call_inputs(sub.path, config.get_init_inputs, "get_init_inputs")
            inputs = make_inputs(sub.path, config, self.seed + 1, torch.device("cpu"))
            configs.append((_bind(sub.model_cls.__init__, tuple(init), {}, skip_self=True),
                            _bind(sub.model_cls.forward, tuple(inputs), {}, skip_self=True)))
        return _SubproblemFacts(name, configs, hasattr(sub.module, "get_input_configs"))

    def _run_standalone(self, sub) -> str | None:

        for index, config in enumerate(sub.configs):
            outputs = []
            for _ in range(2):
                try:
                    init = call_inputs(sub.path, config.get_init_inputs, "get_init_inputs")
                    model = build_model(sub.path, sub.model_cls, init, self.seed, self.device, self.eval_mode)
                    inputs = make_inputs(sub.path, config, self.seed + 1, self.device)
                    with torch.no_grad():
                        outputs.append(flatten_outputs(model(*inputs)))
                except ProblemError as err:
                    return f"config {index}: {err.reason}"
                except Exception as err:  # noqa: BLE001  (untrusted code: any error is the verdict)
                    return f"config {index}: forward raised {type(err).__name__}: {err}"
            if not all(isinstance(t, torch.Tensor) for t in outputs[0]):
                return f"config {index}: forward must return a tensor or a tuple of tensors"
            # Within the verifier's tolerance, not bit for bit: some GPU kernels (transposed convolutions in
            # cuDNN) add in a different order from run to run.
            if _compare(outputs[0], outputs[1], ATOL, RTOL) is not None:
                return (f"config {index}: two runs with the same seeds differ beyond atol=rtol={ATOL:g} "
                        "(the module is non-deterministic)")
        return None

    # -- equivalence, with recording ----------------------------------------------------------------

    def _equivalence(self, problem, top) -> CheckResult:
        classes = _subproblem_classes(top, self.folder / PROBLEMS_DIR)
        for index, config in enumerate(problem.configs):
            try:
                init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
                reason = self._compare_config(problem, top, classes, init, config)
            except ProblemError as err:
                reason = err.reason
            if reason:
                prefix = f"config {index}: " if len(problem.configs) > 1 else ""
                return CheckResult(EQUIVALENCE, False, prefix + reason)
        return CheckResult(EQUIVALENCE, True)

    def _compare_config(self, problem, top, classes: dict, init: list, config) -> str | None:

        reference = build_model(problem.path, problem.model_cls, init, self.seed, self.device, self.eval_mode)
        first = len(self.instances)
        with _RecordConstruction(classes, self.instances):
            try:
                decomposed = build_model(self.folder / PROBLEM_FILE, top.Model, init, self.seed, self.device,
                                         self.eval_mode, what="top-level Model")
            except ProblemError as err:
                return err.reason
        new = self.instances[first:]
        self.runtime_impurities += _structure_impurities(decomposed, new, classes)
        for trial in range(self.trials):
            inputs = make_inputs(problem.path, config, self.seed + 1 + trial, self.device)
            with torch.no_grad():
                seed_everything(self.seed + 1000 + trial)
                expected = flatten_outputs(reference(*inputs))
                seed_everything(self.seed + 1000 + trial)
                try:
                    if trial == 0:
                        with _RecordForward(new, self.top_level_ops):
                            actual = flatten_outputs(decomposed(*inputs))
                    else:
                        actual = flatten_outputs(decomposed(*inputs))
                except Exception as err:  # noqa: BLE001  (untrusted code: any error is the verdict)
                    return f"top-level forward raised {type(err).__name__}: {err}"
            mismatch = _compare(expected, actual, ATOL, RTOL)
            if mismatch:
                return (f"trial {trial}: {mismatch}. Same seed, same constructor arguments: build the "
                        "subproblem modules in the order the original creates its layers, so the weights match")
        return None

    def _runtime_impurities(self) -> list[str]:
        ops = sorted(set(self.top_level_ops) - VIEW_OPS)
        found = list(dict.fromkeys(self.runtime_impurities))
        if ops:
            found.append(f"forward ran {', '.join('aten.' + o for o in ops)} outside every subproblem module; "
                         "move that computation into a subproblem")
        return found

    # -- coverage -----------------------------------------------------------------------------------

    def _coverage(self, facts: dict[str, _SubproblemFacts]) -> list[CheckResult]:
        forward_gaps, init_gaps = [], []
        by_name: dict[str, list[_Instance]] = {}
        for instance in self.instances:
            by_name.setdefault(instance.name, []).append(instance)
        for name, instances in by_name.items():
            fact = facts.get(name)
            if fact is None:
                forward_gaps.append(f"{name}: not checked, the subproblem does not load on its own")
                continue
            forward_gaps += _forward_gaps(fact, instances)
            init_gaps += _init_gaps(fact, instances)
        return [CheckResult(FORWARD_COVERAGE, not forward_gaps, "; ".join(forward_gaps)),
                CheckResult(INIT_COVERAGE, not init_gaps, "; ".join(init_gaps))]

    def instance_configs(self) -> dict[str, list[InstanceConfig]]:
        configs: dict[str, list[InstanceConfig]] = {}
        for instance in self.instances:
            calls = tuple(dict.fromkeys(c.render() if c else "(unbindable call)" for c in instance.calls))
            init = instance.init.render() if instance.init else "(unbindable arguments)"
            configs.setdefault(instance.name, []).append(InstanceConfig(instance.attribute, init, calls))
        return configs


def _purity(static: list[str], runtime: list[str]) -> CheckResult:
    found = static + runtime
    return CheckResult(PURITY, not found, "; ".join(found))


def _subproblem_classes(top, problems_dir: Path) -> dict[type, str]:
    """Subproblem Model classes the top-level module bound, by the file they came from."""
    classes = {}
    for value in vars(top).values():
        if isinstance(value, type) and issubclass(value, nn.Module):
            module = sys.modules.get(value.__module__)
            origin = Path(getattr(module, "__file__", "") or "")
            if origin.parent.resolve() == problems_dir.resolve():
                classes[value] = origin.stem
    return classes


class _RecordConstruction:
    """Records every construction of a subproblem class (arguments bound to its __init__) while active."""

    def __init__(self, classes: dict[type, str], sink: list[_Instance]):
        self.classes = classes
        self.sink = sink
        self.saved: list[tuple[type, Any]] = []

    def __enter__(self) -> _RecordConstruction:
        for cls, name in self.classes.items():
            self.saved.append((cls, cls.__dict__.get("__init__")))
            cls.__init__ = self._recording(cls, name, cls.__init__)
        return self

    def _recording(self, cls: type, name: str, original):
        sink = self.sink

        def init(module, *args, **kwargs):
            if type(module) is cls:
                sink.append(_Instance(name, module, _bind(original, args, kwargs, skip_self=True)))
            original(module, *args, **kwargs)

        return init

    def __exit__(self, *exc) -> None:
        for cls, own in self.saved:
            if own is None:
                del cls.__init__
            else:
                cls.__init__ = own


def _structure_impurities(model, instances: list[_Instance], classes: dict[type, str]) -> list[str]:
    """What the built top-level holds besides subproblem modules."""
    found = [f"Model registers its own parameter '{n}'; parameters belong in a subproblem"
             for n in model._parameters]
    found += [f"Model registers its own buffer '{n}'; buffers belong in a subproblem" for n in model._buffers]
    children = dict(model.named_children())
    for attribute, child in children.items():
        if type(child) not in classes:
            found.append(f"child module '{attribute}' is a {type(child).__module__}.{type(child).__qualname__}, "
                         "not a subproblem module; the top-level builds only subproblem modules")
    by_id = {id(child): attribute for attribute, child in children.items()}
    for instance in instances:
        instance.attribute = by_id.get(id(instance.module), "?")
        if instance.attribute == "?":
            found.append(f"a {instance.name} module is built but not stored as an attribute of Model "
                         "(self.<name> = ...); lists and dicts of modules are not allowed")
    return found


class _RecordForward:
    """Forward hooks on every subproblem instance (their inputs), and the ATen ops run outside them."""

    def __init__(self, instances: list[_Instance], ops: list[str]):
        self.instances = instances
        self.ops = ops
        self.handles = []
        self.mode = None

    def __enter__(self) -> _RecordForward:
        ops = self.ops
        state = {"depth": 0}

        class OutsideSubproblems(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if state["depth"] == 0:
                    ops.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        for instance in self.instances:
            self.handles.append(instance.module.register_forward_pre_hook(
                self._pre_hook(instance, state), with_kwargs=True))
            self.handles.append(instance.module.register_forward_hook(self._post_hook(state)))
        self.mode = OutsideSubproblems()
        self.mode.__enter__()
        return self

    @staticmethod
    def _pre_hook(instance: _Instance, state: dict):
        def hook(module, args, kwargs):
            instance.calls.append(_bind(type(module).forward, tuple(args), dict(kwargs), skip_self=True))
            state["depth"] += 1

        return hook

    @staticmethod
    def _post_hook(state: dict):
        def hook(module, args, output):
            state["depth"] -= 1

        return hook

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        for handle in self.handles:
            handle.remove()


def _compare(expected: list, actual: list, atol: float, rtol: float) -> str | None:
    if len(expected) != len(actual):
        return f"the original returns {len(expected)} output(s), the top-level {len(actual)}"
    for index, (a, b) in enumerate(zip(expected, actual)):
        label = f"output {index}" if len(expected) > 1 else "the output"
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if a != b:
                return f"{label} differs: {a!r} != {b!r}"
            continue
        if a.shape != b.shape:
            return f"{label} has shape {list(b.shape)}, expected {list(a.shape)}"
        if a.dtype != b.dtype:
            return f"{label} has dtype {b.dtype}, expected {a.dtype}"
        if not torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf"))
            return f"{label} differs: max abs error {diff.max().item():.3g} (tolerance atol=rtol={ATOL:g})"
    return None


def _forward_gaps(fact: _SubproblemFacts, instances: list[_Instance]) -> list[str]:
    offered = {inputs for _, inputs in fact.configs if inputs is not None}
    gaps = []
    for instance in instances:
        for call in dict.fromkeys(instance.calls):
            if call is None:
                gaps.append(f"{fact.name} ('{instance.attribute}') is called with arguments its forward does not "
                            "accept")
            elif call not in offered:
                gaps.append(f"{fact.name} ('{instance.attribute}') is called with {call.render()}, but its "
                            f"inputs offer only {_offer(offered)}; add a get_input_configs entry for this call")
    return gaps


def _init_gaps(fact: _SubproblemFacts, instances: list[_Instance]) -> list[str]:
    offered = {init for init, _ in fact.configs if init is not None}
    gaps = []
    for instance in instances:
        if instance.init is None:
            gaps.append(f"{fact.name} ('{instance.attribute}') is built with arguments its __init__ does not accept")
        elif instance.init not in offered:
            gaps.append(f"{fact.name} ('{instance.attribute}') is built with {instance.init.render()}, but its "
                        f"init inputs offer only {_offer(offered)}")
    count, entries = len(instances), len(fact.configs)
    if count > 1 and not fact.has_config_list:
        gaps.append(f"{fact.name} is instantiated {count} times, so it must define get_input_configs() with one "
                    "entry per instantiation")
    elif fact.has_config_list and entries != count:
        gaps.append(f"{fact.name} has {entries} get_input_configs() entries but is instantiated {count} "
                    "time(s); keep exactly one entry per instantiation")
    elif count > 1 and not gaps:
        gaps += _unpaired(fact, instances)
    return gaps


def _offer(signatures: set) -> str:
    rendered = sorted(s.render() for s in signatures)
    return " | ".join(rendered) if rendered else "nothing"


def _unpaired(fact: _SubproblemFacts, instances: list[_Instance]) -> list[str]:
    """Instantiations and get_input_configs entries left over by a maximum one-to-one pairing (same
    constructor arguments, and every call's inputs equal to the entry's)."""
    graph = nx.Graph()
    left = [("instance", i) for i in range(len(instances))]
    right = [("config", j) for j in range(len(fact.configs))]
    graph.add_nodes_from(left + right)
    for i, instance in enumerate(instances):
        for j, (init, inputs) in enumerate(fact.configs):
            if instance.init == init and all(call == inputs for call in instance.calls):
                graph.add_edge(("instance", i), ("config", j))
    matching = nx.bipartite.hopcroft_karp_matching(graph, top_nodes=left)
    gaps = [f"{fact.name}: instantiation '{instances[i].attribute}' has no get_input_configs() entry of its own "
            "(each entry serves one instantiation)" for kind, i in left if (kind, i) not in matching]
    for kind, j in right:
        if (kind, j) not in matching:
            init, inputs = fact.configs[j]
            described = "; ".join(s.render() for s in (init, inputs) if s is not None)
            gaps.append(f"{fact.name}: get_input_configs()[{j}] ({described}) matches no instantiation the "
                        "top-level makes")
    return gaps
