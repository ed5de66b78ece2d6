"""GPU-only checks of what a CPU cannot measure: timing, the side-stream rule, per-subkernel profiles.
They skip themselves without CUDA (tests/conftest.py) and run as they are on a GPU machine."""

from pathlib import Path

import pytest

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.run_layout import BEST
from mkevolve.solution import Manifest
from mkevolve.verify.profile import SubkernelProfile
from mkevolve.verify.result import Status
from mkevolve.verify.timing import MIN_TIMED_RUNS, TIMED_RUNS
from mkevolve.workers.pool import Job
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "scripts" / "kernels"
CORPUS = ROOT / "tests" / "corpus"

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def verifier():
    with Verifier(RunConfig(workers=1, trials=2, timeout=600.0)) as v:
        yield v


def test_timed_result_has_speedup_and_spread(verifier):
    result = verifier.check_kernel(KERNELS / "silu_large.py", KERNELS / "silu_large_honest.py")
    assert result.passed, result.reason
    t = result.runtime
    assert MIN_TIMED_RUNS <= t.runs <= TIMED_RUNS and 0 < t.p10_ms <= t.median_ms <= t.p90_ms
    assert result.speedup == pytest.approx(result.baseline.median_ms / t.median_ms)


def test_the_baseline_backend_compiles_as_torch_compile_does():
    import torch

    from mkevolve.verify.correctness import inductor_with_the_gpu_lent

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)).cuda()
    x = torch.randn(16, 64, device="cuda")
    ours = torch.compile(model, backend=inductor_with_the_gpu_lent)(x)
    torch._dynamo.reset()
    theirs = torch.compile(model)(x)
    assert torch.equal(ours, theirs)


def test_side_stream_work_is_inside_the_timed_interval(verifier):
    honest, side = verifier.check_kernels([(KERNELS / "silu_large.py", KERNELS / "silu_large_honest.py"),
                                           (KERNELS / "silu_large.py", KERNELS / "silu_large_side_stream.py")])
    assert honest.passed and side.passed
    # The same kernel on a side stream must not look faster than on the current one.
    assert side.runtime.median_ms > 0.8 * honest.runtime.median_ms


def test_timed_calls_on_shifted_values_catch_kept_outputs_and_precision_dropped_on_seen_values(verifier):
    """Timed calls take three sets again and again, each call its set's values shifted its own way: an output
    kept under a fingerprint of the values is another call's answer, and a kernel coarse on values it has seen
    strays from the fp32 reference on the checked timed calls. An honest kernel is timed as before."""
    gemm = CORPUS / "problems" / "gemm_epilogue.py"
    memo, coarse, honest = verifier.check_kernels([(gemm, CORPUS / "cheats" / "timed_output_value_memo.py"),
                                                   (gemm, CORPUS / "cheats" / "precision_exact_on_new_inputs.py"),
                                                   (gemm, CORPUS / "honest" / "gemm_epilogue.py")])
    assert memo.status is Status.CHEATING and memo.rule == "timed-output", memo.reason
    assert coarse.status is Status.CHEATING and coarse.rule == "precision-downgrade", coarse.reason
    assert "(a timed or late call)" in coarse.reason
    assert honest.passed and honest.runtime is not None, honest.reason


def test_run_profiles_every_subkernel(tmp_path):
    problem = ROOT / "problems" / "gemm_chain.py"
    assert main(["run", str(problem), "--out", str(tmp_path), "--iterations", "1", "--budget", "3"]) == 0
    best = next((tmp_path / problem.stem).iterdir()) / BEST
    manifest = Manifest.read(best)
    assert manifest.speedup is not None and manifest.device != "cpu"
    shares = [e.runtime_share for e in manifest.subkernels.values()]
    assert all(s is not None and s > 0 for s in shares) and sum(shares) == pytest.approx(1.0)
    with Verifier(RunConfig(workers=1)) as v:
        outcome = v.run_jobs([Job("mkevolve.verify.profile:profile_subkernels",
                                  {"problem_path": str(problem), "solution_path": str(best / "decomposed_solution.py")},
                                  timeout=600.0)])[0]
    assert outcome.ok and isinstance(outcome.value, SubkernelProfile)
    assert set(outcome.value.runtime_ms) == set(manifest.subkernels)


def test_outputs_saved_while_the_profiler_records_are_not_taken_for_the_forward_s_copies(tmp_path, monkeypatch):
    """Each device tensor the harness saves early is one profiled copy to the host, whatever its size (a
    300 MB one included): all of them leave the profile, and a copy the forward made is still in it."""
    import torch

    from mkevolve.verify import harness
    from mkevolve.verify.kernel_audit import ActivityRecorder

    monkeypatch.setattr(harness, "_WAITING_OUTPUT_BYTES", 0)     # every kept output is saved at once
    saved = harness._SavedOutputs(str(tmp_path), {"phases": {}})
    for forward_copies in (0, 1):
        with ActivityRecorder() as recorder:
            saved.keep("big", [torch.ones(75 << 20, device="cuda")])
            saved.keep("small", [torch.ones(3, device="cuda"), torch.ones(2), 4])
            if forward_copies:
                torch.ones(5, device="cuda").cpu()
        names = harness._without_own_copies(recorder.names, saved.host_copies)
        assert names.count(harness._HOST_COPY_NAME) == forward_copies
        saved.host_copies = 0
    saved.save()        # the last writes, still running in the background
    assert all(entry and "file" in entry for entry in saved.entries.values())
