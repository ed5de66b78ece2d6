"""Problem loading: every malformed problem file fails with one line naming the file and the reason."""

import textwrap

import pytest
import torch

from mkevolve.problem import ProblemError, check_reference, load_problem, read_source

GOOD = """
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn(2, 8)]

def get_init_inputs():
    return [8]
"""


def write(tmp_path, text, name="problem.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def expect_error(path, fragment):
    with pytest.raises(ProblemError) as info:
        problem = load_problem(path)
        check_reference(problem, torch.device("cpu"), eval_mode=False)
    message = str(info.value)
    assert str(path) in message and fragment in message
    assert "\n" not in message
    return message


def test_good_problem_loads(tmp_path):
    problem = load_problem(write(tmp_path, GOOD))
    assert problem.model_cls.__name__ == "Model" and len(problem.configs) == 1
    check_reference(problem, torch.device("cpu"), eval_mode=False)


def test_missing_file(tmp_path):
    expect_error(tmp_path / "nope.py", "no such file")


def test_folder(tmp_path):
    expect_error(tmp_path, "is a folder")


def test_empty_file(tmp_path):
    expect_error(write(tmp_path, "   \n"), "empty")


def test_non_utf8(tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"# caf\xe9\nimport torch\n")
    expect_error(path, "not UTF-8")


def test_syntax_error_names_line(tmp_path):
    expect_error(write(tmp_path, "import torch\ndef f(:\n    pass\n"), "syntax error at line 2")


def test_import_error(tmp_path):
    expect_error(write(tmp_path, "import not_a_module_anywhere\n"), "import failed: ModuleNotFoundError")


def test_no_model(tmp_path):
    expect_error(write(tmp_path, "def get_inputs():\n    return []\n"), "no class named Model")


def test_model_not_module(tmp_path):
    expect_error(write(tmp_path, "class Model:\n    pass\n"), "not a subclass of torch.nn.Module")


def test_missing_input_functions(tmp_path):
    source = GOOD.replace("def get_init_inputs():\n    return [8]\n", "")
    expect_error(write(tmp_path, source), "missing function(s): get_init_inputs")


def test_inputs_not_a_list(tmp_path):
    source = GOOD.replace("return [torch.randn(2, 8)]", "return torch.randn(2, 8)")
    expect_error(write(tmp_path, source), "get_inputs() must return a list or tuple, got Tensor")


def test_constructor_raises(tmp_path):
    source = GOOD.replace("return [8]", "return [-1]")
    expect_error(write(tmp_path, source), "Model(*get_init_inputs()) raised")


def test_bad_input_configs(tmp_path):
    source = GOOD + "\ndef get_input_configs():\n    return [{'get_inputs': get_inputs}]\n"
    expect_error(write(tmp_path, source), "get_input_configs()[0] must be a dict")


def test_nondeterministic_dropout_suggests_eval(tmp_path):
    source = GOOD.replace("self.fc = nn.Linear(n, n)", "self.fc = nn.Linear(n, n)\n        self.drop = nn.Dropout(0.5)")
    source = source.replace("return torch.relu(self.fc(x))", "return self.drop(torch.relu(self.fc(x)))")
    message = expect_error(write(tmp_path, source), "non-deterministic")
    assert "--eval" in message
    problem = load_problem(tmp_path / "problem.py")
    check_reference(problem, torch.device("cpu"), eval_mode=True)  # deterministic in eval mode


def test_nondeterministic_without_dropout(tmp_path):
    source = GOOD.replace("return torch.relu(self.fc(x))", "return self.fc(x) + torch.rand_like(x)")
    message = expect_error(write(tmp_path, source), "non-deterministic")
    assert "--eval" not in message


def test_input_configs(tmp_path):
    source = GOOD + textwrap.dedent("""
    def get_input_configs():
        return [
            {"get_init_inputs": lambda: [8], "get_inputs": lambda: [torch.randn(2, 8)]},
            {"get_init_inputs": lambda: [4], "get_inputs": lambda: [torch.randn(3, 4)]},
        ]
    """)
    problem = load_problem(write(tmp_path, source))
    assert len(problem.configs) == 2
    check_reference(problem, torch.device("cpu"), eval_mode=False)


def test_read_source_returns_text(tmp_path):
    assert "class Model" in read_source(write(tmp_path, GOOD))


def test_inputs_made_on_the_meta_device_have_shapes_without_values(tmp_path):
    """The decomposition check's coverage compares shapes and dtypes only: a 64 GiB input costs nothing there."""
    from mkevolve.problem import make_inputs

    huge = GOOD.replace("return [torch.randn(2, 8)]", "return [torch.randn(1 << 34), torch.randint(0, 4, (3,)), 2.5]")
    problem = load_problem(write(tmp_path, huge))
    x, index, scale = make_inputs(problem.path, problem.configs[0], 1, torch.device("meta"), made_there=True)
    assert x.is_meta and x.shape == (1 << 34,) and index.is_meta and index.dtype == torch.int64 and scale == 2.5


def test_a_get_inputs_that_reads_a_value_back_is_made_on_the_cpu_instead(tmp_path):
    from mkevolve.problem import make_inputs

    reads = GOOD.replace("return [torch.randn(2, 8)]", "return [torch.randn(2, int(torch.randint(8, 9, ()).item()))]")
    problem = load_problem(write(tmp_path, reads))
    (on_meta,) = make_inputs(problem.path, problem.configs[0], 1, torch.device("meta"), made_there=True)
    (on_cpu,) = make_inputs(problem.path, problem.configs[0], 1, torch.device("cpu"))
    assert on_meta.is_meta and on_meta.shape == on_cpu.shape == (2, 8)     # drawn on the CPU, then moved


@pytest.mark.gpu
def test_inputs_made_on_the_gpu_are_drawn_there_and_the_same_for_the_same_seed(tmp_path):
    """The decomposition check's runs on a GPU: each set drawn on the GPU, the same for the same seed (the
    original and the top-level see one set), another for another seed (the trials differ)."""
    from mkevolve.problem import make_inputs

    problem = load_problem(write(tmp_path, GOOD.replace("torch.randn(2, 8)", "torch.randn(4096, 8)")))
    gpu = torch.device("cuda")
    first, again, other = (make_inputs(problem.path, problem.configs[0], seed, gpu, made_there=True)[0]
                           for seed in (1, 1, 2))
    assert first.is_cuda and first.shape == (4096, 8) and torch.equal(first, again) and not torch.equal(first, other)
    on_cpu = make_inputs(problem.path, problem.configs[0], 1, gpu)[0]
    assert on_cpu.is_cuda and not torch.equal(first, on_cpu)     # other values than the CPU's stream


def test_a_reference_that_cannot_run_on_its_values_in_another_order_is_a_clear_error(tmp_path):
    """Timed calls get their inputs' values shifted (problem.shifted_values): a Model whose inputs need a
    structure is refused up front, naming the file, rather than failing every candidate's check."""
    path = tmp_path / "cholesky.py"
    path.write_text(
        "import torch\n\n\nclass Model(torch.nn.Module):\n"
        "    def forward(self, a):\n        return torch.linalg.cholesky(a)\n\n\n"
        "def get_inputs():\n    m = torch.randn(6, 6)\n    return [m @ m.T + 6 * torch.eye(6)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    with pytest.raises(ProblemError, match=r"cholesky\.py: Model\.forward raised .* values in another order"):
        check_reference(load_problem(path), torch.device("cpu"), eval_mode=False)
