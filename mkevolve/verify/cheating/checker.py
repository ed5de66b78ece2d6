"""The visitor that walks the executed part of a solution and applies every static rule, by region."""

from __future__ import annotations

import ast
from enum import Enum

import torch

from mkevolve.verify.cheating.forbidden import (
    DOTTED_RULES,
    INPUT_FUNCTIONS,
    KERNEL_LIBRARIES,
    REFERENCE_ATTRIBUTES,
    REFERENCE_BUILTINS,
    REFERENCE_IMPORTED_NAMES,
    REFERENCE_MODULE_PARTS,
    REFERENCE_MODULES,
    THREAD_MODULES,
)
from mkevolve.verify.cheating.names import Names, is_literal_getattr, jit_decorated, root_name, self_key, under
from mkevolve.verify.cheating.precision import (
    ACCEPTED_DOT_PRECISIONS,
    DOT_ADVICE,
    LOW_PRECISION_METHODS,
    PRECISION_SETTINGS,
    low_precision_dtype,
    stated_dot_precision,
)
from mkevolve.verify.cheating.rules import KERNEL_ADVICE, Rule, Violation, is_less_precise
from mkevolve.verify.cheating.torch_compute import (
    HOST_ESCAPE_METHODS,
    TENSOR_MATH_METHODS,
    host_torch_reason,
    is_tensor_class,
)


class _Region(Enum):
    """Where code runs: SETUP before any input exists, HOST around launches, KERNEL in Triton."""

    SETUP = "setup"
    HOST = "host"
    KERNEL = "kernel"


class StaticChecker(ast.NodeVisitor):
    """Walks the executed part of a solution and records every rule it breaks."""

    def __init__(self, names: Names, reference_dtype: torch.dtype, problem_name: str | None):
        self.names = names
        self.reference_dtype = reference_dtype
        self.problem_name = problem_name
        self.violations: list[Violation] = []
        self.region = _Region.SETUP
        self.launched = False
        self._inner: set[int] = set()   # ids of name nodes that are part of a longer chain
        self._called: set[int] = set()  # ids of expressions that are called

    @property
    def _reference_module_parts(self) -> frozenset[str]:
        extra = {self.problem_name} if self.problem_name else set()
        return REFERENCE_MODULE_PARTS | extra

    @property
    def fp32_reference(self) -> bool:
        return self.reference_dtype == torch.float32

    def flag(self, rule: Rule, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(rule, message, getattr(node, "lineno", None)))

    def in_region(self, region: _Region, nodes: list[ast.AST]) -> None:
        outer, self.region = self.region, region
        for node in nodes:
            self.visit(node)
        self.region = outer

    # -- definitions --------------------------------------------------------------------------

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body:
            # A copied get_inputs() makes test data with torch.randn; the verifier uses the
            # problem's own, so these run (if ever) before any input exists.
            if isinstance(stmt, ast.FunctionDef) and stmt.name in INPUT_FUNCTIONS:
                self._visit_function(stmt, _Region.SETUP)
            else:
                self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        region = _Region.KERNEL if jit_decorated(self.names, node) else _Region.HOST
        self._visit_function(node, region)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, body_region: _Region) -> None:
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.flag(Rule.TENSOR_SUBCLASS, node, f"`{node.name}` changes what tensor operations "
                      "do (a tensor subclass or override); return plain torch.Tensor outputs "
                      "computed by your Triton kernels")
        for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                self.visit(child)
        self.in_region(body_region, node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            dotted = self.names.dotted(base)
            if dotted and is_tensor_class(dotted):
                self.flag(Rule.TENSOR_SUBCLASS, base, f"class `{node.name}` subclasses `{dotted}`: "
                          "a tensor subclass can fake or defer results; return plain torch.Tensor "
                          "outputs computed by your Triton kernels")
        for child in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(child)
        for stmt in node.body:
            # A constructor at setup time runs before any input exists: building layers and
            # preparing weights there is how a solution matches the reference's parameters.
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__" and self.region is _Region.SETUP:
                self._visit_function(stmt, _Region.SETUP)
            else:
                self.visit(stmt)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for child in [*node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                self.visit(child)
        self.in_region(_Region.HOST if self.region is not _Region.KERNEL else self.region,
                       [node.body])

    # -- statements ---------------------------------------------------------------------------

    def visit_Try(self, node: ast.AST) -> None:
        self.flag(Rule.TRY_EXCEPT, node, "`try:` block: an exception handler can hide a failing "
                  "kernel behind a fallback; remove the try/except and let errors surface")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name, level=0)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._check_module(node, module, node.level)
        for alias in node.names:
            if alias.name in REFERENCE_IMPORTED_NAMES:
                self.flag(Rule.REFERENCE_ACCESS, node, f"imports `{alias.name}` from `{module}`: "
                          "a solution may not use the reference problem; compute from the inputs")
            elif alias.name == "*" and under(module, "torch"):
                self.flag(Rule.TORCH_COMPUTE, node, f"`from {module} import *` hides which PyTorch "
                          "functions forward calls; import names explicitly")
            else:
                self._check_dotted(node, f"{module}.{alias.name}", called=False)

    def _check_module(self, node: ast.AST, module: str, level: int) -> None:
        parts = module.split(".") if module else []
        top = parts[0] if parts else ""
        if level == 0 and top in KERNEL_LIBRARIES:
            self.flag(Rule.TORCH_COMPUTE, node, f"imports `{module}`, another kernel library; the "
                      "work must be done by your own @triton.jit kernels")
        elif level == 0 and top in THREAD_MODULES:
            self.flag(Rule.THREADS, node, f"imports `{module}`: work on other threads or processes "
                      "escapes the launch checks and the timer; run everything on the calling thread")
        elif level == 0 and top in REFERENCE_MODULES:
            self.flag(Rule.REFERENCE_ACCESS, node, f"imports `{module}`, which can reach other "
                      "modules, frames or objects (the reference included); compute from the inputs only")
        elif top in ("mock",) or under(module, "unittest.mock"):
            self.flag(Rule.MONKEYPATCH, node, f"imports `{module}`, which patches other modules; "
                      "leave torch, triton and the timers unchanged")
        elif set(parts) & self._reference_module_parts:
            self.flag(Rule.REFERENCE_ACCESS, node, f"imports `{module}`, which looks like the "
                      "reference problem; a solution must compute from its inputs only")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        if isinstance(node.op, ast.MatMult):
            self._flag_matmul_operator(node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def _check_target(self, target: ast.AST, value: ast.AST | None = None) -> None:
        """Writing into an imported module (torch.cuda.synchronize = ...) is a monkeypatch."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_target(element)
            return
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        root = root_name(target)
        if root is None or root == "self" or root not in self.names.aliases:
            return
        shown = ast.unparse(target)
        if isinstance(target, ast.Attribute) and target.attr in PRECISION_SETTINGS:
            # Turning TF32 off (or asking for IEEE fp32) only restates the reference's setting.
            if isinstance(value, ast.Constant) and value.value in (False, "ieee"):
                return
            self.flag(Rule.PRECISION, target, f"`{shown} = ...` lowers fp32 matmul precision; the "
                      "reference is fp32 with TF32 off, so leave these settings alone")
            return
        self.flag(Rule.MONKEYPATCH, target, f"assigns to `{shown}`, changing the imported module "
                  f"`{self.names.aliases[root]}` that the verifier and timer rely on; never modify "
                  "torch, triton, timing functions or the environment")

    # -- expressions --------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        self._called.add(id(node.func))
        if isinstance(node.func, ast.Subscript) and self.region is not _Region.KERNEL:
            self.launched = True
        if is_literal_getattr(node):
            self._check_attribute_name(node, node.args[1].value)
            dotted = self.names.dotted(node)
            if dotted is not None:
                self._inner.add(id(node.args[0]))
                self._check_dotted(node, dotted, called=id(node) in self._called)
        elif self._is_dynamic_torch_lookup(node):
            self.flag(Rule.TORCH_COMPUTE, node, f"`{ast.unparse(node)}` looks up a torch function by "
                      "a computed name; name what you call directly (forward may only allocate, "
                      "view and launch)")
        self._check_call(node)
        self.generic_visit(node)

    def _is_dynamic_torch_lookup(self, node: ast.Call) -> bool:
        """`getattr(torch, computed_name)` or `vars(torch)`: a torch function chosen by string."""
        if self.region is not _Region.HOST or not isinstance(node.func, ast.Name) or not node.args:
            return False
        is_lookup = (node.func.id == "getattr" and len(node.args) >= 2) or node.func.id == "vars"
        target = self.names.dotted(node.args[0])
        return is_lookup and target is not None and under(target, "torch")

    def _check_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            self._check_setattr(node, node.args[0])
        if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__") and node.args:
            self._check_setattr(node, node.args[0])
        if isinstance(func, ast.Attribute) and func.attr == "run":
            self.launched = self.launched or self_key(func.value) in self.names.kernels
        dotted = self.names.dotted(func) or ""
        if dotted == "triton.language.dot":
            self._check_dot(node)
        if dotted in ("triton.Config", "triton.autotune", "triton.runtime.Config", "triton.runtime.autotune"):
            self._check_launch_hooks(node)
        if not dotted and isinstance(func, ast.Attribute):
            self._check_method(node, func.attr)
        layer = self.names.layer_key(func)
        if layer and self.region is _Region.HOST:
            self.flag(Rule.TORCH_COMPUTE, node, f"`{ast.unparse(func)}(...)` runs the torch.nn layer "
                      f"{self.names.layers[layer]} in forward; keep the layer in __init__ for its "
                      "weights, but compute with them in a Triton kernel (pass its .weight and .bias)")

    def _check_setattr(self, node: ast.Call, obj: ast.AST) -> None:
        root = root_name(obj)
        if root is not None and root != "self" and root in self.names.aliases:
            self.flag(Rule.MONKEYPATCH, node, f"`{ast.unparse(node.func)}` on `{ast.unparse(obj)}` "
                      "changes an imported module that the verifier and timer rely on; never modify "
                      "torch, triton or timing functions")

    def _check_launch_hooks(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg in ("pre_hook", "post_hook"):
                self.flag(Rule.MONKEYPATCH, keyword.value, f"`{keyword.arg}=` runs host code inside "
                          "the kernel launch, out of sight of the checks; prepare buffers in forward "
                          "(or use reset_to_zero) instead")

    def _check_method(self, node: ast.Call, method: str) -> None:
        if method in LOW_PRECISION_METHODS:
            if is_less_precise(LOW_PRECISION_METHODS[method], self.reference_dtype):
                self.flag(Rule.PRECISION, node, f"`.{method}()` converts to a lower precision than "
                          f"the {self.reference_dtype} reference; keep data and math in the "
                          "reference dtype")
        elif self.region is not _Region.HOST:
            return
        elif method in TENSOR_MATH_METHODS and not self._is_python_container(node.func.value):
            self.flag(Rule.TORCH_COMPUTE, node, f"`.{method}(...)` is tensor math run by PyTorch "
                      f"outside a kernel; {KERNEL_ADVICE}")
        elif method in HOST_ESCAPE_METHODS:
            self.flag(Rule.TORCH_COMPUTE, node, f"`.{method}()` moves the data to Python/NumPy, "
                      f"where the work would be done outside a kernel; {KERNEL_ADVICE}")

    def _is_python_container(self, receiver: ast.AST) -> bool:
        """`seen.add(k)` or `self.seen.add(k)` where the source only ever binds `seen` to a set/dict/list."""
        if isinstance(receiver, ast.Name):
            return receiver.id in self.names.containers
        return (isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name)
                and receiver.value.id == "self" and receiver.attr in self.names.containers)

    def _check_dot(self, node: ast.Call) -> None:
        if not self.fp32_reference:
            return
        stated = stated_dot_precision(node, self.names.constants)
        if stated is None:
            self.flag(Rule.PRECISION, node, "tl.dot states no precision, and Triton's default for "
                      f"fp32 inputs is tf32 (about 1e-3 relative error); {DOT_ADVICE}")
        elif stated == "unknown":
            self.flag(Rule.PRECISION, node, "tl.dot's precision is not a literal the checker can "
                      f"read; {DOT_ADVICE}")
        elif stated not in ACCEPTED_DOT_PRECISIONS:
            self.flag(Rule.PRECISION, node, f'tl.dot with input_precision="{stated}" is less '
                      f"accurate than the fp32 reference; {DOT_ADVICE}")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self._flag_matmul_operator(node)
        self.generic_visit(node)

    def _flag_matmul_operator(self, node: ast.AST) -> None:
        if self.region is _Region.HOST:
            self.flag(Rule.TORCH_COMPUTE, node, "the `@` operator runs a PyTorch matmul outside a "
                      'kernel; write the GEMM in Triton with tl.dot(..., input_precision="ieee")')

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._inner.add(id(node.value))
        self._check_attribute_name(node, node.attr)
        if isinstance(node.ctx, ast.Load) and id(node) not in self._inner:
            dotted = self.names.dotted(node)
            if dotted:
                self._check_dotted(node, dotted, called=id(node) in self._called)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        if node.id in REFERENCE_BUILTINS and node.id not in self.names.aliases:
            self.flag(Rule.REFERENCE_ACCESS, node, f"`{node.id}` can run hidden code or reach other "
                      "modules' globals (the reference included); write plain code over the inputs")
        elif id(node) not in self._inner and node.id in self.names.aliases:
            self._check_dotted(node, self.names.aliases[node.id], called=id(node) in self._called)

    def _check_attribute_name(self, node: ast.AST, attr: str) -> None:
        if attr in REFERENCE_ATTRIBUTES:
            self.flag(Rule.REFERENCE_ACCESS, node, f"`{attr}` reaches frames, globals or live "
                      "objects of other code (the reference and verifier included); compute from "
                      "the inputs only")
        elif attr in ("as_subclass", "_make_subclass", "_make_wrapper_subclass"):
            self.flag(Rule.TENSOR_SUBCLASS, node, f"`{attr}` builds a tensor subclass, which can "
                      "fake or defer results; return plain torch.Tensor outputs")
        elif attr == "add_pre_run_hook":
            self.flag(Rule.MONKEYPATCH, node, "`add_pre_run_hook` runs host code inside the kernel "
                      "launch, out of sight of the checks; do that work in forward")

    def _check_dotted(self, node: ast.AST, dotted: str, called: bool) -> None:
        for entry in DOTTED_RULES:
            if under(dotted, entry.prefix):
                self.flag(entry.rule, node, f"`{dotted}`: {entry.why}")
                return
        leaf = dotted.rsplit(".", 1)[-1]
        low = low_precision_dtype(leaf)
        if low is not None and dotted.split(".")[0] in ("torch", "triton", "numpy"):
            # Naming a dtype in a table that maps it to itself computes nothing (see exemptions.table_dtypes).
            if is_less_precise(low, self.reference_dtype) and id(node) not in self.names.table_dtypes:
                self.flag(Rule.PRECISION, node, f"`{dotted}` is a lower-precision dtype than the "
                          f"{self.reference_dtype} reference; keep loads, math and accumulation in "
                          "the reference dtype (tl.float32 for fp32)")
            return
        if self.region is _Region.HOST:
            reason = host_torch_reason(dotted, called)
            if reason:
                self.flag(Rule.TORCH_COMPUTE, node, f"`{dotted}` {reason}; {KERNEL_ADVICE}")
