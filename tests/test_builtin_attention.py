"""The builtin generator on what level 3 needs: fused attention (matmul and scaled_dot_product_attention
forms, causal, float mask, ReLU weights), torch.cat and embedding lookups, each accepted by the real
verifier; and a truthful decline where it has no kernel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mkevolve.agents.evolve import builtin_decline
from mkevolve.builtin.kernels import UnsupportedOps, UnsupportedSubproblem, generate_kernel, variant_count
from mkevolve.config import RunConfig
from mkevolve.verify.verifier import Verifier

from builtin_matching import ON_GPU, TARGET

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "attention_small"
IEEE_VARIANT = 1 if ON_GPU else 0    # on a GPU, kernels with tl.dot try tf32x3 first (builtin/kernels/configs.py)

ATTENTION = ["sdpa_causal", "sdpa_float_mask", "matmul_softmax", "causal_self_attention", "relu_self_attention",
             "multihead_attention", "vision_attention", "expanded_causal"]
MOVEMENT = {"cat_tokens": "cat of 2 parts", "embedding": "embedding lookup", "gather": "gather along dim 1"}


@pytest.fixture(scope="module")
def verifier():
    with Verifier(RunConfig(workers=2, timeout=120.0, trials=1)) as v:
        yield v


def _check(verifier: Verifier, stem: str, variant: int, tmp_path: Path, mode: str | None = None) -> str:
    """Generate, write and verify one variant; returns the generated source."""
    problem = FIXTURES / f"{stem}.py"
    generated = generate_kernel(problem, variant, TARGET, mode)
    solution = tmp_path / f"{stem}_v{variant}.py"
    solution.write_text(generated.source)
    result = verifier.check_kernel(problem, solution, timed=False)
    assert result.passed, f"{stem}: {result}"
    return generated.source


@pytest.mark.parametrize("stem", ATTENTION)
@pytest.mark.slow
def test_attention_is_one_fused_kernel_and_verifies(stem, verifier, tmp_path):
    source = _check(verifier, stem, IEEE_VARIANT, tmp_path)
    assert len(re.findall(r"^def _attention_kernel_\d+\(", source, re.M)) == 1
    # the online softmax's two exps are the only ones: no softmax kernel of its own, the scores stay in registers
    assert source.count("tl.exp(") <= 2
    assert 'input_precision="ieee"' in source


@pytest.mark.parametrize("stem", ["sdpa_causal", "expanded_causal"])
def test_causal_attention_skips_the_blocks_past_the_diagonal(stem):
    """is_causal, and the ones_like(scores).tril() mask the decomposer writes for it (computed, not read)."""
    source = generate_kernel(FIXTURES / f"{stem}.py", 0, TARGET).source
    assert "range(0, tl.minimum(N, (pid_m + 1) * BLOCK_M), BLOCK_N)" in source
    assert "range(0, N, BLOCK_N)" in generate_kernel(FIXTURES / "sdpa_float_mask.py", 0, TARGET).source


def test_relu_attention_has_no_normaliser():
    generated = generate_kernel(FIXTURES / "relu_self_attention.py", 0, TARGET)
    assert "fused relu attention" in generated.description
    assert "l_i" not in generated.source and "tl.exp" not in generated.source


def test_tf32x3_variant_verifies(verifier, tmp_path):
    path = FIXTURES / "sdpa_causal.py"
    variants = [generate_kernel(path, v, TARGET) for v in range(variant_count(path, TARGET))]
    tf32x3 = next(g for g in variants if g.precision == "tf32x3")
    assert 'input_precision="tf32x3"' in tf32x3.source
    _check(verifier, "sdpa_causal", tf32x3.variant, tmp_path)


@pytest.mark.parametrize("stem", sorted(MOVEMENT))
def test_cat_and_embedding_verify(stem, verifier, tmp_path):
    assert MOVEMENT[stem] in generate_kernel(FIXTURES / f"{stem}.py", 0, TARGET).description
    _check(verifier, stem, 0, tmp_path)


@pytest.mark.slow
def test_transformer_layers_verify_in_eval_mode(tmp_path):
    """Encoder and decoder layers with dropout on: eval mode gets kernels, training mode says why it gets none."""
    for stem in ("transformer_layer", "decoder_layer"):
        with pytest.raises(UnsupportedSubproblem, match=r"dropout=0\.1 in training mode.*--eval"):
            generate_kernel(FIXTURES / f"{stem}.py", 0, TARGET, mode="train")
    with Verifier(RunConfig(workers=2, timeout=120.0, trials=1, eval_mode=True)) as verifier:
        source = _check(verifier, "transformer_layer", 0, tmp_path, mode="eval")
        _check(verifier, "decoder_layer", 0, tmp_path, mode="eval")
    assert len(re.findall(r"^def _attention_kernel_\d+\(", source, re.M)) == 1   # both layers share it


def test_index_masks_outside_attention_are_declined(tmp_path):
    path = _problem(tmp_path, "tril_alone", "torch.where(torch.ones_like(q, dtype=torch.bool).tril(), q, k) + v", QKV)
    with pytest.raises(UnsupportedSubproblem, match="ones_like/tril/triu mask used other than in a fused attention"):
        generate_kernel(path, 0, TARGET)


def _problem(tmp_path: Path, name: str, forward: str, inputs: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                    f"class Model(nn.Module):\n    def forward(self, q, k, v):\n        return {forward}\n\n\n"
                    f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n")
    return path


QKV = "[torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16)]"


def test_ops_without_a_kernel_are_named_truthfully(tmp_path):
    path = _problem(tmp_path, "scan_attention",
                    "torch.logcumsumexp(F.scaled_dot_product_attention(q, k, v), dim=-1) + torch.gather(q, 2, k.long())"
                    " + torch.mode(v, dim=-1, keepdim=True).values", QKV)
    with pytest.raises(UnsupportedOps) as caught:
        variant_count(path, TARGET)
    assert builtin_decline(caught.value) == ("the builtin generator has no kernel for: "
                                             "torch.logcumsumexp, Tensor.long, torch.mode")


def test_integer_math_is_declined_with_its_reason(tmp_path):
    """Kernels compute in fp32: integer arithmetic whose result is an integer tensor is refused by name."""
    path = tmp_path / "index_math.py"
    path.write_text((FIXTURES / "gather.py").read_text().replace("torch.gather(x, 1, index)",
                                                                   "torch.gather(x, 1, index + index)"))
    with pytest.raises(UnsupportedSubproblem, match="add produces torch.int64; only float32 is supported"):
        generate_kernel(path, 0, TARGET)


def test_attention_dropout_is_declined_with_its_reason(tmp_path):
    path = _problem(tmp_path, "dropout_attention", "F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)", QKV)
    with pytest.raises(UnsupportedSubproblem) as caught:
        generate_kernel(path, 0, TARGET)
    assert builtin_decline(caught.value).startswith(
        "the builtin generator has no kernel for this subproblem: scaled_dot_product_attention with dropout_p=0.1")


@pytest.mark.parametrize("stem", ATTENTION + sorted(MOVEMENT))
def test_cuda_source_autotunes_and_leaves_nothing_unread(stem):
    """The GPU variants (not run here) parse, autotune, and keep host arithmetic in the file's own helpers."""
    path = FIXTURES / f"{stem}.py"
    for variant in range(variant_count(path, "cuda")):
        source = generate_kernel(path, variant, "cuda").source
        tree = ast.parse(source)
        assert "@triton.autotune" in source
        assert "triton.cdiv" not in source and "triton.next_power_of_2" not in source
        for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            read = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            written = {t.id for n in ast.walk(function) if isinstance(n, ast.Assign) for t in n.targets
                       if isinstance(t, ast.Name)}
            assert written <= read, f"{stem}: {function.name} never reads {written - read}"


@pytest.mark.parametrize("forward, reason", [
    ('torch.einsum("bhii,bhij->bhj", q, k) + v[..., 0]', "repeated letter or a sum over one operand"),
    ('torch.einsum("bhqd->bhdq", q) + k + v', "other than of two tensors"),
    ('torch.einsum("bhqd,bhkd->bhq", q, k) + v[..., 0]', "repeated letter or a sum over one operand"),
    ('torch.einsum("...qd,...kd->...qk", q, k) + v', "ellipses"),
    ('torch.einsum("bhqd,bhkd,bhke->bhqe", q, k, v)', "other than of two tensors"),
])
def test_einsum_forms_without_a_kernel_say_which(tmp_path, forward, reason):
    """torch.einsum is written for two tensors whose letters each appear once, none summed in one operand."""
    path = _problem(tmp_path, "einsum_form", forward, QKV)
    with pytest.raises(UnsupportedSubproblem, match=reason):
        generate_kernel(path, 0, TARGET)
