"""Lowering of linear layers, matmuls, convolutions, pooling, padding, resampling, reordering copies, views and
shape arithmetic into the tensor program."""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import (fuse_attention, multihead_attention, multihead_attention_module, ones_like,
                        scaled_dot_product_attention, sub_param, triangle)
from .builders import Builder, tuple_arg
from .calls import Call, Handler, as_param, module_param
from .errors import UnsupportedInMode, UnsupportedSubproblem
from .geometry import sliding_windows, transposed_size
from .handlers_math import ValuesIndices, layer_norm
from .ir import (Arange, Gather, IntOp, Pad, Pool, PoolIndices, Reindex, Resize, Scalar, Shape, Unpool,
                 Value, View, is_integer)
from .recurrent import ATEN_RECURRENT, recurrent_cell_module, recurrent_module
from .trace import TaggedInt

# --- GEMMs ------------------------------------------------------------------------------------------


def _linear(b: Builder, call: Call):
    return b.linear(call.arg(0, "input"), as_param(call.arg(1, "weight"), "weight"),
                  as_param(call.arg(2, "bias", None), "bias"))


def _linear_module(b: Builder, call: Call):
    return b.linear(call.arg(0, "input"), module_param(b, call, "weight"), module_param(b, call, "bias"))


def bilinear(b: Builder, x1: Value, x2: Value, weight: Value, bias: Value | None) -> Value:
    """x1^T A_o x2 + b_o for each output o: one GEMM of x1 [.., I1] with the weight seen as [I1, O * I2], then
    each output's I2 products with x2 summed, the bias in the epilogue."""
    out_f, in1, in2 = weight.shapes[0]
    if any(s != weight.shapes[0] for s in weight.shapes):
        raise UnsupportedSubproblem("a Bilinear weight whose shape differs between input configs")
    per_input = b.view(weight, "permute", ((1, 0, 2),), tuple((in1, out_f, in2) for _ in weight.shapes))
    flat = b.view(per_input, "reshape", ((in1, out_f * in2),), tuple((in1, out_f * in2) for _ in weight.shapes))
    rows = b.matmul(x1, flat)                                              # [.., O * I2]
    split = b.view(rows, "unflatten", (-1, (out_f, in2)), tuple((*s[:-1], out_f, in2) for s in x1.shapes))
    out = b.reduce_keep("sum", b.pw("mul", split, b.unsqueeze(x2, x2.rank - 1)), split.rank - 1, keepdim=False)
    return b.pw("add", out, bias) if bias is not None else out


def _bilinear(b: Builder, call: Call):
    return bilinear(b, call.arg(0, "input1"), call.arg(1, "input2"), as_param(call.arg(2, "weight"), "weight"),
                    as_param(call.arg(3, "bias", None), "bias"))


def _bilinear_module(b: Builder, call: Call):
    return bilinear(b, call.arg(0, "input1"), call.arg(1, "input2"), module_param(b, call, "weight"),
                    module_param(b, call, "bias"))


def _matmul(b: Builder, call: Call):
    a, other = call.arg(0, "input"), call.arg(1, "other")
    return fuse_attention(b, a, other) or b.matmul(a, other)


def _einsum(b: Builder, call: Call):
    """torch.einsum of two tensors, each letter once per operand and every letter of only one operand kept: a
    matmul of permuted views, its batch the letters both operands and the output share, K the letters they
    share alone. "bhqd,bhkd->bhqk" is q @ k^T (and "bhqk,bhkd->bhqd" after a softmax one fused attention)."""
    equation, operands = call.args[0], list(call.args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if not isinstance(equation, str) or len(operands) != 2 or not all(isinstance(o, Value) for o in operands):
        raise UnsupportedSubproblem("einsum other than of two tensors")
    (xl, yl), out = _einsum_letters(equation.replace(" ", ""), [o.rank for o in operands])
    x, y = operands
    batch = [c for c in out if c in xl and c in yl]
    rows, cols = [c for c in out if c not in yl], [c for c in out if c not in xl]
    summed = [c for c in xl if c in yl and c not in out]
    a, m = _grouped(b, x, xl, [batch, rows, summed]), _grouped(b, y, yl, [batch, summed, cols])
    product = fuse_attention(b, a, m) or b.matmul(a, m)
    names = batch + rows + cols      # the product's dims once its M and N are split back into letters
    shapes = tuple(tuple(xs[xl.index(c)] for c in batch + rows) + tuple(ys[yl.index(c)] for c in cols)
                   for xs, ys in zip(x.shapes, y.shapes))
    if shapes != product.shapes:
        sizes = [b.size(x, xl.index(c)) for c in batch + rows] + [b.size(y, yl.index(c)) for c in cols]
        product = b.view(product, "reshape", (tuple(sizes),), shapes)
    return _permuted(b, product, names.index, out)


def _einsum_letters(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, for the forms `_einsum` computes."""
    inputs, arrow, out = equation.partition("->")
    letters = inputs.split(",")
    if "." in equation or len(letters) != len(ranks) or any(len(t) != r for t, r in zip(letters, ranks)):
        raise UnsupportedSubproblem(f"einsum {equation!r} (ellipses, or letters that do not match the ranks)")
    if not arrow:   # implicit output: the letters seen once, in alphabetical order
        out = "".join(sorted(c for c in set(inputs) - {","} if inputs.count(c) == 1))
    alone = [c for t in letters for c in t if c not in out and sum(c in u for u in letters) == 1]
    if any(len(set(t)) != len(t) for t in letters + [out]) or alone:
        raise UnsupportedSubproblem(f"einsum {equation!r} with a repeated letter or a sum over one operand")
    return letters, out


def _grouped(b: Builder, x: Value, letters: str, groups: list[list[str]]) -> Value:
    """x permuted to the groups' order, then each group after the first (the batch) merged into one dim (a
    size-1 dim where the group is empty)."""
    x = _permuted(b, x, letters.index, [c for group in groups for c in group])
    sizes, shapes = [b.size(x, d) for d in range(len(groups[0]))], [s[:len(groups[0])] for s in x.shapes]
    start = len(groups[0])
    for group in groups[1:]:
        dims = range(start, start + len(group))
        size = b.size(x, dims[0]) if group else 1
        for d in dims[1:]:
            size = IntOp("mul", size, b.size(x, d))
        sizes.append(size)
        shapes = [shape + (math.prod(full[d] for d in dims),) for shape, full in zip(shapes, x.shapes)]
        start += len(group)
    shapes = tuple(shapes)
    return x if shapes == x.shapes else b.view(x, "reshape", (tuple(sizes),), shapes)


def _permuted(b: Builder, x: Value, position, wanted) -> Value:
    """x with its dims reordered so that dim i holds what `wanted[i]` names (`position` gives its dim in x)."""
    order = tuple(position(w) for w in wanted)
    if order == tuple(range(x.rank)):
        return x
    return b.view(x, "permute", (order,), tuple(tuple(s[d] for d in order) for s in x.shapes))


def _bmm(b: Builder, call: Call):
    a, m = call.arg(0, "input"), call.arg(1, "mat2")
    if a.rank != 3 or m.rank != 3:
        raise UnsupportedSubproblem("bmm of tensors that are not 3-d")
    return fuse_attention(b, a, m) or b.matmul(a, m)


def _addmm_like(first: str, second: str) -> Handler:
    """addmm / baddbmm: beta * input + alpha * (first @ second), the scaled sum as the GEMM's epilogue."""
    def handler(b: Builder, call: Call):
        bias, a, m = call.arg(0, "input"), call.arg(1, first), call.arg(2, second)
        beta, alpha = call.kwargs.get("beta", 1), call.kwargs.get("alpha", 1)
        product = b.matmul(a, m)
        if alpha != 1:
            product = b.pw("mul", product, alpha)
        if beta == 0:
            return product
        return b.pw("add", product, b.pw("mul", bias, beta) if beta != 1 else bias)
    return handler


def _outer(b: Builder, call: Call):
    """torch.outer: x[:, None] * y[None, :], elementwise (a GEMM with K = 1 would waste its tiles)."""
    x, y = call.arg(0, "input"), call.arg(1, "vec2")
    if not (isinstance(x, Value) and isinstance(y, Value) and x.rank == y.rank == 1):
        raise UnsupportedSubproblem("outer of tensors that are not 1-d")
    return b.pw("mul", b.unsqueeze(x, 1), b.unsqueeze(y, 0))


def _cat(b: Builder, call: Call):
    """torch.cat / concat / concatenate of tensors of one rank along `dim`."""
    return b.concat(_tensor_list(call, "cat"), b.const(call.arg(1, "dim", 0), "cat dim"))


def _stack(b: Builder, call: Call):
    """torch.stack: a cat of the tensors, each given a new size-1 dim at `dim`."""
    parts = _tensor_list(call, "stack")
    dim = int(b.const(call.arg(1, "dim", 0), "stack dim")) % (parts[0].rank + 1)
    return b.concat([b.unsqueeze(p, dim) for p in parts], dim)


def _tensor_list(call: Call, what: str) -> list[Value]:
    parts = list(call.arg(0, "tensors"))
    if not parts or not all(isinstance(p, Value) for p in parts):
        raise UnsupportedSubproblem(f"{what} of something other than a list of tensors")
    return parts


def gather(b: Builder, table: Value, index: Value, dim: int, wraps: bool = False) -> Value:
    dim %= table.rank
    shapes = tuple(t[:dim] + i + t[dim + 1:] for t, i in zip(table.shapes, index.shapes))
    positions = _arange_of(index)
    if positions is not None:
        # table rows start:end:step, the index's leading size-1 dims (`arange(n)[None]`) put in front of them
        rows = tuple(t[:dim] + i[-1:] + t[dim + 1:] for t, i in zip(table.shapes, index.shapes))
        bounds = (slice(None),) * dim + (slice(positions.start, positions.end, positions.step),)
        out = b.view(table, "__getitem__", (bounds,), rows)
        for _ in range(index.rank - 1):
            out = b.unsqueeze(out, dim)
        return out
    if not is_integer(index):
        raise UnsupportedSubproblem("embedding/index_select indices that are not an integer input or buffer")
    return b.program.add(Gather(shapes, table=table, index=index, dim=dim, wraps=wraps))


# Views that keep a 1-d tensor's elements in order when they only put size-1 dims before it.
_ORDER_KEEPING_VIEWS = {"reshape", "view", "unsqueeze", "__getitem__", "expand", "flatten", "contiguous"}


def _arange_of(index: Value) -> Arange | None:
    """The torch.arange an index is, directly or through views that only add leading size-1 dims (`[None]`,
    `unsqueeze(0)`): a view keeping all n of its elements, in a shape of leading 1s then n, keeps their order."""
    value = index
    while isinstance(value, View) and value.method in _ORDER_KEEPING_VIEWS:
        value = value.base
    if not isinstance(value, Arange):
        return None
    for shape, n in zip(index.shapes, (s[0] for s in value.shapes)):
        if shape[-1:] != (n,) or any(size != 1 for size in shape[:-1]):
            return None
    return value


def _arange(b: Builder, call: Call):
    """torch.arange: an embedding's positions (a slice of its table, see `_arange_of`), or numbers a kernel of
    its own writes in the dtype PyTorch would give it."""
    positional = [a for a in call.args if not isinstance(a, torch.dtype)]
    if len(positional) == 1 and "end" not in call.kwargs:       # arange(end)
        positional = [0] + positional
    given = dict(zip(("start", "end", "step"), positional))
    start, end, step = (given.get(k, call.kwargs.get(k, default)) for k, default in
                        (("start", 0), ("end", None), ("step", 1)))
    dtype = call.kwargs.get("dtype")
    if dtype is None:      # as PyTorch picks it: any float bound makes floats
        dtype = torch.float32 if any(isinstance(v, float) for v in (start, end, step)) else torch.int64
    if dtype not in (torch.int64, torch.int32, torch.float32):
        raise UnsupportedSubproblem(f"torch.arange of {dtype}")
    if end is None or not (isinstance(step, (int, float)) and step > 0):
        raise UnsupportedSubproblem("torch.arange without an end, or with a step that is not positive")
    return b.program.add(Arange(call.shapes, start=_shape_arg(b, start), end=_shape_arg(b, end),
                                step=_shape_arg(b, step), dtype=str(dtype).removeprefix("torch.")))


def _gather_along(b: Builder, call: Call):
    """torch.gather(input, dim, index): out[i][j][k] = input[i][index[i][j][k]][k] for dim 1."""
    table, index = call.arg(0, "input"), call.arg(2, "index")
    if not is_integer(index):
        raise UnsupportedSubproblem("gather indices that are not an integer input or buffer")
    if index.rank != table.rank:
        raise UnsupportedSubproblem("gather with an index of another rank than its input")
    return take_along(b, table, index, b.const(call.arg(1, "dim"), "gather dim") % table.rank)


def take_along(b: Builder, table: Value, index: Value, dim: int) -> Value:
    """out[i] = table[i with `dim` replaced by index[i]]: the output has the index's shape."""
    return b.program.add(Gather(index.shapes, table=table, index=index, dim=dim, mode="along"))


def _embedding(b: Builder, call: Call):
    if call.arg(3, "max_norm", None) is not None:
        raise UnsupportedSubproblem("embedding with max_norm (it renormalises the weight in place)")
    return gather(b, as_param(call.arg(1, "weight"), "weight"), call.arg(0, "input"), 0)


def _aten_embedding(b: Builder, call: Call):
    return gather(b, call.arg(0, "weight"), call.arg(1, "indices"), 0)


def _embedding_module(b: Builder, call: Call):
    if call.module.max_norm is not None:
        raise UnsupportedSubproblem("nn.Embedding with max_norm (it renormalises the weight in place)")
    return gather(b, module_param(b, call, "weight"), call.arg(0, "input"), 0)


def embedding_bag(b: Builder, weight: Value, index: Value, mode: str, per_sample_weights: Value | None) -> Value:
    """nn.EmbeddingBag over a 2-d input: each row of indices one bag of equal size, its rows of `weight`
    gathered (times their per-sample weights, mode "sum" only) and summed, averaged or maxed. Without offsets
    PyTorch takes no other input rank."""
    rows = gather(b, weight, index, 0)                                     # [bags, bag size, dim]
    if per_sample_weights is not None:
        rows = b.pw("mul", rows, b.unsqueeze(per_sample_weights, 2))
    return b.reduce_keep({"sum": "sum", "mean": "mean", "max": "amax"}[mode], rows, (1,), keepdim=False)


def _embedding_bag_refusals(offsets, max_norm, padding_idx) -> None:
    if offsets is not None:
        raise UnsupportedSubproblem("embedding_bag with offsets (bags of varying size)")
    if max_norm is not None:
        raise UnsupportedSubproblem("embedding_bag with max_norm (it renormalises the weight in place)")
    if padding_idx is not None:
        raise UnsupportedSubproblem("embedding_bag with padding_idx (its entries leave the bags)")


def _embedding_bag(b: Builder, call: Call):
    _embedding_bag_refusals(call.arg(2, "offsets", None), call.arg(3, "max_norm", None),
                            call.arg(10, "padding_idx", None))
    return embedding_bag(b, as_param(call.arg(1, "weight"), "weight"), call.arg(0, "input"),
                         b.const(call.arg(6, "mode", "mean"), "embedding_bag mode"),
                         call.arg(8, "per_sample_weights", None))


def _embedding_bag_module(b: Builder, call: Call):
    module = call.module
    _embedding_bag_refusals(call.arg(1, "offsets", None), module.max_norm, module.padding_idx)
    return embedding_bag(b, module_param(b, call, "weight"), call.arg(0, "input"), call.module_attr("mode"),
                         call.arg(2, "per_sample_weights", None))


def _index_select(b: Builder, call: Call):
    x, index = call.arg(0, "input"), call.arg(2, "index")
    if index.rank != 1:
        raise UnsupportedSubproblem("index_select with an index that is not 1-d")
    return gather(b, x, index, b.const(call.arg(1, "dim"), "index_select dim"))


class _LayerParts:
    """The pieces nn.TransformerEncoderLayer/DecoderLayer are made of, on the layer at `call.path`."""

    def __init__(self, b: Builder, call: Call, masks: tuple[tuple[int, str], ...]):
        layer = call.module
        if any(call.arg(i, name, None) not in (None, False) for i, name in masks):
            raise UnsupportedSubproblem(f"{type(layer).__name__} with {' or '.join(n for _, n in masks)}")
        if layer.training and layer.dropout.p:
            raise UnsupportedInMode(f"{type(layer).__name__} with dropout={layer.dropout.p} in training mode: the "
                                    "reference draws its random mask from torch's generator; run with --eval")
        self.b, self.call, self.layer = b, call, layer
        self.activation = _activation_op(layer.activation)

    def param(self, name: str):
        return sub_param(self.b, self.call.modules, self.call.path, name)

    def norm(self, name: str, x: Value) -> Value:
        eps = getattr(self.layer, name).eps
        return layer_norm(self.b, x, 1, self.param(f"{name}.weight"), self.param(f"{name}.bias"), eps)

    def attend(self, attr: str, x: Value, memory: Value) -> Value:
        modules = [getattr(m, attr) for m in self.call.modules]
        return multihead_attention(self.b, modules, f"{self.call.path}.{attr}", x, memory, memory)

    def feed_forward(self, x: Value) -> Value:
        b = self.b
        hidden = b.pw(self.activation, b.linear(x, self.param("linear1.weight"), self.param("linear1.bias")))
        return b.linear(hidden, self.param("linear2.weight"), self.param("linear2.bias"))

    def residual(self, x: Value, norm: str, block) -> Value:
        """x + block(norm(x)) (norm_first), or norm(x + block(x))."""
        if self.layer.norm_first:
            return self.b.pw("add", x, block(self.norm(norm, x)))
        return self.norm(norm, self.b.pw("add", x, block(x)))


def _transformer_encoder_layer(b: Builder, call: Call):
    """nn.TransformerEncoderLayer without masks: self-attention (fused) and the ReLU/GELU feed-forward."""
    parts = _LayerParts(b, call, ((1, "src_mask"), (2, "src_key_padding_mask"), (3, "is_causal")))
    x = parts.residual(call.arg(0, "src"), "norm1", lambda h: parts.attend("self_attn", h, h))
    return parts.residual(x, "norm2", parts.feed_forward)


def _transformer_decoder_layer(b: Builder, call: Call):
    """nn.TransformerDecoderLayer without masks: self-attention, attention to `memory`, feed-forward."""
    parts = _LayerParts(b, call, ((2, "tgt_mask"), (3, "memory_mask"), (4, "tgt_key_padding_mask"),
                                  (5, "memory_key_padding_mask"), (6, "tgt_is_causal"), (7, "memory_is_causal")))
    memory = call.arg(1, "memory")
    x = parts.residual(call.arg(0, "tgt"), "norm1", lambda h: parts.attend("self_attn", h, h))
    x = parts.residual(x, "norm2", lambda h: parts.attend("multihead_attn", h, memory))
    return parts.residual(x, "norm3", parts.feed_forward)


def _activation_op(activation) -> str:
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if activation is F.gelu or (isinstance(activation, nn.GELU) and activation.approximate == "none"):
        return "gelu"
    raise UnsupportedSubproblem(f"nn.TransformerEncoderLayer with activation {activation!r}")


# --- convolutions -----------------------------------------------------------------------------------

def _conv_padding(padding, weight: Value, spatial: int, dilation: tuple[int, ...]) -> tuple[int, ...]:
    """Numeric padding; 'same' pads (total // 2) before, the masked loads cover the rest."""
    if padding == "valid":
        return (0,) * spatial
    if padding == "same":
        kernel = weight.shapes[0][2:]
        return tuple(dilation[d] * (kernel[d] - 1) // 2 for d in range(spatial))
    return tuple_arg(padding, spatial, "padding")


def conv(b: Builder, x: Value, weight: Value, bias: Value | None, *, transposed: bool, stride, padding,
         dilation, output_padding, groups, geometry_from: str | None = None) -> Value:
    """stride, padding, dilation and groups: one value for every input config, or (from a module whose
    instances differ, read at run time from `geometry_from`) a list with one per config."""
    spatial = weight.rank - 2
    if x.rank != weight.rank:
        raise UnsupportedSubproblem(f"convolution of a rank-{x.rank} input (unbatched input is not supported)")
    configs = len(x.shapes)
    paddings_given = padding if isinstance(padding, list) else [padding]
    if len({s[2:] for s in weight.shapes}) > 1 and (transposed or "same" in paddings_given):
        raise UnsupportedSubproblem("a transposed or padding='same' convolution whose kernel size differs "
                                    "between input configs")

    def per_config(value, what: str) -> list:
        return value if isinstance(value, list) else [b.const(value, what)] * configs

    dilations = [tuple_arg(d, spatial, "dilation") for d in per_config(dilation, "dilation")]
    strides = [tuple_arg(s, spatial, "stride") for s in per_config(stride, "stride")]
    paddings = [_conv_padding(p, weight, spatial, d) for p, d in zip(per_config(padding, "padding"), dilations)]
    groups = tuple(int(g) for g in per_config(groups, "groups"))
    if transposed and (len(set(groups)) > 1 or geometry_from is not None):
        # the weight [C_in, C_out / groups, K..] does not tell the groups apart, and phases follow the stride
        raise UnsupportedSubproblem("a transposed convolution whose groups or geometry differ between input configs")
    out = b.conv(x, weight, transposed=transposed, stride=strides, padding=paddings, dilation=dilations,
                 output_padding=tuple_arg(b.const(output_padding, "output_padding"), spatial, "output_padding"),
                 groups=groups, geometry_from=geometry_from)
    return b.pw("add", out, b.channel_view(bias, out.rank)) if bias is not None else out


def _conv(b: Builder, call: Call):
    return conv(b, call.arg(0, "input"), as_param(call.arg(1, "weight"), "weight"),
                as_param(call.arg(2, "bias", None), "bias"), transposed=False, stride=call.arg(3, "stride", 1),
                padding=call.arg(4, "padding", 0), dilation=call.arg(5, "dilation", 1), output_padding=0,
                groups=call.arg(6, "groups", 1))


def _conv_transpose(b: Builder, call: Call):
    return conv(b, call.arg(0, "input"), as_param(call.arg(1, "weight"), "weight"),
                as_param(call.arg(2, "bias", None), "bias"), transposed=True, stride=call.arg(3, "stride", 1),
                padding=call.arg(4, "padding", 0), output_padding=call.arg(5, "output_padding", 0),
                groups=call.arg(6, "groups", 1), dilation=call.arg(7, "dilation", 1))


def _convolution(b: Builder, call: Call):
    """aten.convolution: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)."""
    return conv(b, call.arg(0, "input"), as_param(call.arg(1, "weight"), "weight"),
                as_param(call.arg(2, "bias"), "bias"), transposed=bool(call.arg(6, "transposed")),
                stride=call.arg(3, "stride"), padding=call.arg(4, "padding"), dilation=call.arg(5, "dilation"),
                output_padding=call.arg(7, "output_padding"), groups=call.arg(8, "groups"))


def _conv_module(b: Builder, call: Call):
    module = call.module
    if call.module_attr("padding_mode") != "zeros":
        return _conv_padded_first(b, call)
    transposed = isinstance(module, nn.modules.conv._ConvTransposeNd)
    output_padding = call.module_attr("output_padding")
    if transposed and call.arg(1, "output_size", None) is not None:
        output_padding = _output_padding_traced(call)
    # A subproblem's instances may differ in groups (depthwise layers of several widths) and in stride,
    # padding or dilation (a MobileNet's or ResNet's blocks): those the launcher takes per call.
    geometry = {name: [getattr(m, name) for m in call.modules] for name in ("stride", "padding", "dilation")}
    varying = any(len(set(values)) > 1 for values in geometry.values())
    if varying and any(isinstance(p, str) for p in geometry["padding"]):
        raise UnsupportedSubproblem(f"{type(module).__name__} with padding='same' whose geometry differs "
                                    "between input configs")
    return conv(b, call.arg(0, "input"), module_param(b, call, "weight"), module_param(b, call, "bias"),
                transposed=transposed, output_padding=output_padding,
                groups=[m.groups for m in call.modules], geometry_from=call.path if varying else None,
                **{name: values if varying else values[0] for name, values in geometry.items()})


def _output_padding_traced(call: Call) -> tuple[int, ...]:
    """The output_padding by which ConvTranspose reached the output size its forward was given (`output_size`,
    a U-Net decoder's skip.shape): the traced output's size less the smallest the geometry gives, per dim."""
    module, x_shapes = call.module, [tuple(s) for s in call.arg(0, "input").shapes]
    spatial = len(module.kernel_size)
    geometry = list(zip(module.stride, module.padding, module.dilation, module.kernel_size))
    found = set()
    for x_shape, out_shape in zip(x_shapes, call.shapes):
        found.add(tuple(out - transposed_size(n, k, s, p, d, 0)
                        for n, out, (s, p, d, k) in zip(x_shape[-spatial:], out_shape[-spatial:], geometry)))
    if len(found) > 1:
        raise UnsupportedSubproblem("ConvTranspose whose output_size needs a different output_padding per "
                                    "input config")
    return found.pop()


# --- padding ----------------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(b: Builder, x: Value, amounts, mode: str = "constant", value=None) -> Value:
    """F.pad: `amounts` are (before, after) counts from the last dim backwards, as F.pad takes them."""
    amounts = [int(a) for a in b.const(list(amounts), "pad")]
    if mode not in PAD_MODES:
        raise UnsupportedSubproblem(f"padding mode {mode!r} (supported: {', '.join(PAD_MODES)})")
    if len(amounts) % 2 or len(amounts) // 2 > x.rank:
        raise UnsupportedSubproblem(f"pad {tuple(amounts)} of a rank-{x.rank} tensor")
    count = len(amounts) // 2
    pads = tuple((amounts[2 * k], amounts[2 * k + 1]) for k in reversed(range(count)))   # in dim order
    if mode != "constant" and min(amounts, default=0) < 0:
        raise UnsupportedSubproblem(f"{mode} padding with a negative amount {tuple(amounts)}")
    first = x.rank - count
    shapes = tuple(shape[:first] + tuple(n + lo + hi for n, (lo, hi) in zip(shape[first:], pads))
                   for shape in x.shapes)
    if any(n <= 0 for shape in shapes for n in shape[first:]):
        raise UnsupportedSubproblem(f"pad {tuple(amounts)} leaves an empty dim")
    fill = 0.0 if value is None else float(b.const(value, "pad value"))
    return b.program.add(Pad(shapes, x=x, pads=pads, mode=mode, value=fill))


def _pad(b: Builder, call: Call):
    return pad(b, call.arg(0, "input"), call.arg(1, "pad"), b.const(call.arg(2, "mode", "constant"), "pad mode"),
               call.arg(3, "value", None))


def _constant_pad_nd(b: Builder, call: Call):
    """aten.constant_pad_nd(input, pad, value=0), what F.pad's constant mode becomes."""
    return pad(b, call.arg(0, "input"), call.arg(1, "pad"), "constant", call.arg(2, "value", 0.0))


# The nn.*Pad*d layers, by the F.pad mode each pads in.
_PAD_MODULES = {getattr(nn, f"{stem}Pad{d}d"): mode
                for stem, mode in (("Zero", "constant"), ("Constant", "constant"), ("Reflection", "reflect"),
                                   ("Replication", "replicate"), ("Circular", "circular"))
                for d in (1, 2, 3) if hasattr(nn, f"{stem}Pad{d}d")}


def _pad_module(b: Builder, call: Call):
    mode = _PAD_MODULES[type(call.module)]
    value = call.module_attr("value") if mode == "constant" else None
    return pad(b, call.arg(0, "input"), call.module_attr("padding"), mode, value)


def _conv_padded_first(b: Builder, call: Call):
    """A convolution whose padding_mode is "reflect", "replicate" or "circular" pads its input that way, then
    convolves it unpadded, as nn.Conv*d does (its `_reversed_padding_repeated_twice` is F.pad's argument)."""
    padded = pad(b, call.arg(0, "input"), call.module_attr("_reversed_padding_repeated_twice"),
                 call.module_attr("padding_mode"))
    return conv(b, padded, module_param(b, call, "weight"), module_param(b, call, "bias"), transposed=False,
                stride=call.module_attr("stride"), padding=0, dilation=call.module_attr("dilation"),
                output_padding=0, groups=[m.groups for m in call.modules])


# --- reordering copies: flip, roll, repeat, pixel (un)shuffle -----------------------------------------

def _dims_of(x: Value, dims, what: str) -> tuple[int, ...]:
    return tuple(d % x.rank for d in _const_ints(dims, what))


def _const_ints(values, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints, each a constant (not a traced size)."""
    values = values if isinstance(values, (tuple, list)) else (values,)
    if not all(isinstance(v, int) for v in values):
        raise UnsupportedSubproblem(f"{what} {tuple(values)!r}: it must be constant ints")
    return tuple(int(v) for v in values)


def _flip(b: Builder, call: Call):
    x = call.arg(0, "input")
    dims = _dims_of(x, b.const(_varargs(call, 1), "flip dims"), "flip dims")
    return b.program.add(Reindex(x.shapes, x=x, kind="flip", dims=dims))


def _roll(b: Builder, call: Call):
    x, dims = call.arg(0, "input"), call.arg(2, "dims", None)
    if dims is None or dims == ():
        raise UnsupportedSubproblem("torch.roll without dims (a roll of the flattened tensor)")
    shifts = _const_ints(b.const(call.arg(1, "shifts"), "roll shifts"), "roll shifts")
    dims = _dims_of(x, b.const(dims, "roll dims"), "roll dims")
    if len(shifts) != len(dims):
        raise UnsupportedSubproblem(f"roll by {shifts} along {dims}")
    return b.program.add(Reindex(x.shapes, x=x, kind="roll", dims=dims, amounts=shifts))


def _repeat(b: Builder, call: Call):
    x = call.arg(0, "input")
    times = _const_ints(b.const(_varargs(call, 1), "repeat sizes"), "repeat sizes")
    if len(times) < x.rank:
        raise UnsupportedSubproblem(f"repeat {times} of a rank-{x.rank} tensor")
    lead = len(times) - x.rank
    shapes = tuple(times[:lead] + tuple(n * t for n, t in zip(shape, times[lead:])) for shape in x.shapes)
    return b.program.add(Reindex(shapes, x=x, kind="repeat", amounts=times))


def _repeat_interleave(b: Builder, call: Call):
    """repeat_interleave(x, r, dim): each element along `dim` r times in a row (grouped-query attention's
    key and value heads, repeated for the query heads)."""
    x, dim = call.arg(0, "input"), call.arg(2, "dim", None)
    if dim is None:
        raise UnsupportedSubproblem("repeat_interleave without dim (a repeat of the flattened tensor)")
    r = _const_ints(b.const(call.arg(1, "repeats"), "repeat_interleave repeats"), "repeat_interleave repeats")[0]
    d = _dims_of(x, b.const(dim, "repeat_interleave dim"), "repeat_interleave dim")[0]
    shapes = tuple(s[:d] + (s[d] * r,) + s[d + 1:] for s in x.shapes)
    return b.program.add(Reindex(shapes, x=x, kind="repeat_interleave", dims=(d,), amounts=(r,)))


def pixel_shuffle(b: Builder, x: Value, factor, inverse: bool) -> Value:
    """F.pixel_shuffle (channels c*r*r at (h, w) -> c at (h*r, w*r)) and its inverse, F.pixel_unshuffle."""
    r = _const_ints(b.const(factor, "pixel shuffle factor"), "pixel shuffle factor")[0]
    if x.rank < 3 or r < 1:
        raise UnsupportedSubproblem(f"pixel shuffle of a rank-{x.rank} tensor by {r}")
    shapes = []
    for shape in x.shapes:
        *lead, c, h, w = shape
        if inverse:
            shapes.append((*lead, c * r * r, h // r, w // r))
        else:
            shapes.append((*lead, c // (r * r), h * r, w * r))
    kind = "pixel_unshuffle" if inverse else "pixel_shuffle"
    return b.program.add(Reindex(tuple(shapes), x=x, kind=kind, amounts=(r,)))


def _pixel_shuffle(inverse: bool) -> Handler:
    def handler(b: Builder, call: Call):
        return pixel_shuffle(b, call.arg(0, "input"), call.arg(1, "upscale_factor" if not inverse
                                                                  else "downscale_factor"), inverse)
    return handler


def _pixel_shuffle_module(b: Builder, call: Call):
    inverse = isinstance(call.module, nn.PixelUnshuffle)
    factor = call.module_attr("downscale_factor" if inverse else "upscale_factor")
    return pixel_shuffle(b, call.arg(0, "input"), factor, inverse)


def unfold(b: Builder, x: Value, kernel_size, dilation, padding, stride) -> Value:
    """F.unfold / nn.Unfold (im2col): [N, C, H, W] -> [N, C * kh * kw, L], column (c, ki, kj) of block l the
    input at (c, oh * sh + ki * dh - ph, ow * sw + kj * dw - pw), zero in the padding. `amounts` holds
    (kh, kw, dh, dw, ph, pw, sh, sw). PyTorch itself refuses other ranks and inputs too small for a block."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (tuple_arg(b.const(v, what), 2, what) for v, what in (
        (kernel_size, "unfold kernel_size"), (dilation, "unfold dilation"), (padding, "unfold padding"),
        (stride, "unfold stride")))
    shapes = []
    for *lead, c, h, w in x.shapes:
        blocks = sliding_windows(h, kh, sh, ph, dh) * sliding_windows(w, kw, sw, pw, dw)
        shapes.append((*lead, c * kh * kw, blocks))
    return b.program.add(Reindex(tuple(shapes), x=x, kind="unfold", amounts=(kh, kw, dh, dw, ph, pw, sh, sw)))


def _unfold(b: Builder, call: Call):
    if call.method:
        raise UnsupportedSubproblem("Tensor.unfold (sliding windows along one dim, a view) is not supported; "
                                    "F.unfold is")
    return unfold(b, call.arg(0, "input"), call.arg(1, "kernel_size"), call.arg(2, "dilation", 1),
                  call.arg(3, "padding", 0), call.arg(4, "stride", 1))


def _unfold_module(b: Builder, call: Call):
    return unfold(b, call.arg(0, "input"), *(call.module_attr(name) for name in
                                              ("kernel_size", "dilation", "padding", "stride")))


def channel_shuffle(b: Builder, x: Value, groups) -> Value:
    """nn.ChannelShuffle: channels seen as [groups, C / groups], transposed and flattened back (ShuffleNet's
    spelling), so the copy is the reordering the views imply."""
    g = int(b.const(groups, "channel shuffle groups"))
    if x.rank < 3 or g < 1 or any(shape[1] % g for shape in x.shapes):
        raise UnsupportedSubproblem(f"channel shuffle of a rank-{x.rank} tensor into {g} groups")
    split = b.view(x, "unflatten", (1, (g, -1)), tuple((s[0], g, s[1] // g, *s[2:]) for s in x.shapes))
    swapped = b.view(split, "transpose", (1, 2), tuple((s[0], s[2], s[1], *s[3:]) for s in split.shapes))
    return b.view(swapped, "flatten", (1, 2), x.shapes)


def _channel_shuffle(b: Builder, call: Call):
    groups = call.module_attr("groups") if call.modules else call.arg(1, "groups")
    return channel_shuffle(b, call.arg(0, "input"), groups)


# --- resampling -------------------------------------------------------------------------------------

# F.interpolate's modes the kernel writes, by the name it takes them under: (bi/tri)linear is linear along
# each spatial dim.
RESIZE_MODES = {"nearest": "nearest", "nearest-exact": "nearest-exact", "linear": "linear", "bilinear": "linear",
                "trilinear": "linear"}


def resize(b: Builder, x: Value, size, scale_factor, mode: str, align_corners, recompute_scale_factor) -> Value:
    """F.interpolate, with its arguments as it takes them; aten.upsample_* may pass both a size and factors, the
    size then deciding the output's shape and the factors its coordinates. "area" is an adaptive average pool
    to the output's sizes, as PyTorch computes it."""
    if mode not in RESIZE_MODES and mode != "area":
        raise UnsupportedSubproblem(f"interpolate with mode={mode!r} (supported: {', '.join(RESIZE_MODES)}, area)")
    spatial = x.rank - 2
    if spatial < 1 or (size is None and scale_factor is None):
        raise UnsupportedSubproblem(f"interpolate of a rank-{x.rank} tensor with size={size!r}, "
                                    f"scale_factor={scale_factor!r}")
    sizes = tuple_arg(b.const(size, "interpolate size"), spatial, "size") if size is not None else None
    factors = None
    if scale_factor is not None:
        given = b.const(scale_factor, "interpolate scale_factor")
        factors = tuple(float(f) for f in (given if isinstance(given, (tuple, list)) else [given] * spatial))
        if len(factors) != spatial:
            raise UnsupportedSubproblem(f"scale_factor {given!r} for {spatial} spatial dims")
    shapes = tuple(shape[:2] + (sizes or tuple(int(n * f) for n, f in zip(shape[2:], factors)))
                   for shape in x.shapes)
    if any(n <= 0 for shape in shapes for n in shape[2:]):
        raise UnsupportedSubproblem(f"interpolate to an empty size: {shapes[0]}")
    if mode == "area":
        return b.adaptive_pool("avg", x, [shape[2:] for shape in shapes])
    return b.program.add(Resize(shapes, x=x, mode=RESIZE_MODES[mode], align_corners=bool(align_corners),
                                size=sizes, scale_factor=factors,
                                recompute_scale_factor=bool(recompute_scale_factor)))


def _interpolate(b: Builder, call: Call):
    if call.arg(6, "antialias", False):
        raise UnsupportedSubproblem("interpolate with antialias=True")
    return resize(b, call.arg(0, "input"), call.arg(1, "size", None), call.arg(2, "scale_factor", None),
                  b.const(call.arg(3, "mode", "nearest"), "interpolate mode"),
                  b.const(call.arg(4, "align_corners", None), "align_corners"),
                  b.const(call.arg(5, "recompute_scale_factor", None), "recompute_scale_factor"))


def _aten_upsample(mode: str) -> Handler:
    """aten.upsample_* (what an nn.Upsample built inside forward traces to): (input, output_size,
    [align_corners for linear modes,] scale factors), the factors one list (the .vec form) or one per dim."""
    def handler(b: Builder, call: Call):
        size, rest = call.args[1], list(call.args[2:])
        align = rest.pop(0) if mode in ("linear", "bilinear", "trilinear") else None
        factors = rest[0] if len(rest) == 1 and (rest[0] is None or isinstance(rest[0], (tuple, list))) else rest
        if factors is not None and all(f is None for f in factors):
            factors = None
        if factors is not None and None in factors:
            raise UnsupportedSubproblem(f"{call.name} with scales for some dims only: {factors}")
        return resize(b, call.arg(0, "input"), size, factors, mode, align, False)
    return handler


_ATEN_UPSAMPLES = {f"aten.upsample_nearest{d}d": _aten_upsample("nearest") for d in (1, 2, 3)}
_ATEN_UPSAMPLES.update({f"aten._upsample_nearest_exact{d}d": _aten_upsample("nearest-exact") for d in (1, 2, 3)})
_ATEN_UPSAMPLES.update({"aten.upsample_linear1d": _aten_upsample("linear"),
                        "aten.upsample_bilinear2d": _aten_upsample("bilinear"),
                        "aten.upsample_trilinear3d": _aten_upsample("trilinear")})


def _upsample_module(b: Builder, call: Call):
    """nn.Upsample, and its UpsamplingNearest2d and UpsamplingBilinear2d (align_corners=True) forms."""
    return resize(b, call.arg(0, "input"), call.module_attr("size"), call.module_attr("scale_factor"),
                  call.module_attr("mode"), call.module_attr("align_corners"),
                  call.module_attr("recompute_scale_factor"))


# --- pooling ----------------------------------------------------------------------------------------

def _pool_geometry(b: Builder, spatial: int, kernel, stride, padding, dilation):
    kernel = tuple_arg(b.const(kernel, "kernel_size"), spatial, "kernel_size")
    stride = b.const(stride, "stride")
    stride = kernel if stride is None or stride == [] or stride == () else tuple_arg(stride, spatial, "stride")
    return (kernel, stride, tuple_arg(b.const(padding, "padding"), spatial, "padding"),
            tuple_arg(b.const(dilation, "dilation"), spatial, "dilation"))


def _max_pool(spatial: int, with_indices: bool = False) -> Handler:
    """F.max_pool{n}d. With return_indices=True fx records F.max_pool{n}d_with_indices (`with_indices`), which
    returns (values, indices) whatever its return_indices argument says; aten's max_pool{n}d_with_indices (what
    export records) takes the same arguments up to ceil_mode."""
    def handler(b: Builder, call: Call):
        kernel, stride, padding, dilation = _pool_geometry(
            b, spatial, call.arg(1, "kernel_size"), call.arg(2, "stride", None), call.arg(3, "padding", 0),
            call.arg(4, "dilation", 1))
        ceil_mode = bool(b.const(call.arg(5, "ceil_mode", False), "ceil_mode"))
        values = b.pool("max", call.arg(0, "input"), kernel, stride, padding, dilation, ceil_mode)
        pair = with_indices or b.const(call.arg(6, "return_indices", False), "return_indices")
        return max_pool_pair(b, values) if pair else values
    return handler


def max_pool_pair(b: Builder, values: Pool) -> ValuesIndices:
    """A max pool's (values, indices): the indices kernel is built once, and only where the forward takes them."""
    return ValuesIndices(values, functools.cache(lambda: b.program.add(PoolIndices(values.shapes, pool=values))))


def _avg_pool(spatial: int) -> Handler:
    def handler(b: Builder, call: Call):
        kernel, stride, padding, dilation = _pool_geometry(
            b, spatial, call.arg(1, "kernel_size"), call.arg(2, "stride", None), call.arg(3, "padding", 0), 1)
        ceil_mode = bool(b.const(call.arg(4, "ceil_mode", False), "ceil_mode"))
        include_pad = bool(b.const(call.arg(5, "count_include_pad", True), "count_include_pad"))
        divisor = b.const(call.arg(6, "divisor_override", None), "divisor_override")
        return b.pool("avg", call.arg(0, "input"), kernel, stride, padding, dilation, ceil_mode, include_pad, divisor)
    return handler


def _pool_module(b: Builder, call: Call):
    module = call.module
    kind = "max" if isinstance(module, nn.modules.pooling._MaxPoolNd) else "avg"
    spatial = int(type(module).__name__[-2])
    dilation = call.module_attr("dilation") if kind == "max" else 1
    kernel, stride, padding, dilation = _pool_geometry(b, spatial, call.module_attr("kernel_size"),
                                                       call.module_attr("stride"), call.module_attr("padding"),
                                                       dilation)
    ceil_mode = bool(call.module_attr("ceil_mode"))
    if kind == "max":
        values = b.pool("max", call.arg(0, "input"), kernel, stride, padding, dilation, ceil_mode)
        return max_pool_pair(b, values) if call.module_attr("return_indices") else values
    include_pad = bool(call.module_attr("count_include_pad"))
    divisor = getattr(module, "divisor_override", None)
    return b.pool("avg", call.arg(0, "input"), kernel, stride, padding, dilation, ceil_mode, include_pad, divisor)


def lp_pool(b: Builder, x: Value, spatial: int, norm_type, kernel, stride, ceil_mode) -> Value:
    """Power-average pooling as PyTorch computes it: the average of x^p over each window times the window's
    size, to the power 1/p (NaN where that sum is negative, as for an odd p)."""
    p = float(b.const(norm_type, "norm_type"))
    kernel, stride, padding, dilation = _pool_geometry(b, spatial, kernel, stride, 0, 1)
    powered = b.pw("pow_const", x, exponent=Scalar(p))
    average = b.pool("avg", powered, kernel, stride, padding, dilation, bool(b.const(ceil_mode, "ceil_mode")))
    return b.pw("pow_const", b.pw("mul", average, float(math.prod(kernel))), exponent=Scalar(1.0 / p))


def _lp_pool(spatial: int) -> Handler:
    def handler(b: Builder, call: Call):
        return lp_pool(b, call.arg(0, "input"), spatial, call.arg(1, "norm_type"), call.arg(2, "kernel_size"),
                       call.arg(3, "stride", None), call.arg(4, "ceil_mode", False))
    return handler


def _lp_pool_module(b: Builder, call: Call):
    spatial = int(type(call.module).__name__[-2])
    return lp_pool(b, call.arg(0, "input"), spatial, *(call.module_attr(name) for name in
                                                       ("norm_type", "kernel_size", "stride", "ceil_mode")))


def local_response_norm(b: Builder, x: Value, size, alpha, beta, k) -> Value:
    """x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta, the channels zero-padded by
    size // 2 before and (size - 1) // 2 after, as PyTorch computes it: the channel axis made a pooling axis
    ([N, 1, C, ..]) and averaged by a window of `size` channels and 1 position."""
    size = int(b.const(size, "LocalResponseNorm size"))
    if x.rank not in (3, 4):
        raise UnsupportedSubproblem(f"LocalResponseNorm of a rank-{x.rank} input (3 or 4 are supported)")
    lifted = b.unsqueeze(b.pw("mul", x, x), 1)                  # [N, 1, C, L] or [N, 1, C, H, W]
    spatial = x.rank - 1
    padded = pad(b, lifted, [0, 0] * (spatial - 1) + [size // 2, (size - 1) // 2])
    window = (size,) + (1,) * (spatial - 1)
    mean = b.squeeze(b.pool("avg", padded, window, (1,) * spatial, (0,) * spatial, (1,) * spatial, False), (1,))
    scaled = b.pw("add", b.pw("mul", mean, b.scalar(alpha)), b.scalar(k))
    return b.pw("div", x, b.pw("pow_const", scaled, exponent=b.scalar(beta)))


# PyTorch's own defaults (alpha, beta, k), read from its signature rather than copied here
_LRN_DEFAULTS = inspect.signature(F.local_response_norm).parameters


def _local_response_norm(b: Builder, call: Call):
    alpha, beta, k = (call.arg(i, name, _LRN_DEFAULTS[name].default)
                      for i, name in enumerate(("alpha", "beta", "k"), start=2))
    return local_response_norm(b, call.arg(0, "input"), call.arg(1, "size"), alpha, beta, k)


def _local_response_norm_module(b: Builder, call: Call):
    return local_response_norm(b, call.arg(0, "input"), call.module_attr("size"), call.module_attr("alpha"),
                               call.module_attr("beta"), call.module_attr("k"))


_NO_ADAPTIVE_INDICES = "adaptive max pooling's indices are not written"


def _adaptive_pool(kind: str, spatial: int) -> Handler:
    def handler(b: Builder, call: Call):
        if kind == "max" and call.arg(2, "return_indices", False):
            raise UnsupportedSubproblem(f"{call.name} with return_indices=True ({_NO_ADAPTIVE_INDICES})")
        out_sizes = [shape[-spatial:] for shape in call.shapes]
        return b.adaptive_pool(kind, call.arg(0, "input"), out_sizes)
    return handler


def _adaptive_pool_module(b: Builder, call: Call):
    module = call.module
    kind = "max" if "Max" in type(module).__name__ else "avg"
    if kind == "max" and call.module_attr("return_indices"):
        raise UnsupportedSubproblem(f"{type(module).__name__} with return_indices=True ({_NO_ADAPTIVE_INDICES})")
    spatial = int(type(module).__name__[-2])
    return b.adaptive_pool(kind, call.arg(0, "input"), [shape[-spatial:] for shape in call.shapes])


def _adaptive_max_pool_with_indices(b: Builder, call: Call):
    """F.adaptive_max_pool{n}d_with_indices: what F.adaptive_max_pool{n}d(..., return_indices=True) records."""
    raise UnsupportedSubproblem(f"{call.name} ({_NO_ADAPTIVE_INDICES})")


# --- max unpooling ----------------------------------------------------------------------------------

def max_unpool(b: Builder, x, indices, spatial: int, stride: tuple[int, ...] | None,
               out_shapes: tuple[Shape, ...]) -> Value:
    """MaxUnpool: `x`'s values written into zeros of the traced `out_shapes` at `indices`, flat positions within
    each (N, C) plane of the trailing `spatial` dims. `stride` (None where the call gives none) lets the
    kernel find output sizes that differ between input configs from its input's sizes."""
    if not isinstance(x, Value) or not isinstance(indices, Value):
        raise UnsupportedSubproblem("max_unpool of a non-tensor")
    if is_integer(x) or not is_integer(indices):
        raise UnsupportedSubproblem("max_unpool of an integer tensor, or with indices that are not integers")
    scale, offset = _unpooled_sizes(x.shapes, out_shapes, spatial, stride)
    return b.program.add(Unpool(out_shapes, x=x, indices=indices, scale=scale, offset=offset,
                                distinct=_indices_distinct(indices)))


def _unpooled_sizes(in_shapes, out_shapes, spatial: int, stride) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per pooled dim, (scale, offset) such that every config's output size is its input size * scale + offset:
    scale 0 where all configs agree on the size, else the stride (PyTorch's size is (in - 1) * stride -
    2 * padding + kernel_size, an output_size within a stride of it)."""
    scale, offset = [], []
    for d in range(spatial):
        ins = [shape[len(shape) - spatial + d] for shape in in_shapes]
        outs = [shape[len(shape) - spatial + d] for shape in out_shapes]
        if len(set(outs)) == 1:
            scale.append(0)
            offset.append(outs[0])
            continue
        offsets = {o - i * stride[d] for i, o in zip(ins, outs)} if stride else set()
        if len(offsets) != 1:
            raise UnsupportedSubproblem(f"max_unpool to sizes {outs} along pooled dim {d} that the input sizes "
                                        f"{ins} do not give alike under every input config")
        scale.append(stride[d])
        offset.append(offsets.pop())
    return tuple(scale), tuple(offset)


def _indices_distinct(indices: Value) -> bool:
    """Whether no two elements can name one position: the indices of a max pool whose windows of consecutive
    taps (dilation 1) do not overlap (stride >= kernel along every dim) each lie in a window of their own."""
    if not isinstance(indices, PoolIndices):
        return False
    pool = indices.pool
    return all(d == 1 and s >= k for k, s, d in zip(pool.kernel, pool.stride, pool.dilation))


def _max_unpool(spatial: int) -> Handler:
    """F.max_unpool{n}d(input, indices, kernel_size, stride=None, padding=0, output_size=None); the output's
    shape is the traced one, so output_size needs no reading."""
    def handler(b: Builder, call: Call):
        _, stride, _, _ = _pool_geometry(b, spatial, call.arg(2, "kernel_size"), call.arg(3, "stride", None),
                                         call.arg(4, "padding", 0), 1)
        return max_unpool(b, call.arg(0, "input"), call.arg(1, "indices"), spatial, stride, call.shapes)
    return handler


def _max_unpool_module(b: Builder, call: Call):
    """nn.MaxUnpool1d/2d/3d: forward(input, indices, output_size=None)."""
    spatial = int(type(call.module).__name__[-2])
    stride = tuple_arg(call.module_attr("stride"), spatial, "stride")
    return max_unpool(b, call.arg(0, "input"), call.arg(1, "indices"), spatial, stride, call.shapes)


def _aten_max_unpool(spatial: int) -> Handler:
    """aten.max_unpool2d(input, indices, output_size) and aten.max_unpool3d(input, indices, output_size, stride,
    padding): what export records (a 1d unpool as a 2d one of width 1)."""
    def handler(b: Builder, call: Call):
        stride = call.arg(3, "stride", None)
        stride = None if stride is None else tuple_arg(b.const(stride, "stride"), spatial, "stride")
        return max_unpool(b, call.arg(0, "input"), call.arg(1, "indices"), spatial, stride, call.shapes)
    return handler


# --- views and shape arithmetic ---------------------------------------------------------------------

def _shape_arg(b: Builder, value):
    """A view argument: plain ints stay, config-dependent attributes are read at run time, tensors are refused."""
    if isinstance(value, Value):
        raise UnsupportedSubproblem("a view argument computed from tensor data")
    if isinstance(value, TaggedInt):
        values = {int(_resolve(m, value.attr)) for m in b.models}
        return int(value) if len(values) == 1 else Scalar(int(value), attr=value.attr)
    if isinstance(value, (tuple, list)):
        return type(value)(_shape_arg(b, v) for v in value)
    if isinstance(value, slice):
        return slice(_shape_arg(b, value.start), _shape_arg(b, value.stop), _shape_arg(b, value.step))
    return value


def _resolve(model, path: str):
    for part in path.split("."):
        model = getattr(model, part)
    return model


def _varargs(call: Call, start: int) -> tuple:
    """`x.view(a, b)` and `x.view((a, b))` alike."""
    rest = call.args[start:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        return tuple(rest[0])
    if not rest:
        for key in ("shape", "size", "dims", "sizes"):
            if key in call.kwargs:
                return tuple(call.kwargs[key])
    return tuple(rest)


def _view_method(method: str, varargs: bool = False) -> Handler:
    """A tensor method that only changes metadata; its result shape is the traced one."""
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        if not isinstance(x, Value):
            raise UnsupportedSubproblem(f"{call.name} of a non-tensor")
        args = (_varargs(call, 1),) if varargs else tuple(call.args[1:])
        if not varargs and call.kwargs:
            names = {"flatten": ("start_dim", "end_dim"), "transpose": ("dim0", "dim1"),
                     "squeeze": ("dim",), "unsqueeze": ("dim",)}.get(method, ())
            args = tuple(call.arg(1 + i, n, None) for i, n in enumerate(names))
            while args and args[-1] is None:
                args = args[:-1]
        return b.view(x, method, _shape_arg(b, args), call.shapes)
    return handler


def _flatten_module(b: Builder, call: Call):
    module = call.module
    return b.view(call.arg(0, "input"), "flatten", (module.start_dim, module.end_dim), call.shapes)


def _unflatten_module(b: Builder, call: Call):
    module = call.module
    return b.view(call.arg(0, "input"), "unflatten", (module.dim, tuple(module.unflattened_size)), call.shapes)


def _getitem(b: Builder, call: Call):
    base, index = call.args[0], call.args[1]
    if isinstance(base, ValuesIndices):
        return base.item(index)
    if isinstance(base, (tuple, list)):
        return base[index]
    if isinstance(base, Value):
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, Value) for p in parts):
            return _index_with_tensor(b, base, parts)
        return b.view(base, "__getitem__", (_shape_arg(b, index),), call.shapes)
    raise UnsupportedSubproblem(f"indexing a {type(base).__name__}")


def _index_with_tensor(b: Builder, base: Value, parts: tuple) -> Value:
    """`table[index]` or `table[:, index]`: one integer tensor among whole-dim slices picks entries along its
    dim, as index_select does with an index of any shape (a relative position bias read by a buffer of
    indices). Other tensor indexing (a bool mask, several index tensors) is refused."""
    dims = [d for d, p in enumerate(parts) if isinstance(p, Value)]
    whole = all(p == slice(None) for d, p in enumerate(parts) if d != dims[0])
    if len(dims) != 1 or not whole or not is_integer(parts[dims[0]]):
        raise UnsupportedSubproblem("indexing a tensor with a tensor other than one integer index among whole-dim "
                                    "slices (a bool mask's result has a size that depends on the data)")
    return gather(b, base, parts[dims[0]], dims[0], wraps=True)


def _aten_slice(b: Builder, call: Call):
    """aten.slice(x, dim, start, end, step): `x[:, .., start:end:step]` in the forward."""
    x = call.arg(0, "input")
    if not isinstance(x, Value):
        raise UnsupportedSubproblem("slice of a non-tensor")
    dim = int(b.const(call.arg(1, "dim", 0), "slice dim")) % x.rank
    bounds = slice(call.arg(2, "start", None), call.arg(3, "end", None), call.arg(4, "step", 1))
    index = (slice(None),) * dim + (_shape_arg(b, bounds),)
    return b.view(x, "__getitem__", (index,), call.shapes)


def _expand_as(b: Builder, call: Call):
    x, other = call.arg(0, "input"), call.arg(1, "other")
    if not isinstance(x, Value) or not isinstance(other, Value):
        raise UnsupportedSubproblem("expand_as of a non-tensor")
    return _expanded(b, x, other)


def _expanded(b: Builder, x: Value, other: Value) -> Value:
    """x.expand_as(other): x.expand(other's sizes), literal where every config agrees on a dim."""
    sizes = tuple(other.shapes[0][d] if len({s[d] for s in other.shapes}) == 1 else b.size(other, d)
                  for d in range(other.rank))
    return b.view(x, "expand", (sizes,), other.shapes)


def _copy(b: Builder, call: Call):
    """`dst.copy_(src)` (and aten.copy): src broadcast to dst's shape, computed as a new value. The lowering
    makes the in-place form write it back into dst (a module attribute: an Assign)."""
    dst, src = call.arg(0, "input"), call.arg(1, "src")
    if not isinstance(dst, Value) or not isinstance(src, Value):
        raise UnsupportedSubproblem("copy_ between non-tensors")
    if src.shapes != dst.shapes:
        src = _expanded(b, src, dst)
    return b.pw("identity", src)


def _split_like(method: str) -> Handler:
    """chunk / split: one view per piece, each `x.<method>(...)[i]` in the forward."""
    def handler(b: Builder, call: Call):
        x = call.arg(0, "input")
        args = tuple(_shape_arg(b, a) for a in call.args[1:]) + tuple(
            _shape_arg(b, v) for v in call.kwargs.values())
        return tuple(b.view(x, method, args, shapes, item=i) for i, shapes in enumerate(_pieces(call.results)))
    return handler


def _glu(b: Builder, call: Call):
    """F.glu: the first half along `dim` times the sigmoid of the second, the halves as chunk views."""
    return _gated(b, call.arg(0, "input"), call.arg(1, "dim", -1), call.shapes)


def _glu_module(b: Builder, call: Call):
    return _gated(b, call.arg(0, "input"), call.module_attr("dim"), call.shapes)


def _gated(b: Builder, x: Value, dim, shapes: tuple) -> Value:
    dim = int(b.const(dim, "glu dim"))
    value, gate = (b.view(x, "chunk", (2, dim), shapes, item=i) for i in range(2))
    return b.pw("mul", value, b.pw("sigmoid", gate))


def _pieces(shapes) -> list[tuple]:
    """Per-config shapes of a tuple result, regrouped as one tuple of per-config shapes per piece."""
    counts = {len(s) for s in shapes}
    if len(counts) > 1:
        raise UnsupportedSubproblem("chunk/split gives a different number of pieces under different configs")
    return [tuple(s[i] for s in shapes) for i in range(counts.pop())]


def _size(b: Builder, call: Call):
    x = call.arg(0, "input")
    dim = call.arg(1, "dim", None)
    if dim is None:
        return tuple(b.size(x, d) for d in range(x.rank))
    return b.size(x, int(b.const(dim, "size dim")))


def _numel(b: Builder, call: Call):
    x = call.arg(0, "input")
    if x.rank == 0:
        return 1
    out = b.size(x, 0)
    for d in range(1, x.rank):
        out = IntOp("mul", out, b.size(x, d))
    return out


def _dim(b: Builder, call: Call):
    return call.arg(0, "input").rank


def _getattr(b: Builder, call: Call):
    x, name = call.args
    if isinstance(x, ValuesIndices):
        return x.item(name)
    if not isinstance(x, Value):
        raise UnsupportedSubproblem(f"attribute {name!r} of a {type(x).__name__}")
    if name == "shape":
        return tuple(b.size(x, d) for d in range(x.rank))
    if name == "ndim":
        return x.rank
    if name in ("T", "mT"):
        return b.view(x, "transpose", (-2, -1), call.shapes) if x.rank >= 2 else x
    if name in ("device", "dtype"):
        return Placement(name)
    raise UnsupportedSubproblem(f"tensor attribute .{name}")


@dataclass(frozen=True)
class Placement:
    """`x.device` or `x.dtype`: only `.to(...)` may read it, which the lowering treats as the identity (the
    dtype check keeps every result float32); any other use is refused as an operand of unknown type."""

    attr: str


def _math(fn: str) -> Handler:
    """math.<fn> on shape values (fx records it, e.g. `math.sqrt(k.size(-1))`): Python arithmetic in forward."""
    def handler(b: Builder, call: Call):
        value = call.args[0]
        if isinstance(value, Value):
            raise UnsupportedSubproblem(f"math.{fn} of a tensor")
        if isinstance(value, (int, float)) and type(value) in (int, float):
            return {"sqrt": math.sqrt, "ceil": math.ceil, "floor": math.floor}[fn](value)
        if fn == "sqrt":
            return IntOp("pow", value, 0.5)
        raise UnsupportedSubproblem(f"math.{fn} of a shape value")
    return handler


FUNCTIONS: dict[str, Handler] = {
    "math.sqrt": _math("sqrt"), "math.ceil": _math("ceil"), "math.floor": _math("floor"),
    "linear": _linear, "matmul": _matmul, "operator.matmul": _matmul, "mm": _matmul, "bmm": _bmm,
    "scaled_dot_product_attention": scaled_dot_product_attention,
    "ones_like": ones_like, "tril": triangle("tril"), "triu": triangle("triu"),
    "cat": _cat, "concat": _cat, "concatenate": _cat, "stack": _stack,
    "embedding": _embedding, "embedding_bag": _embedding_bag, "aten.embedding": _aten_embedding,
    "index_select": _index_select, "arange": _arange,
    "gather": _gather_along, "pad": _pad, "constant_pad_nd": _constant_pad_nd, "interpolate": _interpolate,
    "flip": _flip, "roll": _roll, "repeat": _repeat, "repeat_interleave": _repeat_interleave,
    "pixel_shuffle": _pixel_shuffle(inverse=False), "pixel_unshuffle": _pixel_shuffle(inverse=True),
    "unfold": _unfold,
    "channel_shuffle": _channel_shuffle, "native_channel_shuffle": _channel_shuffle, **_ATEN_UPSAMPLES,
    "addmm": _addmm_like("mat1", "mat2"), "baddbmm": _addmm_like("batch1", "batch2"), "outer": _outer, "ger": _outer,
    "bilinear": _bilinear,
    "conv1d": _conv, "conv2d": _conv, "conv3d": _conv, "conv_transpose1d": _conv_transpose,
    "conv_transpose2d": _conv_transpose, "conv_transpose3d": _conv_transpose, "convolution": _convolution,
    "max_pool1d": _max_pool(1), "max_pool2d": _max_pool(2), "max_pool3d": _max_pool(3),
    **{f"max_pool{n}d_with_indices": _max_pool(n, with_indices=True) for n in (1, 2, 3)},
    **{f"adaptive_max_pool{n}d_with_indices": _adaptive_max_pool_with_indices for n in (1, 2, 3)},
    **{f"max_unpool{n}d": _max_unpool(n) for n in (1, 2, 3)},
    "aten.max_unpool2d": _aten_max_unpool(2), "aten.max_unpool3d": _aten_max_unpool(3),
    "avg_pool1d": _avg_pool(1), "avg_pool2d": _avg_pool(2), "avg_pool3d": _avg_pool(3),
    "adaptive_avg_pool1d": _adaptive_pool("avg", 1), "adaptive_avg_pool2d": _adaptive_pool("avg", 2),
    "adaptive_avg_pool3d": _adaptive_pool("avg", 3), "adaptive_max_pool1d": _adaptive_pool("max", 1),
    "adaptive_max_pool2d": _adaptive_pool("max", 2), "adaptive_max_pool3d": _adaptive_pool("max", 3),
    "local_response_norm": _local_response_norm,
    "lp_pool1d": _lp_pool(1), "lp_pool2d": _lp_pool(2), "lp_pool3d": _lp_pool(3),
    "view": _view_method("reshape", varargs=True), "reshape": _view_method("reshape", varargs=True),
    "_unsafe_view": _view_method("reshape", varargs=True),
    "permute": _view_method("permute", varargs=True), "expand": _view_method("expand", varargs=True),
    "flatten": _view_method("flatten"), "unflatten": _view_method("unflatten"),
    "transpose": _view_method("transpose"), "swapaxes": _view_method("transpose"), "t": _view_method("t"),
    "squeeze": _view_method("squeeze"), "unsqueeze": _view_method("unsqueeze"), "narrow": _view_method("narrow"),
    "select": _view_method("select"), "slice": _aten_slice, "expand_as": _expand_as,
    "chunk": _split_like("chunk"), "split": _split_like("split"), "tensor_split": _split_like("tensor_split"),
    "einsum": _einsum, "glu": _glu,
    "operator.getitem": _getitem, "getattr": _getattr, "size": _size, "sym_size": _size, "numel": _numel,
    "dim": _dim, "ndimension": _dim, "copy": _copy, **ATEN_RECURRENT,
}

MODULES: dict[type, Handler] = {
    nn.Linear: _linear_module, nn.Bilinear: _bilinear_module, nn.Flatten: _flatten_module,
    nn.Unflatten: _unflatten_module,
    nn.Embedding: _embedding_module, nn.EmbeddingBag: _embedding_bag_module,
    nn.MultiheadAttention: multihead_attention_module,
    nn.TransformerEncoderLayer: _transformer_encoder_layer, nn.TransformerDecoderLayer: _transformer_decoder_layer,
    **{cls: _conv_module for cls in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                                     nn.ConvTranspose3d)},
    **{cls: _pad_module for cls in _PAD_MODULES},
    **{cls: _upsample_module for cls in (nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d)},
    nn.PixelShuffle: _pixel_shuffle_module, nn.PixelUnshuffle: _pixel_shuffle_module, nn.Unfold: _unfold_module,
    nn.ChannelShuffle: _channel_shuffle, nn.GLU: _glu_module,
    nn.LocalResponseNorm: _local_response_norm_module,
    nn.LPPool1d: _lp_pool_module, nn.LPPool2d: _lp_pool_module, nn.LPPool3d: _lp_pool_module,
    nn.RNN: recurrent_module, nn.LSTM: recurrent_module, nn.GRU: recurrent_module,
    nn.RNNCell: recurrent_cell_module, nn.LSTMCell: recurrent_cell_module, nn.GRUCell: recurrent_cell_module,
    **{cls: _pool_module for cls in (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
                                     nn.AvgPool3d)},
    **{cls: _max_unpool_module for cls in (nn.MaxUnpool1d, nn.MaxUnpool2d, nn.MaxUnpool3d)},
    **{cls: _adaptive_pool_module for cls in (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                                              nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)},
}
