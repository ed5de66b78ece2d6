"""AllocateBudget: even for new/failing subproblems, proportional to runtime otherwise, exact sums."""

import pytest

from mkevolve.budget import allocate_budget, largest_remainder


def test_even_split_among_new_or_failing():
    parts = allocate_budget(32, ["a", "b", "c", "d"], needs_work={"b", "d"}, runtime_ms={"a": 9.0})
    assert parts == {"a": 0, "b": 16, "c": 0, "d": 16}


def test_even_split_rounds_to_earlier_names():
    parts = allocate_budget(32, ["a", "b", "c"], needs_work={"a", "b", "c"}, runtime_ms={})
    assert parts == {"a": 11, "b": 11, "c": 10}


def test_proportional_to_runtime():
    parts = allocate_budget(32, ["a", "b"], needs_work=set(), runtime_ms={"a": 3.0, "b": 1.0})
    assert parts == {"a": 24, "b": 8}


def test_largest_remainder_rounding():
    # quotas 10*0.55=5.5, 10*0.25=2.5, 10*0.2=2.0 -> floors 5,2,2 and one call left for the 0.5 tie
    parts = largest_remainder(10, {"a": 0.55, "b": 0.25, "c": 0.2})
    assert parts == {"a": 6, "b": 2, "c": 2}
    assert sum(parts.values()) == 10


def test_zero_or_missing_runtimes_fall_back_to_even():
    parts = allocate_budget(7, ["a", "b"], needs_work=set(), runtime_ms={"a": 0.0, "b": None})
    assert parts == {"a": 4, "b": 3}


@pytest.mark.parametrize("total", [0, 1, 5, 31, 32, 97])
def test_parts_always_add_up(total):
    parts = allocate_budget(total, list("abcdefg"), needs_work=set(),
                            runtime_ms={n: i * 0.37 + 0.01 for i, n in enumerate("abcdefg")})
    assert sum(parts.values()) == total and all(p >= 0 for p in parts.values())


def test_no_subproblems():
    assert allocate_budget(32, [], needs_work=set(), runtime_ms={}) == {}


def test_exhausted_subproblems_get_no_call_and_the_others_share_theirs():
    parts = allocate_budget(8, ["a", "b", "c"], needs_work={"a", "b"}, runtime_ms={}, exhausted={"b"})
    assert parts == {"a": 8, "b": 0, "c": 0}
    parts = allocate_budget(9, ["a", "b", "c"], needs_work=set(), runtime_ms={"a": 1.0, "b": 5.0, "c": 2.0},
                            exhausted={"b"})
    assert parts == {"a": 3, "b": 0, "c": 6}


def test_a_failing_subproblem_that_is_exhausted_leaves_the_budget_to_runtime():
    parts = allocate_budget(6, ["a", "b", "c"], needs_work={"b"}, runtime_ms={"a": 1.0, "c": 2.0},
                            exhausted={"b"})
    assert parts == {"a": 2, "b": 0, "c": 4}


def test_every_subproblem_exhausted_means_no_call_at_all():
    assert allocate_budget(8, ["a", "b"], needs_work={"a"}, runtime_ms={}, exhausted={"a", "b"}) == {"a": 0, "b": 0}
