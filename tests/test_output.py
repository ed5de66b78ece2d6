"""What a user reads and keeps: plain output that never wraps, files that honour the umask, `check`'s
error as a share of the tolerance, every violation in --json, a PyTorch solution called what it is."""

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from mkevolve.cli import main
from mkevolve.config import RunConfig
from mkevolve.display import RunDisplay, RunView, make_console
from mkevolve.fsutil import current_umask, write_atomic
from mkevolve.verify.cheating import Rule, Violation, static_violations
from mkevolve.verify.correctness import _compare_values, _Errors, _raise_violations
from mkevolve.verify.result import EvalResult, Rejected, Status
from mkevolve.verify.verifier import Verifier, _print_result, error_line

PROBLEM = Path(__file__).resolve().parent / "corpus" / "problems" / "elementwise.py"
LONG_DIR = "/home/someone/projects/" + "a-rather-long-folder-name/" * 6 + "outputs/gemm_chain/20261130-231133"

PYTORCH_ONLY = """
import torch
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)
"""

SEVERAL = """
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _copy[(1,)](x, y, x.numel(), BLOCK=4096)
        y = torch.sigmoid(y)
        y = torch.tanh(y)
        return torch.relu(y)
"""


# ---- a. plain output ------------------------------------------------------------------------------


def test_plain_console_keeps_a_long_path_on_one_line(capsys):
    assert len(LONG_DIR) > 150
    display = RunDisplay(RunView(problem="gemm_chain.py", iterations=2))
    display.console.print(f"run directory: {LONG_DIR}")  # how the orchestrator prints it
    display.log(f"kept best in {LONG_DIR}/best")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"run directory: {LONG_DIR}"
    assert len(lines) == 2 and lines[1].endswith(f"kept best in {LONG_DIR}/best")


def test_plain_console_is_not_a_terminal_one(capsys):
    console = make_console()
    assert not console.is_terminal and console.width > 1000


def test_check_table_keeps_a_long_reason_on_one_line(capsys):
    reason = f"[sandbox] opened {LONG_DIR}/secret.pt, outside the solution's folder"
    _print_result(EvalResult(status=Status.CHEATING, reason=reason), 0.5)
    out = capsys.readouterr().out
    assert any(line.rstrip().endswith(reason) for line in out.splitlines()), out


# ---- b. file modes --------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_written_file_follows_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        path = write_atomic(tmp_path / "state.json", "{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert path.read_text() == "{}"


# ---- c. error as a share of the tolerance ---------------------------------------------------------


def test_tolerance_share_of_a_known_small_error():
    errors = _Errors()
    ref = torch.tensor([1.0, 0.0, -2.0])
    out = torch.tensor([1.0 + 1e-5, 1e-6, -2.0])
    assert _compare_values("output", ref, out, errors) == ""
    # at ref 1: 1e-5 / (1e-4 + 1e-4) = 0.05; at ref 0: 1e-6 / 1e-4 = 0.01, where rel explodes
    assert errors.tolerance_used == pytest.approx(0.05, rel=1e-2)  # fp32 inputs: 1 + 1e-5 rounds
    assert errors.max_rel > 1000
    result = EvalResult(status=Status.OK, max_abs_err=errors.max_abs, max_rel_err=errors.max_rel,
                        tolerance_used=errors.tolerance_used)
    assert error_line(result).startswith("5% of the tolerance")


def test_a_looser_tolerance_is_used_and_named():
    ref, out = torch.tensor([1.0, 0.0]), torch.tensor([1.001, 0.0])
    assert "atol=rtol=0.0001" in _compare_values("output", ref, out, _Errors())
    loose = _Errors(atol=1e-2, rtol=1e-2)
    assert _compare_values("output", ref, out, loose) == ""
    result = EvalResult(status=Status.OK, max_abs_err=loose.max_abs, tolerance_used=loose.tolerance_used,
                        atol=1e-2, rtol=1e-3)
    assert "(atol=0.01, rtol=0.001;" in error_line(result)


def test_tolerance_flags_reach_the_config():
    from mkevolve.cli import build_parser
    from mkevolve.config import TOLERANCE, config_from_args

    args = build_parser().parse_args(["check", "p.py", "s.py", "--atol", "1e-2"])
    config = config_from_args(args)
    assert (config.atol, config.rtol) == (1e-2, TOLERANCE)


def test_tolerance_share_above_one_fails_and_keeps_the_max():
    errors = _Errors()
    _compare_values("output", torch.tensor([1.0]), torch.tensor([1.0 + 1e-5]), errors)
    message = _compare_values("output", torch.tensor([1.0]), torch.tensor([1.0003]), errors)
    assert message and errors.tolerance_used == pytest.approx(1.5, rel=1e-2)
    _compare_values("output", torch.tensor([1.0]), torch.tensor([1.0]), errors)
    assert errors.tolerance_used == pytest.approx(1.5, rel=1e-2)  # a later exact trial does not lower it


def test_tolerance_share_ignores_matching_nans():
    errors = _Errors()
    nan = float("nan")
    assert _compare_values("output", torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0]), errors) == ""
    assert errors.tolerance_used == 0.0


# ---- d. every violation, and a PyTorch solution called so -----------------------------------------


def test_check_json_lists_every_violation(tmp_path, capsys):
    solution = tmp_path / "several.py"
    solution.write_text(SEVERAL)
    expected = static_violations(SEVERAL, str(solution))
    assert len(expected) >= 3
    assert main(["check", str(PROBLEM), str(solution), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "cheating" and f"(+{len(expected) - 1} more)" in data["reason"]
    assert data["violations"] == [{"rule": v.rule.value, "line": v.line, "message": v.message} for v in expected]


def test_runtime_rejection_carries_every_violation():
    found = [Violation(Rule.TORCH_COMPUTE, "PyTorch ran `aten.mul`", 12), Violation(Rule.NO_LAUNCH, "none", 9)]
    with pytest.raises(Rejected) as caught:
        _raise_violations(found)
    result = caught.value.to_result()
    assert result.rule == "torch-compute"
    assert [v["rule"] for v in result.violations] == ["torch-compute", Rule.NO_LAUNCH.value]


def test_pytorch_only_solution_is_called_so():
    with Verifier(RunConfig(workers=1)) as verifier:
        pytorch = verifier.static_check(PYTORCH_ONLY, "pytorch_only.py")
        mixed = verifier.static_check(SEVERAL, "several.py")
    assert pytorch.rule == "no-triton-kernel"
    assert pytorch.reason.startswith("a PyTorch solution, not a Triton kernel: ")
    assert {v["rule"] for v in pytorch.violations} == {"no-triton-kernel", "torch-compute"}
    assert mixed.rule == "torch-compute" and not mixed.reason.startswith("a PyTorch solution")
