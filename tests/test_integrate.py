"""`mkevolve integrate`: runs' best solutions go into the model only when correct (and, on a GPU, faster)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mkevolve
from mkevolve.capture import CaptureSettings, capture, load_model_file
from mkevolve.cli import main
from mkevolve.integration import (CallShape, IntegrateError, RegionResult, Replacement, Settings, Verdict, amdahl,
                                  fp32_arithmetic, weight_names)
from mkevolve.problem import seed_everything
from mkevolve.run_state import RunState

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "integrate"
CAPTURE_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "capture"
TINY = FIXTURES / "tiny.py"
CPU = torch.device("cpu")


@pytest.fixture
def captured(tmp_path) -> Path:
    """The tiny model captured into tmp: problem files for fc1, act and fc2."""
    out = tmp_path / "capture"
    capture(TINY, out, CaptureSettings(top=3, warmup=0, runs=1, device=CPU))
    return out


def _run_dir(tmp_path: Path, captured: Path, region: str, solution: str | None) -> Path:
    """A run directory as `mkevolve run` leaves one, for the captured problem of `region`."""
    run_dir = tmp_path / f"run_{region}_{solution or 'none'}"
    run_dir.mkdir()
    RunState(problem=str(captured / f"tiny_{region}.py"), run_id=run_dir.name).save(run_dir)
    if solution:
        (run_dir / "best").mkdir()
        shutil.copy(FIXTURES / solution, run_dir / "best" / "decomposed_solution.py")
    return run_dir


def _model_and_inputs():
    model_file = load_model_file(TINY)
    return model_file.build(0), model_file.inputs(1, CPU)


def test_correct_replacement_is_used_with_accept_untimed(tmp_path, captured):
    model, inputs = _model_and_inputs()
    with torch.no_grad():
        expected = model(*inputs)
    run = _run_dir(tmp_path, captured, "fc1", "linear_ok.py")
    report = mkevolve.integrate(model, [run], inputs=inputs, settings=Settings(accept_untimed=True))
    (row,) = report.regions
    assert row.verdict is Verdict.USED and row.weights == "the model's" and row.max_abs_error < 1e-6
    assert isinstance(model.get_submodule("fc1"), Replacement)
    with torch.no_grad():
        assert torch.allclose(model(*inputs), expected, atol=1e-6)
    e2e = report.end_to_end
    # No GPU: nothing is timed, and nothing is made up.
    assert row.region_ms is None and row.replacement_ms is None
    assert e2e.eager_ms is None and e2e.compiled_ms is None and e2e.speedup_vs_eager is None
    assert e2e.amdahl is None and e2e.max_abs_error < 1e-6


def test_wrong_replacement_is_kept_out_with_its_error(tmp_path, captured):
    model, inputs = _model_and_inputs()
    original = model.fc1
    run = _run_dir(tmp_path, captured, "fc1", "linear_wrong.py")
    report = mkevolve.integrate(model, [run], inputs=inputs, settings=Settings(accept_untimed=True))
    (row,) = report.regions
    assert row.verdict is Verdict.INCORRECT and row.max_abs_error == pytest.approx(1.0)
    assert "max abs error 1 over tolerance" in row.reason
    assert model.fc1 is original and report.end_to_end.max_abs_error == 0.0


def test_on_cpu_a_correct_replacement_is_kept_as_speed_unknown(tmp_path, captured):
    model, inputs = _model_and_inputs()
    original = model.fc1
    run = _run_dir(tmp_path, captured, "fc1", "linear_ok.py")
    (row,) = mkevolve.integrate(model, [run], inputs=inputs).regions
    assert row.verdict is Verdict.SPEED_UNKNOWN and "--accept-untimed" in row.reason
    assert model.fc1 is original


def test_a_run_without_best_is_skipped_with_its_reason(tmp_path, captured):
    model, _ = _model_and_inputs()
    run = _run_dir(tmp_path, captured, "fc2", None)
    (row,) = mkevolve.integrate(model, [run], settings=Settings(accept_untimed=True)).regions  # default inputs
    assert row.verdict is Verdict.NO_BEST and "best/decomposed_solution.py does not exist" in row.reason
    assert isinstance(model.fc2, torch.nn.Linear)


def test_the_share_comes_from_capture_json_and_amdahl_combines_regions(tmp_path, captured):
    model, inputs = _model_and_inputs()
    run = _run_dir(tmp_path, captured, "fc1", "linear_ok.py")
    (row,) = mkevolve.integrate(model, [run], inputs=inputs, settings=Settings(accept_untimed=True)).regions
    shares = {r["path"]: r["share"] for r in json.loads((captured / "capture.json").read_text())["rows"]}
    assert row.share == pytest.approx(shares["fc1"]) and row.share_from == "capture.json"
    a = RegionResult("a", "x", Verdict.USED, share=0.5, region_ms=2.0, replacement_ms=1.0)
    b = RegionResult("b", "y", Verdict.USED, share=0.25, region_ms=1.0, replacement_ms=0.25)
    assert amdahl([a, b]) == pytest.approx(1 / (0.25 + 0.25 + 0.0625))
    assert amdahl([a, RegionResult("c", "z", Verdict.USED, share=0.1)]) is None  # r unknown: no prediction


def test_cli_reports_and_writes_json(tmp_path, captured, capsys):
    ok = _run_dir(tmp_path, captured, "fc1", "linear_ok.py")
    none = _run_dir(tmp_path, captured, "fc2", None)
    target = tmp_path / "report.json"
    assert main(["integrate", str(TINY), str(ok), str(none), "--accept-untimed", "-o", str(target)]) == 0
    out = capsys.readouterr().out
    assert "used" in out and "skipped: no best" in out and "unknown (no GPU)" in out
    saved = json.loads(target.read_text())
    assert [r["verdict"] for r in saved["regions"]] == ["used", "skipped: no best"]
    assert saved["end_to_end"]["eager_ms"] is None
    assert main(["integrate", str(TINY), str(ok), "--out", str(tmp_path / "o")]) == 0
    default = json.loads((tmp_path / "o" / "tiny" / "integrate" / "integrate.json").read_text())
    assert default["regions"][0]["verdict"] == "kept: speed unknown"


def test_cli_bad_input_exits_2_with_one_line_naming_the_file(tmp_path, captured, capsys):
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    assert main(["integrate", str(TINY), str(not_a_run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(not_a_run) in err and "not a run directory" in err
    # A region the model does not have: the problem came from another model.
    run = _run_dir(tmp_path, captured, "fc1", "linear_ok.py")
    state = json.loads((run / "state.json").read_text())
    other = captured / "tiny_other.py"
    other.write_text((captured / "tiny_fc1.py").read_text().replace("REGION = 'fc1'", "REGION = 'nope'"))
    state["problem"] = str(other)
    (run / "state.json").write_text(json.dumps(state))
    assert main(["integrate", str(TINY), str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run) in err and "'nope'" in err
    with pytest.raises(IntegrateError, match="not a problem written by `mkevolve capture`"):
        other.write_text("import torch\n")
        mkevolve.integrate(torch.nn.Linear(2, 2), [run])


def test_import_mkevolve_stays_light():
    import subprocess
    import sys

    code = "import sys, mkevolve; assert 'torch' not in sys.modules; assert callable(mkevolve.integrate)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- how a region's calls map to the problem's inputs, and its weights to the candidate's -------------------


def test_a_call_maps_to_the_problem_inputs_only_when_it_is_the_captured_call():
    call = CallShape(positional=3, positional_literals={1: "None"}, keyword_inputs=("gate",),
                     keyword_literals={"flag": "True"}, input_shapes=((2, 4), (1, 4), (2, 4)))
    x, y, gate = torch.zeros(2, 4), torch.zeros(1, 4), torch.ones(2, 4)
    assert call.inputs((x, None, y), {"gate": gate, "flag": True}) == [x, y, gate]
    assert call.inputs((x, None, y), {"gate": gate, "flag": False}) is None        # another literal value
    assert call.inputs((x, 0, y), {"gate": gate, "flag": True}) is None            # another positional literal
    assert call.inputs((x, None, y), {"gate": gate}) is None                       # a keyword missing
    assert call.inputs((x, None, y, x), {"gate": gate, "flag": True}) is None      # one argument more
    assert call.inputs((x, None, torch.zeros(3, 4)), {"gate": gate, "flag": True}) is None  # another shape
    assert CallShape().inputs((x,), {}) == [x] and CallShape().inputs((x,), {"k": 1}) is None


def test_a_replacement_runs_the_original_on_any_other_call_and_when_disabled():
    original, candidate = torch.nn.Identity(), torch.nn.Identity()
    candidate.forward = lambda x: x + 1  # marks the candidate's calls
    replacement = Replacement(original, candidate, "run", CallShape(positional=1, input_shapes=((2,),)))
    x = torch.zeros(2)
    assert torch.equal(replacement(x), x + 1)
    assert torch.equal(replacement(torch.zeros(3)), torch.zeros(3))  # not the verified shape: the original
    replacement.enabled = False
    assert torch.equal(replacement(x), x)


class _Renamed(torch.nn.Module):
    """A candidate whose layer has other names, drawn from the same seed as the problem's nn.Linear(8, 16)."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.Linear(8, 16)
        self.w, self.b = layer.weight, layer.bias
        self.register_buffer("ones", torch.ones(3))


def test_weights_are_matched_by_value_whatever_their_names():
    seed_everything(0)
    reference = torch.nn.Module()
    reference.region = torch.nn.Linear(8, 16)
    reference.region.register_buffer("scale", torch.ones(3))
    seed_everything(0)
    assert weight_names(_Renamed(), reference) == {"w": "weight", "b": "bias", "ones": "scale"}
    seed_everything(1)  # drawn from another seed: nothing matches, so the weights cannot be put in
    assert weight_names(_Renamed(), reference) is None


def test_outputs_are_compared_in_fp32_and_the_flags_come_back():
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with fp32_arithmetic():
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# ---- capture, run and integrate, for real ---------------------------------------------------------------


@pytest.mark.slow
def test_capture_run_integrate_end_to_end(tmp_path):
    """The keyword-call model: capture writes its regions, `mkevolve run` (builtin agent, real verifier)
    finds a kernel for each, and integrate puts them in with the model's own weights, correct."""
    model_path = CAPTURE_FIXTURES / "keyword_call.py"
    capture(model_path, tmp_path / "capture", CaptureSettings(top=2, warmup=0, runs=1, device=CPU))
    run_dirs = []
    for region in ("linear", "scaled"):
        env = dict(os.environ, TRITON_INTERPRET="1")
        done = subprocess.run([sys.executable, "-m", "mkevolve", "run", str(tmp_path / "capture" /
                               f"keyword_call_{region}.py"), "--iterations", "1", "--out", str(tmp_path / "runs")],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        (run_dir,) = (tmp_path / "runs" / f"keyword_call_{region}").iterdir()
        run_dirs.append(run_dir)
    model_file = load_model_file(model_path)
    model, inputs = model_file.build(0), model_file.inputs(1, CPU)
    with torch.no_grad():
        expected = model(*inputs)
    report = mkevolve.integrate(model, run_dirs, inputs=inputs, settings=Settings(accept_untimed=True))
    assert [r.verdict for r in report.regions] == [Verdict.USED, Verdict.USED], [r.reason for r in report.regions]
    assert report.regions[0].weights == "the model's"
    with torch.no_grad():
        assert torch.allclose(model(*inputs), expected, atol=1e-5)
    assert report.end_to_end.max_abs_error < 1e-4
