"""Offline, deterministic Triton generation for one KernelBench-form subproblem: no LLM, template kernels.

generate_kernel traces the subproblem's Model, fuses its ops into kernels (elementwise chains; GEMMs,
convolutions and pooling with their elementwise epilogue; row reductions with prologue and epilogue;
attention, softmax or ReLU weights, as one flash-style kernel; torch.cat; embedding/index_select gathers)
and returns the source of a ModelNew file. Variant 0 is the safest tiling; later variants try others.
"""

from __future__ import annotations

from pathlib import Path

from .errors import UnsupportedOps, UnsupportedSubproblem
from .generate import GeneratedKernel, analyse, generate, variant_total


def generate_kernel(problem_path: str | Path, variant: int = 0, target: str = "cuda",
                    mode: str | None = None) -> GeneratedKernel:
    """The ModelNew source for one variant; raises UnsupportedSubproblem for ops without a template, or
    where `mode` ("train", "eval") is given and that module mode cannot get kernels."""
    return generate(problem_path, variant, target, mode)


def variant_count(problem_path: str | Path, target: str = "cuda", mode: str | None = None) -> int:
    """How many variants generate_kernel accepts for this subproblem and target; raises
    UnsupportedSubproblem where generate_kernel would for every variant (`mode` as there)."""
    unsupported = analyse(problem_path).unsupported
    if mode in unsupported:
        raise UnsupportedSubproblem(unsupported[mode])
    return variant_total(problem_path, target)


__all__ = ["GeneratedKernel", "UnsupportedOps", "UnsupportedSubproblem", "generate_kernel", "variant_count"]
