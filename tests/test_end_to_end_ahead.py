"""End-to-end checks run ahead of the searches' end: when one starts, which verdict the iteration takes, and
a run on this CPU where the checks ahead are on (as they are where kernels are timed)."""

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from mkevolve import orchestrator as orchestrator_module
from mkevolve.cli import main
from mkevolve.end_to_end_ahead import MAX_CHECKS, NEAR_END, PRIORITY, Composition, EndToEndAhead
from mkevolve.event_records import EndToEndAheadEvent, VerdictEvent, parse_events
from mkevolve.events import EventLog
from mkevolve.orchestrator import Orchestrator
from mkevolve.report import composite_checked
from mkevolve.search.beam import Candidate, PromptKind
from mkevolve.verify.result import EvalResult, Status

ROOT = Path(__file__).resolve().parents[1]


def candidate(name: str, seq: int, speedup: float | None, source: str | None = None) -> Candidate:
    result = EvalResult(status=Status.OK if speedup is not None else Status.INCORRECT, speedup=speedup)
    return Candidate(id=f"c{seq:04d}", subproblem=name, parent=None, kind=PromptKind.GENERATE,
                     source=source or f"# {name} kernel {seq}\n", result=result)


class Checks:
    """A stand-in for the orchestrator's check: records each composition and answers OK, or raises, or waits
    on `release` before answering."""

    def __init__(self, fail: bool = False, release: threading.Event | None = None):
        self.started: list[tuple[int, dict[str, str]]] = []
        self.withdrawn: dict[int, threading.Event] = {}
        self.fail, self.release = fail, release

    def __call__(self, composition: Composition, number: int, withdrawn: threading.Event) -> EvalResult:
        self.started.append((number, composition.as_dict()))
        self.withdrawn[number] = withdrawn
        if self.release is not None:
            self.release.wait(timeout=10)
        if self.fail:
            raise OSError("no space left on device")
        return EvalResult(status=Status.OK, speedup=float(number))


def test_no_check_until_every_subproblem_has_a_passing_kernel():
    checks = Checks()
    ahead = EndToEndAhead(1, ["conv", "norm"], checks, best={}, unfinished={"conv": 1, "norm": 1})
    ahead.child("conv", candidate("conv", 0, 1.5), 0)
    ahead.child("norm", candidate("norm", 0, None), 0)       # failed: norm still has no kernel
    ahead.close()
    assert checks.started == []


def test_no_check_while_more_than_near_end_candidates_are_left_then_the_best_so_far():
    checks = Checks()
    started = []
    ahead = EndToEndAhead(1, ["conv", "norm"], checks, best={}, unfinished={"conv": 8, "norm": 8},
                          on_start=lambda composition, number: started.append(dict(composition.candidates)))
    ahead.child("conv", None, 3)                              # the searches say what they plan
    ahead.child("norm", None, 1)
    conv, norm = candidate("conv", 1, 1.5), candidate("norm", 0, 0.9)
    ahead.child("conv", candidate("conv", 0, 1.2), 2)
    ahead.child("norm", norm, 0)
    ahead.child("conv", conv, 1)                              # ranks higher; NEAR_END candidates left
    ahead.child("conv", candidate("conv", 2, 1.1), 0)         # slower: the composition stays
    ahead.close()
    assert NEAR_END == 1
    assert checks.started == [(1, {"conv": conv.source, "norm": norm.source})]
    assert started == [{"conv": "c0001", "norm": "c0000"}]


def test_a_kernel_kept_from_an_earlier_iteration_counts_as_its_subproblems_best():
    checks = Checks()
    kept = candidate("norm", 3, 1.1)
    ahead = EndToEndAhead(2, ["conv", "norm"], checks, best={"norm": kept}, unfinished={"conv": 2})
    conv = candidate("conv", 4, 1.3)
    ahead.child("conv", conv, 1)
    ahead.close()
    assert checks.started == [(1, {"conv": conv.source, "norm": kept.source})]


def test_only_a_higher_ranked_kernel_changes_the_composition_and_at_most_max_checks_start():
    checks = Checks()
    ahead = EndToEndAhead(1, ["gemm"], checks, best={}, unfinished={"gemm": 0})
    ahead.child("gemm", candidate("gemm", 0, 1.4), 0)
    ahead.child("gemm", candidate("gemm", 1, 1.2), 0)     # slower: the composition stays
    ahead.child("gemm", candidate("gemm", 2, 1.4), 0)     # as fast but newer: the older one ranks first
    for seq in range(3, 3 + MAX_CHECKS + 1):
        ahead.child("gemm", candidate("gemm", seq, 1.4 + seq), 0)
    ahead.close()
    assert [number for number, _ in checks.started] == list(range(1, MAX_CHECKS + 1))
    assert checks.started[0][1] == {"gemm": candidate("gemm", 0, 1.4).source}
    # Each check but the last was withdrawn when the next started (it runs all the same if it had a worker).
    assert [checks.withdrawn[n].is_set() for n in range(1, MAX_CHECKS + 1)] == [True] * (MAX_CHECKS - 1) + [False]


def test_the_verdict_is_taken_only_for_exactly_the_checked_kernels_and_waits_for_a_running_check():
    release = threading.Event()
    ahead = EndToEndAhead(1, ["conv", "norm"], Checks(release=release), best={}, unfinished={})
    conv, norm = candidate("conv", 0, 1.5), candidate("norm", 0, 1.0)
    ahead.child("conv", conv, 0)
    ahead.child("norm", norm, 0)
    assert ahead.verdict_for({"conv": conv.source, "norm": "# another norm kernel\n"}) is None
    got = []
    waiter = threading.Thread(target=lambda: got.append(ahead.verdict_for({"norm": norm.source,
                                                                           "conv": conv.source})))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and got == []              # the check still runs: the verdict is waited for
    release.set()
    waiter.join(timeout=10)
    number, result = got[0]
    assert number == 1 and result.status is Status.OK and result.speedup == 1.0
    assert ahead.close() == []


def test_an_error_is_raised_where_the_verdict_is_used_and_reported_by_close_where_it_is_not():
    used = EndToEndAhead(1, ["gemm"], Checks(fail=True), best={}, unfinished={})
    gemm = candidate("gemm", 0, 1.4)
    used.child("gemm", gemm, 0)
    with pytest.raises(OSError, match="no space"):
        used.verdict_for({"gemm": gemm.source})
    assert used.close() == []
    unused = EndToEndAhead(1, ["gemm"], Checks(fail=True), best={}, unfinished={})
    unused.child("gemm", gemm, 0)
    errors = unused.close()
    assert [(number, type(error)) for number, error in errors] == [(1, OSError)]


def _composing_orchestrator(ahead: EndToEndAhead | None, checked: list) -> Orchestrator:
    orchestrator = Orchestrator.__new__(Orchestrator)
    orchestrator.events = EventLog()
    orchestrator._ahead = ahead
    orchestrator.problem_path = Path("problem.py")
    orchestrator.verifier = SimpleNamespace(check_composite=lambda problem, folder, pytorch: checked.append(
        (folder, pytorch)) or EvalResult(status=Status.OK, speedup=0.5))
    orchestrator._best_of = lambda name: SimpleNamespace(source=f"# {name} best\n")
    return orchestrator


def test_compose_takes_the_verdict_of_the_check_ahead_of_the_same_kernels(tmp_path):
    from mkevolve.codebase import Decomposition, SubproblemSpec

    top_level = 'def load_subproblem(name):\n    pass\n\nGemm = load_subproblem("gemm")\n'
    decomposition = Decomposition(top_level, [SubproblemSpec("gemm", "G = 1\n")])
    ahead = EndToEndAhead(1, ["gemm"], Checks(), best={}, unfinished={})
    ahead.child("gemm", candidate("gemm", 0, 1.4, source="# gemm best\n"), 0)
    checked = []
    orchestrator = _composing_orchestrator(ahead, checked)
    result = orchestrator._compose(tmp_path, decomposition, [])
    assert checked == [] and result.speedup == 1.0     # the check ahead's verdict (Checks answers its number)
    assert (tmp_path / "subkernel_implementations" / "gemm.py").read_text() == "# gemm best\n"
    assert [(e["state"], e["check"]) for e in orchestrator.events.events] == [(EndToEndAheadEvent.USED, 1)]
    # With a subproblem run as PyTorch code (guarded completion), or no check ahead, the composite is checked.
    assert orchestrator._compose(tmp_path, decomposition, ["gemm"]).speedup == 0.5 and len(checked) == 1
    orchestrator._ahead = None
    assert orchestrator._compose(tmp_path, decomposition, []).speedup == 0.5 and len(checked) == 2
    ahead.close()


def test_the_report_counts_a_check_ahead_only_when_its_verdict_was_used():
    def verdict(path: str) -> VerdictEvent:
        return VerdictEvent(solution=path, status="ok", composite=True)

    events = [verdict("run/iterations/iter_01/ahead/1/decomposed_solution.py"),
              verdict("run/iterations/iter_02/ahead/1/decomposed_solution.py"),
              verdict("run/iterations/iter_02/ahead/2/decomposed_solution.py"),
              EndToEndAheadEvent(iteration=2, check=2, state=EndToEndAheadEvent.USED),
              verdict("run/iterations/iter_03/decomposed_solution.py")]
    assert composite_checked(events) == {2, 3}


def test_a_run_with_checks_ahead_uses_one_and_says_so(tmp_path, monkeypatch):
    """gemm_chain on this CPU with the checks ahead switched on, as they are where kernels are timed: each
    search ends at its first passing kernel, so the composition checked ahead is the one delivered, and no
    second end-to-end check of it runs."""
    from mkevolve.verify.verifier import Verifier

    monkeypatch.setattr(orchestrator_module, "times_kernels", lambda device: True)
    priorities, original = [], Verifier.check_composite

    def recording(self, *args, **kwargs):
        priorities.append(kwargs.get("priority", 0))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Verifier, "check_composite", recording)
    out = tmp_path / "runs"
    args = ["run", str(ROOT / "problems" / "gemm_chain.py"), "--out", str(out), "--iterations", "1",
            "--budget", "3", "--workers", "2", "--trials", "2"]
    assert main(args) == 0
    run_dir = next((out / "gemm_chain").iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    ahead = [e for e in events if e["kind"] == EndToEndAheadEvent.KIND]
    assert [e["state"] for e in ahead] == [EndToEndAheadEvent.STARTED, EndToEndAheadEvent.USED]
    assert priorities == [PRIORITY]                  # one composite check in all: the one ahead
    composites = [e for e in events if e["kind"] == "verdict" and e.get("composite")]
    assert len(composites) == 1 and "/ahead/1/" in composites[0]["solution"]
    assert composite_checked(parse_events(events)) == {1}
    assert (run_dir / "best" / "decomposed_solution.py").is_file()


def test_a_withdrawn_check_has_no_verdict_and_counts_as_no_evaluation():
    from mkevolve.verify.result import not_started_cause
    from mkevolve.verify.verifier import _to_result
    from mkevolve.workers.pool import JobFailure, JobOutcome

    result = _to_result(JobOutcome(failure=JobFailure.WITHDRAWN, reason="withdrawn while it waited for a worker"))
    assert result.status is Status.NOT_RUN and "withdrawn" in not_started_cause(result.reason)
