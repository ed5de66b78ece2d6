"""`mkevolve capture`: regions ranked by time share, Amdahl ceilings, and the top regions as loadable problems."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

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
    table = [row.share for row in report.rows if row.in_table]
    assert all(0 <= s < 1 for s in shares) and sum(table) <= 1 + 1e-9
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


def _rebuilt_output(problem, region: torch.nn.Module, inputs: list):
    """The problem's Model with the region's weights loaded, called on `inputs`."""
    model = problem.model_cls(*problem.module.get_init_inputs())
    model.region.load_state_dict(region.state_dict())
    with torch.no_grad():
        return model(*inputs)


def test_top_regions_are_written_as_problems_that_rebuild_the_region(tmp_path):
    report = capture(MLP_CONV, tmp_path, CaptureSettings(top=20, warmup=1, runs=2, device=CPU))
    written = [row for row in report.rows if row.problem]
    assert {"mlp.0", "mlp.1", "mlp.2", "head", "embed", "features.1"} <= {row.path for row in written}
    for row in written:
        problem = load_problem(row.problem)
        check_reference(problem, CPU, eval_mode=False)
        seed_everything(5)
        inputs = problem.module.get_inputs()
        assert [list(x.shape) for x in inputs] == [spec.shape for spec in row.inputs]
        region = load_model_file(MLP_CONV).build(0).get_submodule(row.path)
        assert torch.equal(_rebuilt_output(problem, region, inputs), _region_output(MLP_CONV, row.path, inputs)), \
            row.path


def test_a_block_that_does_not_keep_its_init_arguments_is_assembled_from_its_parts(tmp_path):
    """ConvBlock(channels) keeps no `channels` (as torchvision's BasicBlock keeps no `inplanes`): its problem
    builds a ConvBlock without its __init__, from its convolution and norm rebuilt, and reproduces it."""
    report = capture(MLP_CONV, tmp_path, CaptureSettings(top=20, warmup=1, runs=2, device=CPU))
    block = next(row for row in report.rows if row.path == "features.0")
    assert block.problem and block.skipped is None
    source = Path(block.problem).read_text()
    assert "_assembled(ConvBlock, [('conv', nn.Conv2d(" in source and "('bn', nn.BatchNorm2d(" in source
    problem = load_problem(block.problem)
    inputs = problem.module.get_inputs()
    region = load_model_file(MLP_CONV).build(0).get_submodule("features.0")
    assert torch.equal(_rebuilt_output(problem, region, inputs), _region_output(MLP_CONV, "features.0", inputs))


def test_a_module_with_tensors_or_objects_of_its_own_is_not_assembled(tmp_path):
    from types import ModuleType

    from mkevolve.capture import _Unsupported, rebuild

    class Scaled(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.linear = nn.Linear(width, width)
            self.scale = nn.Parameter(torch.ones(width))

    class Activated(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.linear = nn.Linear(width, width)
            self.act = torch.relu

    for module, words in ((Scaled(4), "parameters or buffers of its own"), (Activated(4), "'act' is a")):
        with pytest.raises(_Unsupported, match=words):
            rebuild(module, ModuleType("model"))


def test_the_problem_rebuilds_the_layer_from_its_init_arguments_and_keeps_integer_ranges(tmp_path):
    report = capture(MLP_CONV, tmp_path, CaptureSettings(top=20, warmup=1, runs=2, device=CPU))
    embed = next(row for row in report.rows if row.path == "embed")
    source = Path(embed.problem).read_text()
    assert "self.region = nn.Embedding(num_embeddings=20, embedding_dim=10" in source
    assert "_build_full_model" not in source and "MODEL_FILE = " in source  # no read of MODEL.py at run time
    problem = load_problem(embed.problem)
    spec = embed.inputs[0]
    assert spec.dtype == "torch.int64" and 0 <= spec.low <= spec.high < 20
    for _ in range(5):
        tokens = problem.module.get_inputs()[0]
        assert tokens.dtype == torch.int64 and spec.low <= int(tokens.min()) and int(tokens.max()) <= spec.high


def test_config_objects_arguments_kept_by_parts_keywords_and_copied_classes(tmp_path):
    """A block built from a config object that only its part keeps (as Hugging Face blocks are), called with
    keyword tensors and literals: the problem rebuilds it and reproduces it; a dict-returning region is not
    written, with the reason."""
    model_path = FIXTURES / "configured.py"
    report = capture(model_path, tmp_path, CaptureSettings(top=5, warmup=0, runs=1, device=CPU))
    rows = {row.path: row for row in report.rows}
    assert rows["blocks.1"].problem and rows["blocks.0"].problem
    assert "returns a dict" in rows["heads"].skipped
    source = Path(rows["blocks.1"].problem).read_text()
    assert "Block(config=BlockConfig(**{'width': 8, 'scale': 2.0}), index=2)" in source
    assert "def forward(self, arg0, gate):" in source and "mask=None" in source and "flag=True" in source
    assert source.count("from torch import nn") == 1 and "class Inner(nn.Module)" in source
    problem = load_problem(rows["blocks.1"].problem)
    assert problem.module.KEYWORD_INPUTS == ("gate",)
    assert problem.module.KEYWORD_LITERALS == {"mask": "None", "flag": "True"}
    seed_everything(3)
    x, gate = problem.module.get_inputs()
    region = load_model_file(model_path).build(0).get_submodule("blocks.1")
    with torch.no_grad():
        expected = region(x, mask=None, gate=gate, flag=True)
    assert torch.equal(_rebuilt_output(problem, region, [x, gate]), expected)


def test_a_kernelbench_file_is_captured(tmp_path):
    report = capture(KERNELBENCH, tmp_path, _settings())
    assert {row.path for row in report.rows} == {"up", "act", "down"}
    up = next(row for row in report.rows if row.path == "up")
    problem = load_problem(up.problem)
    inputs = problem.module.get_inputs()
    assert [list(x.shape) for x in inputs] == [[4, 16]]
    region = load_model_file(KERNELBENCH).build(0).get_submodule("up")
    assert torch.equal(_rebuilt_output(problem, region, inputs), _region_output(KERNELBENCH, "up", inputs))


def test_a_region_called_with_a_keyword_literal_gets_it_written_into_the_call(tmp_path):
    report = capture(FIXTURES / "keyword_call.py", tmp_path, _settings())
    scaled = next(row for row in report.rows if row.path == "scaled")
    assert scaled.problem and "return self.region(arg0, scale=2.0)" in Path(scaled.problem).read_text()
    problem = load_problem(scaled.problem)
    x = problem.module.get_inputs()[0]
    with torch.no_grad():
        assert torch.equal(problem.model_cls()(x), x * 2.0)


def test_top_limits_the_problem_files(tmp_path, capsys):
    assert main(["capture", str(MLP_CONV), "--top", "2", "--runs", "2", "--warmup", "1",
                 "--out", str(tmp_path)]) == 0
    out_dir = tmp_path / "mlp_conv" / "capture"
    saved = json.loads((out_dir / "capture.json").read_text())
    assert len(saved["rows"]) > 2
    problems = sorted(p.name for p in out_dir.glob("*.py"))
    assert len(problems) == 2
    assert problems == sorted(Path(r["problem"]).name for r in saved["rows"] if r["problem"])
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
    table = {row.path for row in report.rows if row.in_table}
    assert {"backbone.stem", "backbone.blocks.0", "backbone.blocks.1", "backbone.blocks.2", "head"} == table
    written = [row for row in report.rows if row.problem]
    assert len(written) == 1
    top = written[0]
    # Backbone(width) keeps no `width`: it is assembled from its stem and blocks (each assembled in turn)
    assert top.path == "backbone" and "_assembled(Backbone" in Path(top.problem).read_text()
    problem = load_problem(top.problem)
    inputs = problem.module.get_inputs()
    region = load_model_file(FIXTURES / "backbone.py").build(0).get_submodule(top.path)
    expected = _region_output(FIXTURES / "backbone.py", top.path, inputs)
    assert torch.equal(_rebuilt_output(problem, region, inputs), expected)


def test_residual_blocks_written_as_torchvision_writes_them_are_captured_and_decompose(tmp_path):
    """BasicBlock keeps its layers, stride and downsample but not `inplanes`: both blocks get problems,
    assembled from their parts (the downsample Sequential with its members), that the builtin decomposer
    splits and checks like any problem."""
    model_file = FIXTURES / "resnet_blocks.py"
    report = capture(model_file, tmp_path, _settings(top=3))
    rows = {row.path: row for row in report.rows}
    assert rows["layer1"].problem and rows["layer2"].problem
    source = Path(rows["layer2"].problem).read_text()
    assert "_assembled(BasicBlock, [('conv1', nn.Conv2d(in_channels=8, out_channels=16" in source
    assert "('downsample', nn.Sequential(nn.Conv2d(" in source and "{'stride': 2}" in source
    problem = load_problem(rows["layer2"].problem)
    inputs = problem.module.get_inputs()
    region = load_model_file(model_file).build(0).get_submodule("layer2")
    assert torch.equal(_rebuilt_output(problem, region, inputs), _region_output(model_file, "layer2", inputs))
    assert main(["decompose", rows["layer2"].problem, "--out", str(tmp_path / "decomposed")]) == 0
