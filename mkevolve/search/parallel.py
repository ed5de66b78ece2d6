"""Parallel sampling: every call is an independent generation; the best `width` samples form the beam."""

from __future__ import annotations

from mkevolve.search.beam import Beam, Propose


def parallel_sampling(beam: Beam, budget: int, propose: Propose) -> Beam:
    """Spend the whole budget on fresh generations at once; no sample sees another's verdict."""
    if budget > 0:
        beam.select(propose([None] * budget))
    return beam
