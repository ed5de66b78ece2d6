"""The LLM judge (`--judge MODEL`): a second model reads each kernel the hard checks accepted, beside its
reference, and may reject a semantic cheat no program sees (the test shapes special-cased, work the reference
does skipped).

The judge can only take an acceptance away, and only with a well-formed reject: a failed call or a reply not
in the verdict form is recorded as "no verdict" and the hard checks' verdict stands. It never sees a kernel
the hard checks rejected, so it cannot accept one.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from mkevolve.config import RunConfig
from mkevolve.events import EventLog
from mkevolve.llm.client import LLMClient, RetryPolicy, make_client
from mkevolve.llm.providers import make_provider
from mkevolve.llm.tokens import TokenReport
from mkevolve.llm.types import LLMRequest
from mkevolve.prompts import render
from mkevolve.verify.cheating.rules import Rule, Violation
from mkevolve.verify.result import EvalResult, JudgeRuling, JudgeVerdict, Status

JUDGE_AGENT = "judge"      # the agent name of its requests: its own row in the token accounting
REASON_CHARS = 1200        # of the judge's reason, which a reject sends back into the next debug prompt
_VERDICT = re.compile(r"VERDICT:[ \t]*(pass|reject)", re.IGNORECASE)
_ANY_VERDICT = re.compile(r"^\s*VERDICT:", re.IGNORECASE | re.MULTILINE)


class JudgeReplyError(ValueError):
    """A judge reply that is not in the verdict form; the message says how it departs from it."""


@dataclass(frozen=True)
class KernelUnderReview:
    """What the judge reads: one accepted candidate of a subproblem and the subproblem's reference source."""

    subproblem: str
    sample: int          # the candidate's number: no two reviews of a subproblem share a cache key
    reference: str
    kernel: str


def parse_verdict(text: str) -> tuple[JudgeRuling, str]:
    """The ruling and the reason of a reply whose first line is `VERDICT: pass` or `VERDICT: reject` and whose
    reason follows. Anything else raises JudgeReplyError: a reply that hedges or has two verdicts is no
    verdict, and a reject must say why (the reason becomes the kernel's rejection)."""
    lines = text.strip().splitlines()
    if not lines:
        raise JudgeReplyError("the reply is empty")
    found = _VERDICT.fullmatch(lines[0].strip())
    if found is None:
        raise JudgeReplyError(f"its first line is not 'VERDICT: pass' or 'VERDICT: reject': {lines[0][:80]!r}")
    rest = "\n".join(lines[1:])
    if _ANY_VERDICT.search(rest):
        raise JudgeReplyError("it gives more than one verdict line")
    reason = " ".join(rest.split())
    if not reason:
        raise JudgeReplyError("no reason follows the verdict")
    return JudgeRuling(found.group(1).lower()), reason[:REASON_CHARS]


class Judge:
    """The judge model behind its own client (its own provider, cache entries, token ledger)."""

    def __init__(self, client: LLMClient, model: str):
        self.client = client
        self.model = model

    def request(self, item: KernelUnderReview) -> LLMRequest:
        prompt = render("judge.j2", subproblem=item.subproblem, reference=item.reference, kernel=item.kernel)
        return LLMRequest(agent=JUDGE_AGENT, prompt=prompt, subproblem=item.subproblem, sample=item.sample)

    def review(self, item: KernelUnderReview) -> JudgeVerdict:
        """The judge's verdict on one kernel; NONE, with why, when there is none. Raises ProviderError when
        the judge's provider can answer no call at all: the run stops there, resumable, as it does for the
        model that writes the kernels (judging nothing would quietly drop what the user asked for)."""
        response = self.client.complete(self.request(item))
        if response.error is not None:
            return self._none(f"the call failed: {response.error}")
        try:
            ruling, reason = parse_verdict(response.text)
        except JudgeReplyError as err:
            return self._none(f"malformed reply: {err}")
        return JudgeVerdict(ruling=ruling, reason=reason, model=self.model)

    def _none(self, why: str) -> JudgeVerdict:
        return JudgeVerdict(ruling=JudgeRuling.NONE, reason=why, model=self.model)

    def emit_totals(self) -> TokenReport:
        return self.client.emit_totals()


def judge_rejection(result: EvalResult, verdict: JudgeVerdict) -> EvalResult:
    """The verdict of a kernel the judge rejected: cheating under rule llm-judge, with the hard checks'
    measurements kept on record. Its reason goes into the next debug prompt like any checker's."""
    violation = Violation(Rule.LLM_JUDGE, f"a reviewer rejects it: {verdict.reason}")
    return dataclasses.replace(result, status=Status.CHEATING, reason=violation.describe(),
                               rule=Rule.LLM_JUDGE.value, line=None, violations=[violation.to_dict()])


def check_judge(config: RunConfig) -> None:
    """Raise LLMConfigError when the judge's model cannot work at all (unknown, no key, no replay file), so a
    run finds out before it makes its directory. No judge: nothing to check."""
    if config.judge:
        make_provider(config.judge).check()


def make_judge(config: RunConfig, events: EventLog | None = None, cache_dir: str | Path | None = None,
               retry: RetryPolicy = RetryPolicy()) -> Judge | None:
    """The judge `config.judge` names, or None when it is off. `api_base` is the kernel model's: the judge,
    often another provider's model, goes to its provider's default endpoint."""
    if not config.judge:
        return None
    judge_config = dataclasses.replace(config, model=config.judge, api_base=None)
    return Judge(make_client(judge_config, events, cache_dir=cache_dir, retry=retry), config.judge)
