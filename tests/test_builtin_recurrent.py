"""Recurrent layers in the builtin generator: nn.RNN, nn.LSTM and nn.GRU (a GEMM for every step's input gates,
then one launch per step, emit_recurrence.py), their single-step cells, and the aten ops torch.export records for
both. Small shapes, so the Triton interpreter runs them on a CPU."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mkevolve.builtin.kernels import UnsupportedSubproblem, generate_kernel, variant_count
from mkevolve.problem import load_problem

from builtin_matching import TARGET, assert_variant_matches

SUBPROBLEMS = Path(__file__).resolve().parent / "subproblems"


def _problem(tmp_path: Path, name: str, init: str, forward: str, inputs: str, configs: str = "") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(f'''\
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = {init}

            def forward(self, x):
                return {forward}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return []
        ''') + configs)
    return path


@pytest.mark.parametrize("stem", ["lstm", "gru_rnn"])
def test_every_variant_of_a_recurrent_subproblem_matches(stem, tmp_path):
    """lstm.py: two bidirectional LSTM layers from a given (h0, c0), every output; gru_rnn.py: two GRU layers
    from zeros, then a ReLU RNN without biases from a given h0."""
    path = SUBPROBLEMS / f"{stem}.py"
    count = variant_count(path, TARGET)
    assert count >= 2
    for variant in range(count):
        generated = assert_variant_matches(path, variant, tmp_path)
        assert "_recurrence_kernel" in generated.source and "steps" in generated.description


def test_each_layer_is_one_gemm_for_its_input_and_a_launch_per_step_for_its_recurrence(tmp_path):
    """The input's gates of all steps come from one GEMM; the steps are a loop in the launcher, walking
    backwards for the reverse direction (where the step before is t + 1), and nn.LSTM's own forward is never
    called."""
    generated = generate_kernel(SUBPROBLEMS / "lstm.py", 0, TARGET)
    forward = generated.source.split("class ModelNew")[1].split('if __name__ == "__main__":')[0]
    # 2 layers x 2 directions
    assert forward.count("_matmul_kernel") == 4 and forward.count("_recurrence_kernel") == 4
    # each launch is given the whole buffers and its step's time, and the time of the step before it
    assert "for step, t in enumerate(range(T)):" in generated.source and ", out, t, t - 1, T, B, H," in generated.source
    assert ("for step, t in enumerate(reversed(range(T))):" in generated.source
            and ", out, t, t + 1, T, B, H," in generated.source)
    assert "self.lstm(" not in forward


def test_one_kernel_file_serves_input_configs_of_other_lengths_and_batches(tmp_path):
    """Two input configs that differ in sequence length and batch size: the launcher reads T and B at run time."""
    configs = textwrap.dedent('''

        def get_input_configs():
            return [{"get_init_inputs": lambda: [], "get_inputs": lambda: [torch.randn(3, 4, 5)]},
                    {"get_init_inputs": lambda: [], "get_inputs": lambda: [torch.randn(17, 9, 5)]}]
        ''')
    path = _problem(tmp_path, "gru_configs", "nn.GRU(5, 24, batch_first=True)", "self.rnn(x)[1]",
                    "[torch.randn(3, 4, 5)]", configs)
    assert len(load_problem(path).configs) == 2
    assert_variant_matches(path, 0, tmp_path)


def test_training_mode_without_dropout_is_written_and_with_dropout_is_refused_in_that_mode(tmp_path):
    plain = _problem(tmp_path, "lstm_train", "nn.LSTM(4, 16, num_layers=2)", "self.rnn(x)[0]",
                     "[torch.randn(5, 2, 4)]")
    assert_variant_matches(plain, 0, tmp_path)     # nn.Module's default: training mode
    dropout = _problem(tmp_path, "lstm_dropout", "nn.LSTM(4, 16, num_layers=2, dropout=0.5)", "self.rnn(x)[0]",
                       "[torch.randn(5, 2, 4)]")
    with pytest.raises(UnsupportedSubproblem, match=r"dropout=0\.5 between its layers in training mode.*--eval"):
        generate_kernel(dropout, 0, TARGET, mode="train")
    assert_variant_matches(dropout, 0, tmp_path, eval_mode=True)     # eval mode, where dropout is off


@pytest.mark.parametrize(("name", "init", "forward", "inputs", "reason"), [
    ("projected", "nn.LSTM(4, 16, proj_size=8)", "self.rnn(x)[0]", "[torch.randn(5, 2, 4)]", "proj_size"),
    ("unbatched", "nn.GRU(4, 16)", "self.rnn(x)[0]", "[torch.randn(5, 4)]", "unbatched 2-d input"),
])
def test_forms_without_a_kernel_are_refused_with_the_reason(tmp_path, name, init, forward, inputs, reason):
    path = _problem(tmp_path, name, init, forward, inputs)
    with pytest.raises(UnsupportedSubproblem, match=reason):
        generate_kernel(path, 0, TARGET)


@pytest.mark.parametrize(("name", "init", "args", "forward", "inputs"), [
    ("lstm_cell", "nn.LSTMCell(8, 20)", "x, h, c", "self.rnn(x, (h, c))",
     "[torch.randn(3, 8), torch.randn(3, 20), torch.randn(3, 20)]"),
    ("lstm_cell_from_zeros", "nn.LSTMCell(8, 20)", "x", "self.rnn(x)", "[torch.randn(3, 8)]"),
    ("gru_cell", "nn.GRUCell(8, 20)", "x, h", "self.rnn(x, h)", "[torch.randn(3, 8), torch.randn(3, 20)]"),
    ("gru_cell_from_zeros", "nn.GRUCell(8, 20)", "x", "self.rnn(x)", "[torch.randn(3, 8)]"),
    ("gru_cell_without_biases", "nn.GRUCell(8, 20, bias=False)", "x, h", "self.rnn(x, h)",
     "[torch.randn(3, 8), torch.randn(3, 20)]"),
    ("relu_cell", "nn.RNNCell(8, 20, nonlinearity='relu')", "x, h", "self.rnn(x, h)",
     "[torch.randn(3, 8), torch.randn(3, 20)]"),
])
def test_single_step_cells_are_two_gemms_and_elementwise_kernels(tmp_path, name, init, args, forward, inputs):
    """nn.LSTMCell, nn.GRUCell and nn.RNNCell, from a given state or from zeros: no step loop, the cell's
    formulas fused after the GEMMs."""
    path = _problem(tmp_path, name, init, forward, inputs)
    path.write_text(path.read_text().replace("def forward(self, x):", f"def forward(self, {args}):"))
    generated = assert_variant_matches(path, 0, tmp_path)
    assert "_recurrence_kernel" not in generated.source and "_matmul_kernel" in generated.source


@pytest.mark.parametrize(("name", "init", "first", "step"), [
    ("lstm_cell_loop", "nn.LSTMCell(8, 20)", "h, c = self.rnn(x[0])", "h, c = self.rnn(x[t], (h, c))"),
    ("gru_cell_loop", "nn.GRUCell(8, 20)", "h = self.rnn(x[0])", "h = self.rnn(x[t], h)"),
    ("tanh_cell_loop", "nn.RNNCell(8, 20)", "h = self.rnn(x[0])", "h = self.rnn(x[t], h)"),
])
def test_a_python_loop_of_cells_over_time_is_unrolled_into_steps(tmp_path, name, init, first, step):
    """`for t in range(x.shape[0])` defeats torch.fx; torch.export unrolls it into aten.*_cell calls, the first
    from aten.zeros (nn.*Cell's own zero state), and each call becomes one cell step."""
    path = _problem(tmp_path, name, init, "h", "[torch.randn(4, 3, 8)]")
    loop = f"{first}\n        for t in range(1, x.shape[0]):\n            {step}\n        return h"
    path.write_text(path.read_text().replace("return h", loop))
    generated = assert_variant_matches(path, 0, tmp_path)
    assert generated.source.count("_matmul_kernel") >= 4 and "_recurrence_kernel" not in generated.source


def test_zeros_built_in_forward_are_a_number_where_read_and_no_state_at_all_for_a_recurrence(tmp_path):
    """torch.zeros / full_like in the forward: an accumulator's start, a GRU's h0 and an added constant become
    numbers in the kernels that read them, and the GRU's state is not read at all; alone (an output) it is refused."""
    loop = _problem(tmp_path, "zeros_sum", "nn.Identity()", "acc", "[torch.randn(4, 3, 8)]")
    body = ("acc = torch.zeros(x.shape[1], x.shape[2], device=x.device)\n"
            "        for t in range(x.shape[0]):\n            acc = acc + x[t]\n        return acc")
    loop.write_text(loop.read_text().replace("return acc", body))
    assert "torch.zeros" not in assert_variant_matches(loop, 0, tmp_path).source.split("class ModelNew")[1]
    gru = _problem(tmp_path, "gru_zero_state", "nn.GRU(8, 16, batch_first=True)",
                   "self.rnn(x, torch.zeros(1, x.size(0), 16, device=x.device))[0] + torch.full_like(x[..., :1], 0.5)",
                   "[torch.randn(3, 5, 8)]")
    generated = assert_variant_matches(gru, 0, tmp_path)
    assert "the first step: h (and c) before it are zeros" in generated.source and "h0_ptr" not in generated.source
    alone = _problem(tmp_path, "zeros_alone", "nn.Identity()", "x + 1, torch.zeros(2, 3, device=x.device)",
                     "[torch.randn(4, 3)]")
    with pytest.raises(UnsupportedSubproblem, match="a tensor of one value .* written out alone"):
        generate_kernel(alone, 0, TARGET)


@pytest.mark.parametrize(("name", "init", "call", "inputs"), [
    ("lstm_exported", "nn.LSTM(8, 20, num_layers=2, batch_first=True)", "self.rnn(x)", "[torch.randn(3, 5, 8)]"),
    ("gru_exported", "nn.GRU(8, 20, bidirectional=True, bias=False)", "self.rnn(x, h0)",
     "[torch.randn(5, 3, 8), torch.randn(2, 3, 20)]"),
])
def test_layers_that_only_torch_export_can_trace_are_the_same_stack(tmp_path, name, init, call, inputs):
    """Python on a shape defeats torch.fx; torch.export records the layer as aten.lstm / aten.gru with its
    weights as a flat list (and nn.LSTM's zero state as aten.zeros, which is not read)."""
    path = _problem(tmp_path, name, init, "result", inputs)
    args = "x, h0" if "h0" in call else "x"
    body = (f"result = {call}\n        if x.shape[0] > 2:\n            return result[0] * 2.0, result[1]\n"
            "        return result[0], result[1]")
    path.write_text(path.read_text().replace("def forward(self, x):", f"def forward(self, {args}):")
                    .replace("return result", body))
    generated = assert_variant_matches(path, 0, tmp_path)
    assert generated.source.count("def _recurrence_kernel") >= 2


def test_a_forward_argument_that_get_inputs_leaves_to_its_default_is_refused(tmp_path):
    """KernelBench's 35_LSTM form: `h0=None` in forward, drawn inside it when not given. A kernel traced without
    it would be specialised to the default yet require it in its signature: refused, naming it."""
    path = _problem(tmp_path, "lstm_defaults", "nn.LSTM(8, 20, batch_first=True)", "self.rnn(x, h0)[0]",
                    "[torch.randn(3, 5, 8)]")
    path.write_text(path.read_text().replace("def forward(self, x):", "def forward(self, x, h0=None):"))
    with pytest.raises(UnsupportedSubproblem, match="Model.forward's h0 are not given by get_inputs"):
        generate_kernel(path, 0, TARGET)
