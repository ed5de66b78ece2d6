"""What a solution's names stand for (imports, torch.nn layers, module constants, Triton kernels), collected
before the rules run, and the part of its module that the verifier executes."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from mkevolve.verify.cheating.torch_compute import is_torch_layer_class


def under(dotted: str, prefix: str) -> bool:
    return dotted == prefix or dotted.startswith(prefix + ".")


@dataclass
class Names:
    """What the module's names stand for, collected before the rules run."""

    aliases: dict[str, str] = field(default_factory=dict)     # name or "self.x" -> dotted path
    layers: dict[str, str] = field(default_factory=dict)      # name or "self.x" -> torch.nn class
    constants: dict[str, object] = field(default_factory=dict)  # module-level literal constants
    kernels: dict[str, int] = field(default_factory=dict)     # @triton.jit function -> line
    containers: frozenset[str] = frozenset()  # names only ever bound to a Python set/dict/list
    table_dtypes: frozenset[int] = frozenset()  # ids of dtype names inside lookup-only dtype tables

    def dotted(self, node: ast.AST) -> str | None:
        """The import-rooted dotted path an expression stands for, or None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return self.aliases.get(f"self.{node.attr}")
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if is_literal_getattr(node):
            base = self.dotted(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def layer_key(self, node: ast.AST) -> str | None:
        """The key of a torch.nn layer that calling `node` would run, or None."""
        if isinstance(node, ast.Attribute) and node.attr in ("forward", "__call__"):
            return self.layer_key(node.value)
        if isinstance(node, ast.Subscript):
            return self.layer_key(node.value)
        key = self_key(node)
        return key if key in self.layers else None


def is_literal_getattr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def self_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def root_name(node: ast.AST) -> str | None:
    """The variable an attribute/subscript chain starts from (`torch` in torch.cuda.Event)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Call):
            if not node.args:
                return None
            node = node.args[0]
        else:
            node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`, whose body the verifier never runs."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    has_name = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    has_main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return has_name and has_main


def executed_module(tree: ast.Module) -> ast.Module:
    """The module without its `if __name__ == "__main__":` blocks."""
    body = [stmt for stmt in tree.body if not _is_main_guard(stmt)]
    return ast.Module(body=body, type_ignores=tree.type_ignores)


def collect_names(tree: ast.Module) -> Names:
    names = Names(aliases=_import_aliases(tree), constants=_module_constants(tree))
    assignments = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
    for node in assignments:
        _record_assignment(names, node)
    return names


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    """Every name an import binds, anywhere in the module, to the dotted path it stands for."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            module = "." * node.level + node.module
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    return aliases


def _module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level `NAME = <literal>` assignments (how a dot precision is often spelled)."""
    constants = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = stmt.value.value
    return constants


def _record_assignment(names: Names, node: ast.Assign) -> None:
    """Aliases (`mm = torch.matmul`) and layers (`self.fc = nn.Linear(...)`) made by assignment."""
    keys = [key for key in map(self_key, node.targets) if key]
    if not keys:
        return
    dotted = names.dotted(node.value)
    layer = _layer_built_by(names, node.value)
    for key in keys:
        if dotted:
            names.aliases[key] = dotted
        if layer:
            names.layers[key] = layer


def _layer_built_by(names: Names, value: ast.AST) -> str | None:
    """The torch.nn layer class a call builds; containers count only when they hold a layer."""
    if not isinstance(value, ast.Call):
        return None
    dotted = names.dotted(value.func)
    if dotted is None or not under(dotted, "torch.nn"):
        return None
    if is_torch_layer_class(dotted):
        return dotted
    if dotted.rsplit(".", 1)[-1] in ("Sequential", "ModuleList", "ModuleDict"):
        inner = (_layer_built_by(names, n) for n in ast.walk(value) if n is not value)
        return next((dotted for found in inner if found), None)
    return None


def jit_decorated(names: Names, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        dotted = names.dotted(target)
        if dotted and dotted.split(".")[0] == "triton" and dotted.rsplit(".", 1)[-1] == "jit":
            return True
    return False


def kernel_names(names: Names, tree: ast.Module) -> dict[str, int]:
    kernels = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and jit_decorated(names, node):
            kernels[node.name] = node.lineno
        elif isinstance(node, ast.Call) and node.args and _jit_decorated_call(names, node):
            kernels[ast.unparse(node.args[0])] = node.lineno
    return kernels


def _jit_decorated_call(names: Names, node: ast.Call) -> bool:
    """`triton.jit(fn)` written as a call rather than a decorator."""
    dotted = names.dotted(node.func)
    return bool(dotted) and dotted.split(".")[0] == "triton" and dotted.rsplit(".", 1)[-1] == "jit"
