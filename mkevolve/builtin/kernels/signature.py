"""A kernel's signature as the Triton tutorials write it: one parameter a line, each with what it is.

A pointer's comment gives the tensor's role and shape, then the tensor this launch passes: "A [M, K]: x [4, 16]";
a size says what it counts, a stride what it steps over, a constexpr what it tiles. The comments line up in one
column. Launches whose kernels differ only in comments share one kernel in the file, and its pointers keep
their role alone (`merge_shared`).
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass

from .ir import Shape

_COMMENT = "  # "


@dataclass(frozen=True)
class KernelParam:
    name: str
    doc: str                     # its role, e.g. "A [M, K]"; never contains ": "
    detail: str = ""             # the tensor one launch passes, e.g. "x [4, 16]": dropped where launches share
    constexpr: bool = False

    def declaration(self) -> str:
        return f"{self.name}: tl.constexpr" if self.constexpr else self.name

    def comment(self) -> str:
        return f"{self.doc}: {self.detail}" if self.detail else self.doc


def constexpr(name: str, doc: str) -> KernelParam:
    return KernelParam(name, doc, constexpr=True)


def signature(name: str, params: list[KernelParam]) -> str:
    """`def name(`, a `param,  # comment` line per parameter, and `):`."""
    declarations = [p.declaration() + "," for p in params]
    width = max(len(d) for d in declarations)
    lines = [f"    {d:<{width}}{_COMMENT}{p.comment()}" for d, p in zip(declarations, params)]
    return "\n".join([f"def {name}(", *lines, "):"])


def shape_text(shapes: tuple[Shape, ...]) -> str:
    """A tensor's shape over the input configs: "[64, 128]"; a dim that differs lists its sizes, "[4|8, 128]"."""
    return "[" + ", ".join("|".join(str(s) for s in dict.fromkeys(sizes)) for sizes in zip(*shapes)) + "]"


def code_key(source: str) -> str:
    """`source` without its comments: kernels with equal keys compute the same thing."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return tokenize.untokenize((t.type, t.string) for t in tokens if t.type != tokenize.COMMENT)


def merge_shared(kept: str, other: str) -> str:
    """`kept`, a kernel that another launch (`other`, the same code) shares: a parameter comment that
    differs between them keeps its role, and the shape where both launches agree on it, but no tensor."""
    lines, in_signature = [], False
    for mine, theirs in zip(kept.splitlines(), other.splitlines()):
        if in_signature and mine != theirs:
            code, comment = mine.split(_COMMENT, 1)
            mine = code + _COMMENT + _common_comment(comment, theirs.split(_COMMENT, 1)[1])
        in_signature = (in_signature or mine.startswith("def ")) and mine != "):"
        lines.append(mine)
    return "\n".join(lines) + ("\n" if kept.endswith("\n") else "")


def _common_comment(mine: str, theirs: str) -> str:
    """"operand: t3 [4, 8]" and "operand: t7 [4, 8]" -> "operand: [4, 8]"; other shapes -> "operand"."""
    role, _, detail = mine.partition(": ")
    shape = detail[detail.find(" ["):] if " [" in detail else None
    same_shape = shape is not None and theirs.endswith(shape) and theirs.partition(": ")[0] == role
    return f"{role}: {shape.strip()}" if same_shape else role
