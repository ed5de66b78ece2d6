"""What the precision rules know: settings and dtype names below fp32, and the precision a tl.dot call states."""

from __future__ import annotations

import ast

import torch

# Settings whose only purpose is to lower fp32 matmul precision.
PRECISION_SETTINGS = frozenset({"allow_tf32", "allow_fp16_reduced_precision_reduction",
                                "allow_bf16_reduced_precision_reduction", "fp32_precision"})
_LOW_PRECISION_NAMES = {
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "HalfTensor": torch.float16, "chalf": torch.float16, "complex32": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "BFloat16Tensor": torch.bfloat16,
}
_LOW_PRECISION_PREFIXES = ("float8", "fp8", "float4", "fp4")
LOW_PRECISION_METHODS = {"half": torch.float16, "bfloat16": torch.bfloat16}
# tl.dot input precisions, weakest first; the accepted ones are as accurate as fp32.
DOT_PRECISION_ORDER = ("unknown", "tf32", "bf16x3", "bf16x6", "tf32x3", "ieee")
ACCEPTED_DOT_PRECISIONS = frozenset({"ieee", "tf32x3"})
DOT_ADVICE = ('state input_precision="ieee" (exact fp32) or input_precision="tf32x3" '
              "(fp32-accurate on tensor cores) as a string literal")


def low_precision_dtype(name: str) -> torch.dtype | None:
    """The torch dtype a low-precision dtype name stands for (fp8/fp4 as float8_e5m2)."""
    if name in _LOW_PRECISION_NAMES:
        return _LOW_PRECISION_NAMES[name]
    if name.startswith(_LOW_PRECISION_PREFIXES):
        return torch.float8_e5m2
    return None


def stated_dot_precision(call: ast.Call, constants: dict[str, object]) -> str | None:
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
