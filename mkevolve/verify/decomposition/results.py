"""What the decomposition checks report: the checks' names, one check's verdict, and a whole run's report."""

from __future__ import annotations

from dataclasses import dataclass, field

from mkevolve.codebase import InstanceConfig

STRUCTURE, PURITY, STANDALONE = "structure", "purity", "standalone"
EQUIVALENCE, FORWARD_COVERAGE, INIT_COVERAGE = "equivalence", "forward_coverage", "init_coverage"
CHECKS = (STRUCTURE, PURITY, STANDALONE, EQUIVALENCE, FORWARD_COVERAGE, INIT_COVERAGE)


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    reason: str = ""


@dataclass
class CheckReport:
    """Every check's verdict, the subproblem instances the top-level made (name -> instances), and how each
    loaded subproblem file is called (name -> problem.describe_inputs lines, for prompts)."""

    passed: bool
    checks: list[CheckResult]
    instances: dict[str, list[InstanceConfig]] = field(default_factory=dict)
    wall_s: float = 0.0
    # Seconds per part of the run in the worker: "load" (each subproblem imported, its inputs drawn on the
    # CPU), "standalone" (each built and called twice), "import" (the top-level), "equivalence" (original and
    # top-level built, "equivalence.build", and compared over the trials, "equivalence.trials"), "coverage":
    # where a full-size check spends its time (level2/19: 38 s on the H200).
    phases: dict[str, float] = field(default_factory=dict)
    inputs: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_checks(cls, checks: list[CheckResult], instances: dict[str, list[InstanceConfig]] | None = None,
                    wall_s: float = 0.0, phases: dict[str, float] | None = None,
                    inputs: dict[str, list[str]] | None = None) -> CheckReport:
        return cls(passed=all(c.passed for c in checks), checks=checks, instances=instances or {},
                   wall_s=wall_s, phases=phases or {}, inputs=inputs or {})

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]

    def reasons(self) -> list[str]:
        """One line per failed check that ran (checks skipped because of another are left out)."""
        return [f"{c.name}: {c.reason}" for c in self.failures() if not c.reason.startswith(_NOT_RUN)]

    def verdict(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "wall_s": round(self.wall_s, 3),
                "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
                "checks": [{"name": c.name, "passed": c.passed, "reason": c.reason} for c in self.checks]}


_NOT_RUN = "not run"


def not_run(names: tuple[str, ...], because: str) -> list[CheckResult]:
    return [CheckResult(n, False, f"{_NOT_RUN}: {because}") for n in names]
