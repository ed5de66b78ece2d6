"""Static decomposition checks (no code runs): the files form a decomposition, and the top-level only wires
subproblem modules together."""

from __future__ import annotations

import ast
from pathlib import Path

from mkevolve.codebase import LOADER, PROBLEM_FILE, PROBLEMS_DIR, is_valid_name, referenced_subproblems
from mkevolve.pysource import parse_python

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
# What a top-level's __init__ may loop over to re-initialise its subproblems' weights after building them all,
# as the original does (MobileNetV2's `for m in self.modules(): nn.init.kaiming_normal_(m.weight)`).
REINIT_ITERATORS = frozenset({"modules", "named_modules", "children", "named_children", "parameters",
                              "named_parameters"})


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
    """__init__ may compute sizes in Python and build subproblem modules; it builds nothing else.

    It may also re-initialise what it built, in a loop over self.modules() (or another REINIT_ITERATORS method)
    whose body only tests items (isinstance, `is None`) and calls torch.nn.init functions on them. Such a loop
    writes new values into the subproblems' parameters and does no math on inputs; whether the values are the
    original's is for the equivalence check, which compares outputs."""

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

    def visit_For(self, node: ast.For) -> None:
        call = node.iter
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in REINIT_ITERATORS and isinstance(call.func.value, ast.Name)
                and call.func.value.id == "self"):
            self.generic_visit(node)
            return
        loop = f"a loop over self.{call.func.attr}() in __init__ may only test items and call torch.nn.init " \
               "functions on them"
        if call.args or call.keywords or node.orelse:
            self.violations.append(f"line {node.lineno}: {loop}, with no arguments to the method and no else block")
        items = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        for stmt in node.body:
            self._reinit_statement(stmt, loop, items)

    def _reinit_statement(self, stmt: ast.stmt, loop: str, items: set[str]) -> None:
        if isinstance(stmt, ast.If):
            for part in (stmt.test, *stmt.body, *stmt.orelse):
                if isinstance(part, ast.stmt):
                    self._reinit_statement(part, loop, items)
                else:
                    self._reinit_expression(part, loop, items)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and self._is_init_function(stmt.value):
            for argument in (*stmt.value.args, *(k.value for k in stmt.value.keywords)):
                self._reinit_expression(argument, loop, items)
        elif not isinstance(stmt, ast.Pass):
            self.violations.append(f"line {stmt.lineno}: {loop}; `{_short(stmt)}` does more")

    def _reinit_expression(self, node: ast.expr, loop: str, items: set[str]) -> None:
        """Tests and init arguments may use builtins, shape queries, torch.nn.init helpers (calculate_gain) and
        functions of other modules (math.sqrt); nothing that makes or changes a tensor."""
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            func, root = call.func, _root_name(call.func)
            allowed = ((isinstance(func, ast.Name) and func.id in INIT_BUILTINS)
                       or (isinstance(func, ast.Attribute) and func.attr in SHAPE_METHODS)
                       or self._in_init_namespace(func)
                       or (isinstance(func, ast.Attribute) and root is not None
                           and root not in self.torch_names | items | {"self"}))
            if not allowed:
                self.violations.append(f"line {call.lineno}: {loop}; `{_short(call)}` does more")

    def _is_init_function(self, call: ast.Call) -> bool:
        """nn.init.<name>_, torch.nn.init.<name>_ or init.<name>_ imported from torch.nn: an in-place init."""
        return self._in_init_namespace(call.func) and call.func.attr.endswith("_")

    def _in_init_namespace(self, func: ast.expr) -> bool:
        namespace = func.value if isinstance(func, ast.Attribute) else None
        named_init = (isinstance(namespace, ast.Attribute) and namespace.attr == "init") or \
                     (isinstance(namespace, ast.Name) and namespace.id == "init")
        return named_init and _root_name(func) in self.torch_names


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
