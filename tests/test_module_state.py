"""Module state: the buffers a reference forward changes (batch norm's running statistics in training) must be
held by ModelNew's buffers after the first call and after the last, whatever ModelNew names them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mkevolve.config import RunConfig, TOLERANCE
from mkevolve.problem import load_problem
from mkevolve.verify.cheating import Rule
from mkevolve.verify.module_state import mismatches
from mkevolve.verify.reference import reference_set
from mkevolve.verify.result import Status
from mkevolve.verify.verifier import Verifier

from test_cheating import corpus_constants

CORPUS = Path(__file__).resolve().parent / "corpus"
BATCH_NORM = CORPUS / "problems" / "batch_norm.py"
HONEST = CORPUS / "honest" / "batch_norm.py"
CHEATS = sorted((CORPUS / "cheats").glob("module_state_*.py"))


# ---- matching by value ---------------------------------------------------------------------------------------

def test_buffers_match_by_value_whatever_their_order_and_names():
    mean, var = torch.tensor([0.1, 0.2]), torch.tensor([0.9, 1.1])
    expected = [("bn.running_mean", mean), ("bn.running_var", var)]
    assert mismatches(expected, [var.clone(), torch.zeros(3), mean.clone()], TOLERANCE, TOLERANCE) == []


def test_each_candidate_buffer_stands_for_one_reference_buffer():
    # Two batch norms that moved to the same values need two buffers holding them, not one seen twice.
    value = torch.tensor([0.5, 0.5])
    expected = [("a.running_mean", value), ("b.running_mean", value.clone())]
    (missing,) = mismatches(expected, [value.clone()], TOLERANCE, TOLERANCE)
    assert missing.name in ("a.running_mean", "b.running_mean") and missing.closest_error == 0.0


def test_a_greedy_choice_would_fail_where_a_matching_succeeds():
    # The first expected buffer matches both candidates, the second only the first candidate: a greedy pass
    # that gave the first candidate to the first buffer would report the second as missing.
    loose = torch.tensor([1.0])
    expected = [("wide", loose), ("narrow", torch.tensor([1.00005]))]
    candidates = [torch.tensor([1.00005]), torch.tensor([0.99996])]
    assert mismatches(expected, candidates, 1e-4, 0.0) == []


def test_a_stale_buffer_is_reported_with_its_nearest_error():
    expected = [("bn.running_mean", torch.tensor([0.3, -0.2]))]
    (missing,) = mismatches(expected, [torch.zeros(2), torch.zeros(5)], TOLERANCE, TOLERANCE)
    assert missing.name == "bn.running_mean" and missing.shape == (2,)
    assert missing.closest_error == pytest.approx(0.3)
    assert "off by up to 0.3" in missing.describe()
    (no_shape,) = mismatches(expected, [torch.zeros(3)], TOLERANCE, TOLERANCE)
    assert no_shape.closest_error is None and "no buffer of ModelNew has its shape" in no_shape.describe()


def test_one_right_buffer_among_thousands_of_its_shape_is_found():
    # Compared as one stack per shape: a ModelNew that registers thousands of buffers costs one comparison.
    right = torch.tensor([0.1, 0.2])
    candidates = [torch.zeros(2) for _ in range(5000)] + [right.clone()]
    assert mismatches([("bn.running_mean", right)], candidates, TOLERANCE, TOLERANCE) == []
    (missing,) = mismatches([("bn.running_mean", right)], candidates[:-1], TOLERANCE, TOLERANCE)
    assert missing.closest_error == pytest.approx(0.2)


def test_dtype_must_match():
    expected = [("bn.running_mean", torch.tensor([0.25]))]
    assert mismatches(expected, [torch.tensor([0.25], dtype=torch.float64)], TOLERANCE, TOLERANCE)


# ---- what the reference records ------------------------------------------------------------------------------

@pytest.mark.parametrize("problem, eval_mode, changed", [
    (BATCH_NORM, False, ["bn.running_mean", "bn.running_var"]),   # num_batches_tracked is an integer counter
    (BATCH_NORM, True, []),
    (CORPUS / "problems" / "row_reduction.py", False, []),
])
def test_reference_records_the_floating_buffers_its_first_forward_changes(tmp_path, problem, eval_mode, changed):
    reference = reference_set(tmp_path, load_problem(problem), 0, 0, eval_mode, torch.device("cpu"))
    reference.ensure(["trial0"])
    assert reference.mutated_buffers() == changed


def test_a_folder_written_before_states_were_recorded_gets_its_record(tmp_path):
    reference = reference_set(tmp_path, load_problem(BATCH_NORM), 0, 0, False, torch.device("cpu"))
    reference.ensure(["trial0", "trial1"])
    inputs = reference.inputs_file("trial0").read_bytes()
    reference.state_file.unlink()
    reference.ensure(["trial1"])
    assert reference.mutated_buffers() == ["bn.running_mean", "bn.running_var"]
    assert reference.inputs_file("trial0").read_bytes() == inputs     # the same set, computed again


# ---- verdicts ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verdicts():
    with Verifier(RunConfig(workers=2, timeout=120.0, trials=2)) as verifier:
        pairs = [(BATCH_NORM, path) for path in [HONEST, *CHEATS]]
        training = verifier.check_kernels(pairs, timed=False)
    with Verifier(RunConfig(workers=1, timeout=120.0, trials=2, eval_mode=True)) as verifier:
        (evaluation,) = verifier.check_kernels([(BATCH_NORM, HONEST)], timed=False)
    return dict(zip([HONEST, *CHEATS], training)), evaluation


@pytest.mark.slow
def test_honest_batch_norm_passes_in_training_and_in_eval_mode(verdicts):
    training, evaluation = verdicts
    assert training[HONEST].status is Status.OK, training[HONEST].reason
    assert evaluation.status is Status.OK, evaluation.reason


def test_the_corpus_has_a_cheat_for_each_way_of_leaving_the_state_behind():
    assert {p.stem for p in CHEATS} == {"module_state_running_stats_skipped", "module_state_first_call_only",
                                        "module_state_unregistered_copy"}
    assert {corpus_constants(p)["EXPECTED_RULE"] for p in CHEATS} == {Rule.MODULE_STATE.value}


@pytest.mark.slow
@pytest.mark.parametrize("path, when", [
    (CORPUS / "cheats" / "module_state_running_stats_skipped.py", "after the first call (trial 0)"),
    (CORPUS / "cheats" / "module_state_unregistered_copy.py", "after the first call (trial 0)"),
    (CORPUS / "cheats" / "module_state_first_call_only.py", "after the last of"),
])
def test_state_left_behind_is_rejected_naming_the_buffer(verdicts, path, when):
    result = verdicts[0][path]
    assert result.status is Status.INCORRECT, result.reason
    assert result.rule == Rule.MODULE_STATE.value
    assert result.reason.startswith(f"[{Rule.MODULE_STATE.value}] {when}")
    assert "`bn.running_mean` (shape (8,))" in result.reason and "(+1 more)" in result.reason
