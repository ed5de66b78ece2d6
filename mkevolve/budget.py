"""AllocateBudget: how an iteration's LLM calls are shared among subproblems, in exact integers."""

from __future__ import annotations

from fractions import Fraction


def largest_remainder(total: int, weights: dict[str, Fraction | float | int]) -> dict[str, int]:
    """Split `total` in proportion to `weights`; parts add up to `total`; ties go to the earlier key."""
    names = list(weights)
    exact = {n: Fraction(weights[n]) for n in names}
    weight_sum = sum(exact.values())
    if not names:
        return {}
    if weight_sum <= 0:
        exact = {n: Fraction(1) for n in names}
        weight_sum = Fraction(len(names))
    quotas = {n: total * exact[n] / weight_sum for n in names}
    parts = {n: int(quotas[n]) for n in names}
    leftover = total - sum(parts.values())
    order = sorted(names, key=lambda n: (-(quotas[n] - parts[n]), names.index(n)))
    for name in order[:leftover]:
        parts[name] += 1
    return parts


def allocate_budget(total: int, subproblems: list[str], needs_work: set[str],
                    runtime_ms: dict[str, float | None], exhausted: set[str] = frozenset()) -> dict[str, int]:
    """New or failing subproblems share the budget evenly; otherwise it follows measured runtime.

    Runtimes come from the last end-to-end evaluation; where none was measured (a CPU run, or
    every share zero) the split is even. Subproblems the agent has nothing more for (`exhausted`)
    get no call, and the others share what they would have had; the parts add up to `total`
    unless every subproblem is exhausted, when all are 0.
    """
    open_ = [n for n in subproblems if n not in exhausted]
    parts = dict.fromkeys(subproblems, 0)
    if not open_:
        return parts
    wanted = needs_work & set(open_)
    if wanted:
        weights = {n: (1 if n in wanted else 0) for n in open_}
    else:
        weights = {n: Fraction(runtime_ms.get(n) or 0).limit_denominator(10**9) for n in open_}
    parts.update(largest_remainder(total, weights))
    return parts
