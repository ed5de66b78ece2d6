"""`mkevolve capture`: regions ranked by time share, Amdahl ceilings, and the top regions as loadable problems."""

import json
from pathlib import Path

import pytest
import torch

from mkevolve.capture import CaptureSettings, capture, ceiling_of, load_model_file
from mkevolve.cli import main
from mkevolve.problem import check_reference, load_problem, seed_everything

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "capture"
MLP_CONV = FIXTURES / "mlp_conv.py"
KERNELBENCH = FIXTURES / "kernelbench_model.py"
CPU = torch.device("cpu")


def _settings(top: int = 3) -> CaptureSettings:
    return CaptureSettings(top=top, warmup=1, runs=3, device=CPU)


def _region_output(model_path: Path, region: str, inputs: list, seed: int = 0):
    """The region of the model capture builds, called on `inputs`."""
    model = load_model_file(model_path).build(seed).get_submodule(region)
    with torch.no_grad():
        return model(*inputs)


def test_regions_are_ranked_with_shares_and_amdahl_ceilings(tmp_path):
    report = capture(MLP_CONV, tmp_path, _settings())
    paths = [row.path for row in report.rows]
    # Sequential members are regions of their own; the Sequential itself is not one.
    assert {"mlp.0", "mlp.1", "mlp.2", "head", "embed", "features.1"} <= set(paths)
    assert "mlp" not in paths and "features" not in paths
    shares = [row.share for row in report.rows]
    assert shares == sorted(shares, reverse=True)
    assert all(0 <= s < 1 for s in shares) and sum(shares) <= 1 + 1e-9
    for row in report.rows:
        assert row.ceiling == pytest.approx(1 / (1 - row.share))
        assert row.share == pytest.approx(row.ms / report.total_ms)
    # `head` is called twice per forward: its calls are counted and summed.
    assert next(row for row in report.rows if row.path == "head").calls == 2
    assert ceiling_of(1.0) is None and ceiling_of(0.5) == pytest.approx(2.0)


def test_capture_json_has_the_rows_device_torch_version_and_date(tmp_path):
    report = capture(MLP_CONV, tmp_path, _settings())
    saved = json.loads((tmp_path / "capture.json").read_text())
    assert saved["device"] == "cpu" and saved["torch_version"] == torch.__version__ and saved["date"]
    assert saved["timer"] == "cpu perf_counter"
    assert [r["path"] for r in saved["rows"]] == [r.path for r in report.rows]
    assert {"path", "type", "calls", "ms", "share", "ceiling"} <= set(saved["rows"][0])


def test_top_regions_are_written_as_problems_that_reproduce_the_region(tmp_path):
    report = capture(MLP_CONV, tmp_path, CaptureSettings(top=20, warmup=1, runs=2, device=CPU))
    written = [row for row in report.rows if row.problem]
    assert len(written) == len(report.rows)  # every region of this model has tensor arguments only
    for row in written:
        problem = load_problem(row.problem)
        check_reference(problem, CPU, eval_mode=False)
        seed_everything(5)
        inputs = problem.module.get_inputs()
        assert [list(x.shape) for x in inputs] == [spec.shape for spec in row.inputs]
        with torch.no_grad():
            got = problem.model_cls(*problem.module.get_init_inputs())(*inputs)
        assert torch.equal(got, _region_output(MLP_CONV, row.path, inputs)), row.path


def test_the_generated_problem_keeps_the_real_weights_and_integer_ranges(tmp_path):
    report = capture(MLP_CONV, tmp_path, CaptureSettings(top=20, warmup=1, runs=2, device=CPU))
    embed = next(row for row in report.rows if row.path == "embed")
    problem = load_problem(embed.problem)
    region = problem.model_cls().region
    full = load_model_file(MLP_CONV).build(0)
    assert torch.equal(region.weight, full.embed.weight)
    spec = embed.inputs[0]
    assert spec.dtype == "torch.int64" and 0 <= spec.low <= spec.high < 20
    for _ in range(5):
        tokens = problem.module.get_inputs()[0]
        assert tokens.dtype == torch.int64 and spec.low <= int(tokens.min()) and int(tokens.max()) <= spec.high


def test_a_kernelbench_file_is_captured(tmp_path):
    report = capture(KERNELBENCH, tmp_path, _settings())
    assert {row.path for row in report.rows} == {"up", "act", "down"}
    up = next(row for row in report.rows if row.path == "up")
    problem = load_problem(up.problem)
    inputs = problem.module.get_inputs()
    assert [list(x.shape) for x in inputs] == [[4, 16]]
    with torch.no_grad():
        assert torch.equal(problem.model_cls()(*inputs), _region_output(KERNELBENCH, "up", inputs))


def test_a_region_called_with_keywords_is_skipped_with_a_reason(tmp_path):
    report = capture(FIXTURES / "keyword_call.py", tmp_path, _settings())
    scaled = next(row for row in report.rows if row.path == "scaled")
    assert scaled.problem is None and "keyword arguments (scale)" in scaled.skipped
    assert next(row for row in report.rows if row.path == "linear").problem


def test_top_limits_the_problem_files(tmp_path, capsys):
    assert main(["capture", str(MLP_CONV), "--top", "2", "--runs", "2", "--warmup", "1",
                 "--out", str(tmp_path)]) == 0
    out_dir = tmp_path / "mlp_conv" / "capture"
    saved = json.loads((out_dir / "capture.json").read_text())
    assert len(saved["rows"]) > 2
    problems = sorted(p.name for p in out_dir.glob("*.py"))
    assert len(problems) == 2
    assert problems == sorted(Path(r["problem"]).name for r in saved["rows"][:2])
    text = capsys.readouterr().out
    assert "ceiling" in text and "CPU times" in text and str(out_dir) in text


def test_a_file_without_a_model_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["capture", str(FIXTURES / "no_model.py"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no_model.py" in err and "neither get_model() nor a Model class" in err
    assert not any(tmp_path.iterdir())


def test_bad_counts_are_exit_2(tmp_path, capsys):
    assert main(["capture", str(MLP_CONV), "--top", "0", "--out", str(tmp_path)]) == 2
    assert "--top" in capsys.readouterr().err


def test_a_child_holding_most_of_the_time_is_opened_one_level(tmp_path):
    report = capture(FIXTURES / "backbone.py", tmp_path, _settings(top=1))
    paths = {row.path for row in report.rows}
    assert {"backbone.stem", "backbone.blocks.0", "backbone.blocks.1", "backbone.blocks.2", "head"} == paths
    top = report.rows[0]
    assert top.path.startswith("backbone.") and top.problem
    problem = load_problem(top.problem)
    inputs = problem.module.get_inputs()
    with torch.no_grad():
        assert torch.equal(problem.model_cls()(*inputs), _region_output(FIXTURES / "backbone.py", top.path, inputs))
