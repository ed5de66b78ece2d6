"""Recognise attention, softmax(q @ kt * scale + mask) @ v, and lower it to one Attention value.

Two forms reach here: `p @ v` where p is a softmax over the last dim (or a ReLU) of an elementwise
expression of `q @ kt`, and F.scaled_dot_product_attention. Either way the scores stay in registers.
"""

from __future__ import annotations

import math

import torch

from .builders import Builder
from .calls import Call
from .errors import UnsupportedInMode, UnsupportedSubproblem
from .handlers_math import ValuesIndices
from .ir import Arange, Attention, IndexMask, Input, Matmul, Param, Pointwise, Scalar, Value, View

NEG_INF = float("-inf")


def fuse_attention(b: Builder, p: Value, v: Value) -> Value | None:
    """An Attention value for `p @ v`, or None where p is not normalised scores of a batched q @ kt."""
    if p.id in b.softmax_inputs:
        normalize, logits = "softmax", b.softmax_inputs[p.id]
    elif isinstance(p, Pointwise) and p.op == "relu":
        normalize, logits = "relu", p.args[0]
    else:
        return None
    parts = _logit_parts(logits)
    if parts is None or v.rank != p.rank:
        return None
    scores, extras = parts
    if not _same_batch(scores.a, scores.b, v) or any(s[-1] != sv[-2] for s, sv in zip(p.shapes, v.shapes)):
        return None
    return attention(b, scores.a, scores.b, v, scores, logits, extras, normalize, causal=_is_causal(logits))


def _is_causal(logits: Value) -> bool:
    """masked_fill(~tril(ones), -inf) (or where(tril, x, -inf)) last: keys after the query weigh exactly 0,
    so their blocks can be skipped."""
    if not (isinstance(logits, Pointwise) and logits.op == "where"):
        return False
    cond, keep, fill = logits.args
    if isinstance(cond, Pointwise) and cond.op == "logical_not":
        cond, keep, fill = cond.args[0], fill, keep
    return (isinstance(cond, IndexMask) and cond.kind == "tril" and cond.diagonal <= 0
            and isinstance(fill, Scalar) and fill.is_literal and fill.value == NEG_INF)


def _logit_parts(logits: Value) -> tuple[Matmul, tuple[Value, ...]] | None:
    """The one batched q @ kt the elementwise expression reads, with the scores' shape, and its other tensors
    (index masks are not tensors: the kernel computes them)."""
    scores, extras, stack, seen = [], [], [logits], set()
    while stack:
        value = stack.pop()
        if value.id in seen:
            continue
        seen.add(value.id)
        if isinstance(value, Pointwise):
            stack.extend(value.operands())
        elif isinstance(value, Matmul) and value.batched and value.shapes == logits.shapes:
            scores.append(value)
        elif isinstance(value, IndexMask):
            if value.shapes != logits.shapes:
                return None
        else:
            extras.append(value)
    if len(scores) != 1:
        return None
    return scores[0], tuple(sorted(extras, key=lambda e: e.id))


def _same_batch(*values: Value) -> bool:
    return all(len({v.shapes[c][:-2] for v in values}) == 1 for c in range(len(values[0].shapes)))


_COMPARES = {"gt", "lt", "ge", "le", "eq", "ne", "logical_and", "logical_or"}


def _is_bool(b: Builder, mask: Value) -> bool:
    """Compares are bool; so are a bool buffer and a bool input (seen through views)."""
    while isinstance(mask, View):
        mask = mask.base
    if isinstance(mask, Input):
        return mask.boolean
    if isinstance(mask, Pointwise):
        return mask.op in _COMPARES
    if isinstance(mask, Param):
        tensor = b.models[0]
        for part in mask.path.split("."):
            tensor = getattr(tensor, part)
        return tensor.dtype == torch.bool
    return False


def attention(b: Builder, q: Value, kt: Value, v: Value, scores: Value, logits: Value, extras: tuple,
              normalize: str, causal: bool, empty_rows_zero: bool = False) -> Value:
    shapes = tuple(sq[:-1] + (sv[-1],) for sq, sv in zip(q.shapes, v.shapes))
    return b.program.add(Attention(shapes, q=q, kt=kt, v=v, scores=scores, logits=logits, extras=extras,
                                   normalize=normalize, causal=causal, empty_rows_zero=empty_rows_zero))


def scaled_dot_product_attention(b: Builder, call: Call) -> Value:
    """F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)."""
    q, k, v = call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value")
    mask = call.arg(3, "attn_mask", None)
    dropout_p = b.const(call.arg(4, "dropout_p", 0.0), "dropout_p")
    causal = bool(b.const(call.arg(5, "is_causal", False), "is_causal"))
    scale = call.arg(6, "scale", None)
    if dropout_p:
        raise UnsupportedSubproblem(f"scaled_dot_product_attention with dropout_p={dropout_p}: the reference "
                                    "draws its random mask from torch's generator")
    if call.kwargs.get("enable_gqa") or q.rank < 3 or not _same_batch(q, k, v):
        raise UnsupportedSubproblem("scaled_dot_product_attention with broadcast or grouped batch/head dims")
    if scale is None:
        dims = {s[-1] for s in q.shapes}
        if len(dims) > 1:
            raise UnsupportedSubproblem("scaled_dot_product_attention: head dim differs between input configs")
        scale = 1.0 / math.sqrt(dims.pop())
    kt = b.view(k, "transpose", (-2, -1), tuple(s[:-2] + (s[-1], s[-2]) for s in k.shapes))
    scores = b.matmul(q, kt)
    logits = b.pw("mul", scores, scale)
    extras: tuple = ()
    if isinstance(mask, Value):
        # a bool mask says which keys a query may see; a float mask is added to the scores
        logits = b.pw("where", mask, logits, NEG_INF) if _is_bool(b, mask) else b.pw("add", logits, mask)
        extras = (mask,)
    # SDPA gives 0, not softmax's NaN, to a query whose keys are all masked
    return attention(b, q, kt, v, scores, logits, extras, "softmax", causal, empty_rows_zero=True)


class AttentionOutputs(ValuesIndices):
    """nn.MultiheadAttention's (output, weights) pair: the fused kernel never forms the weights."""

    def item(self, index):
        if index == 0:
            return self.values
        raise UnsupportedSubproblem("the attention weights output of nn.MultiheadAttention (need_weights) "
                                    "is not supported: the fused kernel never stores them")


def multihead_attention_module(b: Builder, call: Call) -> AttentionOutputs:
    """nn.MultiheadAttention without masks; its weights output is not formed."""
    _check_plain_mha(call.module, call)
    query, key, value = call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value")
    return AttentionOutputs(multihead_attention(b, call.modules, call.path, query, key, value))


def multihead_attention(b: Builder, modules: list, path: str, query: Value, key: Value, value: Value) -> Value:
    """q/k/v projections (three GEMMs), one fused attention over (batch * heads, seq, head_dim) views, the
    output projection; `modules` are the per-config nn.MultiheadAttention instances at `path`."""
    module = modules[0]
    if module.batch_first:
        query, key, value = (b.swap01(t) for t in (query, key, value))
    e, heads = module.embed_dim, module.num_heads
    weight, bias = (sub_param(b, modules, path, name) for name in ("in_proj_weight", "in_proj_bias"))

    def project(x: Value, i: int) -> Value:
        """The i-th of the packed q/k/v projections, split into heads."""
        rows_bias = None if bias is None else _rows(b, bias, i * e, e)
        return _heads(b, b.linear(x, _rows(b, weight, i * e, e), rows_bias), heads)

    q, k, v = project(query, 0), project(key, 1), project(value, 2)
    kt = b.view(k, "transpose", (-2, -1), tuple(s[:-2] + (s[-1], s[-2]) for s in k.shapes))
    scores = b.matmul(q, kt)
    logits = b.pw("mul", scores, 1.0 / math.sqrt(e // heads))
    out = _merge_heads(b, attention(b, q, kt, v, scores, logits, (), "softmax", causal=False), query)
    out = b.linear(out, sub_param(b, modules, path, "out_proj.weight"),
                  sub_param(b, modules, path, "out_proj.bias"))
    return b.swap01(out) if module.batch_first else out


def sub_param(b: Builder, modules: list, path: str, name: str) -> Value | None:
    """`self.<path>.<name>` (name may be dotted) as a leaf, or None where the module has none."""
    tensors = []
    for module in modules:
        for part in name.split("."):
            module = getattr(module, part)
        tensors.append(module)
    if tensors[0] is None:
        return None
    return b.param(f"{path}.{name}" if path else name, tuple(tuple(t.shape) for t in tensors))


def _check_plain_mha(module, call: Call) -> None:
    if any(call.arg(i, name, None) is not None for i, name in ((3, "key_padding_mask"), (5, "attn_mask"))):
        raise UnsupportedSubproblem("nn.MultiheadAttention with key_padding_mask or attn_mask")
    if call.arg(7, "is_causal", False):
        raise UnsupportedSubproblem("nn.MultiheadAttention with is_causal")
    if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
        raise UnsupportedSubproblem("nn.MultiheadAttention with kdim/vdim, add_bias_kv or add_zero_attn")
    if module.dropout and module.training:
        raise UnsupportedInMode(f"nn.MultiheadAttention with dropout={module.dropout} in training mode: the "
                                "reference draws its random mask from torch's generator; run with --eval")


def _rows(b: Builder, param: Value, start: int, length: int) -> Value:
    """Rows [start, start + length) of a packed in-projection weight or bias, as a view."""
    return b.view(param, "narrow", (0, start, length), tuple((length,) + s[1:] for s in param.shapes))


def _heads(b: Builder, x: Value, heads: int) -> Value:
    """(L, N, E) -> (N * heads, L, E / heads), as MultiheadAttention lays heads out."""
    split = tuple((s[0], s[1] * heads, s[2] // heads) for s in x.shapes)
    x = b.view(x, "reshape", (b.size(x, 0), -1, split[0][2]), split)
    return b.swap01(x)


def _merge_heads(b: Builder, out: Value, query: Value) -> Value:
    """(N * heads, L, hd) -> (L, N, E), heads side by side again."""
    out = b.swap01(out)
    return b.view(out, "reshape", (b.size(query, 0), b.size(query, 1), -1), query.shapes)


def ones_like(b: Builder, call: Call) -> Value:
    x = call.arg(0, "input")
    return b.program.add(IndexMask(x.shapes, kind="ones"))


def triangle(kind: str):
    """tril/triu of ones_like(...): the causal mask an attention kernel computes from its offsets; of any other
    tensor, its elements on the kept side of the diagonal and zeros elsewhere."""
    def handler(b: Builder, call: Call) -> Value:
        x, diagonal = call.arg(0, "input"), int(b.const(call.arg(1, "diagonal", 0), f"{kind} diagonal"))
        if isinstance(x, IndexMask) and x.kind == "ones":
            return b.program.add(IndexMask(x.shapes, kind=kind, diagonal=diagonal))
        return _triangle_of_data(b, x, kind, diagonal)
    return handler


def _triangle_of_data(b: Builder, x: Value, kind: str, diagonal: int) -> Value:
    """x where column - row <= diagonal (tril) or >= diagonal (triu), else 0, over the last two dims; the row
    and column numbers are aranges (exact as float32 below 2**24)."""
    sizes = {shape[-2:] for shape in x.shapes} if x.rank >= 2 else set()
    if len(sizes) != 1:
        raise UnsupportedSubproblem(f"{kind} of a tensor whose last two sizes differ between input configs "
                                    "(or of fewer than two dims)")
    ((rows, cols),) = sizes

    def numbers(n: int, shape: tuple[int, int]) -> Value:
        arange = b.program.add(Arange(((n,),) * b.n_configs, start=0, end=n, step=1))
        return b.view(arange, "reshape", shape, (shape,) * b.n_configs)

    offset = b.pw("sub", numbers(cols, (1, cols)), numbers(rows, (rows, 1)))      # [rows, cols]
    keep = b.pw("le" if kind == "tril" else "ge", offset, float(diagonal))
    return b.pw("where", keep, x, 0.0)
