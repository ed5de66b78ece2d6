"""The builtin decomposer on shrunk KernelBench level-3 problems: attention layers expanded into their
operations, RNN layers as whole-layer subproblems, user-defined submodules with their buffers. Every
decomposition must pass every decomposition check, as `mkevolve decompose` runs them."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mkevolve.builtin import expansions
from mkevolve.builtin.decomposer import UnsupportedModule, decomposition_files
from mkevolve.builtin.kernels import variant_count
from mkevolve.codebase import PROBLEM_FILE, PROBLEMS_DIR
from mkevolve.verify.decomposition.worker import run_checks

SMALL = Path(__file__).parent / "fixtures" / "level3_small"


def _decompose(name: str, tmp_path: Path) -> dict[str, str]:
    return _checked_decomposition(SMALL / f"{name}.py", tmp_path)


def _checked_decomposition(problem: Path, tmp_path: Path) -> dict[str, str]:
    """The subproblem sources (name -> source) of a decomposition that passed every check."""
    files = decomposition_files(problem)
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    report = run_checks(str(problem), str(tmp_path), seed=0, trials=2)
    assert not report.failures(), report.reasons()
    return {Path(k).stem: v for k, v in files.items() if k.startswith(PROBLEMS_DIR + "/") and k != PROBLEM_FILE}


def _with(subproblems: dict[str, str], *words: str) -> list[str]:
    return [name for name, source in subproblems.items() if all(w in source for w in words)]


def test_multihead_attention_is_expanded_into_its_operations(tmp_path):
    subs = _decompose("31_VisionAttention", tmp_path)
    attention = _with(subs, "torch.softmax(", "torch.matmul(", "in_proj_weight", "out_proj.weight")
    assert len(attention) == 1, subs.keys()
    # The residual's layer norm is its own subproblem, not hidden in the attention layer.
    assert _with(subs, "nn.LayerNorm(") and not _with(subs, "nn.LayerNorm(", "softmax")


def test_transformer_encoder_layer_becomes_attention_feed_forward_and_norm_subproblems(tmp_path):
    subs = _decompose("32_ConvolutionalVisionTransformer", tmp_path)
    assert not _with(subs, "TransformerEncoderLayer")
    assert _with(subs, "torch.softmax(", "in_proj_weight")
    feed_forward = [n for n in _with(subs, "nn.Linear(", "relu") if "softmax" not in subs[n]]
    assert feed_forward, subs.keys()
    norms = [n for n in _with(subs, "nn.LayerNorm(") if "softmax" not in subs[n] and "nn.Linear(" not in subs[n]]
    assert norms, subs.keys()


def test_explicit_attention_keeps_projections_apart_from_the_softmax(tmp_path):
    subs = _decompose("attention", tmp_path)
    softmax = _with(subs, "softmax")
    assert softmax and not any("nn.Linear(" in subs[n] for n in softmax)
    assert [n for n in _with(subs, "nn.Linear(") if "softmax" not in subs[n]]


def test_scaled_dot_product_attention_is_expanded(tmp_path):
    subs = _decompose("sdpa_attention", tmp_path)
    assert not _with(subs, "scaled_dot_product_attention(")
    core = _with(subs, "softmax", "tril")   # the causal mask is part of the attention core
    assert core and not any("nn.Linear(" in subs[n] for n in core)
    assert len(_with(subs, "nn.Linear(")) >= 2
    # ... and so is `weights @ v`: only a fused attention kernel computes the mask, so the builtin generator
    # has a kernel for the core (cut after the softmax, the scores' subproblem had none)
    assert subs[core[0]].count("torch.matmul(") == 2
    (tmp_path / "core.py").write_text(subs[core[0]])
    assert variant_count(tmp_path / "core.py", "cpu") > 0


def test_causal_attention_alone_is_one_subproblem(tmp_path):
    """A forward that is only a causally masked attention is not cut in two (its scores would get no kernel)."""
    subs = _checked_decomposition(SMALL.parent / "attention_small" / "sdpa_causal.py", tmp_path)
    assert len(subs) == 1 and _with(subs, "softmax", "tril")


def test_registered_causal_mask_reaches_the_subproblem_that_masks(tmp_path):
    subs = _decompose("50_ReLUSelfAttention", tmp_path)
    masking = _with(subs, "masked_fill")
    assert len(masking) == 1 and "register_buffer(" in subs[masking[0]] and "tril" in subs[masking[0]]
    assert not _with(subs, "register_buffer(", "nn.Linear(")


def test_positions_made_by_arange_are_made_again_where_an_embedding_reads_them(tmp_path):
    """`torch.arange(ids.shape[1])` is recomputed by the subproblem whose embedding reads it, never handed from
    one subproblem to the next as an integer tensor (which only an embedding may take)."""
    subs = _checked_decomposition(Path(__file__).parent / "subproblems" / "position_embeddings.py", tmp_path)
    with_positions = _with(subs, "torch.arange(")
    assert with_positions and all("nn.Embedding(" in subs[name] for name in with_positions)
    assert all(variant_count(tmp_path / PROBLEMS_DIR / f"{name}.py", "cpu") for name in with_positions)


ROTARY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, heads, seq):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.norm = nn.LayerNorm(dim)
        self.qk = nn.Linear(dim, dim)
        angles = torch.outer(torch.arange(seq).float(), torch.arange(self.head_dim).float() / self.head_dim)
        self.register_buffer("cos", angles.cos())

    def forward(self, x):
        b, t, _ = x.shape
        q = self.qk(self.norm(x)).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        return q * self.cos


def get_inputs():
    return [torch.randn(2, 6, 8)]


def get_init_inputs():
    return [8, 2, 6]
"""


def test_a_buffer_made_from_plain_attributes_takes_their_assignment_along(tmp_path):
    """Rotary tables built from `self.head_dim` (a LLaMA attention's): the subproblem that reads the buffer
    repeats the statement that assigns the sizes, where the whole model used to stay one subproblem."""
    problem = tmp_path / "rotary.py"
    problem.write_text(ROTARY)
    subs = _checked_decomposition(problem, tmp_path / "out")
    assert len(subs) > 1
    with_buffer = _with(subs, 'register_buffer("cos"') or _with(subs, "register_buffer('cos'")
    assert len(with_buffer) == 1 and "self.heads, self.head_dim = (heads, dim // heads)" in subs[with_buffer[0]]


TIED_HEAD = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return self.lm_head(self.ln(self.fc(self.wte(idx))))


def get_inputs():
    return [torch.randint(0, 20, (2, 5))]


def get_init_inputs():
    return [20, 8]
"""


# nanoGPT's spelling: the layers in a ModuleDict, the embedding tied to the head
NESTED_TIE = {"self.wte = ": "self.transformer = nn.ModuleDict(dict(wte=",
              "nn.Embedding(vocab, dim)\n": "nn.Embedding(vocab, dim)))\n",
              "self.lm_head.weight = self.wte.weight": "self.transformer.wte.weight = self.lm_head.weight",
              "self.wte(idx)": "self.transformer.wte(idx)"}


@pytest.mark.parametrize("nested", [False, True])
def test_a_head_tied_to_the_token_embedding_is_tied_again_by_the_top_level(nested, tmp_path):
    """`self.lm_head.weight = self.wte.weight` (a GPT's head; nanoGPT's `self.transformer.wte.weight =
    self.lm_head.weight`) no longer keeps every layer between the two in one subproblem: each layer goes where
    it is used, the top-level ties the parameter once both are built (the equivalence check runs the composed
    model), and the head's bias-free Linear is a pattern apart from the Linear with a bias."""
    source = TIED_HEAD
    for old, new in NESTED_TIE.items() if nested else ():
        assert old in source
        source = source.replace(old, new)
    problem = tmp_path / "tied_head.py"
    problem.write_text(source)
    subs = _checked_decomposition(problem, tmp_path / "out")
    assert len(subs) > 2
    top = (tmp_path / "out" / PROBLEM_FILE).read_text()
    ties = [line.strip() for line in top.splitlines() if line.strip().endswith(".weight") and " = self." in line]
    assert len(ties) == 1 and ties[0].startswith("self.") and ".embedding.weight" in ties[0]
    assert len(_with(subs, "nn.Linear(")) == 2    # fc's and the head's: the same forward, one with a bias


def test_user_defined_submodules_recurse_with_their_buffers(tmp_path):
    subs = _decompose("gpt_block", tmp_path)
    masking = _with(subs, "masked_fill")
    # The buffer of the user's CausalSelfAttention, built with that submodule's own argument (max_seqlen=4).
    assert len(masking) == 1 and "register_buffer(" in subs[masking[0]]
    assert "torch.ones(4, 4)" in subs[masking[0]]
    assert len(subs) >= 4 and _with(subs, "nn.LayerNorm(")


def test_recurrent_layers_are_whole_layer_subproblems(tmp_path):
    subs = _decompose("gru_lstm", tmp_path)
    gru, lstm = _with(subs, "nn.GRU("), _with(subs, "nn.LSTM(")
    assert len(gru) == 1 and len(lstm) == 1 and gru != lstm
    assert "batch_first=" in subs[gru[0]]   # rebuilt with the settings it was made with, not the defaults


def test_hand_written_rnn_cell_keeps_its_hidden_state(tmp_path):
    subs = _decompose("33_VanillaRNN", tmp_path)
    assert len(subs) >= 2
    state = _with(subs, "torch.randn(", "copy_(")
    assert len(state) == 1, subs.keys()


def test_decoder_layer_and_norm_first_encoder_layer_are_expanded(tmp_path):
    subs = _decompose("transformer_layers", tmp_path)
    assert not _with(subs, "TransformerEncoderLayer") and not _with(subs, "TransformerDecoderLayer")
    # Self-attention in each layer and the decoder's cross-attention: three attention subproblems.
    assert len(_with(subs, "torch.softmax(", "in_proj_weight")) == 3, subs.keys()
    assert _with(subs, "gelu") and _with(subs, "relu")


def test_the_expanded_attention_matches_torch_with_masks():
    """The rewrites the tracer uses compute what the layers compute, masks and layouts included."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    keep = torch.rand(3, 5) > 0.3
    keep[:, 0] = True
    none = keep.clone()
    none[1] = False            # a query with no key left: SDPA gives it 0 (softmax would give NaN)
    for kwargs in ({}, {"attn_mask": keep}, {"attn_mask": torch.randn(3, 5)}, {"scale": 0.3}, {"attn_mask": none}):
        expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
        assert torch.allclose(expansions._sdpa(q, k, v, **kwargs), expected, atol=1e-5)
    square = torch.randn(2, 2, 5, 4)
    assert torch.allclose(expansions._sdpa(square, k, v, is_causal=True),
                          F.scaled_dot_product_attention(square, k, v, is_causal=True), atol=1e-5)

    mha = nn.MultiheadAttention(8, 2).eval()
    x, memory = torch.randn(3, 2, 8), torch.randn(5, 2, 8)
    hidden = torch.triu(torch.ones(3, 5, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        for args, kwargs in (((x, x, x), {}), ((x, memory, memory), {"attn_mask": hidden})):
            expected = mha(*args, need_weights=False, **kwargs)[0]
            assert torch.allclose(expansions.multihead_attention(mha, *args, **kwargs)[0], expected, atol=1e-5)


# A model that re-initialises its layers after building them all, as MobileNetV2 does; {init} is the statement.
REINITIALISED = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, std=0.01):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)
{init}

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def get_inputs():
    return [torch.randn(2, 3, 6, 6)]


def get_init_inputs():
    return [0.5]
'''


def _reinitialised(init: str, tmp_path: Path) -> Path:
    problem = tmp_path / "reinitialised.py"
    problem.write_text(REINITIALISED.format(init=init))
    return problem


def test_an_init_loop_is_replayed_by_each_subproblem_on_its_own_layers(tmp_path):
    """Its only random draws come after the last layer is built, so replaying it subproblem by subproblem draws
    the same numbers in the same order: the weights and eps match the original's."""
    init = """        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 0.5)
                m.eps = 1e-3
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, std)
                nn.init.zeros_(m.bias)"""
    subs = _checked_decomposition(_reinitialised(init, tmp_path), tmp_path / "decomposition")
    assert len(subs) > 1
    assert _with(subs, "nn.BatchNorm2d(", "for m in self.batchnorm2d.modules():", "m.eps = 0.001")
    assert _with(subs, "nn.Linear(", "for m in self.linear.modules():", "nn.init.normal_(m.weight, 0, std)")
    assert not _with(subs, "nn.Conv2d(", "for m in")   # the loop changes nothing of the convolution


def test_a_loop_that_draws_after_every_layer_is_built_runs_in_the_top_level(tmp_path):
    """MobileNetV2's loop: the convolution's new weights come after the linear layer's default ones. Replayed in
    the first subproblem it would draw before the last one's layers do; the top-level runs it after building
    them all, as the original does, and the subproblems keep their layers' default initialisation."""
    init = """        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")"""
    folder = tmp_path / "decomposition"
    subs = _checked_decomposition(_reinitialised(init, tmp_path), folder)
    assert len(subs) > 1 and not _with(subs, "for m in")
    top = (folder / PROBLEM_FILE).read_text()
    init = top[top.index("def __init__"):top.index("def forward")]
    assert init.index("for m in self.modules():") > init.rindex("        self.")   # after every subproblem is built
    assert "nn.init.kaiming_normal_(m.weight, mode='fan_out')" in top


def test_mobilenet_v2_splits_into_layer_patterns_and_its_top_level_re_initialises_them(tmp_path):
    """KernelBench's MobileNetV2 (shrunk): 52 convolutions in two subproblems, the dense ones (a GEMM each) and
    the depthwise ones (a window sum each), each serving every shape of its kind; and the kaiming loop in the
    top-level after all 105 subproblem modules are built."""
    subs = _decompose("20_MobileNetV2", tmp_path)
    assert set(subs) == {"conv2d", "conv2d_depthwise", "batchnorm2d", "batchnorm2d_relu6",
                         "batchnorm2d_relu6_adaptiveavgpool2d", "dropout_linear"}
    top = (tmp_path / PROBLEM_FILE).read_text()
    assert top.count("= Conv2d(") == 35 and top.count("= Conv2dDepthwise(") == 17
    assert "get_input_configs" in subs["conv2d_depthwise"] and not _with(subs, "nn.init")
    assert "nn.init.kaiming_normal_(m.weight, mode='fan_out')" in top


def test_a_single_statement_that_draws_after_later_layers_is_declined_with_its_reason(tmp_path):
    """Only a loop over self.modules() (or the like) may re-initialise in the top-level: a statement naming one
    layer would name a path of the original."""
    with pytest.raises(UnsupportedModule, match=r"draws random numbers in `nn\.init\.normal_.*exact only as one "
                                                r"subproblem"):
        decomposition_files(_reinitialised("        nn.init.normal_(self.conv.weight, 0, std)", tmp_path))


@pytest.mark.parametrize(("init", "reason"), [
    ("""        for name, p in self.named_parameters():
            if name.startswith("fc"):
                nn.init.zeros_(p)""", r"loop over self\.named_parameters\(\).*reads the names"),
    ("""        for m in self.modules():
            if m is not self and isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)""", r"loop over self\.modules\(\).*reads self"),
    ("""        for m in self.modules():
            if not isinstance(m, (nn.Conv2d, nn.BatchNorm2d, nn.Linear)):
                m.scale = 2.0""", r"writes scale for 'self', which is not one torch\.nn layer"),
])
def test_an_init_loop_no_subproblem_can_replay_is_declined_with_its_reason(tmp_path, init, reason):
    with pytest.raises(UnsupportedModule, match=reason):
        decomposition_files(_reinitialised(init, tmp_path))


def test_bags_of_embeddings_start_a_subproblem_and_a_topk_closes_one(tmp_path):
    """EmbeddingBag is an anchor as Embedding is; sort and topk reduce rows, as argmax does."""
    subs = _decompose("recommender_head", tmp_path)
    (bags,) = _with(subs, "nn.EmbeddingBag(")
    assert "nn.Linear(" not in subs[bags]
    (top,) = _with(subs, "torch.topk(")
    assert "nn.EmbeddingBag(" not in subs[top]
    assert all(variant_count(tmp_path / PROBLEMS_DIR / f"{name}.py", "cpu") >= 1 for name in subs)
