"""Operation kinds: which operations start a fusion group, close it, or join the group that is open."""

from __future__ import annotations

from enum import Enum

from torch import fx, nn

from mkevolve.builtin.values import ValueInfo, ValueKind


class Kind(Enum):
    ANCHOR = "anchor"          # GEMM, convolution, normalisation: starts a group
    REDUCTION = "reduction"    # closes the group it ends
    POINTWISE = "pointwise"    # joins the open group as an epilogue
    VIEW = "view"              # joins the open group; does no arithmetic
    RANDOM = "random"          # draws from torch's random stream: a group of its own


_ANCHORS = {
    "linear", "bilinear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "conv1d", "conv2d",
    "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convtranspose1d", "convtranspose2d",
    "convtranspose3d", "convolution", "_convolution", "batchnorm1d", "batchnorm2d", "batchnorm3d",
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "layernorm", "layer_norm", "native_layer_norm", "groupnorm", "group_norm", "native_group_norm",
    "instancenorm1d", "instancenorm2d", "instancenorm3d", "instance_norm", "rmsnorm", "rms_norm",
    "localresponsenorm", "local_response_norm", "embedding", "embeddingbag", "embedding_bag", "multiheadattention",
    "scaled_dot_product_attention", "lstm", "gru", "rnn",
}
# Anchors the builtin kernels fuse an elementwise epilogue into (GEMM, convolution and row-kernel templates).
EPILOGUE_ANCHORS = {
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convtranspose1d", "convtranspose2d", "convtranspose3d",
    "convolution", "_convolution", "layernorm", "layer_norm", "groupnorm", "group_norm", "rmsnorm", "rms_norm",
    "batchnorm1d", "batchnorm2d", "batchnorm3d", "batch_norm", "instancenorm1d", "instancenorm2d",
    "instancenorm3d", "instance_norm",
}
_REDUCTIONS = {
    "sum", "mean", "amax", "amin", "prod", "logsumexp", "softmax", "_softmax", "log_softmax", "_log_softmax",
    "softmin", "logsoftmax", "softmax2d", "norm", "linalg_vector_norm", "var", "std", "var_mean", "std_mean",
    "cumsum", "cumprod", "logcumsumexp", "argmax", "argmin", "sort", "argsort", "msort", "topk", "kthvalue",
    "median", "nanmedian", "all", "any",
    "max_pool1d", "max_pool2d", "max_pool3d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "maxpool1d", "maxpool2d", "maxpool3d", "avgpool1d", "avgpool2d", "avgpool3d",
    "adaptiveavgpool1d", "adaptiveavgpool2d", "adaptiveavgpool3d", "adaptivemaxpool1d", "adaptivemaxpool2d",
    "adaptivemaxpool3d", "lppool1d", "lppool2d", "max_unpool1d", "max_unpool2d", "max_unpool3d", "maxunpool1d",
    "maxunpool2d", "maxunpool3d", "normalize",
}
_VIEWS = {
    "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "squeeze", "unsqueeze",
    "contiguous", "expand", "expand_as", "view_as", "reshape_as", "getitem", "chunk", "split", "unbind",
    "narrow", "select", "slice", "clone", "alias", "detach", "_unsafe_view", "identity", "movedim",
    "split_with_sizes", "getattr", "arange",
}
# Tensors made from shape values alone (positions): recomputed, as a pure view is, by the subproblem that needs one.
POSITION_FACTORIES = {"arange"}
# Views with no side effects: a subproblem that needs one recomputes it from its base tensor.
PURE_VIEWS = {
    "view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "squeeze", "unsqueeze", "expand",
    "expand_as", "view_as", "reshape_as", "getitem", "chunk", "split", "unbind", "narrow", "select", "slice",
    "_unsafe_view", "movedim", "alias", "split_with_sizes", "getattr",
}
# Ops that draw from torch's random stream: no kernel can draw the numbers torch draws, so each is a group of
# its own, kept as PyTorch code, and the work around it still gets kernels. Dropouts draw only while the
# model trains, and only with p > 0.
_DROPOUTS = {
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alphadropout", "featurealphadropout", "alpha_dropout",
    "feature_alpha_dropout", "feature_dropout", "native_dropout",
}
_SAMPLING = {"bernoulli", "rand_like", "randn_like", "randint_like", "multinomial", "normal", "poisson"}
# Reductions that take a second tensor are elementwise (torch.max(a, b)).
_BINARY_WHEN_TWO_TENSORS = {"max", "min"}


def kind_of(label: str, node: fx.Node, values: dict[fx.Node, ValueInfo], model: nn.Module) -> Kind:
    base = label.rstrip("_")
    if base in _SAMPLING or (base in _DROPOUTS and _dropout_draws(node, model)):
        return Kind.RANDOM
    if base in _BINARY_WHEN_TWO_TENSORS:
        tensors = [a for a in node.args
                   if isinstance(a, fx.Node) and a in values and values[a].kind is ValueKind.TENSOR]
        return Kind.POINTWISE if len(tensors) >= 2 else Kind.REDUCTION
    if base in _ANCHORS:
        return Kind.ANCHOR
    if base in _REDUCTIONS:
        return Kind.REDUCTION
    if base in _VIEWS:
        return Kind.VIEW
    return Kind.POINTWISE


def _dropout_draws(node: fx.Node, model: nn.Module) -> bool:
    """A dropout draws when it trains with p > 0: a layer's own `p` and `training`; a function's p and
    training arguments (F.dropout's default is to train), where tracing left them as constants."""
    if node.op == "call_module":
        layer = model.get_submodule(node.target)
        return layer.training and getattr(layer, "p", 0.5) != 0
    p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
    training = node.kwargs.get("training", node.kwargs.get("train", node.args[2] if len(node.args) > 2 else True))
    return not (p == 0 or training is False)
