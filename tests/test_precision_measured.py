"""The measured side of the precision rule: the last trial's error against the reference Model run in fp64, beside
eager fp32's own. A kernel that rounds its operands by hand passes the tolerance and every source and IR rule
(tests/corpus/cheats/precision_mantissa_mask.py, judged in test_isolation.py); this is what catches it."""

from collections import OrderedDict
from pathlib import Path

import torch

from mkevolve.config import PRECISION_TOLERANCE_SHARE, PRECISION_ULPS, PRECISION_VS_EAGER
from mkevolve.problem import load_problem
from mkevolve.verify import reference
from mkevolve.verify.correctness import KernelEvalRequest, evaluate_kernel, precision_limit
from mkevolve.verify.result import Status

CORPUS = Path(__file__).parent / "corpus"
GEMM = CORPUS / "problems" / "gemm_epilogue.py"


def _evaluate(problem: Path, solution: Path, cache: Path):
    return evaluate_kernel(KernelEvalRequest(problem_path=str(problem), solution_path=str(solution), trials=2,
                                             timed=False, cache_dir=str(cache)))


def _first_set(problem: Path, cache: Path) -> reference.ReferenceSet:
    references = reference.reference_set(cache, load_problem(problem), 0, 0, False, torch.device("cpu"))
    references.ensure([reference.FIRST_SET])
    return references


def test_the_fp64_reference_is_the_model_in_fp64_and_measures_eager_s_own_error(tmp_path):
    references = _first_set(GEMM, tmp_path)
    exact = references.fp64(reference.FIRST_SET)
    expected = references.expected(reference.FIRST_SET)
    assert exact is not None and exact.outputs[0].dtype == torch.float64
    assert exact.eager_error == float((expected[0].double() - exact.outputs[0]).abs().max())
    assert 0 < exact.eager_error < 1e-5                 # fp32's rounding, not a different computation
    assert exact.largest == float(exact.outputs[0].abs().max())


def test_an_honest_kernel_stays_near_eager_and_the_mantissa_cheat_does_not(tmp_path):
    honest = _evaluate(GEMM, CORPUS / "honest" / "gemm_epilogue.py", tmp_path)
    assert honest.status is Status.OK, honest.reason
    assert 0 < honest.error_vs_fp64 <= PRECISION_VS_EAGER * honest.eager_error_vs_fp64
    cheat = _evaluate(GEMM, CORPUS / "cheats" / "precision_mantissa_mask.py", tmp_path)
    assert cheat.status is Status.CHEATING and cheat.rule == "precision-downgrade", cheat.reason
    assert cheat.tolerance_used <= 1                    # it passed the tolerance: only the measurement saw it
    assert cheat.error_vs_fp64 > 30 * cheat.eager_error_vs_fp64


def test_the_limit_is_the_run_s_own(tmp_path):
    """--precision-vs-eager sets the rule's limit: the honest GEMM with its outputs scaled by 1 + 2.4e-6 (about 20
    fp32 ulps, under the tolerance) errs 6 to 15 times as much as eager, by the inputs drawn; a limit of 64
    times passes it, 4 times (above the floor of 16 ulps of the largest output) rejects it and says so."""
    scaled = tmp_path / "scaled_gemm.py"
    scaled.write_text((CORPUS / "honest" / "gemm_epilogue.py").read_text().replace(
        "y = tl.maximum(acc + bias[None, :], 0.0)", "y = tl.maximum((acc + bias[None, :]) * 1.0000024, 0.0)"))

    def evaluate(vs_eager: float):
        return evaluate_kernel(KernelEvalRequest(problem_path=str(GEMM), solution_path=str(scaled), trials=2,
                                                 timed=False, cache_dir=str(tmp_path / "cache"),
                                                 precision_vs_eager=vs_eager))

    loose = evaluate(64.0)
    assert loose.status is Status.OK, loose.reason
    assert 4 * loose.eager_error_vs_fp64 < loose.error_vs_fp64 < 64 * loose.eager_error_vs_fp64
    strict = evaluate(4.0)
    assert strict.status is Status.CHEATING and strict.rule == "precision-downgrade", strict.reason
    assert "allows" in strict.reason and "4 times eager" in strict.reason


def test_a_kernel_exact_on_its_first_call_alone_is_measured_on_a_hidden_trial(tmp_path):
    cheat = _evaluate(GEMM, CORPUS / "cheats" / "precision_exact_first_call.py", tmp_path)
    assert cheat.status is Status.CHEATING and cheat.rule == "precision-downgrade", cheat.reason
    first_over = cheat.reason.removeprefix("[precision-downgrade] ")        # the first call over, in order
    assert first_over.startswith(("trial 1: ", "call ")), cheat.reason


def test_a_kernel_exact_on_new_inputs_alone_is_measured_where_it_has_seen_them(tmp_path):
    """Every trial's inputs are new; the last checked call repeats inputs the kernel has seen, as timed calls do."""
    cheat = _evaluate(GEMM, CORPUS / "cheats" / "precision_exact_on_new_inputs.py", tmp_path)
    assert cheat.status is Status.CHEATING and cheat.rule == "precision-downgrade", cheat.reason
    assert "(a timed or late call): its outputs stray from the fp32 reference" in cheat.reason
    assert cheat.tolerance_used <= 1


def test_a_kernel_exact_at_the_first_shape_alone_is_measured_at_every_shape(tmp_path):
    """The first input config is the one a problem file lists first: a kernel could be exact there alone."""
    problem = tmp_path / "gemm_two_batches.py"
    problem.write_text(GEMM.read_text().replace("def get_inputs():", """def get_input_configs():
    return [{"get_init_inputs": get_init_inputs, "get_inputs": (lambda b=b: [torch.randn(b, IN_FEATURES)])}
            for b in (BATCH, 24)]


def get_inputs():"""))
    solution = tmp_path / "coarse_past_the_first_shape.py"
    cheat = (CORPUS / "cheats" / "precision_exact_first_call.py").read_text()
    assert "COARSE=self.calls > 0" in cheat
    solution.write_text(cheat.replace("COARSE=self.calls > 0", "COARSE=M != 32"))
    result = _evaluate(problem, solution, tmp_path / "cache")
    assert result.status is Status.CHEATING and result.rule == "precision-downgrade", result.reason
    assert "(input config 1): its outputs" in result.reason


def test_a_model_without_an_fp64_form_goes_unmeasured(tmp_path):
    """A Model that makes fp32 tensors of its own cannot run in fp64: no measurement, not a failed check."""
    problem = tmp_path / "own_fp32.py"
    problem.write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n"
        "    def forward(self, x):\n        return torch.matmul(x, torch.ones(x.shape[-1], 3))\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 5)]\n\n\ndef get_init_inputs():\n    return []\n")
    assert _first_set(problem, tmp_path / "cache").fp64(reference.FIRST_SET) is None


def test_outputs_too_large_to_keep_in_fp64_are_kept_at_secret_positions(tmp_path, monkeypatch):
    """Eager's error and the largest magnitude over every element; the exact values at a few positions alone,
    drawn anew by each computation (a secret seed), where a candidate's error is then taken."""
    monkeypatch.setattr(reference, "FP64_REFERENCE_BYTES", 0)
    monkeypatch.setattr(reference, "FP64_SAMPLED_POSITIONS", 16)
    monkeypatch.setattr(reference, "_fp64_references", OrderedDict())
    references = _first_set(GEMM, tmp_path)
    exact = references.fp64(reference.FIRST_SET)
    whole = references._forward_fp64(reference.FIRST_SET)[0]
    expected = references.expected(reference.FIRST_SET)
    [positions] = exact.positions
    assert positions.shape == (16,) and torch.equal(exact.outputs[0], whole.reshape(-1)[positions])
    assert exact.eager_error == reference.largest_error(expected, [whole]) > 0
    assert exact.largest == float(whole.abs().max())
    off = expected[0].clone()
    off.reshape(-1)[positions[0]] += 1.0
    assert 0.99 < exact.error([off]) < 1.01
    reference._fp64_references.clear()
    assert not torch.equal(references.fp64(reference.FIRST_SET).positions[0], positions)


def test_outputs_too_large_to_keep_are_measured_and_the_mantissa_cheat_is_caught(tmp_path, monkeypatch):
    """Sets past both caches (outputs computed again for each read, fp64 kept at sampled positions): before,
    such sets went unmeasured, so any kernel passed the rule on a full-size 3-D convolution."""
    monkeypatch.setattr(reference, "RECOMPUTED_OUTPUT_BYTES", 0)
    monkeypatch.setattr(reference, "FP64_REFERENCE_BYTES", 0)
    monkeypatch.setattr(reference, "FP64_SAMPLED_POSITIONS", 256)
    monkeypatch.setattr(reference, "_fp64_references", OrderedDict())
    honest = _evaluate(GEMM, CORPUS / "honest" / "gemm_epilogue.py", tmp_path)
    assert honest.status is Status.OK, honest.reason
    assert 0 < honest.error_vs_fp64 <= PRECISION_VS_EAGER * honest.eager_error_vs_fp64
    cheat = _evaluate(GEMM, CORPUS / "cheats" / "precision_mantissa_mask.py", tmp_path)
    assert cheat.status is Status.CHEATING and cheat.rule == "precision-downgrade", cheat.reason


def test_fp64_references_of_several_subproblems_are_kept_while_they_fit(tmp_path, monkeypatch):
    """A worker taking candidates of two subproblems in turn computes each fp64 reference once; past
    FP64_REFERENCE_BYTES the least recently used one is dropped."""
    monkeypatch.setattr(reference, "_fp64_references", OrderedDict())
    gemm, rows = _first_set(GEMM, tmp_path), _first_set(CORPUS / "problems" / "row_reduction.py", tmp_path)
    first = gemm.fp64(reference.FIRST_SET)
    assert rows.fp64(reference.FIRST_SET) is not None
    assert gemm.fp64(reference.FIRST_SET) is first                # kept: not computed again
    held = sum(exact.nbytes for exact in reference._fp64_references.values())
    monkeypatch.setattr(reference, "FP64_REFERENCE_BYTES", held - 1)      # now either fits, not both
    reference._fp64_references.clear()
    first = gemm.fp64(reference.FIRST_SET)
    rows.fp64(reference.FIRST_SET)
    assert list(reference._fp64_references) == [(str(rows.folder), "cpu", reference.FIRST_SET)]
    assert gemm.fp64(reference.FIRST_SET) is not first           # dropped for the newer one, computed again


def test_an_fp64_reference_without_gpu_memory_runs_on_the_cpu(tmp_path, monkeypatch):
    """Unmeasured while the GPU is full would let any kernel pass the rule then: the CPU computes it instead."""
    monkeypatch.setattr(reference, "_fp64_references", OrderedDict())
    references = _first_set(GEMM, tmp_path)
    devices, on_device = [], reference.ReferenceSet._forward_fp64_on

    def full_gpu(self, name, device):
        devices.append(device)
        if len(devices) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (held by other processes)")
        return on_device(self, name, device)

    monkeypatch.setattr(reference.ReferenceSet, "_forward_fp64_on", full_gpu)
    exact = references.fp64(reference.FIRST_SET)
    assert devices[1] == torch.device("cpu") and exact is not None and exact.eager_error > 0


def test_the_limit_is_a_multiple_of_eager_s_error_with_floors_for_tiny_errors():
    eps = torch.finfo(torch.float32).eps
    assert precision_limit(1e-6, 1.0, 1e-4) == PRECISION_VS_EAGER * 1e-6
    assert precision_limit(0.0, 1000.0, 1e-4) == PRECISION_ULPS * eps * 1000.0    # eager exact, large outputs
    assert precision_limit(0.0, 1e-3, 1e-4) == PRECISION_TOLERANCE_SHARE * 1e-4   # eager exact, small outputs


def test_the_memory_of_an_fp64_forward_is_given_back_once_it_is_kept(tmp_path, monkeypatch):
    """Up to 26 GB at full size, which the allocator would otherwise hold until the job ends while other runs'
    candidates on the GPU run out of memory."""
    monkeypatch.setattr(reference, "_fp64_references", OrderedDict())
    references = _first_set(GEMM, tmp_path)
    released = []
    monkeypatch.setattr(reference.torch.cuda, "empty_cache", lambda: released.append(len(reference._fp64_references)))
    references.fp64(reference.FIRST_SET)
    assert released == [1]                   # after the reference was computed and kept
    references.fp64(reference.FIRST_SET)     # kept: nothing computed, nothing to give back
    assert released == [1]


OFFSET_PROBLEM = '''import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return (x + 4096.0) - 4096.0     # fp32 keeps x only to 2**-11 steps: eager errs up to 2.4e-4


def get_inputs():
    # from 0.5 to 1.5: fp64 holds 4096 + x exactly (53 bits reach down to 2**-40), so the fp64 reference is x
    # itself; a draw of randn below 2**-17 in magnitude would make it miss x, and an exact kernel err by 1e-13
    return [torch.rand(64, 64) + 0.5]


def get_init_inputs():
    return []
'''

SHIFTED_KERNEL = '''import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def shifted(x_ptr, out_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + SHIFT, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        shifted[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), SHIFT={shift}, BLOCK=1024)
        return out
'''


def test_a_kernel_more_exact_than_eager_passes_and_one_far_from_both_does_not(tmp_path):
    """Eager fp32 misses fp64 by 2.4e-4 here, so an exact kernel misses eager by as much: more than
    atol=rtol=1e-4 allows. The comparison's atol grows by EAGER_ERROR_SLACK times eager's own error (an honest
    long cumsum on an H100 missed eager by 3.2e-4 while eager missed fp64 by 3.1e-4 and it by 6.7e-5), and no
    further: a kernel 2e-3 off is still wrong, and says by how much the tolerance grew."""
    problem = tmp_path / "offset.py"
    problem.write_text(OFFSET_PROBLEM)

    def shifted_by(shift: float) -> Path:
        solution = tmp_path / f"shifted_{shift}.py"
        solution.write_text(SHIFTED_KERNEL.replace("{shift}", repr(shift)))
        return solution

    exact = _evaluate(problem, shifted_by(0.0), tmp_path / "cache")
    assert exact.status is Status.OK, exact.reason
    assert 2e-4 < exact.eager_error_vs_fp64 <= 2.45e-4 and exact.error_vs_fp64 == 0
    far = _evaluate(problem, shifted_by(2e-3), tmp_path / "cache")
    assert far.status is Status.INCORRECT and "for eager fp32's own error" in far.reason, far.reason
    assert 5e-4 < far.atol < 6e-4                       # 1e-4 + 2 x eager's error
