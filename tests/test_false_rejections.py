"""Honest idioms the verifier once rejected, and the cheats that hide behind the same idioms.

1. `triton.autotune` with several configs under the CPU interpreter (no driver to benchmark on).
2. `set.add` and friends in host code (`add` is also a tensor method).
3. A dtype table naming torch.float16 (naming a dtype is not computing in it).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import CORPUS, ROOT
from mkevolve.verify.cheating import RuntimeGuard, Rule, static_violations

IDIOMS = sorted((CORPUS / "honest" / "idioms").glob("*.py"))
AUTOTUNE = CORPUS / "honest" / "idioms" / "autotune_configs.py"
ON_GPU = torch.cuda.is_available()


def problem_stem(path: Path) -> str:
    namespace: dict = {}
    exec(next(line for line in path.read_text().splitlines() if line.startswith("PROBLEM =")), namespace)
    return namespace["PROBLEM"]


def violations_of(source: str) -> list[tuple[Rule, str]]:
    """(rule, offending source line) for each static violation."""
    lines = source.splitlines()
    return [(v.rule, lines[v.line - 1].strip() if v.line else "") for v in static_violations(source)]


# ---------------------------------------------------------------------------------------------
# The honest corpus of idioms: statically clean, and correct under the runtime guard
# ---------------------------------------------------------------------------------------------

def test_idioms_corpus_has_one_file_per_false_rejection():
    assert {p.stem for p in IDIOMS} == {"autotune_configs", "host_containers", "dtype_table"}
    for path in IDIOMS:
        assert (CORPUS / "problems" / f"{problem_stem(path)}.py").is_file(), path


@pytest.mark.parametrize("path", IDIOMS, ids=[p.stem for p in IDIOMS])
def test_idiom_has_no_static_violations(path):
    problem = problem_stem(path)
    assert static_violations(path.read_text(), str(path), problem_name=problem) == []


# The script a candidate-like process runs: interpreter set-up first, then the solution.
GUARDED_RUN = '''
import json, sys, torch
from mkevolve.workers.interpreter import make_autotune_interpretable
interpretable = make_autotune_interpretable()   # before the solution's module is imported
from mkevolve.problem import build_model, flatten_outputs, import_file, load_problem, make_inputs
from mkevolve.verify.cheating import RuntimeGuard, output_violations

solution_path, problem_path = sys.argv[1:3]
problem = load_problem(problem_path)
config = problem.configs[0]
init = config.get_init_inputs()
device = torch.device("cpu")
model = build_model(problem.path, import_file(solution_path).ModelNew, init, 0, device, True, "ModelNew")
reference = build_model(problem.path, problem.model_cls, init, 0, device, True)
inputs, reference_inputs = (make_inputs(problem.path, config, 1, device) for _ in range(2))
guard = RuntimeGuard(solution_path)
with torch.no_grad():
    with guard:
        outputs = flatten_outputs(model(*inputs))
        again = flatten_outputs(model(*inputs))   # a second call reuses the tuned config
    expected = reference(*reference_inputs)
torch.testing.assert_close(outputs[0], expected, atol=1e-4, rtol=1e-4)
torch.testing.assert_close(again[0], expected, atol=1e-4, rtol=1e-4)
print(json.dumps({"interpretable": interpretable, "launches": guard.launches,
                  "violations": [v.describe() for v in guard.violations],
                  "output_violations": [v.describe() for v in output_violations(outputs, inputs)]}))
'''


def run_python(script: str, *args: str, interpret: str | None = "1") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def last_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", IDIOMS, ids=[p.stem for p in IDIOMS])
@pytest.mark.slow
def test_idiom_matches_the_reference_under_the_runtime_guard(path):
    problem = CORPUS / "problems" / f"{problem_stem(path)}.py"
    report = last_json(run_python(GUARDED_RUN, str(path), str(problem)))
    assert report["interpretable"] is True
    # Two forwards; the first autotuned one also runs each of its two configs once while tuning.
    assert report["launches"] == (4 if path == AUTOTUNE else 2)
    assert report["violations"] == [] and report["output_violations"] == []


# ---------------------------------------------------------------------------------------------
# 1. Autotune under the interpreter
# ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(ON_GPU, reason="with a GPU the driver exists and the autotuner can benchmark")
@pytest.mark.slow
def test_multi_config_autotune_fails_on_cpu_without_the_fix():
    """The failure the fix is for: the same script, minus the set-up call, dies benchmarking."""
    script = GUARDED_RUN.replace("make_autotune_interpretable()", "False")
    result = run_python(script, str(AUTOTUNE), str(CORPUS / "problems" / "elementwise.py"))
    assert result.returncode != 0
    assert "active drivers" in result.stderr


AUTOTUNE_SEMANTICS = '''
import json, torch, triton, triton.language as tl
from mkevolve.workers.interpreter import make_autotune_interpretable, run_once
assert make_autotune_interpretable() and make_autotune_interpretable()   # idempotent
wrapped = triton.autotune
make_autotune_interpretable()
import triton.runtime, triton.runtime.autotuner
same = triton.autotune is wrapped is triton.runtime.autotune is triton.runtime.autotuner.autotune

runs = {}
def counting(name):
    def hook(nargs):
        runs[name] = runs.get(name, 0) + 1
    return hook

def configs():
    return [triton.Config({"BLOCK": 64}, pre_hook=counting("first")),
            triton.Config({"BLOCK": 128}, pre_hook=counting("second"))]

@triton.autotune(configs=configs(), key=["n"])
@triton.jit
def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)

# GPU-only benchmarking arguments an honest solution may pass: ignored in the interpreter.
@triton.autotune(configs=configs()[:1] + [triton.Config({"BLOCK": 256})], key=["n"], warmup=5, rep=5,
                 do_bench=lambda fn, quantiles: triton.testing.do_bench(fn, quantiles=quantiles))
@triton.jit
def double_gpu_bench(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)

x = torch.randn(1000)
grid = lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)
results = []
for _ in range(2):
    out = torch.empty_like(x)
    double[grid](x, out, 1000)
    results.append(torch.equal(out, x * 2))
after_first_key = dict(runs)
out = torch.empty_like(x)
double_gpu_bench[grid](x, out, 1000)
print(json.dumps({"same": same, "correct": results + [torch.equal(out, x * 2)], "runs": after_first_key,
                  "best_block": double.best_config.kwargs["BLOCK"], "times": run_once(lambda: None, (0.5, 0.2))}))
'''


def test_every_config_runs_once_and_the_first_is_kept():
    report = last_json(run_python(AUTOTUNE_SEMANTICS))
    assert report["same"] is True
    assert report["correct"] == [True, True, True]
    # Tuning ran each config once; the chosen first config ran again for each of the two launches.
    assert report["runs"] == {"first": 3, "second": 1}
    assert report["best_block"] == 64
    assert report["times"] == [0.0, 0.0]


@pytest.mark.parametrize("interpret", [None, "0"])
def test_without_the_interpreter_triton_is_left_untouched(interpret):
    script = textwrap.dedent('''
        import json, triton
        from mkevolve.workers.interpreter import make_autotune_interpretable
        original = triton.autotune
        print(json.dumps({"patched": make_autotune_interpretable(), "same": triton.autotune is original}))
    ''')
    report = last_json(run_python(script, interpret=interpret))
    assert report == {"patched": False, "same": True}


# ---------------------------------------------------------------------------------------------
# 2. Python containers in host code
# ---------------------------------------------------------------------------------------------

HEADER = '''
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def copy_kernel(x_ptr, out_ptr):
    tl.store(out_ptr, tl.load(x_ptr))

'''


def solution(forward_body: str, extra: str = "", init_body: str = "pass") -> str:
    """A minimal solution: `extra` at module level, then ModelNew with the given bodies."""
    return HEADER + textwrap.dedent(extra) + textwrap.dedent(f'''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{textwrap.indent(textwrap.dedent(init_body), " " * 8)}

    def forward(self, x, y):
{textwrap.indent(textwrap.dedent(forward_body), " " * 8)}
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out)
        return out
''')


@pytest.mark.parametrize("extra, init_body, call", [
    ("SEEN = set()", "pass", "SEEN.add(x.shape)"),
    ("SEEN = {0}", "pass", "SEEN.add(x.shape)"),
    ("SEEN = {n for n in range(3)}", "pass", "SEEN.add(x.shape)"),
    ("SEEN: set = set()", "pass", "SEEN.add(x.shape)"),
    ("", "self.seen = set()", "self.seen.add(x.shape)"),
    ("", "self.counts = dict()", "self.counts.update({x.shape: 1})"),
    ("", "self.sizes = []", "self.sizes.append(x.numel())"),
], ids=["set-call", "set-literal", "set-comprehension", "annotated", "self-set", "self-dict", "self-list"])
def test_container_methods_in_host_code_are_accepted(extra, init_body, call):
    assert violations_of(solution(call, extra, init_body)) == []


# Each cheat calls `.add` on what is really a tensor while the source also shows a set by
# that name somewhere; each must stay a TORCH_COMPUTE violation at the `.add(` line.
CONTAINER_CHEATS = {
    "tensor-receiver": ("", "pass", "x.add(y)"),
    "rebound-local": ("acc = set()", "pass", "acc = x\nacc.add(y)"),
    "rebound-in-loop": ("acc = set()", "pass", "for acc in (x,):\n    acc.add(y)"),
    "rebound-by-walrus": ("acc = set()", "pass", "(acc := x)\nacc.add(y)"),
    "parameter-shadows": ("acc = set()\ndef helper(acc, y):\n    return acc.add(y)", "pass", "helper(x, y)"),
    "attribute-set-elsewhere": (
        "class Holder:\n    def __init__(self):\n        self.acc = set()\n"
        "    def push(self, y):\n        return self.acc.add(y)",
        "self.holder = Holder()", "self.holder.acc = x\nself.holder.push(y)"),
    "registered-buffer": ("class Holder:\n    def __init__(self):\n        self.acc = set()",
                          "self.register_buffer('acc', torch.zeros(4))", "self.acc.add(y)"),
    "setattr-literal": ("class Holder:\n    def __init__(self):\n        self.acc = set()",
                        "setattr(self, 'acc', torch.zeros(4))", "self.acc.add(y)"),
    "class-attribute": ("class Holder(nn.Module):\n    acc = torch.zeros(4)\n"
                        "    def push(self, y):\n        return self.acc.add(y)\n"
                        "def make():\n    h = Holder()\n    h.acc = set()\n    return h",
                        "pass", "make().push(y)"),
    "shadowed-set": ("def set():\n    return torch.zeros(4)\nacc = set()", "pass", "acc.add(y)"),
    "tensor-attribute-name": ("class Holder:\n    def __init__(self):\n        self.data = set()\n"
                              "def push(self, y):\n    return self.data.add(y)", "pass", "push(x, y)"),
}


@pytest.mark.parametrize("extra, init_body, body", CONTAINER_CHEATS.values(), ids=CONTAINER_CHEATS.keys())
def test_tensor_add_behind_a_container_name_is_still_flagged(extra, init_body, body):
    found = violations_of(solution(body, extra, init_body))
    assert any(rule is Rule.TORCH_COMPUTE and ".add(" in line for rule, line in found), found


def test_runtime_guard_backs_the_static_rule_for_computed_names():
    """A name the source cannot show (built from strings) is out of static reach; the guard still
    sees the tensor add it runs."""

    class Holder:
        def __init__(self):
            self.acc = set()

        def push(self, y):
            return self.acc.add(y)

    class Sneaky(torch.nn.Module):
        def forward(self, x, y):
            holder = Holder()
            setattr(holder, "a" + "cc", x)
            return holder.push(y)

    guard = RuntimeGuard()
    with torch.no_grad(), guard:
        Sneaky()(torch.ones(4), torch.ones(4))
    assert Rule.TORCH_COMPUTE in {v.rule for v in guard.violations}


# ---------------------------------------------------------------------------------------------
# 3. Dtype tables
# ---------------------------------------------------------------------------------------------

TABLE = "_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}"


@pytest.mark.parametrize("extra, init_body, body", [
    (TABLE, "pass", "pass"),
    (TABLE, "pass", "dtype = _DTYPES[x.dtype]"),
    (TABLE, "pass", "dtype = _DTYPES.get(x.dtype, tl.float32)"),
    (TABLE, "pass", "assert x.dtype in _DTYPES"),
    ("", "self.dtypes = {torch.float32: tl.float32, torch.float16: tl.float16}", "d = self.dtypes[x.dtype]"),
    ("", "pass", "d = {torch.float32: tl.float32, torch.float16: tl.float16}[x.dtype]"),
    ("_WIDEN = {torch.float16: torch.float32, torch.float32: torch.float32}", "pass", "d = _WIDEN[x.dtype]"),
], ids=["unused", "subscript", "get", "membership", "self-table", "inline", "widening"])
def test_dtype_tables_are_accepted(extra, init_body, body):
    assert violations_of(solution(body, extra, init_body)) == []


# Each cheat gets float16 out of a table without naming it where it computes.
TABLE_CHEATS = {
    # The table itself downgrades: looking up a float32 input's dtype yields float16.
    "narrowing-entry": ("_DTYPES = {torch.float32: torch.float16}", "x = x.to(_DTYPES[x.dtype])"),
    # A faithful table whose keys are read out by iteration instead of lookup.
    "iterated-keys": (TABLE, "x = x.to(list(_DTYPES)[1])"),
    "items": (TABLE, "x = x.to([k for k, v in _DTYPES.items()][1])"),
    "aliased": (TABLE + "\nHALF = _DTYPES", "x = x.to(list(HALF)[1])"),
    "reached-by-string": (TABLE, "x = x.to(list(globals()['_DTYPES'])[1])"),
    # String keys: a literal lookup names no dtype at all.
    "string-keys": ("_DTYPES = {'half': torch.float16}", "x = x.to(_DTYPES['half'])"),
    "popitem": (TABLE, "x = x.to(_DTYPES.popitem()[0])"),
}


@pytest.mark.parametrize("extra, body", TABLE_CHEATS.values(), ids=TABLE_CHEATS.keys())
def test_low_precision_escaping_a_table_is_still_flagged(extra, body):
    rules = {rule for rule, _ in violations_of(solution(body, extra))}
    assert Rule.PRECISION in rules


@pytest.mark.parametrize("body", [
    "x = x.to(torch.float16)",
    "x = torch.empty(4, dtype=torch.float16)",
    "x = x.half()",
    "x = x.to(dtype=tl.float16)",
], ids=["to", "constructor", "half", "triton-dtype"])
def test_computing_in_low_precision_is_still_flagged(body):
    found = violations_of(solution(body))
    assert [rule for rule, _ in found] == [Rule.PRECISION], found


def test_low_precision_cast_inside_a_kernel_is_still_flagged_next_to_a_table():
    source = solution("pass", TABLE + textwrap.dedent('''

        @triton.jit
        def cast_kernel(x_ptr, out_ptr):
            tl.store(out_ptr, tl.load(x_ptr).to(tl.float16))
    '''))
    found = violations_of(source)
    assert [rule for rule, _ in found] == [Rule.PRECISION], found
    assert "tl.float16))" in found[0][1]

