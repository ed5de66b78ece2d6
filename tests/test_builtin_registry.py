"""The builtin kernel kinds' registry, and the work the generated self-check places its time against."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mkevolve.builtin.kernels import generate_kernel, ir
from mkevolve.builtin.kernels.generate import analyse
from mkevolve.builtin.kernels.registry import (ANCHOR_TYPES, KINDS, POINTWISE, ROWS, kind_named, kind_of,
                                               kind_of_anchor)
from mkevolve.gpu_peaks import H200, peaks_for
from mkevolve.problem import call_inputs, load_problem

TESTS = Path(__file__).resolve().parent
KERNELS = TESTS.parent / "mkevolve" / "builtin" / "kernels"
PROBLEMS = (sorted((TESTS / "subproblems").glob("*.py")) + sorted((TESTS / "fixtures" / "attention_small").glob("*.py"))
            + sorted((TESTS.parent / "problems").glob("*.py")))
# IR nodes that never start a kernel of their own: leaves, elementwise values, views and reductions.
NOT_ANCHORS = {ir.Value, ir.Input, ir.Param, ir.Pointwise, ir.View, ir.Reduce, ir.IndexMask}


def _kinds_planned() -> set[str]:
    kinds = set()
    for path in PROBLEMS:
        try:
            analysis = analyse(path)
        except Exception:  # noqa: BLE001 - unsupported problems (nn.Fold) plan nothing
            continue
        kinds |= {kernel.kind for plan in analysis.plans.values() for kernel in plan.kernels}
    return kinds


def test_every_kind_the_plan_produces_is_registered_and_every_registered_kind_is_planned():
    planned = _kinds_planned()
    names = {kind.name for kind in KINDS}
    assert planned <= names, f"planned kinds without a registry entry: {planned - names}"
    assert names <= planned, f"registered kinds no test problem plans: {names - planned}"


def test_every_ir_node_is_an_anchor_of_one_kind_or_a_known_non_anchor():
    """A new IR node either starts a kernel (then it needs a registry entry) or joins one: it is listed here."""
    nodes = {cls for _, cls in inspect.getmembers(ir, inspect.isclass)
             if issubclass(cls, ir.Value) and cls.__module__ == ir.__name__}
    unregistered = nodes - NOT_ANCHORS - set(ANCHOR_TYPES)
    assert not unregistered, f"IR nodes with no kernel kind: {sorted(c.__name__ for c in unregistered)}"
    assert not set(ANCHOR_TYPES) & NOT_ANCHORS
    for anchor in ANCHOR_TYPES:
        assert kind_of_anchor(anchor.__new__(anchor)).anchor is anchor


def test_kind_names_and_anchors_are_unique_and_looked_up_by_name():
    assert len({k.name for k in KINDS}) == len(KINDS)
    anchors = [k.anchor for k in KINDS if k.anchor is not None]
    assert len(set(anchors)) == len(anchors) == len(ANCHOR_TYPES)
    assert POINTWISE.anchor is None and ROWS.anchor is None
    assert all(kind_named(k.name) is k for k in KINDS)


def _kind_strings(tree: ast.AST, names: set[str]) -> list[str]:
    """Comparisons, dict keys and `.kind = ...` assignments that use a kind's name as a literal."""
    found = []
    for node in ast.walk(tree):
        literals = []
        if isinstance(node, ast.Compare):
            literals = [node.left, *node.comparators]
            literals += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.Set, ast.List)) for e in c.elts]
        elif isinstance(node, ast.Dict):
            literals = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "kind"
                                                  for t in node.targets):
            literals = [node.value]
        found += [ast.unparse(node) for lit in literals if isinstance(lit, ast.Constant) and lit.value in names]
    return found


def test_no_module_but_the_registry_switches_on_a_kind_name():
    # the handlers' tables are keyed by torch's op names ("matmul", "gather"), which are not kind names
    names = {k.name for k in KINDS}
    for path in sorted(KERNELS.glob("*.py")):
        if path.name != "registry.py" and not path.name.startswith("handlers_"):
            assert _kind_strings(ast.parse(path.read_text()), names) == [], path.name


def test_uses_dot_follows_the_template():
    """GEMMs and attention always call tl.dot; a convolution only as an implicit GEMM."""
    for stem, uses_dot in [("linear_gelu", True), ("softmax", False), ("conv2d_bias_relu", False),
                           ("conv_transpose2d", True)]:
        analysis = analyse(TESTS / "subproblems" / f"{stem}.py")
        assert analysis.uses_dot is uses_dot, stem
        kernels = [k for plan in analysis.plans.values() for k in plan.kernels]
        assert any(kind_of(k).kernel_uses_dot(k) for k in kernels) is uses_dot


# --- the work the self-check counts ------------------------------------------------------------------------


@pytest.mark.parametrize("path", [TESTS / "subproblems" / f"{s}.py" for s in
                                  ("linear_gelu", "bmm", "conv2d_bias_relu", "conv_transpose2d", "depthwise_conv2d",
                                   "conv3d_maxpool3d", "attention_scores")]
                         + [TESTS / "fixtures" / "attention_small" / f"{s}.py" for s in
                            ("sdpa_float_mask", "matmul_softmax", "multihead_attention")],
                         ids=lambda p: p.stem)
def test_flops_agree_with_torchs_flop_counter(path):
    problem = load_problem(path)
    work = analyse(path).work()
    assert len(work) == len(problem.configs)
    for config, counted in zip(problem.configs, work):
        model = problem.model_cls(*call_inputs(problem.path, config.get_init_inputs, "get_init_inputs"))
        inputs = call_inputs(problem.path, config.get_inputs, "get_inputs")
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(*inputs)
        assert counted.flops == counter.get_total_flops() > 0
        assert counted.input_shapes == tuple(tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor))


def test_bytes_count_inputs_parameters_and_outputs_once():
    # linear_gelu: x [2, 5, 40] @ W [24, 40].T + b [24] -> [2, 5, 24], all fp32
    (work,) = analyse(TESTS / "subproblems" / "linear_gelu.py").work()
    assert work.min_bytes == 4 * (2 * 5 * 40 + 24 * 40 + 24 + 2 * 5 * 24)
    # int64 indices ids [2, 7] and positions [7]; the tables [50, 16] and [10, 16] (each whole, once); the
    # output [2, 7, 16]; the gathered rows the add reads pass between kernels and are not counted
    (work,) = analyse(TESTS / "fixtures" / "attention_small" / "embedding.py").work()
    assert work.min_bytes == 8 * (2 * 7 + 7) + 4 * (50 * 16 + 10 * 16 + 2 * 7 * 16)


# --- the generated self-check's roofline --------------------------------------------------------------------


def _roofline(source: str):
    """The generated main block's WORK, GPU_PEAKS and roofline(), run on their own."""
    main = next(n for n in ast.parse(source).body if isinstance(n, ast.If))
    names: dict = {}
    for node in main.body:
        assigned = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.FunctionDef) or {"WORK", "GPU_PEAKS"} & set(assigned):
            exec(compile(ast.Module([node], []), "<main>", "exec"), names)
    return names


def test_roofline_on_a_known_gpu_reports_the_rate_and_the_fraction_of_the_floor():
    names = _roofline(generate_kernel(TESTS / "subproblems" / "linear_gelu.py", 0, "cpu").source)
    ((shapes, min_bytes, flops),) = names["WORK"]
    assert names["GPU_PEAKS"] == [(H200.name, H200.fp32_flops_per_s, H200.bytes_per_s)]
    ms = 0.01
    line = names["roofline"](0, shapes, ms, "NVIDIA H200")
    floor_ms = 1e3 * H200.floor_s(flops, min_bytes)
    assert line == (f"{flops / ms / 1e9:.2f} TFLOP/s ({flops / 1e9:.3g} GFLOP); "
                    f"{floor_ms / ms:.1%} of the roofline floor ({floor_ms:.4f} ms on NVIDIA H200)")
    assert "roofline fraction unknown" in names["roofline"](0, shapes, ms, "NVIDIA A100-SXM4-80GB")
    assert "unknown" in names["roofline"](0, [(9, 9)], ms, "NVIDIA H200")


def test_memory_bound_files_report_bandwidth():
    names = _roofline(generate_kernel(TESTS / "subproblems" / "softmax.py", 0, "cpu").source)
    ((shapes, min_bytes, flops),) = names["WORK"]
    assert flops == 0 and min_bytes == 4 * 2 * 4 * 37
    assert names["roofline"](0, shapes, 0.001, "NVIDIA H200").startswith(f"{min_bytes / 1e3:.1f} GB/s")


def test_peaks_are_found_by_device_name():
    assert peaks_for("NVIDIA H200") is H200
    assert peaks_for("NVIDIA GeForce RTX 4090") is None
