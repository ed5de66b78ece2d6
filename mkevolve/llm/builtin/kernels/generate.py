"""From a subproblem file to a ModelNew source: trace, lower, plan per module mode, emit one variant."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from mkevolve.problem import ProblemError, load_problem

from .configs import Variant, variants_for
from .emit_attention import emit_attention
from .emit_common import KernelSource
from .emit_concat import emit_concat, emit_gather
from .emit_conv import conv_uses_dot, emit_conv
from .emit_matmul import emit_matmul
from .emit_pointwise import emit_pointwise
from .emit_pool import emit_adaptive_pool, emit_pool
from .emit_rows import emit_rows
from .errors import UnsupportedInMode, UnsupportedSubproblem
from .lower import lower
from .module_source import ForwardWriter, ModeForward, ProblemSource, assemble
from .plan import KernelPlan, Plan, plan
from .trace import MODES, trace_problem


@dataclass(frozen=True)
class GeneratedKernel:
    source: str          # the whole ModelNew file
    precision: str       # "ieee", "tf32x3" or "none" (no tl.dot)
    variant: int
    description: str


@dataclass
class Analysis:
    """Everything about a subproblem that does not depend on the variant."""

    problem: ProblemSource
    plans: dict[str, Plan]               # per module mode (train, eval) that gets kernels
    unsupported: dict[str, str]          # per module mode that cannot: the reason

    @property
    def uses_dot(self) -> bool:
        return any(uses_dot(k) for p in self.plans.values() for k in p.kernels)


_CACHE: dict[tuple[str, str], Analysis] = {}


def analyse(problem_path: str | Path) -> Analysis:
    path = Path(problem_path).resolve()
    try:
        text = path.read_text()
    except OSError as err:
        raise ProblemError(path, f"cannot read: {err}") from None
    key = (str(path), hashlib.sha256(text.encode()).hexdigest())
    if key not in _CACHE:
        problem = load_problem(path)
        source = ProblemSource.parse(path, problem.source)
        plans, unsupported = {}, {}
        for mode, trace in trace_problem(problem).items():
            try:
                plans[mode] = plan(lower(trace))
            except UnsupportedInMode as err:
                unsupported[mode] = str(err)
        if not plans:
            raise UnsupportedSubproblem("; ".join(dict.fromkeys(unsupported.values())))
        _CACHE[key] = Analysis(source, plans, unsupported)
    return _CACHE[key]


def uses_dot(kernel: KernelPlan) -> bool:
    if kernel.kind in ("matmul", "attention"):
        return True
    return kernel.kind == "conv" and conv_uses_dot(kernel.anchor)


def emit_kernel(kernel: KernelPlan, name: str, variant: Variant, plan_: Plan) -> KernelSource:
    emitters = {"pointwise": emit_pointwise, "matmul": emit_matmul, "rows": emit_rows, "conv": emit_conv,
                "pool": emit_pool, "adaptive_pool": emit_adaptive_pool, "attention": emit_attention,
                "concat": emit_concat, "gather": emit_gather}
    return emitters[kernel.kind](kernel, name, variant, plan_.program)


def generate(problem_path: str | Path, variant: int, target: str, mode: str | None = None) -> GeneratedKernel:
    """One variant's ModelNew; `mode` ("train" or "eval"), where given, must be one that gets kernels."""
    analysis = analyse(problem_path)
    if mode in analysis.unsupported:
        raise UnsupportedSubproblem(analysis.unsupported[mode])
    variants = variants_for(target, analysis.uses_dot)
    if not 0 <= variant < len(variants):
        raise ValueError(f"variant {variant} out of range: this subproblem has {len(variants)} variants "
                         f"for target {target!r}")
    chosen = variants[variant]
    sources: dict[str, KernelSource] = {}
    forwards = []
    arg_names = analysis.problem.forward_arg_names()
    for mode in MODES:
        if mode in analysis.unsupported:
            forwards.append(ModeForward(mode, [f"raise NotImplementedError({analysis.unsupported[mode]!r})"]))
            continue
        mode_plan = analysis.plans[mode]
        launches = {k.root.id: _named(k, chosen, mode_plan, sources) for k in mode_plan.kernels}
        forwards.append(ModeForward(mode, ForwardWriter(mode_plan, launches, arg_names).write()))
    if all(f.lines == forwards[0].lines for f in forwards):
        forwards = forwards[:1]
    kernels = list(sources.values())
    description = "; ".join(dict.fromkeys(k.description for k in kernels)) + f" [{chosen.name}]"
    text = assemble(analysis.problem, kernels, forwards, description)
    precision = chosen.precision if analysis.uses_dot else "none"
    return GeneratedKernel(text, precision, variant, description)


def _named(kernel: KernelPlan, variant: Variant, plan_: Plan, sources: dict[str, KernelSource]) -> KernelSource:
    """Emit under a placeholder name; identical code (e.g. shared by both modes) is written to the file once,
    while each launch keeps its own arguments."""
    placeholder = "_KERNEL_NAME_"
    draft = emit_kernel(kernel, placeholder, variant, plan_)
    key = draft.kernel + draft.launcher
    name = sources[key].launcher_name.removesuffix("_launch") if key in sources else \
        f"_{kernel.kind}_kernel_{len(sources)}"
    draft.kernel = draft.kernel.replace(placeholder, name)
    draft.launcher = draft.launcher.replace(placeholder, name)
    draft.launcher_name = draft.launcher_name.replace(placeholder, name)
    sources.setdefault(key, draft)
    return draft


def variant_total(problem_path: str | Path, target: str) -> int:
    return len(variants_for(target, analyse(problem_path).uses_dot))


__all__ = ["GeneratedKernel", "UnsupportedSubproblem", "analyse", "generate", "variant_total"]
