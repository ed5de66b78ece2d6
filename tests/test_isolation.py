"""Isolated evaluation against the attack corpus: every cheat is rejected for its rule, every fault costs
exactly its own verdict, and nothing a candidate does reaches the caller, the next candidate or the machine.

One batch runs the whole corpus through one Verifier (two workers in parallel); the tests below read its
verdicts. Cheats labelled "gpu" (only the GPU kernel accounting or compiled-IR check can see them) join the
batch only when a CUDA GPU is present.

What a corpus file promises (see tests/corpus/cheats/*.py):
- EXPECTED_RULE with status "cheating", the default;
- EXPECTED_STATUS for a cheat the isolation neutralises rather than detects (a patched torch.allclose in the
  candidate's process cannot reach the trusted comparison: "incorrect"; a patched clock the harness never
  reads leaves an honest kernel: "ok");
- MAY_INSTEAD_BE = "incorrect" for a cheat that misbehaves from some call on: the trials hide among the late
  calls at random places, so whichever wrong call the judge reads first decides between "timed-output" and
  an "incorrect" trial; MAY_INSTEAD_BE = "timeout" where the cheat can hang itself (a flood of bytes into
  a pipe of the GPU driver's that nobody reads);
- faults: EXPECTED_STATUS, and EXPECTED_RULE when that status is "cheating".
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mkevolve.config import RunConfig
from mkevolve.verify.cheating import Rule
from mkevolve.verify.result import EvalResult, Status
from mkevolve.verify.verifier import Verifier

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "corpus"
FAULTS = CORPUS / "faults"
FAULT_PROBLEM = FAULTS / "problem.py"
ON_GPU = torch.cuda.is_available()

# The isolated design forks each candidate from a zygote (a child of the trusted worker). The old code
# imported candidates into the worker itself, whose parent is this test process: there a fault that kills
# its parent would kill the test run, so it only joins the batch when candidates run under a zygote.

PICKLE_MARKER = "MKEVOLVE_CORPUS_PICKLE_RAN"   # set by forged_result_pickle_payload if it ever runs here
SECRET_NAME = "FAKE_API_KEY"                   # read by faults/env_api_key.py
TOKEN_NAME = "MKEVOLVE_ISOLATION_TEST_TOKEN"   # marks the processes this test starts


def constants(path: Path) -> dict[str, str]:
    """A corpus file's upper-case string constants, read without importing it (none if it does not parse)."""
    found = {}
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:  # faults/syntax_error.py
        return found
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    found[target.id] = node.value.value
    return found


def problem_of(path: Path) -> Path:
    if path.parent == FAULTS:
        return FAULT_PROBLEM
    return CORPUS / "problems" / f"{constants(path)['PROBLEM']}.py"


CHEATS = sorted((CORPUS / "cheats").glob("*.py"))
GPU_CHEATS = [p for p in CHEATS if constants(p)["CAUGHT_BY"] == "gpu"]
CPU_CHEATS = [p for p in CHEATS if p not in GPU_CHEATS]
HONEST = sorted((CORPUS / "honest").glob("*.py")) + [FAULTS / "honest.py"]
# The faults with a stated verdict; the older ones are covered by test_verifier.py.
NEW_FAULTS = sorted(p for p in FAULTS.glob("*.py") if "EXPECTED_STATUS" in constants(p))


def ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


# ---------------------------------------------------------------------------------------------
# Processes this test started that are still alive
# ---------------------------------------------------------------------------------------------

def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def _stat(pid: int) -> tuple[str, int, float]:
    """(state, parent pid, start time in seconds since the epoch) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    start = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return fields[0], int(fields[1]), start


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        if pid in (0, 1):
            return False
        _, pid, _ = _stat(pid)
        if pid == ancestor:
            return True
    return False


def leftover_processes(since: float, token: str, roots: list[str], markers: list[str]) -> dict[int, str]:
    """Live processes started since `since` that this test owns: they carry its environment token, run in
    (or name) one of its folders, name one of the corpus faults, or descend from this process."""
    me, found = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        # A process may exit, or belong to someone else, between the listing and the reads.
        with contextlib.suppress(OSError):
            state, _, started = _stat(pid)
            if state == "Z" or started < since - 1.0:
                continue
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environment = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if (token in environment or any(cwd.startswith(r) or r in command for r in roots)
                    or any(m in command for m in markers) or _descends_from(pid, me)):
                found[pid] = command.strip()
    return found


def wait_for_leftovers(since: float, token: str, roots: list[str], markers: list[str],
                       grace_s: float = 10.0) -> dict[int, str]:
    """Leftovers that are still there after a grace period (a zygote exits once it reads EOF)."""
    deadline = time.monotonic() + grace_s
    found = leftover_processes(since, token, roots, markers)
    while found and time.monotonic() < deadline:
        time.sleep(0.5)
        found = leftover_processes(since, token, roots, markers)
    return found


def kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# The batch
# ---------------------------------------------------------------------------------------------

@dataclass
class Batch:
    results: dict[Path, EvalResult]
    honest_afterwards: EvalResult
    wrong_math_afterwards: list[EvalResult]
    leftovers: dict[int, str]
    pickle_ran_here: bool
    secret: str


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Batch:
    scratch = tmp_path_factory.mktemp("isolation")
    home, tmp, cwd = (scratch / name for name in ("home", "tmp", "cwd"))
    for folder in (home, tmp, cwd):
        folder.mkdir()
    secret, token = f"sk-fake-{uuid.uuid4().hex}", uuid.uuid4().hex
    cheats = CHEATS if ON_GPU else CPU_CHEATS
    faults = NEW_FAULTS
    paths = cheats + HONEST + faults
    with pytest.MonkeyPatch.context() as patch:
        # Everything a candidate could litter lands in this test's own folders, never the repository.
        patch.chdir(cwd)
        patch.setenv("HOME", str(home))
        patch.setenv("TMPDIR", str(tmp))
        patch.setenv(SECRET_NAME, secret)
        patch.setenv(TOKEN_NAME, token)
        patch.delenv(PICKLE_MARKER, raising=False)
        started = time.time()
        # 1 GiB: faults/host_memory_bomb.py is stopped long before its own 3 GiB ceiling.
        config = RunConfig(trials=2, timeout=60, workers=2, memory_limit_gb=1.0)
        with Verifier(config) as verifier:
            results = verifier.check_kernels([(problem_of(p), p) for p in paths], timed=False)
            honest = verifier.check_kernels([(FAULT_PROBLEM, FAULTS / "honest.py")], timed=False)[0]
            wrong = verifier.check_kernels([(FAULT_PROBLEM, FAULTS / "wrong_math.py")] * 2, timed=False)
        pickle_ran = os.environ.get(PICKLE_MARKER) is not None
    markers = [str(p) for p in NEW_FAULTS]
    leftovers = wait_for_leftovers(started, token, [str(scratch)], markers)
    kill_all(leftovers)
    return Batch(dict(zip(paths, results)), honest, wrong, leftovers, pickle_ran, secret)


def describe(result: EvalResult) -> str:
    return f"{result.status.value} [{result.rule}] {result.reason[:300]}"


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------

def check_cheat(batch: Batch, path: Path) -> None:
    expected = constants(path)
    result = batch.results[path]
    status = Status(expected.get("EXPECTED_STATUS", "cheating"))
    if status is not Status.CHEATING:
        assert result.status is status, describe(result)
        if result.rule is not None:     # found, rather than neutralised: then for the rule it breaks
            assert result.rule == expected["EXPECTED_RULE"], describe(result)
        return
    if expected["CAUGHT_BY"] == "judge":
        # the judge's own findings: wrong late calls, forged results, a precision measured against fp64
        assert expected["EXPECTED_RULE"] in (Rule.TIMED_OUTPUT.value, Rule.FORGED_RESULT.value,
                                             Rule.PRECISION.value), path
    if expected.get("MAY_INSTEAD_BE") == result.status.value:
        if result.status is Status.INCORRECT:
            assert result.failed_trial is not None, describe(result)
        return
    assert result.status is Status.CHEATING, describe(result)
    assert result.rule == expected["EXPECTED_RULE"], describe(result)


@pytest.mark.parametrize("path", CPU_CHEATS, ids=ids(CPU_CHEATS))
def test_cheat_is_rejected_for_its_rule(batch, path):
    check_cheat(batch, path)


@pytest.mark.gpu
@pytest.mark.parametrize("path", GPU_CHEATS, ids=ids(GPU_CHEATS))
def test_gpu_only_cheat_is_rejected_for_its_rule(batch, path):
    check_cheat(batch, path)


@pytest.mark.parametrize("path", HONEST, ids=[f"{p.parent.name}/{p.stem}" for p in HONEST])
def test_honest_solution_passes(batch, path):
    result = batch.results[path]
    assert result.status is Status.OK, describe(result)


@pytest.mark.parametrize("path", NEW_FAULTS, ids=ids(NEW_FAULTS))
def test_fault_costs_exactly_its_own_verdict(batch, path):
    expected = constants(path)
    result = batch.results[path]
    assert result.status is Status(expected["EXPECTED_STATUS"]), describe(result)
    if "EXPECTED_RULE" in expected:
        assert result.rule == expected["EXPECTED_RULE"], describe(result)


# ---------------------------------------------------------------------------------------------
# What must survive the batch
# ---------------------------------------------------------------------------------------------

def test_pool_still_serves_an_honest_solution_afterwards(batch):
    assert batch.honest_afterwards.status is Status.OK, describe(batch.honest_afterwards)


def test_no_patch_survives_into_a_later_candidate(batch):
    # Several cheats patch the judge; a wrong answer checked after them must still be wrong.
    for result in batch.wrong_math_afterwards:
        assert result.status is Status.INCORRECT, describe(result)


def test_no_candidate_code_ran_in_the_caller(batch):
    assert not batch.pickle_ran_here, "a candidate's pickle was unpickled by the verifier's caller"


def test_no_credential_reaches_any_verdict(batch):
    leaked = [p.name for p, r in batch.results.items() if batch.secret in (r.reason or "")]
    assert not leaked


def test_no_process_is_left_behind(batch):
    assert not batch.leftovers, batch.leftovers
