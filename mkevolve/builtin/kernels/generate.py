"""From a subproblem file to a ModelNew source: trace, lower, plan per module mode, emit one variant."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from mkevolve.problem import ProblemError, load_problem

from .configs import NOMINAL_SMS, TARGETS, Variant, variants_for
from .emit_common import KernelSource
from .emit_matmul import splits_k
from .errors import UnsupportedInMode, UnsupportedSubproblem
from .ir import Matmul
from .kernel_plan import KernelPlan
from .lower import lower
from .module_source import ForwardWriter, ModeForward, ProblemSource, assemble
from .plan import Plan, plan
from .registry import kind_of
from .self_check import main_block, metric_for
from .signature import code_key, merge_shared
from .trace import MODES, trace_problem
from .work import Work, forward_work


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

    @property
    def winograd(self) -> bool:
        """A kernel has a Winograd form: the Winograd variants differ from the others."""
        return any(kind_of(k).winograd(k.anchor) for p in self.plans.values() for k in p.kernels)

    def splits_k(self, target: str) -> bool:
        """A GEMM would split its K on the target's nominal GPU (configs.k_split): the split-K variants differ."""
        tile = next((v.split_k for v in TARGETS.get(target, ()) if v.split_k is not None), None)
        return tile is not None and any(splits_k(k.anchor, NOMINAL_SMS[target], tile) for p in self.plans.values()
                                        for k in p.kernels if isinstance(k.anchor, Matmul))

    def variants(self, target: str) -> tuple[Variant, ...]:
        return variants_for(target, self.uses_dot, self.winograd, self.splits_k(target))

    def work(self) -> list[Work]:
        """The least work per input config, in the mode the self-check runs the module in: training, unless
        only eval mode gets kernels."""
        return forward_work(next(self.plans[m] for m in MODES if m in self.plans))


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
    return kind_of(kernel).kernel_uses_dot(kernel)


def emit_kernel(kernel: KernelPlan, name: str, variant: Variant, plan_: Plan) -> KernelSource:
    return kind_of(kernel).emit(kernel, name, variant, plan_.program)


def generate(problem_path: str | Path, variant: int, target: str, mode: str | None = None) -> GeneratedKernel:
    """One variant's ModelNew; `mode` ("train" or "eval"), where given, must be one that gets kernels."""
    analysis = analyse(problem_path)
    if mode in analysis.unsupported:
        raise UnsupportedSubproblem(analysis.unsupported[mode])
    variants = analysis.variants(target)
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
    check = main_block(analysis.problem.stem, analysis.work(), metric_for(analysis.uses_dot))
    plain_attributes = list(dict.fromkeys(a for p in analysis.plans.values() for a in p.program.plain_attributes))
    text = assemble(analysis.problem, kernels, forwards, description, check, plain_attributes)
    precision = chosen.precision if analysis.uses_dot else "none"
    return GeneratedKernel(text, precision, variant, description)


def _named(kernel: KernelPlan, variant: Variant, plan_: Plan, sources: dict[str, KernelSource]) -> KernelSource:
    """Emit under a placeholder name; identical code (e.g. shared by both modes, or by repeated layers) is
    written to the file once, while each launch keeps its own arguments."""
    placeholder = "_KERNEL_NAME_"
    draft = emit_kernel(kernel, placeholder, variant, plan_)
    key = code_key(draft.kernel + draft.launcher)
    shared = sources.get(key)
    name = shared.launcher_name.removesuffix("_launch") if shared else f"_{kernel.kind}_kernel_{len(sources)}"
    draft.kernel = draft.kernel.replace(placeholder, name)
    draft.launcher = draft.launcher.replace(placeholder, name)
    draft.launcher_name = draft.launcher_name.replace(placeholder, name)
    if shared:
        shared.kernel = merge_shared(shared.kernel, draft.kernel)
    sources.setdefault(key, draft)
    return draft


def variant_total(problem_path: str | Path, target: str) -> int:
    analysis = analyse(problem_path)
    return len(analysis.variants(target))


__all__ = ["GeneratedKernel", "UnsupportedSubproblem", "analyse", "generate", "variant_total"]
