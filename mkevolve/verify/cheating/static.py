"""Static cheating rules: what a solution's source may not do, read from its AST without running it."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import nn

from mkevolve.pysource import parse_python
from mkevolve.verify.cheating.rules import (
    KERNEL_ADVICE,
    Rule,
    Violation,
    is_less_precise,
)

# ---------------------------------------------------------------------------------------------
# What forward may do with PyTorch: allocate, view, copy and ask for metadata; never arithmetic.
# ---------------------------------------------------------------------------------------------

# `torch.<name>` calls allowed outside kernels. `ones`, `full` and `arange` are allowed because
# their values depend only on their scalar arguments, never on the inputs, so they cannot carry
# any of the work; kernels need them for constant buffers and index tensors.
_TORCH_HOST_FUNCTIONS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "arange", "tensor", "as_tensor", "scalar_tensor",
    "reshape", "flatten", "permute", "transpose", "t", "squeeze", "unsqueeze", "narrow",
    "split", "chunk", "unbind", "as_strided", "broadcast_to", "broadcast_shapes", "movedim",
    "swapaxes", "numel", "is_tensor", "is_floating_point", "is_complex", "get_default_dtype",
    "promote_types", "result_type", "can_cast", "is_grad_enabled", "is_inference_mode_enabled",
    "typename",
})
# `torch.<namespace>.*` that never computes on data (device queries, streams, events, versions).
_TORCH_HOST_NAMESPACES = frozenset({"cuda", "version", "backends", "autograd", "types"})
# torch.nn names that are containers or parameters, not layers that compute.
_NN_NON_LAYERS = frozenset({
    "Module", "Parameter", "Buffer", "ModuleList", "ModuleDict", "ParameterList",
    "ParameterDict", "Sequential", "parameter", "modules",
})

# Tensor methods that do arithmetic. Receivers are not typed statically, so this is a denylist;
# names that are common on Python containers (sort, index, count, copy) are left to run time.
_MATH_METHOD_NAMES = (
    "abs absolute acos acosh add addbmm addcdiv addcmul addmm addmv addr all amax amin aminmax "
    "angle any argmax argmin argsort asin asinh atan atan2 atanh baddbmm bernoulli bincount "
    "bitwise_and bitwise_not bitwise_or bitwise_xor bmm ceil cholesky clamp clamp_max clamp_min "
    "clip cos cosh count_nonzero cross cummax cummin cumprod cumsum deg2rad diag diff digamma "
    "dist div divide dot eq erf erfc erfinv exp exp2 expm1 fix flip fliplr flipud float_power "
    "floor floor_divide fmax fmin fmod frac gather gcd ge greater greater_equal gt heaviside "
    "histc hypot index_add index_copy index_fill index_put index_select inner inverse isclose "
    "isfinite isinf isnan kron kthvalue lcm ldexp le lerp less less_equal lgamma log log10 "
    "log1p log2 log_softmax logaddexp logaddexp2 logcumsumexp logical_and logical_not "
    "logical_or logical_xor logit logsumexp lt masked_fill masked_scatter masked_select matmul "
    "matrix_power max maximum mean median min minimum mm mode msort mul multiply mv nan_to_num "
    "nanmean nanmedian nansum ne neg negative nonzero norm not_equal outer pow prod put "
    "quantile rad2deg reciprocal relu remainder renorm repeat repeat_interleave roll rot90 "
    "round rsqrt scatter scatter_add scatter_reduce sigmoid sign signbit sin sinc sinh softmax "
    "sqrt square std sub subtract sum sum_to_size take take_along_dim tan tanh topk trace tril "
    "triu true_divide trunc unique var vdot where xlogy"
).split()
_OPERATOR_DUNDERS = (
    "__matmul__ __rmatmul__ __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ "
    "__rtruediv__ __floordiv__ __pow__ __rpow__ __neg__ __abs__"
).split()
_TENSOR_MATH_METHODS = frozenset(
    _MATH_METHOD_NAMES + [name + "_" for name in _MATH_METHOD_NAMES] + _OPERATOR_DUNDERS
    + ["apply_", "map_", "map2_"]
)
# Methods that hand the data to the host, where Python or NumPy can do the work unseen.
_HOST_ESCAPE_METHODS = frozenset({"numpy", "tolist"})

# Top-level modules of other kernel libraries; importing one means someone else's kernels run.
_KERNEL_LIBRARIES = frozenset({
    "cupy", "cupyx", "apex", "flash_attn", "flash_attn_interface", "xformers", "tilelang",
    "thunderkittens", "pycuda", "numba", "cuda", "nvidia", "cutlass", "nvmath", "cudnn",
    "jax", "jaxlib", "tensorflow", "tvm", "deepspeed", "bitsandbytes", "transformer_engine",
    "liger_kernel", "flashinfer", "vllm", "sgl_kernel", "torchao", "triton_kernels", "mlx",
    "quack", "onnxruntime", "tensorrt", "torch_tensorrt", "sageattention", "fbgemm_gpu",
    "megablocks", "kernels",
})
_THREAD_MODULES = frozenset({"threading", "_thread", "concurrent", "multiprocessing", "asyncio",
                             "subprocess"})
_REFERENCE_MODULES = frozenset({"gc", "inspect", "importlib", "ctypes", "__main__", "runpy",
                                "builtins", "traceback"})
_REFERENCE_MODULE_PARTS = frozenset({"reference", "problem", "problems", "model"})
_INPUT_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs", "get_input_configs"})
_REFERENCE_IMPORTED_NAMES = _INPUT_FUNCTIONS | {"Model"}
_REFERENCE_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "globals",
                                 "__builtins__"})
# Attributes that walk to frames, globals or live objects of other code.
_REFERENCE_ATTRIBUTES = frozenset({
    "f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
    "ag_frame", "_getframe", "_current_frames", "settrace", "setprofile", "__globals__",
    "__builtins__", "__code__", "__closure__", "__subclasses__", "get_referrers",
    "get_referents", "get_objects", "currentframe",
})
# Settings whose only purpose is to lower fp32 matmul precision.
_PRECISION_SETTINGS = frozenset({"allow_tf32", "allow_fp16_reduced_precision_reduction",
                                 "allow_bf16_reduced_precision_reduction", "fp32_precision"})
_LOW_PRECISION_NAMES = {
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "HalfTensor": torch.float16, "chalf": torch.float16, "complex32": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "BFloat16Tensor": torch.bfloat16,
}
_LOW_PRECISION_PREFIXES = ("float8", "fp8", "float4", "fp4")
_LOW_PRECISION_METHODS = {"half": torch.float16, "bfloat16": torch.bfloat16}
# tl.dot input precisions, weakest first; the accepted ones are as accurate as fp32.
_DOT_PRECISION_ORDER = ("unknown", "tf32", "bf16x3", "bf16x6", "tf32x3", "ieee")
_ACCEPTED_DOT_PRECISIONS = frozenset({"ieee", "tf32x3"})
_DOT_ADVICE = ('state input_precision="ieee" (exact fp32) or input_precision="tf32x3" '
               "(fp32-accurate on tensor cores) as a string literal")



@dataclass(frozen=True)
class _DottedRule:
    """A dotted name (and everything under it) that is rejected wherever it appears."""

    prefix: str
    rule: Rule
    why: str


_DOTTED_RULES = (
    _DottedRule("torch.compile", Rule.TORCH_COMPUTE,
                "torch.compile generates the kernels for you; write them in Triton"),
    _DottedRule("torch._dynamo", Rule.TORCH_COMPUTE, "torch._dynamo compiles PyTorch code"),
    _DottedRule("torch._inductor", Rule.TORCH_COMPUTE, "torch._inductor generates kernels"),
    _DottedRule("torch.export", Rule.TORCH_COMPUTE, "torch.export compiles PyTorch code"),
    _DottedRule("torch.jit", Rule.TORCH_COMPUTE, "TorchScript runs PyTorch kernels"),
    _DottedRule("torch.ops", Rule.TORCH_COMPUTE, "torch.ops calls ATen or library kernels directly"),
    _DottedRule("torch._C", Rule.TORCH_COMPUTE, "torch._C calls ATen kernels directly"),
    _DottedRule("torch._ops", Rule.TORCH_COMPUTE, "torch._ops calls ATen kernels directly"),
    _DottedRule("torch._refs", Rule.TORCH_COMPUTE, "torch._refs runs PyTorch reference math"),
    _DottedRule("torch._prims", Rule.TORCH_COMPUTE, "torch._prims runs PyTorch primitives"),
    _DottedRule("torch._decomp", Rule.TORCH_COMPUTE, "torch._decomp runs PyTorch decompositions"),
    _DottedRule("torch.library", Rule.TORCH_COMPUTE, "torch.library registers or calls other kernels"),
    _DottedRule("torch.utils.cpp_extension", Rule.TORCH_COMPUTE,
                "cpp_extension builds CUDA/C++ kernels instead of Triton ones"),
    _DottedRule("triton.ops", Rule.TORCH_COMPUTE, "triton.ops is a library of ready-made kernels"),
    *(_DottedRule(f"torch.cuda.{name}", Rule.TORCH_COMPUTE, "CUDA graphs and runtime-compiled CUDA "
                  "run kernels out of sight of the launch checks")
      for name in ("graph", "graphs", "CUDAGraph", "make_graphed_callables", "jiterator", "cudart")),
    *(_DottedRule(f"operator.{name}", Rule.TORCH_COMPUTE, "it is the `@` operator: a PyTorch matmul")
      for name in ("matmul", "imatmul", "__matmul__", "__imatmul__")),
    _DottedRule("torch.overrides", Rule.TENSOR_SUBCLASS,
                "torch function overrides change what tensor operations do"),
    _DottedRule("torch.utils._python_dispatch", Rule.TENSOR_SUBCLASS,
                "dispatch modes change what tensor operations do"),
    _DottedRule("torch._make_subclass", Rule.TENSOR_SUBCLASS, "it builds a tensor subclass"),
    _DottedRule("torch.multiprocessing", Rule.THREADS, "it runs work in other processes"),
    _DottedRule("os.fork", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.forkpty", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.system", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.popen", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.posix_spawn", Rule.THREADS, "it runs work in another process"),
    _DottedRule("os.sys", Rule.REFERENCE_ACCESS, "it reaches the interpreter's module table"),
    _DottedRule("sys.modules", Rule.REFERENCE_ACCESS,
                "it reaches every loaded module, the reference problem included"),
    *(_DottedRule(f"os.{name}", Rule.MONKEYPATCH, "the environment configures Triton and the "
                  "verifier; leave it unchanged")
      for name in ("putenv", "unsetenv", "environ.update", "environ.setdefault", "environ.pop",
                   "environ.popitem", "environ.clear", "environ.__setitem__", "environ.__delitem__")),
    _DottedRule("torch.set_float32_matmul_precision", Rule.PRECISION,
                "it lets PyTorch lower fp32 matmul precision"),
    _DottedRule("torch.autocast", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("torch.amp", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("torch.cuda.amp", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("torch.cpu.amp", Rule.PRECISION, "autocast runs fp32 math in fp16/bf16"),
    _DottedRule("triton.language.dot_scaled", Rule.PRECISION,
                "dot_scaled multiplies in fp8/fp4 formats"),
    _DottedRule("contextlib.suppress", Rule.TRY_EXCEPT,
                "suppressing exceptions hides a failing kernel; let errors surface"),
    _DottedRule("unittest.mock", Rule.MONKEYPATCH, "mock patches other modules"),
)


def _under(dotted: str, prefix: str) -> bool:
    return dotted == prefix or dotted.startswith(prefix + ".")


def _low_precision_dtype(name: str) -> torch.dtype | None:
    """The torch dtype a low-precision dtype name stands for (fp8/fp4 as float8_e5m2)."""
    if name in _LOW_PRECISION_NAMES:
        return _LOW_PRECISION_NAMES[name]
    if name.startswith(_LOW_PRECISION_PREFIXES):
        return torch.float8_e5m2
    return None


def _torch_object(dotted: str) -> object | None:
    """The object a `torch.` dotted name refers to in the installed torch, or None."""
    parts = dotted.split(".")
    if parts[0] != "torch":
        return None
    obj: object = torch
    for part in parts[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _is_torch_layer_class(dotted: str) -> bool:
    obj = _torch_object(dotted)
    return (isinstance(obj, type) and issubclass(obj, nn.Module)
            and dotted.rsplit(".", 1)[-1] not in _NN_NON_LAYERS)


def _is_tensor_class(dotted: str) -> bool:
    obj = _torch_object(dotted)
    return isinstance(obj, type) and issubclass(obj, torch.Tensor)


# ---------------------------------------------------------------------------------------------
# Static analysis
# ---------------------------------------------------------------------------------------------

class _Region(Enum):
    """Where code runs: SETUP before any input exists, HOST around launches, KERNEL in Triton."""

    SETUP = "setup"
    HOST = "host"
    KERNEL = "kernel"


@dataclass
class _Names:
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
        if _is_literal_getattr(node):
            base = self.dotted(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def layer_key(self, node: ast.AST) -> str | None:
        """The key of a torch.nn layer that calling `node` would run, or None."""
        if isinstance(node, ast.Attribute) and node.attr in ("forward", "__call__"):
            return self.layer_key(node.value)
        if isinstance(node, ast.Subscript):
            return self.layer_key(node.value)
        key = _self_key(node)
        return key if key in self.layers else None


def _is_literal_getattr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def _self_key(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _root_name(node: ast.AST) -> str | None:
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


def _executed_module(tree: ast.Module) -> ast.Module:
    """The module without its `if __name__ == "__main__":` blocks."""
    body = [stmt for stmt in tree.body if not _is_main_guard(stmt)]
    return ast.Module(body=body, type_ignores=tree.type_ignores)


def _collect_names(tree: ast.Module) -> _Names:
    names = _Names(aliases=_import_aliases(tree), constants=_module_constants(tree))
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


def _record_assignment(names: _Names, node: ast.Assign) -> None:
    """Aliases (`mm = torch.matmul`) and layers (`self.fc = nn.Linear(...)`) made by assignment."""
    keys = [key for key in map(_self_key, node.targets) if key]
    if not keys:
        return
    dotted = names.dotted(node.value)
    layer = _layer_built_by(names, node.value)
    for key in keys:
        if dotted:
            names.aliases[key] = dotted
        if layer:
            names.layers[key] = layer


def _layer_built_by(names: _Names, value: ast.AST) -> str | None:
    """The torch.nn layer class a call builds; containers count only when they hold a layer."""
    if not isinstance(value, ast.Call):
        return None
    dotted = names.dotted(value.func)
    if dotted is None or not _under(dotted, "torch.nn"):
        return None
    if _is_torch_layer_class(dotted):
        return dotted
    if dotted.rsplit(".", 1)[-1] in ("Sequential", "ModuleList", "ModuleDict"):
        inner = (_layer_built_by(names, n) for n in ast.walk(value) if n is not value)
        return next((dotted for found in inner if found), None)
    return None


# ---------------------------------------------------------------------------------------------
# Values the source itself shows: Python containers and dtype tables
# ---------------------------------------------------------------------------------------------
# Method names like `add` are tensor math on a tensor but bookkeeping on a set, and a dtype
# name in a table that translates torch dtypes to Triton ones computes nothing. Both are
# decided from every binding in the module at once, so that rebinding a name elsewhere (to a
# tensor, by a loop, by setattr or register_buffer with its name as a string) cancels the
# exemption. Names built at run time (getattr with a computed string) are out of reach of any
# static rule; the runtime guard sees the PyTorch ops they run.

_CONTAINER_NODES = (ast.Set, ast.Dict, ast.List, ast.SetComp, ast.DictComp, ast.ListComp)
_CONTAINER_BUILTINS = frozenset({"set", "dict", "list", "frozenset"})


def _bindings(tree: ast.Module) -> dict[str, list[ast.AST | None]]:
    """Every identifier the module gives a value, with the values it is given.

    A plain `name = value` or `obj.name = value` records the value; every other binding
    (parameters, loop and `with` targets, unpacking, augmented assignment, imports, defs,
    match captures) and every string equal to the name (setattr, register_buffer, getattr)
    records None: a value the source does not show.
    """
    plain = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            plain.update((id(target), node.value) for target in node.targets)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            plain[id(node.target)] = node.value
    found: dict[str, list[ast.AST | None]] = {}
    for node in ast.walk(tree):
        for name in _bound_names(node):
            found.setdefault(name, []).append(plain.get(id(node)))
    return found


def _bound_names(node: ast.AST) -> list[str]:
    """The identifiers one AST node binds (or, for a string, may bind by name)."""
    if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Store):
        return [node.id if isinstance(node, ast.Name) else node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.asname or node.name.split(".")[0]]
    if isinstance(node, (ast.MatchAs, ast.MatchStar, ast.ExceptHandler)) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
        return [node.value]
    return []


def _container_names(bindings: dict[str, list[ast.AST | None]]) -> frozenset[str]:
    """Names (or `self.` attributes) whose every binding is a set/dict/list literal,
    comprehension or builtin constructor call, and never a name tensors or modules carry."""
    def is_container(value: ast.AST | None) -> bool:
        if isinstance(value, _CONTAINER_NODES):
            return True
        # `set()` counts only while the module never rebinds `set` itself.
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in _CONTAINER_BUILTINS and value.func.id not in bindings)

    return frozenset(name for name, values in bindings.items()
                     if all(map(is_container, values)) and not _tensor_or_module_attribute(name))


def _tensor_or_module_attribute(name: str) -> bool:
    """`x.data`, `x.grad`, `m.training`: reached through any tensor or module, bound or not."""
    return hasattr(torch.Tensor, name) or hasattr(nn.Module, name)


def _table_dtypes(tree: ast.Module, names: _Names) -> frozenset[int]:
    """Ids of the low-precision dtype names in dict literals that only translate dtypes.

    A dict literal qualifies when it is only ever looked up (`table[key]`, `table.get(key)`,
    `key in table`): its keys then never leave it, so a low-precision key is exempt; a
    low-precision value is exempt only under the same dtype as key, so looking up a
    float32 tensor's dtype can never yield float16.
    """
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    exempt = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and _only_looked_up(node, tree, parents):
            for key, value in zip(node.keys, node.values):
                key_dtype = _low_precision_of(names, key)
                if key_dtype is not None:
                    exempt.add(id(key))
                    if _low_precision_of(names, value) == key_dtype:
                        exempt.add(id(value))
    return frozenset(exempt)


def _low_precision_of(names: _Names, node: ast.AST | None) -> torch.dtype | None:
    dotted = names.dotted(node) if node is not None else None
    if not dotted or dotted.split(".")[0] not in ("torch", "triton", "numpy"):
        return None
    return _low_precision_dtype(dotted.rsplit(".", 1)[-1])


def _only_looked_up(table: ast.Dict, tree: ast.Module, parents: dict[int, ast.AST]) -> bool:
    """The dict literal is looked up in place, or bound to a name used only in lookups."""
    if _is_lookup(table, parents):
        return True
    parent = parents.get(id(table))
    if not isinstance(parent, (ast.Assign, ast.AnnAssign)) or parent.value is not table:
        return False
    targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
    keys = {_binding_name(target) for target in targets}
    if None in keys:
        return False
    uses = [node for node in ast.walk(tree) if _loads_name(node, keys)]
    return all(_is_lookup(use, parents) for use in uses) and not _named_by_string(tree, keys)


def _binding_name(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


def _loads_name(node: ast.AST, keys: set[str]) -> bool:
    """A read of one of the names, bare or as any object's attribute (`self.table`, `Cls.table`)."""
    if isinstance(node, ast.Name):
        return isinstance(node.ctx, ast.Load) and node.id in keys
    return isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in keys


def _named_by_string(tree: ast.Module, keys: set[str]) -> bool:
    """getattr(obj, "table") reaches the table without a lookup the checker can see."""
    return any(isinstance(node, ast.Constant) and node.value in keys for node in ast.walk(tree))


def _is_lookup(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """`node[key]` read, `node.get(...)` called, or `key in node` / `key not in node`."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Subscript):
        return parent.value is node and isinstance(parent.ctx, ast.Load)
    if isinstance(parent, ast.Attribute) and parent.attr == "get":
        call = parents.get(id(parent))
        return isinstance(call, ast.Call) and call.func is parent
    if isinstance(parent, ast.Compare) and node in parent.comparators:
        operator = parent.ops[parent.comparators.index(node)]
        return isinstance(operator, (ast.In, ast.NotIn))
    return False


def _jit_decorated(names: _Names, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        dotted = names.dotted(target)
        if dotted and dotted.split(".")[0] == "triton" and dotted.rsplit(".", 1)[-1] == "jit":
            return True
    return False


class _StaticChecker(ast.NodeVisitor):
    """Walks the executed part of a solution and records every rule it breaks."""

    def __init__(self, names: _Names, reference_dtype: torch.dtype, problem_name: str | None):
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
        return _REFERENCE_MODULE_PARTS | extra

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
            if isinstance(stmt, ast.FunctionDef) and stmt.name in _INPUT_FUNCTIONS:
                self._visit_function(stmt, _Region.SETUP)
            else:
                self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        region = _Region.KERNEL if _jit_decorated(self.names, node) else _Region.HOST
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
            if dotted and _is_tensor_class(dotted):
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
            if alias.name in _REFERENCE_IMPORTED_NAMES:
                self.flag(Rule.REFERENCE_ACCESS, node, f"imports `{alias.name}` from `{module}`: "
                          "a solution may not use the reference problem; compute from the inputs")
            elif alias.name == "*" and _under(module, "torch"):
                self.flag(Rule.TORCH_COMPUTE, node, f"`from {module} import *` hides which PyTorch "
                          "functions forward calls; import names explicitly")
            else:
                self._check_dotted(node, f"{module}.{alias.name}", called=False)

    def _check_module(self, node: ast.AST, module: str, level: int) -> None:
        parts = module.split(".") if module else []
        top = parts[0] if parts else ""
        if level == 0 and top in _KERNEL_LIBRARIES:
            self.flag(Rule.TORCH_COMPUTE, node, f"imports `{module}`, another kernel library; the "
                      "work must be done by your own @triton.jit kernels")
        elif level == 0 and top in _THREAD_MODULES:
            self.flag(Rule.THREADS, node, f"imports `{module}`: work on other threads or processes "
                      "escapes the launch checks and the timer; run everything on the calling thread")
        elif level == 0 and top in _REFERENCE_MODULES:
            self.flag(Rule.REFERENCE_ACCESS, node, f"imports `{module}`, which can reach other "
                      "modules, frames or objects (the reference included); compute from the inputs only")
        elif top in ("mock",) or _under(module, "unittest.mock"):
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
        root = _root_name(target)
        if root is None or root == "self" or root not in self.names.aliases:
            return
        shown = ast.unparse(target)
        if isinstance(target, ast.Attribute) and target.attr in _PRECISION_SETTINGS:
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
        if _is_literal_getattr(node):
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
        return is_lookup and target is not None and _under(target, "torch")

    def _check_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            self._check_setattr(node, node.args[0])
        if isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__") and node.args:
            self._check_setattr(node, node.args[0])
        if isinstance(func, ast.Attribute) and func.attr == "run":
            self.launched = self.launched or _self_key(func.value) in self.names.kernels
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
        root = _root_name(obj)
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
        if method in _LOW_PRECISION_METHODS:
            if is_less_precise(_LOW_PRECISION_METHODS[method], self.reference_dtype):
                self.flag(Rule.PRECISION, node, f"`.{method}()` converts to a lower precision than "
                          f"the {self.reference_dtype} reference; keep data and math in the "
                          "reference dtype")
        elif self.region is not _Region.HOST:
            return
        elif method in _TENSOR_MATH_METHODS and not self._is_python_container(node.func.value):
            self.flag(Rule.TORCH_COMPUTE, node, f"`.{method}(...)` is tensor math run by PyTorch "
                      f"outside a kernel; {KERNEL_ADVICE}")
        elif method in _HOST_ESCAPE_METHODS:
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
        stated = _stated_dot_precision(node, self.names.constants)
        if stated is None:
            self.flag(Rule.PRECISION, node, "tl.dot states no precision, and Triton's default for "
                      f"fp32 inputs is tf32 (about 1e-3 relative error); {_DOT_ADVICE}")
        elif stated == "unknown":
            self.flag(Rule.PRECISION, node, "tl.dot's precision is not a literal the checker can "
                      f"read; {_DOT_ADVICE}")
        elif stated not in _ACCEPTED_DOT_PRECISIONS:
            self.flag(Rule.PRECISION, node, f'tl.dot with input_precision="{stated}" is less '
                      f"accurate than the fp32 reference; {_DOT_ADVICE}")

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
        if node.id in _REFERENCE_BUILTINS and node.id not in self.names.aliases:
            self.flag(Rule.REFERENCE_ACCESS, node, f"`{node.id}` can run hidden code or reach other "
                      "modules' globals (the reference included); write plain code over the inputs")
        elif id(node) not in self._inner and node.id in self.names.aliases:
            self._check_dotted(node, self.names.aliases[node.id], called=id(node) in self._called)

    def _check_attribute_name(self, node: ast.AST, attr: str) -> None:
        if attr in _REFERENCE_ATTRIBUTES:
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
        for entry in _DOTTED_RULES:
            if _under(dotted, entry.prefix):
                self.flag(entry.rule, node, f"`{dotted}`: {entry.why}")
                return
        leaf = dotted.rsplit(".", 1)[-1]
        low = _low_precision_dtype(leaf)
        if low is not None and dotted.split(".")[0] in ("torch", "triton", "numpy"):
            # Naming a dtype in a table that maps it to itself computes nothing (see _table_dtypes).
            if is_less_precise(low, self.reference_dtype) and id(node) not in self.names.table_dtypes:
                self.flag(Rule.PRECISION, node, f"`{dotted}` is a lower-precision dtype than the "
                          f"{self.reference_dtype} reference; keep loads, math and accumulation in "
                          "the reference dtype (tl.float32 for fp32)")
            return
        if self.region is _Region.HOST:
            reason = _host_torch_reason(dotted, called)
            if reason:
                self.flag(Rule.TORCH_COMPUTE, node, f"`{dotted}` {reason}; {KERNEL_ADVICE}")


def _host_torch_reason(dotted: str, called: bool) -> str | None:
    """Why a torch name may not be used in forward or its helpers; None when it may."""
    parts = dotted.split(".")
    if parts[0] != "torch" or len(parts) == 1:
        return None
    head = parts[1]
    if head == "nn":
        return _host_nn_reason(parts[2:], dotted, called)
    if head == "Tensor":
        method = parts[2] if len(parts) > 2 else ""
        return "is tensor math run by PyTorch" if method in _TENSOR_MATH_METHODS else None
    if head in _TORCH_HOST_NAMESPACES:
        return None
    if len(parts) == 2 and (head in _TORCH_HOST_FUNCTIONS or _is_torch_value(head)):
        return None
    return "computes with PyTorch outside a kernel (forward may only allocate, view and launch)"


def _host_nn_reason(rest: list[str], dotted: str, called: bool) -> str | None:
    if not rest:
        return None
    if rest[0] == "functional" and len(rest) > 1:
        return "is a torch.nn.functional op run by PyTorch"
    if rest[0] == "init":
        return "runs PyTorch weight initialisation math in forward"
    if called and _is_torch_layer_class(dotted):
        return "builds and runs a torch.nn layer in forward"
    return None


@functools.lru_cache(maxsize=None)
def _is_torch_value(name: str) -> bool:
    """Dtypes, memory formats, numbers, classes, namespaces: torch names that are not ops."""
    if name.startswith("__"):  # __dict__ and friends look functions up by name
        return False
    obj = getattr(torch, name, None)
    return obj is not None and (isinstance(obj, type) or not callable(obj))


def _stated_dot_precision(call: ast.Call, constants: dict[str, object]) -> str | None:
    """A tl.dot call's stated input precision; None when unstated, "unknown" when not literal."""
    stated = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    for position, name in ((3, "input_precision"), (4, "allow_tf32")):
        if len(call.args) > position:
            stated.setdefault(name, call.args[position])
    precision = _literal(stated["input_precision"], constants) if "input_precision" in stated else None
    if isinstance(precision, str):
        return precision.lower()
    if precision is not None:
        return "unknown"
    allow_tf32 = _literal(stated["allow_tf32"], constants) if "allow_tf32" in stated else None
    if isinstance(allow_tf32, bool):
        return "tf32" if allow_tf32 else "ieee"
    return None if allow_tf32 is None else "unknown"


_NOT_LITERAL = object()


def _literal(node: ast.AST, constants: dict[str, object]) -> object:
    """A literal, or a module-level constant's value; a sentinel when neither."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    return _NOT_LITERAL


def _kernel_names(names: _Names, tree: ast.Module) -> dict[str, int]:
    kernels = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _jit_decorated(names, node):
            kernels[node.name] = node.lineno
        elif isinstance(node, ast.Call) and node.args and _jit_decorated_call(names, node):
            kernels[ast.unparse(node.args[0])] = node.lineno
    return kernels


def _jit_decorated_call(names: _Names, node: ast.Call) -> bool:
    """`triton.jit(fn)` written as a call rather than a decorator."""
    dotted = names.dotted(node.func)
    return bool(dotted) and dotted.split(".")[0] == "triton" and dotted.rsplit(".", 1)[-1] == "jit"


def _forward_line(tree: ast.Module) -> int | None:
    """The line of the first `def forward`, where a missing kernel launch belongs."""
    lines = [node.lineno for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "forward"]
    return min(lines, default=None)


def _launch_violations(tree: ast.Module, checker: _StaticChecker, kernels: dict[str, int]) -> list[Violation]:
    if not kernels:
        return [Violation(Rule.NO_TRITON_KERNEL, "no @triton.jit kernel: ModelNew must do its work in "
                          "Triton kernels decorated with @triton.jit and launched from forward as "
                          "kernel[grid](...)", _forward_line(tree))]
    if not checker.launched:
        first = min(kernels, key=kernels.get)
        shown = ", ".join(f"`{name}`" for name in kernels)
        return [Violation(Rule.NO_LAUNCH, f"kernel(s) {shown} are defined but never launched (no "
                          "`kernel[grid](...)` outside `if __name__ == \"__main__\":`); launch them "
                          "from forward to do the work", kernels[first])]
    return []


def _parse_executed(source: str, filename: str) -> tuple[ast.Module, _Names]:
    tree = _executed_module(parse_python(source, filename=filename))
    names = _collect_names(tree)
    names.kernels = _kernel_names(names, tree)
    bindings = _bindings(tree)
    names.containers = _container_names(bindings)
    names.table_dtypes = _table_dtypes(tree, names)
    return tree, names


def static_violations(source: str, filename: str = "<solution>", *, problem_name: str | None = None,
                      reference_dtype: torch.dtype = torch.float32) -> list[Violation]:
    """Every rule the source breaks, ordered by line; raises SyntaxError on unparsable source.

    Code under `if __name__ == "__main__":` is skipped: the verifier never runs it.
    `problem_name` (the problem file's stem) also rejects imports of a module with that name;
    `reference_dtype` sets what counts as a precision downgrade (tf32 rules apply to fp32 only).
    """
    tree, names = _parse_executed(source, filename)
    checker = _StaticChecker(names, reference_dtype, problem_name)
    checker.visit(tree)
    found = checker.violations + _launch_violations(tree, checker, names.kernels)
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda v: v.line or 0)


def dot_precision(source: str) -> str | None:
    """The weakest precision the source's tl.dot calls state: "ieee", "tf32x3", "tf32", ...

    An unstated precision counts as Triton's fp32 default, "tf32"; one that is not a literal
    is "unknown"; None when the executed code has no tl.dot.
    """
    tree, names = _parse_executed(source, "<solution>")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and names.dotted(node.func) == "triton.language.dot":
            found.append(_stated_dot_precision(node, names.constants) or "tf32")
    if not found:
        return None
    rank = {name: i for i, name in enumerate(_DOT_PRECISION_ORDER)}
    return min(found, key=lambda p: rank.get(p, 0))


