"""What forward may do with PyTorch outside kernels: allocate, view, copy and ask for metadata; never arithmetic."""

from __future__ import annotations

import functools

import torch
from torch import nn

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
TENSOR_MATH_METHODS = frozenset(
    _MATH_METHOD_NAMES + [name + "_" for name in _MATH_METHOD_NAMES] + _OPERATOR_DUNDERS
    + ["apply_", "map_", "map2_"]
)
# Methods that hand the data to the host, where Python or NumPy can do the work unseen.
HOST_ESCAPE_METHODS = frozenset({"numpy", "tolist"})


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


def is_torch_layer_class(dotted: str) -> bool:
    obj = _torch_object(dotted)
    return (isinstance(obj, type) and issubclass(obj, nn.Module)
            and dotted.rsplit(".", 1)[-1] not in _NN_NON_LAYERS)


def is_tensor_class(dotted: str) -> bool:
    obj = _torch_object(dotted)
    return isinstance(obj, type) and issubclass(obj, torch.Tensor)


def host_torch_reason(dotted: str, called: bool) -> str | None:
    """Why a torch name may not be used in forward or its helpers; None when it may."""
    parts = dotted.split(".")
    if parts[0] != "torch" or len(parts) == 1:
        return None
    head = parts[1]
    if head == "nn":
        return _host_nn_reason(parts[2:], dotted, called)
    if head == "Tensor":
        method = parts[2] if len(parts) > 2 else ""
        return "is tensor math run by PyTorch" if method in TENSOR_MATH_METHODS else None
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
    if called and is_torch_layer_class(dotted):
        return "builds and runs a torch.nn layer in forward"
    return None


@functools.lru_cache(maxsize=None)
def _is_torch_value(name: str) -> bool:
    """Dtypes, memory formats, numbers, classes, namespaces: torch names that are not ops."""
    if name.startswith("__"):  # __dict__ and friends look functions up by name
        return False
    obj = getattr(torch, name, None)
    return obj is not None and (isinstance(obj, type) or not callable(obj))
