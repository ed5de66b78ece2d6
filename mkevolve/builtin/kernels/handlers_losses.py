"""Loss functions, as PyTorch defines them: cross entropy and negative log likelihood over class scores; the
elementwise losses (squared and absolute error, Huber, binary cross entropy, KL divergence, margins); and the
distances and similarities that embedding losses are built on (pairwise distance, cosine similarity).

Class targets are indices (an integer input, `ignore_index` among them) or probabilities (a float tensor of
the scores' shape); class weights, label smoothing and the three reductions follow PyTorch's formulas. Scores
are (N, C, d1, ...), with classes along dim 1, or (C,) for one sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .builders import Builder, normalize_dims
from .calls import Call, Handler, as_param, module_param
from .errors import UnsupportedSubproblem
from .handlers_layers import gather, take_along
from .handlers_math import logsumexp, p_norm
from .ir import Value, is_integer

REDUCTIONS = ("none", "sum", "mean")


@dataclass
class LossOptions:
    """A loss call's options by name: the functional form's arguments after (input, target), in the order
    `names`, or keywords; a loss module's attributes, and its buffers for tensors."""

    b: Builder
    call: Call
    names: tuple[str, ...]
    tensors: int = 2                 # the options follow this many tensor arguments

    def value(self, name: str, default):
        if self.call.modules:
            return self.call.module_attr(name) if hasattr(self.call.module, name) else default
        return self.call.arg(self.tensors + self.names.index(name), name, default)

    def number(self, name: str, default: float) -> float:
        return float(self.b.const(self.value(name, default), f"{self.call.name} {name}"))

    def flag(self, name: str, default: bool) -> bool:
        return bool(self.b.const(self.value(name, default), f"{self.call.name} {name}"))

    def reduction(self) -> str:
        return str(self.b.const(self.value("reduction", "mean"), f"{self.call.name} reduction"))

    def tensor(self, name: str) -> Value | None:
        if self.call.modules:
            return module_param(self.b, self.call, name)
        return as_param(self.value(name, None), f"{self.call.name} {name}")


@dataclass(frozen=True)
class ClassLoss:
    """What one cross entropy or NLL call asks for, besides its tensors."""

    log_probs: bool             # NLL: the scores are log-probabilities already; cross entropy: raw scores
    ignore_index: int = -100    # samples whose target is this class add nothing, to the sum or to the count
    reduction: str = "mean"
    label_smoothing: float = 0.0


def class_loss(b: Builder, scores: Value, target: Value, weight: Value | None, spec: ClassLoss) -> Value:
    if spec.reduction not in REDUCTIONS:
        raise UnsupportedSubproblem(f"loss reduction {spec.reduction!r}")
    if scores.rank == 0:
        raise UnsupportedSubproblem("a loss over 0-d scores")
    dim = 1 if scores.rank >= 2 else 0
    if not is_integer(target):
        if spec.log_probs:
            raise UnsupportedSubproblem("nll_loss with a float target (it takes class indices)")
        return _probability_loss(b, scores, target, weight, dim, spec)
    if target.rank != scores.rank - 1:
        raise UnsupportedSubproblem("a class-index target whose rank is not the scores' rank - 1")
    return _index_loss(b, scores, target, weight, dim, spec)


def _index_loss(b: Builder, scores: Value, target: Value, weight: Value | None, dim: int,
                spec: ClassLoss) -> Value:
    """Per sample, w[t] * -log p(t) for target t, 0 where t is ignore_index; a mean divides the sum by the
    targets' weights (their count without weights), so a batch of ignored targets gives 0 / 0 = nan."""
    index = b.unsqueeze(target, dim)
    picked = b.squeeze(take_along(b, scores, index, dim), (dim,))
    lse = None if spec.log_probs else logsumexp(b, scores, (dim,))      # keepdim: broadcasts against scores
    nll = b.pw("neg", picked) if lse is None else b.pw("sub", b.squeeze(lse, (dim,)), picked)
    # The gather reads 0 for an index outside the table, so an ignored target's weight is finite
    target_weight = gather(b, weight, target, 0) if weight is not None else None
    if target_weight is not None:
        nll = b.pw("mul", nll, target_weight)
    valid = b.pw("ne", target, spec.ignore_index)
    counted = b.pw("where", valid, 1.0 if target_weight is None else target_weight, 0.0)
    loss = _reduced(b, b.pw("where", valid, nll, 0.0), counted, spec.reduction)
    if not spec.label_smoothing:
        return loss
    # Smoothing's term, -sum_c w_c log p_c, is masked and reduced like the NLL term
    smooth = b.reduce_keep("sum", _weighted_surprise(b, scores, lse, weight, dim), (dim,), False)
    return _smoothed(b, loss, _reduced(b, b.pw("where", valid, smooth, 0.0), counted, spec.reduction), spec, scores,
                     dim)


def _probability_loss(b: Builder, scores: Value, target: Value, weight: Value | None, dim: int,
                      spec: ClassLoss) -> Value:
    """Per sample, -sum_c w_c q_c log p_c for target probabilities q (smoothed: q (1 - eps) + eps / C); a
    mean divides by the number of samples."""
    if target.shapes != scores.shapes:
        raise UnsupportedSubproblem("a probability target whose shape is not the scores'")
    surprise = _weighted_surprise(b, scores, logsumexp(b, scores, (dim,)), weight, dim)
    loss = b.reduce_keep("sum", b.pw("mul", surprise, target), (dim,), False)
    if spec.label_smoothing:
        loss = _smoothed(b, loss, b.reduce_keep("sum", surprise, (dim,), False), spec, scores, dim)
    return _reduced(b, loss, None, spec.reduction)


def _weighted_surprise(b: Builder, scores: Value, lse: Value, weight: Value | None, dim: int) -> Value:
    """-w_c log p_c per class: the logsumexp `lse` (kept dims) less the scores, times the class weights."""
    surprise = b.pw("sub", lse, scores)
    return surprise if weight is None else b.pw("mul", surprise, b.channel_view(weight, scores.rank, dim))


def _smoothed(b: Builder, loss: Value, smooth: Value, spec: ClassLoss, scores: Value, dim: int) -> Value:
    """Label smoothing moves eps of each sample's target mass evenly onto all C classes: (1 - eps) times the
    target's loss plus eps / C times the loss summed over every class (`smooth`)."""
    eps = spec.label_smoothing
    return b.pw("add", b.pw("mul", loss, 1.0 - eps), b.pw("div", b.pw("mul", smooth, eps), b.size(scores, dim)))


def _reduced(b: Builder, loss: Value, counted: Value | None, reduction: str) -> Value:
    """The per-sample `loss` reduced: as it is, summed, or summed and divided by the sum of `counted` (by the
    number of samples where `counted` is None). Reduced with kept dims and squeezed last, so a mean's two
    sums and its division are one kernel."""
    if reduction == "none":
        return loss
    dims = tuple(range(loss.rank))
    if not dims:                                                     # one sample: its own sum and mean
        return loss if reduction == "sum" or counted is None else b.pw("div", loss, counted)
    if reduction == "mean" and counted is None:
        return b.squeeze(b.reduce("mean", loss, dims), dims)
    total = b.reduce("sum", loss, dims)
    if reduction == "mean":
        total = b.pw("div", total, b.reduce("sum", counted, dims))
    return b.squeeze(total, dims)


# --- losses per sample (per element, or per row of embeddings), then the reduction ------------------------

def _huber(b: Builder, error: Value, delta: float, scale: float) -> Value:
    """0.5 e^2 / scale below `delta`, else delta / scale * (|e| - 0.5 delta): smooth_l1 (scale = beta) and
    huber (scale = 1)."""
    size = b.pw("abs", error)
    return b.pw("where", b.pw("lt", size, delta), b.pw("div", b.pw("mul", b.pw("square", error), 0.5), scale),
                b.pw("mul", b.pw("sub", size, 0.5 * delta), delta / scale))


def _squared(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    return b.pw("square", b.pw("sub", x, y))


def _absolute(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    return b.pw("abs", b.pw("sub", x, y))


def _smooth_l1(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    beta = options.number("beta", 1.0)
    return _absolute(b, x, y, options) if beta == 0.0 else _huber(b, b.pw("sub", x, y), beta, beta)


def _huber_loss(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    return _huber(b, b.pw("sub", x, y), options.number("delta", 1.0), 1.0)


def _binary_cross_entropy(b: Builder, p: Value, y: Value, options: LossOptions) -> Value:
    """-(y log p + (1 - y) log(1 - p)), each log clamped at -100 as PyTorch does (log 0 is -inf)."""
    log_p = b.pw("clamp_min", b.pw("log", p), low=-100.0)
    log_q = b.pw("clamp_min", b.pw("log", b.pw("sub", 1.0, p)), low=-100.0)
    loss = b.pw("neg", b.pw("add", b.pw("mul", y, log_p), b.pw("mul", b.pw("sub", 1.0, y), log_q)))
    return _weighted(b, loss, options)


def _binary_cross_entropy_with_logits(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    """(1 - y) x - (1 + (w_pos - 1) y) log(sigmoid(x)), with log(sigmoid x) computed without overflow."""
    log_sigmoid = b.pw("logsigmoid", x)
    pos_weight = options.tensor("pos_weight")
    scale = log_sigmoid if pos_weight is None else b.pw(
        "mul", log_sigmoid, b.pw("add", b.pw("mul", b.pw("sub", pos_weight, 1.0), y), 1.0))
    return _weighted(b, b.pw("sub", b.pw("mul", b.pw("sub", 1.0, y), x), scale), options)


def _kl_divergence(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    """y (log y - x) for log-probabilities x, 0 where y is 0 (xlogy); exp(y) (y - x) for log targets."""
    if options.flag("log_target", False):
        return b.pw("mul", b.pw("exp", y), b.pw("sub", y, x))
    y_log_y = b.pw("where", b.pw("eq", y, 0.0), 0.0, b.pw("mul", y, b.pw("log", y)))
    return b.pw("sub", y_log_y, b.pw("mul", y, x))


def _margin_ranking(b: Builder, x1: Value, x2: Value, y: Value, options: LossOptions) -> Value:
    """max(0, margin - y (x1 - x2)): x1 should rank above x2 where y is 1, below where it is -1."""
    shortfall = b.pw("sub", options.number("margin", 0.0), b.pw("mul", y, b.pw("sub", x1, x2)))
    return b.pw("clamp_min", shortfall, low=0.0)


def _hinge_embedding(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    """x where y is 1, max(0, margin - x) where y is -1 (each term 0 where y is the other label)."""
    below = b.pw("clamp_min", b.pw("sub", options.number("margin", 1.0), x), low=0.0)
    return b.pw("add", b.pw("where", b.pw("ne", y, 1.0), below, 0.0), b.pw("where", b.pw("ne", y, -1.0), x, 0.0))


def _soft_margin(b: Builder, x: Value, y: Value, options: LossOptions) -> Value:
    return b.pw("log1p", b.pw("exp", b.pw("neg", b.pw("mul", y, x))))


def _cosine_embedding(b: Builder, x1: Value, x2: Value, y: Value, options: LossOptions) -> Value:
    """1 - cos where y is 1, max(0, cos - margin) where y is -1; cos from squared norms each raised by
    1e-12, PyTorch's own guard against a zero vector."""
    dim = (x1.rank - 1,)
    dot = b.reduce_keep("sum", b.pw("mul", x1, x2), dim, False)
    squares = [b.pw("add", b.reduce_keep("sum", b.pw("square", x), dim, False), 1e-12) for x in (x1, x2)]
    cos = b.pw("div", dot, b.pw("sqrt", b.pw("mul", *squares)))
    apart = b.pw("clamp_min", b.pw("sub", cos, options.number("margin", 0.0)), low=0.0)
    return b.pw("add", b.pw("where", b.pw("eq", y, 1.0), b.pw("sub", 1.0, cos), 0.0),
                b.pw("where", b.pw("eq", y, -1.0), apart, 0.0))


def _triplet_margin(b: Builder, anchor: Value, positive: Value, negative: Value, options: LossOptions) -> Value:
    """max(0, d(anchor, positive) - d(anchor, negative) + margin) in the p-norm pairwise distance; with
    `swap`, the negative's distance is the nearer of the anchor's and the positive's."""
    p, eps = options.number("p", 2.0), options.number("eps", 1e-6)
    near = pairwise_distance(b, anchor, positive, p, eps, False)
    far = pairwise_distance(b, anchor, negative, p, eps, False)
    if options.flag("swap", False):
        far = b.pw("minimum", far, pairwise_distance(b, positive, negative, p, eps, False))
    return b.pw("clamp_min", b.pw("add", b.pw("sub", near, far), options.number("margin", 1.0)), low=0.0)


def _weighted(b: Builder, loss: Value, options: LossOptions) -> Value:
    weight = options.tensor("weight")
    return loss if weight is None else b.pw("mul", loss, weight)


def _refuse_legacy_arguments(options: LossOptions) -> None:
    if options.value("size_average", None) is not None or options.value("reduce", None) is not None:
        raise UnsupportedSubproblem(f"{options.call.name} with the legacy size_average/reduce arguments "
                                    "(use reduction)")


@dataclass(frozen=True)
class SampleLoss:
    """A loss computed per sample (per element, or per row of embeddings) then reduced: its formula, and the
    options after its tensors."""

    formula: Callable[..., Value]           # (builder, *its tensors, options) -> the per-sample loss
    options: tuple[str, ...] = ()           # positional options of the functional form, in order
    batchmean: bool = False                 # 'batchmean' is a reduction too: the sum over the batch size
    inputs: tuple[str, ...] = ("input", "target")     # the tensor arguments before the options


SAMPLE_LOSSES = {
    "mse_loss": SampleLoss(_squared, ("size_average", "reduce", "reduction")),
    "l1_loss": SampleLoss(_absolute, ("size_average", "reduce", "reduction")),
    "smooth_l1_loss": SampleLoss(_smooth_l1, ("size_average", "reduce", "reduction", "beta")),
    "huber_loss": SampleLoss(_huber_loss, ("reduction", "delta")),
    "binary_cross_entropy": SampleLoss(_binary_cross_entropy, ("weight", "size_average", "reduce",
                                                                    "reduction")),
    "binary_cross_entropy_with_logits": SampleLoss(
        _binary_cross_entropy_with_logits, ("weight", "size_average", "reduce", "reduction", "pos_weight")),
    "kl_div": SampleLoss(_kl_divergence, ("size_average", "reduce", "reduction", "log_target"),
                              batchmean=True),
    "margin_ranking_loss": SampleLoss(_margin_ranking, ("margin", "size_average", "reduce", "reduction"),
                                           inputs=("input1", "input2", "target")),
    "hinge_embedding_loss": SampleLoss(_hinge_embedding, ("margin", "size_average", "reduce", "reduction")),
    "soft_margin_loss": SampleLoss(_soft_margin, ("size_average", "reduce", "reduction")),
    "cosine_embedding_loss": SampleLoss(_cosine_embedding, ("margin", "size_average", "reduce",
                                                                 "reduction"), inputs=("input1", "input2", "target")),
    "triplet_margin_loss": SampleLoss(_triplet_margin, ("margin", "p", "eps", "swap", "size_average", "reduce",
                                                             "reduction"), inputs=("anchor", "positive", "negative")),
}
_LOSS_MODULES = {nn.MSELoss: "mse_loss", nn.L1Loss: "l1_loss", nn.SmoothL1Loss: "smooth_l1_loss",
                 nn.HuberLoss: "huber_loss", nn.BCELoss: "binary_cross_entropy",
                 nn.BCEWithLogitsLoss: "binary_cross_entropy_with_logits", nn.KLDivLoss: "kl_div",
                 nn.MarginRankingLoss: "margin_ranking_loss", nn.HingeEmbeddingLoss: "hinge_embedding_loss",
                 nn.SoftMarginLoss: "soft_margin_loss", nn.CosineEmbeddingLoss: "cosine_embedding_loss",
                 nn.TripletMarginLoss: "triplet_margin_loss"}


def _sample_loss(name: str) -> Handler:
    loss = SAMPLE_LOSSES[name]

    def handler(b: Builder, call: Call):
        options = LossOptions(b, call, loss.options, len(loss.inputs))
        _refuse_legacy_arguments(options)
        per_sample = loss.formula(b, *(call.arg(i, arg) for i, arg in enumerate(loss.inputs)), options)
        reduction = options.reduction()
        if reduction == "batchmean" and loss.batchmean:
            total = _reduced(b, per_sample, None, "sum")
            return total if per_sample.rank == 0 else b.pw("div", total, b.size(per_sample, 0))
        if reduction not in REDUCTIONS:
            raise UnsupportedSubproblem(f"{name} reduction {reduction!r}")
        return _reduced(b, per_sample, None, reduction)
    return handler


# cross_entropy's arguments after (input, target); nll_loss's are the same without label_smoothing
_CLASS_LOSS_OPTIONS = ("weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")


def _class_loss(log_probs: bool) -> Handler:
    def handler(b: Builder, call: Call):
        options = LossOptions(b, call, _CLASS_LOSS_OPTIONS)
        _refuse_legacy_arguments(options)
        spec = ClassLoss(log_probs, int(options.number("ignore_index", -100)), options.reduction(),
                         options.number("label_smoothing", 0.0))
        return class_loss(b, call.arg(0, "input"), call.arg(1, "target"), options.tensor("weight"), spec)
    return handler


# --- distances and similarities -------------------------------------------------------------------------

def pairwise_distance(b: Builder, x1: Value, x2: Value, p: float, eps: float, keepdim: bool) -> Value:
    """||x1 - x2 + eps||_p along the last dim (eps keeps the distance of equal vectors differentiable)."""
    difference = b.pw("add", b.pw("sub", x1, x2), eps)
    return p_norm(b, difference, p, (difference.rank - 1,), keepdim)


def cosine_similarity(b: Builder, x1: Value, x2: Value, dim: int, eps: float) -> Value:
    """sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) along `dim`: each side normalised before the product."""
    dims = normalize_dims(dim, max(x1.rank, x2.rank))
    unit = [b.pw("div", x, b.pw("clamp_min", p_norm(b, x, 2, dims, True), low=eps)) for x in (x1, x2)]
    return b.reduce_keep("sum", b.pw("mul", *unit), dims, False)


def _pairwise_distance(b: Builder, call: Call):
    options = LossOptions(b, call, ("p", "eps", "keepdim"))
    p = options.number("norm" if call.modules else "p", 2.0)
    return pairwise_distance(b, call.arg(0, "x1"), call.arg(1, "x2"), p, options.number("eps", 1e-6),
                             options.flag("keepdim", False))


def _cosine_similarity(b: Builder, call: Call):
    options = LossOptions(b, call, ("dim", "eps"))
    return cosine_similarity(b, call.arg(0, "x1"), call.arg(1, "x2"), int(options.number("dim", 1)),
                             options.number("eps", 1e-8))


FUNCTIONS: dict[str, Handler] = {"cross_entropy": _class_loss(False), "nll_loss": _class_loss(True),
                                 "pairwise_distance": _pairwise_distance, "cosine_similarity": _cosine_similarity,
                                 **{name: _sample_loss(name) for name in SAMPLE_LOSSES}}
MODULES: dict[type, Handler] = {nn.CrossEntropyLoss: _class_loss(False), nn.NLLLoss: _class_loss(True),
                                nn.PairwiseDistance: _pairwise_distance, nn.CosineSimilarity: _cosine_similarity,
                                **{cls: _sample_loss(name) for cls, name in _LOSS_MODULES.items()}}
