"""EvolveKernel: the agent that generates, debugs and refines a subproblem's kernel, saving each candidate."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from mkevolve.agents.judge import Judge, KernelUnderReview, judge_rejection
from mkevolve.agents.speculation import SpeculativeCheck
from mkevolve.config import RunConfig
from mkevolve.event_records import CandidateEvent, FinalCheckEvent
from mkevolve.fsutil import write_atomic
from mkevolve.llm.client import LLMClient
from mkevolve.llm.providers import LLMCallError
from mkevolve.llm.parse import ReplyFormatError, extract_code
from mkevolve.llm.types import LLMRequest, LLMResponse, Repertoire
from mkevolve.problem import ProblemError, describe_inputs, load_problem, read_source
from mkevolve.prompts import render
from mkevolve.search.beam import (Beam, Candidate, CandidateRecord, Exhausted, PromptKind, beam_search,
                                  candidate_id)
from mkevolve.search.mcts import mcts_search
from mkevolve.search.parallel import parallel_sampling
from mkevolve.verify.result import EvalResult, Status
from mkevolve.workers.pool import Job, JobOutcome, Priority

REPLY_EXCERPT_CHARS = 2000
REPLY_QUOTE_CHARS = 300   # of a reply without code, quoted in the candidate's reason
# Why a search stops at its first passing kernel where nothing is timed.
UNTIMED_NOTE = ("no GPU to time kernels: a passing kernel cannot be told from a faster one, so no refine call "
                "is made for it")


def times_kernels(device: str) -> bool:
    """Whether the verifier measures speedups on this device; only then can refined kernels be ranked."""
    return device not in ("cpu", "unknown")


class KernelVerifier(Protocol):
    """What the search needs of the verifier."""

    device_name: str

    def check_kernels(self, pairs: list[tuple[Path, Path]], *, timed: bool = True,
                      priority: Priority = 0) -> list[EvalResult]: ...

    def static_check(self, source: str, filename: str) -> EvalResult | None: ...

    def run_jobs(self, jobs: list[Job]) -> list[JobOutcome]: ...


@dataclass(frozen=True)
class RefineContext:
    """What the orchestrator knows of the subproblem's place in the whole model, for the refine prompt."""

    share: float | None = None          # fraction of the end-to-end time this subproblem takes
    end_to_end_ms: float | None = None  # the whole model's time with the current kernels


@dataclass(frozen=True)
class SearchProgress:
    """How far one subproblem's search is, for the live view: candidates evaluated and still to come."""

    subproblem: str
    done: int
    planned: int
    passing: bool          # some candidate of the beam passes

    @property
    def pending(self) -> int:
        return max(0, self.planned - self.done)


ProgressHook = Callable[[SearchProgress], None]
# Told, with the subproblem's name, when its search starts (no candidate; the candidates it plans) and of each
# candidate as its verdict comes (before the beam's final cheating check and judge), with how many of the
# search's candidates are still without one: the orchestrator checks the best composition so far end to end
# while the last candidates are checked.
ChildHook = Callable[[str, Candidate | None, int], None]


# Added to the worker priority of a check for a subproblem that already has a passing kernel: it waits behind
# every check of a subproblem that has none. Under a time budget a kernel for each piece comes before a faster
# kernel for one: level 3 models kept PyTorch subkernels whose first candidates were never checked in time.
COVERED_PRIORITY = 1 << 20
# Added, per check of its step that has already got a worker, to the priority of a subproblem without a passing
# kernel: such subproblems take turns, one check each, instead of the one with the fewest candidates taking
# every free worker (on the H200, level2/19's GroupNorm took both workers for 100 s while its convolution,
# which holds nearly all of the time, waited).
STARTED_PRIORITY = 1 << 10


class StepProgress:
    """One beam step's place in the queue for a worker (a QueuePlace). Checks of subproblems without a
    passing kernel go first, the step with the fewest checks started first; then the step with the fewest
    children still without a verdict, which ends soonest."""

    def __init__(self, children: int, covered: bool = False):
        self.unfinished = children
        self.covered = covered      # the subproblem has a passing kernel: a beam member, or a child of this step
        self.checks_started = 0     # this step's checks that got a worker
        self._lock = threading.Lock()

    def rank(self) -> int:
        """The worker pool's priority of this step's next check (smaller first), read when a worker comes free."""
        if self.covered:
            return COVERED_PRIORITY + self.unfinished
        return self.checks_started * STARTED_PRIORITY + self.unfinished

    def started(self) -> None:
        with self._lock:
            self.checks_started += 1

    @contextmanager
    def one_child(self) -> Iterator[None]:
        """Around one child's reply and check: it counts as unfinished until its verdict (or error)."""
        try:
            yield
        finally:
            with self._lock:
                self.unfinished -= 1


@dataclass(frozen=True)
class KernelTask:
    """A kernel request in typed form, so the builtin offline agent can answer it without reading a prompt."""

    kind: PromptKind
    problem_path: Path
    variant: int          # the builtin agent's template variant: each request of a subproblem tries the next
    target: str           # "cuda", or "cpu" when kernels run under the Triton interpreter
    eval_mode: bool = False   # the module mode the verifier compares in

    @property
    def mode(self) -> str:
        return "eval" if self.eval_mode else "train"

    def builtin_reply(self) -> str:
        from mkevolve.builtin.kernels import UnsupportedSubproblem, generate_kernel, variant_count

        try:
            count = variant_count(self.problem_path, self.target, mode=self.mode)
            if self.variant >= count:
                return render("builtin_kernel_reply.j2", kernel=None, unsupported=None, count=count)
            kernel = generate_kernel(self.problem_path, variant=self.variant, target=self.target, mode=self.mode)
        except UnsupportedSubproblem as err:
            return render("builtin_kernel_reply.j2", kernel=None, unsupported=builtin_decline(err), count=0)
        return render("builtin_kernel_reply.j2", kernel=kernel, unsupported=None, count=count)

    def builtin_repertoire(self) -> Repertoire:
        """The builtin generator's variant count for this subproblem (each request asks for the next), or
        none and what it has no kernel for."""
        from mkevolve.builtin.kernels import UnsupportedSubproblem, variant_count

        try:
            count = variant_count(self.problem_path, self.target, mode=self.mode)
        except UnsupportedSubproblem as err:
            return Repertoire(replies=0, reason=builtin_decline(err))
        return Repertoire(replies=count, reason=f"the builtin generator has no further kernel for this "
                                                f"subproblem: all {count} of its variants have been tried")


def builtin_decline(err: Exception) -> str:
    """What the builtin generator says it cannot write: every op it lacks when that is the reason."""
    from mkevolve.builtin.kernels import UnsupportedOps

    if isinstance(err, UnsupportedOps):
        return f"the builtin generator has no kernel for: {', '.join(err.ops)}"
    return f"the builtin generator has no kernel for this subproblem: {err}"


def _code_or_failure(response: LLMResponse) -> tuple[str, EvalResult | None]:
    """The reply's kernel source, or the verdict of a candidate that has none."""
    if response.error is not None:
        return "", EvalResult(status=Status.COMPILE_ERROR,
                              reason=f"no code: the LLM call failed: {response.error}")
    try:
        return extract_code(response.text), None
    except ReplyFormatError as err:
        # What the reply said instead (a refusal, a question) is the truthful part of this verdict.
        said = " ".join(response.text.split())[:REPLY_QUOTE_CHARS]
        reason = f"no code: {err}" + (f"; the reply says: {said}" if said else "")
        return "", EvalResult(status=Status.COMPILE_ERROR, reason=reason)


def input_shapes_job(problem_path: str) -> list[str]:
    """Runs in a worker: how the problem file is called (problem.describe_inputs), or why that is unknown."""
    try:
        return describe_inputs(load_problem(problem_path))
    except ProblemError as err:
        return [f"unknown ({err.reason}); read get_inputs() in the source"]


class KernelAgent:
    """Turns parents into evaluated children for one subproblem; every child is saved as it is made."""

    def __init__(self, subproblem: str, problem_path: Path, beam: Beam, verifier: KernelVerifier,
                 client: LLMClient, config: RunConfig, candidates_dir: Path,
                 context: RefineContext | None = None, judge: Judge | None = None,
                 on_child: ChildHook | None = None):
        self.subproblem = subproblem
        self.problem_path = Path(problem_path)
        self.problem_source = read_source(problem_path)
        self.problem_sha256 = hashlib.sha256(self.problem_source.encode()).hexdigest()
        self.beam = beam
        self.verifier = verifier
        self.client = client
        self.config = config
        self.folder = Path(candidates_dir) / subproblem
        self.context = context or RefineContext()
        self.events = client.events
        self.device = verifier.device_name
        self.judge = judge  # None: off (the default); else it reads each kernel the hard checks accept
        self.on_child = on_child
        self._unfinished = 0        # candidates the search plans that have no verdict yet (for on_child)
        self._unfinished_lock = threading.Lock()

    def _input_shapes(self) -> list[str]:
        job = Job("mkevolve.agents.evolve:input_shapes_job",
                  {"problem_path": str(self.problem_path.resolve())}, timeout=self.config.timeout)
        outcome = self.verifier.run_jobs([job])[0]
        if outcome.ok and isinstance(outcome.value, list):
            return outcome.value
        why = outcome.reason if not outcome.ok else str(outcome.value).strip().splitlines()[-1]
        return [f"unknown ({why}); read get_inputs() in the source"]

    # -- requests ---------------------------------------------------------------------------------------

    def kind_for(self, parent: Candidate | None) -> PromptKind:
        if parent is None:
            return PromptKind.GENERATE
        return PromptKind.REFINE if parent.passed else PromptKind.DEBUG

    def prompt(self, kind: PromptKind, parent: Candidate | None) -> str:
        if self.beam.input_shapes is None:  # found once, at the first prompt: no job for a subproblem never asked
            self.beam.input_shapes = self._input_shapes()
        variables = {"subproblem": self.subproblem, "problem_source": self.problem_source,
                     "shapes": self.beam.input_shapes, "device": self.device, "on_gpu": times_kernels(self.device)}
        if parent is not None:
            variables.update(code=parent.source, verdict=parent.result, share=self.context.share,
                             end_to_end_ms=self.context.end_to_end_ms)
        return render(f"{kind.value}.j2", **variables)

    def task(self, kind: PromptKind, seq: int) -> KernelTask:
        return KernelTask(kind=kind, problem_path=self.problem_path, variant=seq,
                          target="cpu" if self.device == "cpu" else "cuda", eval_mode=self.config.eval_mode)

    def request(self, parent: Candidate | None, seq: int) -> LLMRequest:
        kind = self.kind_for(parent)
        # The sample is the candidate's sequence number: no two requests of a subproblem share a cache key.
        return LLMRequest(agent=kind.value, prompt=self.prompt(kind, parent), subproblem=self.subproblem,
                          task=self.task(kind, seq), sample=seq)

    # -- what the agent has left ------------------------------------------------------------------------

    def repertoire(self) -> Repertoire | None:
        """The provider's count of replies for this subproblem (None: no fixed limit), asked without a
        call. A provider that cannot tell is recorded and treated as unlimited: the calls then say why."""
        request = LLMRequest(agent=PromptKind.GENERATE.value, prompt="", subproblem=self.subproblem,
                             task=self.task(PromptKind.GENERATE, self.beam.next_seq), sample=self.beam.next_seq)
        try:
            return self.client.repertoire(request)
        except LLMCallError as err:
            if self.events is not None:
                self.events.emit("repertoire_failed", subproblem=self.subproblem, reason=str(err)[:300])
            return None

    def calls_worth_making(self, budget: int, repertoire: Repertoire | None) -> int:
        """`budget`, or fewer when the agent has only so many replies and earlier requests used some: each
        request asks for the next one (its sequence number), so none is made past the last."""
        if repertoire is None:
            return budget
        return max(0, min(budget, repertoire.replies - self.beam.next_seq))

    def plan(self, calls: int) -> None:
        """The search will make `calls` candidates (fewer if it settles or its time runs out): on_child hears."""
        self._unfinished = calls
        if self.on_child is not None:
            self.on_child(self.subproblem, None, calls)

    def settled(self, beam: Beam) -> bool:
        """Without timings a passing kernel can only tie with any later one (the older wins), so calls past
        the first passing kernel would buy nothing."""
        return not times_kernels(self.device) and any(member.passed for member in beam.members)

    def mark_exhausted(self, repertoire: Repertoire | None) -> None:
        """Record in the beam whether the agent has any reply left for this subproblem."""
        used_up = repertoire is not None and self.beam.next_seq >= repertoire.replies
        self.beam.exhausted = Exhausted(model=self.config.model, reason=repertoire.reason) if used_up else None

    # -- proposals --------------------------------------------------------------------------------------

    def propose(self, parents: list[Candidate | None]) -> list[Candidate]:
        """One child per parent. Each kernel is checked as soon as its reply's code block has closed, while
        that reply and later ones are still being written; calls go out in request order (a replay file
        answers in call order)."""
        if not parents:
            return []
        seqs = [self.beam.take_seq() for _ in parents]
        requests = [self.request(parent, seq) for parent, seq in zip(parents, seqs, strict=True)]
        step = StepProgress(len(requests), covered=any(member.passed for member in self.beam.members))
        with ThreadPoolExecutor(max_workers=min(self.client.parallel, len(requests))) as calls, \
                ThreadPoolExecutor(max_workers=len(requests)) as early, \
                ThreadPoolExecutor(max_workers=len(requests)) as checks:
            children = []
            for seq, parent, request in zip(seqs, parents, requests, strict=True):
                cid = candidate_id(seq)
                speculation = SpeculativeCheck(partial(self._verdict, cid, step=step), early)
                reply = calls.submit(self.client.complete, request, speculation.on_text)
                children.append(checks.submit(self._child, cid, parent, request, reply, speculation, step))
            return [child.result() for child in children]

    def _child(self, cid: str, parent: Candidate | None, request: LLMRequest, reply: Future[LLMResponse],
               speculation: SpeculativeCheck, step: StepProgress) -> Candidate:
        """The candidate of one reply, checked and saved: its code's verdict, or why the reply has no code."""
        with step.one_child():
            response = reply.result()
            source, result = _code_or_failure(response)  # result: why the reply has no code, if it has none
            if result is None:
                result = speculation.verdict_for(source)
            if result is None:
                result = self._verdict(cid, source, step=step)
            if result.passed:
                step.covered = True
        child = Candidate(id=cid, subproblem=self.subproblem, parent=parent.id if parent else None,
                          kind=PromptKind(request.agent), source=source, result=result,
                          tokens=response.usage, cached=response.cached)
        self._save(child, response)
        self._emit(CandidateEvent, child)
        if self.on_child is not None:
            with self._unfinished_lock:
                self._unfinished = max(0, self._unfinished - 1)
                unfinished = self._unfinished
            self.on_child(self.subproblem, child, unfinished)
        return child

    def _verdict(self, cid: str, source: str, *, step: StepProgress) -> EvalResult:
        """Write the kernel to its candidate file and check it, ahead of checks from steps further from
        their end and behind those of subproblems without a passing kernel (`StepProgress.rank`, read each
        time a worker comes free: a check that waits while its step's first kernel passes falls behind).

        A candidate this folder already holds with the same source, for the same problem, keeps its saved
        verdict: a resumed run then builds the same prompts (timings included) and its replies come from
        the response cache.
        """
        saved = self._saved_verdict(cid, source)
        if saved is not None:
            return saved
        path = write_atomic(self.folder / f"{cid}.py", source)
        return self.verifier.check_kernels([(self.problem_path, path)], timed=True, priority=step)[0]

    def _saved_verdict(self, cid: str, source: str) -> EvalResult | None:
        record_path, source_path = self.folder / f"{cid}.json", self.folder / f"{cid}.py"
        if not (record_path.exists() and source_path.exists()):
            return None
        record = CandidateRecord.read(record_path)
        same_problem = record.problem_sha256 == self.problem_sha256
        if not same_problem or source_path.read_text(encoding="utf-8") != source:
            return None
        verdict = record.candidate.result
        # A worker that timed out or died may have been the machine's fault, and a check that never ran the
        # kernel said nothing about it: that kernel gets another try.
        return None if verdict.status in (Status.TIMEOUT, Status.CRASHED, Status.NOT_RUN) else verdict

    def _save(self, candidate: Candidate, response: LLMResponse | None = None) -> None:
        excerpt = response.text[:REPLY_EXCERPT_CHARS] if response is not None and not candidate.source else None
        CandidateRecord(candidate, problem_sha256=self.problem_sha256, reply_excerpt=excerpt).write(self.folder)

    def _emit(self, event_type: type[CandidateEvent | FinalCheckEvent], candidate: Candidate) -> None:
        if self.events is None:
            return
        self.events.record(event_type(
            subproblem=self.subproblem, id=candidate.id, parent=candidate.parent, prompt_kind=candidate.kind.value,
            status=candidate.result.status.value, reason=candidate.result.reason[:300],
            speedup=candidate.result.speedup, accepted=candidate.accepted, tokens=candidate.tokens.total,
            cached=candidate.cached))

    # -- acceptance -------------------------------------------------------------------------------------

    def accept_members(self) -> None:
        """The cheating check once more, on every passing member not yet checked; a failure is its verdict.
        With a judge, each member that check accepts is then judged, once: its reject is a failure too."""
        for member in self.beam.members:
            if not member.passed or member.accepted is not None:
                continue
            rejection = self.verifier.static_check(member.source, str(self.folder / f"{member.id}.py"))
            member.accepted = rejection is None
            if rejection is not None:
                member.result = rejection
            elif self.judge is not None:
                self._judge(member)
            self._save(member)
            self._emit(FinalCheckEvent, member)
        self.beam.members.sort(key=Candidate.rank_key)

    def _judge(self, member: Candidate) -> None:
        """Only a member every hard check accepted comes here, so the judge can take an acceptance away but
        never give one. A rejected member fails like a cheat (its reason feeds its debug prompt); any other
        verdict changes nothing but the record."""
        item = KernelUnderReview(subproblem=self.subproblem, sample=member.seq, reference=self.problem_source,
                                 kernel=member.source)
        member.judge = self.judge.review(item)
        if member.judge.rejects:
            member.accepted = False
            member.result = judge_rejection(member.result, member.judge)
        if self.events is not None:
            self.events.emit("judge", subproblem=self.subproblem, id=member.id, model=member.judge.model,
                             verdict=member.judge.ruling.value, reason=member.judge.reason[:300],
                             accepted=member.accepted)


def evolve_kernel(subproblem_name: str, problem_path: Path, beam: Beam, budget: int, verifier: KernelVerifier,
                  client: LLMClient, config: RunConfig, candidates_dir: Path,
                  context: RefineContext | None = None, progress: ProgressHook | None = None,
                  judge: Judge | None = None, deadline: float | None = None,
                  interrupted: threading.Event | None = None, on_child: ChildHook | None = None) -> Beam:
    """Spend `budget` LLM calls improving one subproblem's beam; returns a new beam, the given one untouched.

    The search is `config.search`: beam search (expand every member, keep the best `width`), parallel
    sampling (independent generations) or MCTS (a tree of candidates, widened progressively; the beam keeps
    the best `width` of everything made). Candidates are saved under `candidates_dir/<subproblem_name>/`.
    Where kernels are not timed (no GPU), beam search and MCTS stop at the first passing kernel. `progress` hears
    of every evaluated batch. `judge` (None: off) reads each kernel the hard checks accept and may reject it.
    Past `deadline` (time.monotonic(); None: none) no further batch is asked for: the run's time budget; nor
    once `interrupted` is set (the user stopped the run). `on_child` hears how many candidates the search
    plans, then of each candidate as its verdict comes (ChildHook).
    Raises ProviderError when the provider (the kernels' or the judge's) can answer no call.
    """
    evolved = beam.copy()
    evolved.width = config.beam_width

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def stopped() -> bool:
        return out_of_time() or (interrupted is not None and interrupted.is_set())

    if budget <= 0 or stopped():
        return evolved
    agent = KernelAgent(subproblem_name, Path(problem_path), evolved, verifier, client, config,
                        Path(candidates_dir), context, judge, on_child)
    repertoire = agent.repertoire()
    calls = agent.calls_worth_making(budget, repertoire)
    agent.plan(calls)
    propose = _reporting(agent, calls, progress) if progress is not None and calls > 0 else agent.propose

    def settled(searched: Beam) -> bool:
        return agent.settled(searched) or stopped()

    if calls > 0 and config.search == "parallel":
        parallel_sampling(evolved, calls, propose)
    elif calls > 0 and config.search == "mcts":
        mcts_search(evolved, calls, propose, settled=settled)
    elif calls > 0:
        beam_search(evolved, calls, config.expansion, propose, settled=settled)
    agent.accept_members()
    agent.mark_exhausted(repertoire)
    made = evolved.next_seq - beam.next_seq
    if agent.events is not None:
        best = evolved.best
        agent.events.emit("beam", subproblem=subproblem_name, calls=calls, budget=budget, made=made,
                          members=[c.id for c in evolved.members], best=best.id if best else None,
                          best_speedup=best.result.speedup if best else None,
                          exhausted=evolved.exhausted.reason if evolved.exhausted else None,
                          settled=UNTIMED_NOTE if made < calls and agent.settled(evolved) else None,
                          out_of_time=made < calls and out_of_time())
    return evolved


def _reporting(agent: KernelAgent, planned: int, progress: ProgressHook):
    """agent.propose, telling `progress` before the first batch and after each one."""
    done = 0
    progress(SearchProgress(agent.subproblem, done, planned, passing=False))

    def propose(parents: list[Candidate | None]) -> list[Candidate]:
        nonlocal done
        children = agent.propose(parents)
        done += len(children)
        passing = any(c.passed for c in children + agent.beam.members)  # the beam takes the children after this
        progress(SearchProgress(agent.subproblem, done, planned, passing=passing))
        return children

    return propose
