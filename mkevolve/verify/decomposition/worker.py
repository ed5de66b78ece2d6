"""Worker side of the decomposition checks: `run_checks` imports and runs the problem, the subproblems and
the top-level, and returns every check's verdict."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from mkevolve.codebase import PROBLEM_FILE, PROBLEMS_DIR, InstanceConfig, referenced_subproblems
from mkevolve.config import TOLERANCE
from mkevolve.problem import (
    ProblemError,
    build_model,
    call_inputs,
    clone_values,
    describe_calls,
    flatten_outputs,
    fp32_strict,
    import_file,
    load_problem,
    make_inputs,
    seed_everything,
)
from mkevolve.verify.decomposition.coverage import SubproblemFacts, coverage_checks
from mkevolve.verify.decomposition.recording import (
    Instance,
    RecordConstruction,
    RecordForward,
    structure_impurities,
    subproblem_classes,
)
from mkevolve.verify.decomposition.results import (
    CHECKS,
    EQUIVALENCE,
    FORWARD_COVERAGE,
    INIT_COVERAGE,
    PURITY,
    STANDALONE,
    STRUCTURE,
    CheckReport,
    CheckResult,
    not_run,
)
from mkevolve.verify.decomposition.signatures import bind
from mkevolve.verify.decomposition.static import structure_problems, top_level_violations
from mkevolve.verify.result import timed_phase

ATOL = RTOL = TOLERANCE  # fixed: a decomposition must match its original as strictly as the default

# ATen ops the top-level may run outside subproblem modules: they move no data through arithmetic.
VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "permute", "transpose", "t",
                      "unsqueeze", "squeeze", "expand", "flatten", "unflatten", "select", "slice", "split",
                      "split_with_sizes", "unbind", "chunk", "narrow", "alias", "detach", "clone",
                      "contiguous", "as_strided", "view_as", "movedim", "numpy_T", "lift_fresh"})


def run_checks(problem_path: str, folder: str, seed: int = 0, trials: int = 3,
               eval_mode: bool = False) -> CheckReport:
    """Runs in a worker: every check on the decomposition in `folder` against the problem file."""
    start = time.monotonic()
    folder_path = Path(folder)
    files = {PROBLEM_FILE: _read(folder_path / PROBLEM_FILE)} if (folder_path / PROBLEM_FILE).is_file() else {}
    for path in sorted((folder_path / PROBLEMS_DIR).glob("*.py")):
        files[f"{PROBLEMS_DIR}/{path.name}"] = _read(path)
    problems = structure_problems(files)
    if problems:
        checks = [CheckResult(STRUCTURE, False, "; ".join(problems))]
        return CheckReport.from_checks(checks + not_run(CHECKS[1:], "the structure check failed"),
                                       wall_s=time.monotonic() - start)
    run = _Run(Path(problem_path), folder_path, seed, trials, eval_mode)
    checks = run.all_checks(top_level_violations(files[PROBLEM_FILE]))
    return CheckReport.from_checks(checks, run.instance_configs(), wall_s=time.monotonic() - start,
                                   phases=run.phases, inputs=run.inputs)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class _Run:
    """One check run in a worker: loads the problem, the subproblems and the top-level, then compares."""

    def __init__(self, problem_path: Path, folder: Path, seed: int, trials: int, eval_mode: bool):
        self.problem_path = problem_path
        self.folder = folder
        self.seed = seed
        self.trials = max(1, trials)
        self.eval_mode = eval_mode
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.instances: list[Instance] = []
        self.top_level_ops: list[str] = []
        self.runtime_impurities: list[str] = []
        self.phases: dict[str, float] = {}     # CheckReport.phases
        self.inputs: dict[str, list[str]] = {}  # CheckReport.inputs
        fp32_strict()

    def all_checks(self, static_impurities: list[str]) -> list[CheckResult]:
        try:
            problem = load_problem(self.problem_path)
        except ProblemError as err:
            return [CheckResult(STRUCTURE, False, f"the original problem does not load: {err.reason}")] + \
                not_run(CHECKS[1:], "the original problem does not load")
        facts, standalone = self._standalone()
        try:
            with timed_phase(self.phases, "import"):
                top = import_file(self.folder / PROBLEM_FILE, prefix="mkevolve_top_level")
        except ProblemError as err:
            return [CheckResult(STRUCTURE, False, f"{PROBLEM_FILE} does not import: {err.reason}"),
                    _purity(static_impurities, []), standalone] + \
                not_run(CHECKS[3:], f"{PROBLEM_FILE} does not import")
        with timed_phase(self.phases, EQUIVALENCE):
            equivalence = self._equivalence(problem, top)
        with timed_phase(self.phases, "coverage"):
            coverage = coverage_checks(facts, self.instances) if self.instances else not_run(
                (FORWARD_COVERAGE, INIT_COVERAGE), "the top-level built no subproblem module")
        return [CheckResult(STRUCTURE, True), _purity(static_impurities, self._runtime_impurities()),
                standalone, equivalence, *coverage]

    # -- standalone ----------------------------------------------------------------------------------

    def _standalone(self) -> tuple[dict[str, SubproblemFacts], CheckResult]:
        facts, failures = {}, []
        for name in referenced_subproblems(_read(self.folder / PROBLEM_FILE)):
            path = self.folder / PROBLEMS_DIR / f"{name}.py"
            try:
                with timed_phase(self.phases, "load"):
                    sub = load_problem(path)
                    facts[name] = self._facts(name, sub)
            except ProblemError as err:
                failures.append(f"{name}: {err.reason}")
                continue
            with timed_phase(self.phases, STANDALONE):
                failure = self._run_standalone(sub)
            if failure:
                failures.append(f"{name}: {failure}")
        if failures:
            return facts, CheckResult(STANDALONE, False, "; ".join(failures))
        return facts, CheckResult(STANDALONE, True)

    def _facts(self, name: str, sub) -> SubproblemFacts:
        """What the coverage checks compare, and (self.inputs) how the file is called, for prompts."""
        configs, calls = [], []
        for config in sub.configs:
            init = call_inputs(sub.path, config.get_init_inputs, "get_init_inputs")
            # shapes and dtypes are all the coverage check compares: no values to draw
            inputs = make_inputs(sub.path, config, self.seed + 1, torch.device("meta"), made_there=True)
            configs.append((bind(sub.model_cls.__init__, tuple(init), {}, skip_self=True),
                            bind(sub.model_cls.forward, tuple(inputs), {}, skip_self=True)))
            calls.append((inputs, init))
        self.inputs[name] = describe_calls(calls)
        return SubproblemFacts(name, configs, hasattr(sub.module, "get_input_configs"))

    def _run_standalone(self, sub) -> str | None:
        """Each config built once and called twice on the same inputs: the verifier compares candidates with
        the subproblem's outputs, so they must not change from call to call. Construction is compared by the
        equivalence check, which builds the original and the top-level's subproblem modules apart (building
        twice here cost a 32768 x 32768 Linear 7 s per build on the H200's CPU).

        Each call starts from the same seed, as the equivalence trials do: a subproblem that draws (a training
        dropout, split off to stay PyTorch code) draws the same numbers both times and passes; a forward that
        keeps state between calls still differs. Unseeded, the dropout failed here, and level2/83 lost its
        whole decomposition (0.62x torch.compile on an H100; 1.04x with its convolution and norm in Triton)."""
        for index, config in enumerate(sub.configs):
            outputs = []
            try:
                init = call_inputs(sub.path, config.get_init_inputs, "get_init_inputs")
                model = build_model(sub.path, sub.model_cls, init, self.seed, self.device, self.eval_mode)
                inputs = make_inputs(sub.path, config, self.seed + 1, self.device, made_there=True)
                with torch.no_grad():
                    for _ in range(2):
                        seed_everything(self.seed + 1000)
                        outputs.append(flatten_outputs(model(*clone_values(inputs))))
            except ProblemError as err:
                return f"config {index}: {err.reason}"
            except Exception as err:  # noqa: BLE001  (untrusted code: any error is the verdict)
                return f"config {index}: forward raised {type(err).__name__}: {err}"
            if not all(isinstance(t, torch.Tensor) for t in outputs[0]):
                return f"config {index}: forward must return a tensor or a tuple of tensors"
            # Within the verifier's tolerance, not bit for bit: some GPU kernels (transposed convolutions in
            # cuDNN) add in a different order from run to run.
            if _compare(outputs[0], outputs[1], ATOL, RTOL) is not None:
                return (f"config {index}: two calls on the same inputs differ beyond atol=rtol={ATOL:g} "
                        "(the module is non-deterministic or keeps state between calls)")
        return None

    # -- equivalence, with recording ----------------------------------------------------------------

    def _equivalence(self, problem, top) -> CheckResult:
        classes = subproblem_classes(top, self.folder / PROBLEMS_DIR)
        for index, config in enumerate(problem.configs):
            try:
                init = call_inputs(problem.path, config.get_init_inputs, "get_init_inputs")
                reason = self._compare_config(problem, top, classes, init, config)
            except ProblemError as err:
                reason = err.reason
            if reason:
                prefix = f"config {index}: " if len(problem.configs) > 1 else ""
                return CheckResult(EQUIVALENCE, False, prefix + reason)
        return CheckResult(EQUIVALENCE, True)

    def _compare_config(self, problem, top, classes: dict, init: list, config) -> str | None:
        # the equivalence phase's two parts: building both models (on the CPU, then moved), and the trials
        with timed_phase(self.phases, "equivalence.build"):
            reference = build_model(problem.path, problem.model_cls, init, self.seed, self.device, self.eval_mode)
            first = len(self.instances)
            with RecordConstruction(classes, self.instances):
                try:
                    decomposed = build_model(self.folder / PROBLEM_FILE, top.Model, init, self.seed, self.device,
                                             self.eval_mode, what="top-level Model")
                except ProblemError as err:
                    return err.reason
        new = self.instances[first:]
        self.runtime_impurities += structure_impurities(decomposed, new, classes)
        with timed_phase(self.phases, "equivalence.trials"):
            return self._trials(problem, config, reference, decomposed, new)

    def _trials(self, problem, config, reference, decomposed, new: list[Instance]) -> str | None:
        for trial in range(self.trials):
            inputs = make_inputs(problem.path, config, self.seed + 1 + trial, self.device, made_there=True)
            # Each forward on its own copies, and what each leaves in its arguments compared too: an original
            # that writes into an argument (`x.mul_(2)`) is matched only by a decomposition that does as well.
            expected_args, actual_args = clone_values(inputs), clone_values(inputs)
            with torch.no_grad():
                seed_everything(self.seed + 1000 + trial)
                expected = flatten_outputs(reference(*expected_args))
                seed_everything(self.seed + 1000 + trial)
                try:
                    if trial == 0:
                        with RecordForward(new, self.top_level_ops):
                            actual = flatten_outputs(decomposed(*actual_args))
                    else:
                        actual = flatten_outputs(decomposed(*actual_args))
                except Exception as err:  # noqa: BLE001  (untrusted code: any error is the verdict)
                    return f"top-level forward raised {type(err).__name__}: {err}"
            mismatch = (_compare(expected, actual, ATOL, RTOL)
                        or _compare(expected_args, actual_args, ATOL, RTOL, what="argument", after=" after the call"))
            if mismatch:
                return (f"trial {trial}: {mismatch}. Same seed, same constructor arguments: build the "
                        "subproblem modules in the order the original creates its layers, so the weights match")
        return None

    def _runtime_impurities(self) -> list[str]:
        ops = sorted(set(self.top_level_ops) - VIEW_OPS)
        found = list(dict.fromkeys(self.runtime_impurities))
        if ops:
            found.append(f"forward ran {', '.join('aten.' + o for o in ops)} outside every subproblem module; "
                         "move that computation into a subproblem")
        return found

    # -- instances ----------------------------------------------------------------------------------

    def instance_configs(self) -> dict[str, list[InstanceConfig]]:
        configs: dict[str, list[InstanceConfig]] = {}
        for instance in self.instances:
            calls = tuple(dict.fromkeys(c.render() if c else "(unbindable call)" for c in instance.calls))
            init = instance.init.render() if instance.init else "(unbindable arguments)"
            configs.setdefault(instance.name, []).append(InstanceConfig(instance.attribute, init, calls))
        return configs


def _purity(static: list[str], runtime: list[str]) -> CheckResult:
    found = static + runtime
    return CheckResult(PURITY, not found, "; ".join(found))


def _compare(expected: list, actual: list, atol: float, rtol: float, what: str = "output",
             after: str = "") -> str | None:
    if len(expected) != len(actual):
        return f"the original returns {len(expected)} output(s), the top-level {len(actual)}"
    for index, (a, b) in enumerate(zip(expected, actual)):
        label = (f"{what} {index}" if len(expected) > 1 else f"the {what}") + after
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            if a != b:
                return f"{label} differs: {a!r} != {b!r}"
            continue
        if a.shape != b.shape:
            return f"{label} has shape {list(b.shape)}, expected {list(a.shape)}"
        if a.dtype != b.dtype:
            return f"{label} has dtype {b.dtype}, expected {a.dtype}"
        if not torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True):
            diff = (a.double() - b.double()).abs().nan_to_num(float("inf"))
            return f"{label} differs: max abs error {diff.max().item():.3g} (tolerance atol=rtol={ATOL:g})"
    return None
