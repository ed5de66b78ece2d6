"""The parts of isolated evaluation that need no candidate: the raw-bytes wire, signed reports, the zygote,
the call plan."""

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mkevolve.verify.candidate_run import LATE_CALL_SETS, LATE_CALLS_UNTIMED, plan_calls
from mkevolve.verify.timing import MIN_TIMED_RUNS, TIMED_BUDGET_MS, TIMED_RUNS, WARMUP_RUNS, timing_done
from mkevolve.workers import wire
from mkevolve.workers.zygote import Zygote


# ---- value files ---------------------------------------------------------------------------------------------

def test_values_round_trip_with_dtypes_shapes_and_scalars(tmp_path):
    values = [torch.randn(3, 4), torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.zeros(0, 5),
              torch.tensor([True, False]), torch.randn(2, 2).to(torch.bfloat16), 7, 2.5, None, "mean",
              (3, [1, 2]), torch.float16, torch.randn(4, 4).t(),
              torch.tensor(2.5), torch.tensor(3, dtype=torch.int64)]   # 0-d: a loss, a batch counter
    wire.write_values(tmp_path / "v.mkv", values)
    back = wire.read_values(tmp_path / "v.mkv")
    assert len(back) == len(values)
    for a, b in zip(values, back):
        if isinstance(a, torch.Tensor):
            assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a.contiguous(), b)
        else:
            assert a == b and type(a) is type(b)


@pytest.mark.parametrize("values", [
    [torch.ones(3)],
    [torch.randn(3, 1000), torch.tensor(2.5), torch.zeros(0), "text", (torch.arange(7, dtype=torch.int64), None)],
])
def test_digest_matches_the_file(tmp_path, values):
    """The digest, hashed from memory on a side thread while the file is written, is the written file's."""
    digest = wire.write_values(tmp_path / "v.mkv", values)
    assert digest == wire.file_digest(tmp_path / "v.mkv")


def test_tensors_are_aligned_and_read_without_a_second_copy(tmp_path):
    values = [torch.ones(3, dtype=torch.int8), torch.randn(5, dtype=torch.float64), torch.randn(7)]
    wire.write_values(tmp_path / "v.mkv", values)
    back = wire.read_values(tmp_path / "v.mkv")
    offsets = [t.data_ptr() - back[0].data_ptr() for t in back]
    assert offsets == [0, 64, 128]  # one buffer: each tensor starts on its own 64-byte boundary
    assert all(torch.equal(a, b) for a, b in zip(values, back))


def test_an_unaligned_file_is_still_read(tmp_path):
    tensor = {"t": "tensor", "dtype": "float32", "shape": [2], "offset": 1, "nbytes": 8}
    header = {"value": {"t": "list", "items": [tensor]}}
    path = _file(tmp_path, header, b"\0" + struct.pack("<2f", 1.5, -2.0))
    assert wire.read_values(path)[0].tolist() == [1.5, -2.0]


def test_meta_reads_shapes_from_the_header_alone(tmp_path):
    wire.write_values(tmp_path / "v.mkv", [torch.zeros(2, 3), 4, torch.zeros(5, dtype=torch.int64)])
    meta = wire.read_values(tmp_path / "v.mkv", "meta")
    assert [v.shape if isinstance(v, torch.Tensor) else v for v in meta] == [(2, 3), 4, (5,)]
    assert meta[0].device.type == "meta" and meta[2].dtype == torch.int64
    truncated = tmp_path / "short.mkv"
    truncated.write_bytes((tmp_path / "v.mkv").read_bytes()[:-40])  # the last tensor's bytes cut off
    with pytest.raises(wire.WireError, match="do not match"):
        wire.read_values(truncated, "meta")


def test_objects_other_than_plain_values_cannot_be_sent(tmp_path):
    class Sneaky(torch.Tensor):
        pass

    for value in (object(), torch.ones(2).as_subclass(Sneaky), (1, [2, {"a": 1}])):
        with pytest.raises(wire.WireError, match="can be sent"):
            wire.write_values(tmp_path / "v.mkv", [value])


def _file(tmp_path, header: dict, body: bytes = b"") -> str:
    blob = json.dumps(header).encode()
    path = tmp_path / "bad.mkv"
    path.write_bytes(wire.MAGIC + struct.pack("!I", len(blob)) + blob + body)
    return path


@pytest.mark.parametrize("header, body, message", [
    ({"value": {"t": "tensor", "dtype": "float32", "shape": [1000000], "offset": 0, "nbytes": 4000000}},
     b"\0" * 16, "do not match"),
    ({"value": {"t": "tensor", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 4}}, b"\0" * 8,
     "do not match"),
    ({"value": {"t": "tensor", "dtype": "object", "shape": [1], "offset": 0, "nbytes": 8}}, b"\0" * 8,
     "unknown dtype"),
    ({"value": {"t": "tensor", "dtype": "float32", "shape": [-1], "offset": 0, "nbytes": 4}}, b"\0" * 4,
     "bad shape"),
    ({"value": {"t": "pickle", "v": "cos\nsystem\n"}}, b"", "unknown value kind"),
    ({"value": {"t": "scalar", "v": {"a": 1}}}, b"", "scalar of type dict"),
    ({"nothing": 1}, b"", "no value"),
])
def test_malformed_value_files_are_refused_before_any_byte_is_trusted(tmp_path, header, body, message):
    with pytest.raises(wire.WireError, match=message):
        wire.read_values(_file(tmp_path, header, body))


def test_garbage_and_pickles_are_not_value_files(tmp_path):
    import pickle

    path = tmp_path / "p.mkv"
    path.write_bytes(pickle.dumps({"status": "ok"}))
    with pytest.raises(wire.WireError, match="not a value file"):
        wire.read_values(path)
    path.write_bytes(wire.MAGIC + struct.pack("!I", 1 << 30))
    with pytest.raises(wire.WireError, match="does not fit"):
        wire.read_values(path)


# ---- signed reports -------------------------------------------------------------------------------------------

def test_a_report_verifies_only_with_its_key_and_unchanged():
    key = b"k" * 32
    signed = wire.sign_report({"launches": 3, "times_ms": [[1.5]]}, key)
    assert wire.verify_report(signed, key) == {"launches": 3, "times_ms": [[1.5]]}
    with pytest.raises(wire.WireError, match="signature"):
        wire.verify_report(signed, b"x" * 32)
    tampered = signed.replace(b'"launches":3', b'"launches":4')
    assert tampered != signed
    with pytest.raises(wire.WireError, match="signature"):
        wire.verify_report(tampered, key)
    forged = json.dumps({"body": {"launches": 3}, "mac": "0" * 64}).encode()
    with pytest.raises(wire.WireError, match="signature"):
        wire.verify_report(forged, key)
    for junk in (b"\x80\x04garbage", b"[]", b'{"body": 1}'):
        with pytest.raises(wire.WireError):
            wire.verify_report(junk, key)


# ---- the zygote ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    log = tmp_path_factory.mktemp("zygote") / "zygote.log"
    z = Zygote(("tests.zygote_entries",), env=_env(), log_path=log)
    yield z
    z.close()


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return env


def test_each_child_is_a_fresh_process_in_its_own_session(zygote, tmp_path):
    outcomes = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.txt"
        exit = zygote.run("tests.zygote_entries:describe_self", str(out), tmp_path / "log", 30, 4096)
        assert exit.code == 0, exit.describe()
        outcomes.append(json.loads(out.read_text()))
    assert outcomes[0]["pid"] != outcomes[1]["pid"]
    for seen in outcomes:
        assert seen["sid"] == seen["pid"]          # a session leader: killing its group kills all it left
        assert seen["marker_before"] is None       # the other child's module state did not leak in
    assert zygote.alive


def test_a_hanging_child_is_killed_at_its_deadline_and_the_zygote_goes_on(zygote, tmp_path):
    started = time.monotonic()
    exit = zygote.run("tests.zygote_entries:hang", "", tmp_path / "log", 1.0, 4096)
    assert exit.timed_out and time.monotonic() - started < 10
    assert "time limit" in exit.describe()
    assert zygote.run("tests.zygote_entries:exit_with", "3", tmp_path / "log", 30, 4096).code == 3


def test_a_child_over_its_memory_limit_is_killed(zygote, tmp_path):
    exit = zygote.run("tests.zygote_entries:hog_memory", "", tmp_path / "log", 60, 300)
    assert exit.memory_exceeded and exit.peak_rss_mb > 300
    assert "host memory" in exit.describe()


def test_a_raising_entry_and_a_signal_are_reported_as_such(zygote, tmp_path):
    raised = zygote.run("tests.zygote_entries:raise_error", "", tmp_path / "log", 30, 4096)
    assert raised.code == 70 and "ValueError: on purpose" in (tmp_path / "log").read_text()
    killed = zygote.run("tests.zygote_entries:exit_with", "-9", tmp_path / "log", 30, 4096)
    assert killed.signal == 9 and "SIGKILL" in killed.describe()


def _processes_with(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and token.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def test_the_next_child_prepares_before_its_request_and_leaves_with_the_zygote(tmp_path):
    token = f"MKEVOLVE_ZYGOTE_TEST_{os.getpid()}_{time.monotonic_ns()}"
    env = dict(_env(), **{token: "1"})
    z = Zygote(("tests.zygote_entries",), env=env, log_path=tmp_path / "z.log",
               standby="tests.zygote_entries:prepare")
    try:
        seen = []
        for n in range(2):
            time.sleep(0.5)  # the standby child is forked and prepared meanwhile
            asked = time.time()
            out = tmp_path / f"{n}.json"
            assert z.run("tests.zygote_entries:report_state", str(out), tmp_path / "log", 30, 4096).code == 0
            seen.append((asked, json.loads(out.read_text())))
        for asked, child in seen:
            assert child["state"]["prepared_pid"] == child["pid"]     # the same process, prepared earlier
            assert child["state"]["at"] < asked                        # before its request existed
            assert child["state"]["prepared_sid"] != child["pid"]      # in the zygote's group until then
            assert child["sid"] == child["pid"]                        # its own session once it runs
        assert _processes_with(token)                                  # zygote and the next standby child
    finally:
        z.close()
    deadline = time.monotonic() + 5
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(token) == []


def test_a_request_right_after_another_finds_a_child_prepared_before_either(tmp_path):
    """A worker's second candidate of a beam step comes as soon as its first ends: it must not wait for a
    standby forked when the first was taken (5 to 10 s on a GPU)."""
    z = Zygote(("tests.zygote_entries",), env=_env(), log_path=tmp_path / "z.log",
               standby="tests.zygote_entries:prepare")
    try:
        time.sleep(0.5)  # both waiting children are forked and prepared meanwhile
        first_asked = time.time()
        children = []
        for n in range(3):   # the third child is forked when the first request is taken
            out = tmp_path / f"{n}.json"
            assert z.run("tests.zygote_entries:report_state", str(out), tmp_path / "log", 30, 4096).code == 0
            children.append(json.loads(out.read_text()))
        assert children[0]["state"]["at"] < children[1]["state"]["at"]  # forked once the first had prepared
        assert children[1]["state"]["at"] < first_asked                 # prepared before the first request
        assert children[2]["state"]["at"] > first_asked                 # replaces the first, once taken
        assert len({child["pid"] for child in children}) == 3
    finally:
        z.close()


@pytest.mark.slow
def test_a_zygote_started_early_is_the_one_the_first_candidate_uses(monkeypatch):
    """start_in_background (a GPU worker's first preload) returns before the zygote is up; whoever asks next
    waits for that same zygote rather than starting a second one."""
    from mkevolve.verify import candidate_zygote

    monkeypatch.setattr(candidate_zygote, "_zygote", None)
    started = []
    real = candidate_zygote.Zygote

    def counting(*args, **kwargs):
        started.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(candidate_zygote, "Zygote", counting)
    before = time.monotonic()
    candidate_zygote.start_in_background()
    returned = time.monotonic()
    try:
        zygote = candidate_zygote.running_zygote()
        assert zygote.alive and candidate_zygote.running_zygote() is zygote
        assert len(started) == 1 and returned - before < 0.5   # the zygote's imports alone take seconds
    finally:
        candidate_zygote.forget_zygote()


_FIRST_USE_PROBE = """
import json, sys
from pathlib import Path
from mkevolve.verify import candidate_run, candidate_zygote
from mkevolve.workers import background

candidate_zygote.start_in_background()
candidate_run.warm_worker_early()
background.wait_for_imports()
for thread in candidate_zygote.warming:
    thread.join()
worker = {name: name in sys.modules for name in candidate_zygote.FIRST_USE_IMPORTS}
out = Path(sys.argv[1])
request = json.dumps({"out": str(out / "child.json"), "modules": list(candidate_zygote.FIRST_USE_IMPORTS)})
zygote = candidate_zygote.running_zygote()
exit = zygote.run("tests.zygote_entries:report_modules", request, out / "child.log", 60, 4096)
print(json.dumps({"worker": worker, "child": json.loads((out / "child.json").read_text()), "code": exit.code}))
candidate_zygote.forget_zygote()
"""


@pytest.mark.slow
def test_workers_and_candidate_processes_have_torchs_first_use_imports_done_before_a_job_needs_them(tmp_path):
    """torch imports torch._dynamo on first use of a dispatch mode or the profiler (4.7 s on the H200): the
    worker's warm-up imports it, and each candidate process finds it imported by the zygote."""
    done = subprocess.run([sys.executable, "-c", _FIRST_USE_PROBE, str(tmp_path)], capture_output=True, text=True,
                          env=_env(), timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 0
    assert seen["worker"] == {"torch._dynamo": True}
    assert seen["child"] == {"torch._dynamo": True}


# ---- the call plan ---------------------------------------------------------------------------------------------

def test_untimed_plan_checks_every_call_and_puts_trial_zero_first():
    plan = plan_calls(5, timed=False, on_gpu=False, rng=random.Random(1))
    assert plan.length == 5 + LATE_CALLS_UNTIMED
    assert plan.calls[0].inputs == "trial0"
    assert [c.trial for c in plan.checks if c.trial is not None] == [0, 1, 2, 3, 4]
    assert len(plan.checks) == plan.length and all(c.guard for c in plan.calls)
    assert set(plan.set_names()) == {f"trial{i}" for i in range(5)} | set(LATE_CALL_SETS)
    late = [c.inputs for c in plan.calls if not c.inputs.startswith("trial")]
    assert late[-1] == late[0] and late[-1] != late[-2]     # one repeat of seen inputs, never twice in a row


def test_output_names_are_unique_across_the_configs_of_one_process():
    plans = [plan_calls(3, timed=False, on_gpu=False, rng=random.Random(0), prefix=f"config{i}_") for i in range(2)]
    names = [c.save for plan in plans for c in plan.calls if c.save]
    assert len(names) == len(set(names)) == 2 * (3 + LATE_CALLS_UNTIMED)


def test_timed_plan_hides_trials_among_timed_calls_and_checks_two_timed_outputs():
    positions = set()
    for seed in range(20):
        plan = plan_calls(5, timed=True, on_gpu=True, rng=random.Random(seed))
        assert plan.length == 5 + WARMUP_RUNS + TIMED_RUNS
        assert sum(c.timed for c in plan.calls) == TIMED_RUNS
        late = [c for c in plan.checks if c.trial is None]
        last_timed = max(i for i, c in enumerate(plan.calls) if c.timed)
        assert len(late) in (1, 2) and plan.calls[last_timed].save is not None
        assert all(plan.calls[c.call - 1].timed for c in late)
        assert [c.guard for c in plan.calls] == [c.inputs.startswith("trial") for c in plan.calls]
        positions.add(tuple(i for i, c in enumerate(plan.calls) if c.inputs.startswith("trial")))
    assert len(positions) > 10  # the trials move: a call counter cannot know which calls are read


class _FixedClock:
    """Stands in for the harness's GPU clock: every call takes `ms`."""

    def __init__(self, ms: float):
        self.ms = ms

    def start(self) -> None:
        pass

    def stop(self) -> float:
        return self.ms


@pytest.mark.parametrize("call_ms, timed", [(1.0, TIMED_RUNS), (TIMED_BUDGET_MS / 10, MIN_TIMED_RUNS)])
def test_slow_forwards_are_timed_fewer_times_but_every_checked_call_still_runs(call_ms, timed):
    from mkevolve.verify import harness
    from mkevolve.verify.harness import CandidateRequest

    plan = plan_calls(5, timed=True, on_gpu=True, rng=random.Random(3))
    seen = []

    class Echo(torch.nn.Module):
        def forward(self, x):
            seen.append(float(x[0]))
            return x * 2

    inputs = {name: [torch.full((3,), float(i))] for i, name in enumerate(plan.set_names())}
    request = CandidateRequest(solution=__file__, candidate_dir="", scratch="", key="", device="cpu",
                               eval_mode=False, construct_seed=0, configs=[])
    plan.keep_state(["bn.running_mean"])
    report = {"violations": [], "launches": 0, "times_ms": [[]], "skipped": [[]]}
    saved = harness._SavedOutputs("", report)
    kept = harness._KeptArguments()
    harness._run_calls(request, Echo(), plan.calls, inputs, _FixedClock(call_ms), report, saved,
                       harness._precision_state(), kept)
    times = report["times_ms"][0]
    # the two checked timed calls run even after the median is settled, and are timed as well
    assert timed <= len(times) <= timed + 2 and timing_done(times)
    checked = {c.save for c in plan.checks}
    assert set(saved.waiting) == checked | {plan.state_name("first"), plan.state_name("last")}   # none skipped
    # every checked call's arguments and one drawn among the others, left as given
    assert len(kept.calls) == len(checked) + 1 and kept.changed() == []
    assert len(seen) == plan.length - (TIMED_RUNS - len(times))
    # the calls left out are reported by position, for the module state's replay: timed, nothing kept
    skipped = report["skipped"][0]
    assert len(skipped) == TIMED_RUNS - len(times)
    assert all(plan.calls[i].timed and plan.calls[i].save is None for i in skipped)


def _later_calls(kept, writes_in: set[int], calls: int = 5, checked: bool = True) -> None:
    """A config's first call and `calls - 1` later calls (checked ones, or only timed), each given a fresh copy
    holding its position; the forward writes into its argument in the calls `writes_in`."""
    given = [torch.zeros(4)]
    for position in range(calls):
        args = [given[0] + position]
        if position in writes_in:
            args[0].neg_()
        kept.add(0, [given[0] + position], args, [], first=position == 0, checked=checked)


def test_past_the_byte_budget_one_later_checked_call_per_config_is_still_compared(monkeypatch):
    """A full-size set passes the budget at once: a forward writing into its argument from its second call on
    was compared on its first call alone, and passed."""
    from mkevolve.verify import harness

    monkeypatch.setattr(harness, "_KEPT_ARGUMENT_BYTES", 0)
    kept = harness._KeptArguments()
    _later_calls(kept, writes_in={1, 2, 3, 4})
    assert len(kept.calls) == 2 and kept.changed() == [[0, 0]]     # the first call and one drawn later call

    # the draw is a reservoir: the k-th later call replaces the kept one when the draw below k gives 0
    for draw, caught in ((lambda n: 0, True), (lambda n: 1, False)):
        monkeypatch.setattr(harness, "_draw_below", draw)
        kept = harness._KeptArguments()
        _later_calls(kept, writes_in={4})                          # writes only in its last call
        assert (kept.changed() == [[0, 0]]) is caught


def test_a_forward_that_writes_into_its_argument_only_in_unchecked_calls_is_caught():
    """Which calls are checked can be read in the candidate's process; the drawn call cannot be known before
    it ends. Within the budget, the checked calls are kept and one of the others is drawn."""
    from mkevolve.verify import harness

    kept = harness._KeptArguments()
    _later_calls(kept, writes_in={1, 2, 3, 4}, checked=False)
    assert len(kept.calls) == 2 and kept.changed() == [[0, 0]]


def test_the_later_call_kept_past_the_budget_is_drawn_uniformly(monkeypatch):
    from mkevolve.verify import harness

    monkeypatch.setattr(harness, "_KEPT_ARGUMENT_BYTES", 0)
    counts = {position: 0 for position in range(1, 5)}
    for _ in range(400):
        kept = harness._KeptArguments()
        _later_calls(kept, writes_in=set())
        counts[int(kept.calls[1].given[0][0])] += 1
    assert all(50 <= n <= 150 for n in counts.values()), counts  # 100 expected each; 50 is 5.8 sd away


# ---- the harness after the candidate's import: only what it bound before -----------------------------------

def test_harness_copies_ignore_patched_tensor_methods_and_modes(monkeypatch):
    from torch.overrides import TorchFunctionMode

    from mkevolve.verify import harness

    called = []
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: called.append("clone") or self)

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            called.append(getattr(func, "__name__", "?"))
            return func(*args, **(kwargs or {}))

    x = torch.arange(4.0)
    with Spy():
        copy = harness._copies([x, 3])
        kept = harness._snapshot([x], {"violations": []}, already_checked=False)
    assert called == []
    assert torch.equal(copy[0], x) and copy[0].data_ptr() != x.data_ptr() and copy[1] == 3
    assert kept[0].data_ptr() not in (x.data_ptr(), copy[0].data_ptr())


def test_harness_flattens_a_dict_output_by_its_values_without_calling_its_methods():
    from mkevolve.problem import flatten_outputs
    from mkevolve.verify import harness

    class Record(dict):          # a model-output record whose own methods lie
        def values(self):
            raise AssertionError("the record's values() ran")

        def __iter__(self):
            raise AssertionError("the record's __iter__ ran")

    a, b, c = torch.ones(2), torch.zeros(3), torch.full((1,), 7.0)
    flat = harness._flatten((Record(logits=a, hidden=[b, c]), a))
    assert [t.shape for t in flat] == [(2,), (3,), (1,), (2,)]
    # the same order as the reference's flattening of a plain dict
    assert [t.shape for t in flatten_outputs(({"logits": a, "hidden": [b, c]}, a))] == [t.shape for t in flat]


def test_module_buffers_are_read_from_the_modules_own_dicts():
    from mkevolve.verify import harness

    class Liar(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("kept", torch.ones(2))
            self.inner = torch.nn.BatchNorm1d(3)
            self.inner_again = self.inner                     # shared: its buffers count once
            self.loose = torch.zeros(4)                       # not registered: not the module's state

    def refuse(*args, **kwargs):
        raise AssertionError("the module's own methods ran")

    model = Liar()
    Liar.named_buffers, Liar.__getattr__, Liar.__getattribute__ = refuse, refuse, refuse   # once it is built
    found = harness._module_buffers(model)
    assert sorted(tuple(t.shape) for t in found) == [(), (2,), (3,), (3,)]   # kept; running mean, var, count


def test_harness_reports_a_tensor_subclass_output_without_calling_it():
    from mkevolve.verify import harness

    class Sneaky(torch.Tensor):
        def clone(self, *args, **kwargs):
            raise AssertionError("the harness ran the candidate's method")

    report = {"violations": []}
    kept = harness._snapshot([torch.ones(2).as_subclass(Sneaky), 5], report, already_checked=False)
    assert kept == [5]
    assert [v["rule"] for v in report["violations"]] == ["tensor-subclass"]


def test_inputs_and_kept_outputs_pass_through_the_host_a_few_gigabytes_at_a_time(monkeypatch):
    """Eight 2.2 GB input sets or outputs at once took a candidate past its host memory: groups hold at most
    _HOST_BATCH_BYTES (one larger goes alone) and _SAVERS items; every item is in one group, in order."""
    from mkevolve.verify import harness

    monkeypatch.setattr(harness, "_HOST_BATCH_BYTES", 100)
    monkeypatch.setattr(harness, "_SAVERS", 3)
    sizes = {"a": 40, "b": 40, "c": 40, "d": 400, "e": 4, "f": 4, "g": 4, "h": 4}
    assert harness._host_batches(sizes) == [["a", "b"], ["c"], ["d"], ["e", "f", "g"], ["h"]]


def test_kept_outputs_are_written_with_their_digests_and_errors_named(tmp_path, monkeypatch):
    """Copied to the host, then written and hashed with the GPU lent: each file reads back as what was kept,
    under the digest reported; a value the wire cannot carry is that output's error, not a crash."""
    from mkevolve.verify import harness

    monkeypatch.setattr(harness, "_SAVERS", 2)
    saved = {"a": [torch.arange(6.0).reshape(2, 3), 3], "b": [torch.ones(4, dtype=torch.float64)],
             "c": [torch.ones(2), object()]}
    outputs = harness._SavedOutputs(str(tmp_path), {"phases": {}})
    for name, values in saved.items():
        outputs.keep(name, values)
    outputs.save()
    entries = outputs.entries
    assert list(entries) == ["a", "b", "c"]
    for name in ("a", "b"):
        data = (tmp_path / entries[name]["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entries[name]["sha256"]
        back = wire.read_values(tmp_path / entries[name]["file"])
        assert all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(back, saved[name]))
    assert set(entries["c"]) == {"error"} and "can be sent" in entries["c"]["error"]


def test_kept_outputs_past_the_waiting_budget_are_saved_at_once(tmp_path, monkeypatch):
    """Seven 2 GB outputs kept on the GPU to the end made a 16 GB process: past _WAITING_OUTPUT_BYTES the
    waiting ones are saved then, and each output is reported once, whenever it was saved."""
    from mkevolve.verify import harness

    monkeypatch.setattr(harness, "_WAITING_OUTPUT_BYTES", 100)
    report = {"phases": {}}
    saved = harness._SavedOutputs(str(tmp_path), report)
    saved.keep("a", [torch.zeros(10)])              # 40 bytes wait
    saved.keep("b", [torch.ones(10), 7])            # 80
    assert list(saved.waiting) == ["a", "b"] and saved.entries == {}
    saved.keep("c", [torch.full((10,), 2.0)])       # 120: all three are saved
    assert saved.waiting == {} and saved.waiting_bytes == 0 and list(saved.entries) == ["a", "b", "c"]
    saved.keep("d", [torch.full((3,), 3.0)])
    assert list(saved.waiting) == ["d"]
    saved.save()
    assert list(saved.entries) == ["a", "b", "c", "d"] and "save" in report["phases"]
    back = wire.read_values(tmp_path / saved.entries["b"]["file"])
    assert torch.equal(back[0], torch.ones(10)) and back[1] == 7


def test_only_the_harness_s_own_copies_to_the_host_are_left_out_of_the_profile():
    """Outputs saved while the profiler records are copied to the host by the harness: that many copies leave
    the names the trusted side reads, and a further one (the forward's `.cpu()`) stays, to be rejected."""
    from mkevolve.verify import harness

    copy = harness._HOST_COPY_NAME
    names = ["k", copy, "Memcpy HtoD (Pageable -> Device)", copy, "k", copy]
    assert harness._without_own_copies(names, 2) == ["k", "Memcpy HtoD (Pageable -> Device)", "k", copy]
    assert harness._without_own_copies(names, 3).count(copy) == 0
    assert harness._without_own_copies(names, 0) == names


def test_saves_between_calls_write_in_the_background_and_the_last_one_waits_with_the_gpu_lent(tmp_path,
                                                                                              monkeypatch):
    """Outputs saved between timed calls are copied under the hold alone and written by threads while the
    calls go on: keep() returns with the write still running and the hold still alone (taking it back had
    cost seconds a candidate). The last save waits for every write with the hold given up, and each output is
    reported, in the order kept, with the file it was written to. (A save waits for the last batch's writes
    before its own copies without giving up its hold: they had the calls' time to finish.)"""
    import threading

    from mkevolve.verify import harness
    from mkevolve.workers import gpu_share

    monkeypatch.setenv(gpu_share.LOCK_ENV, str(tmp_path / "lock" / "gpu0"))
    monkeypatch.setattr(gpu_share, "_shares", {})
    monkeypatch.setattr(harness, "_WAITING_OUTPUT_BYTES", 10)
    let_write, writing = threading.Event(), threading.Event()
    held_while_waiting = []
    write = harness._write

    def slow_write(scratch, name, host):
        writing.set()
        assert let_write.wait(10)
        return write(scratch, name, host)

    finish = harness._SavedOutputs._finish_writes

    def noting_the_hold(self):
        if self.writes.running:
            held_while_waiting.append(gpu_share.held_alone())
        finish(self)

    monkeypatch.setattr(harness, "_write", slow_write)
    monkeypatch.setattr(harness._SavedOutputs, "_finish_writes", noting_the_hold)
    saved = harness._SavedOutputs(str(tmp_path), {"phases": {}})
    with gpu_share.gpu_alone():
        saved.keep("a", [torch.ones(5)])                 # 20 bytes: saved at once, written in the background
        assert writing.wait(10) and saved.entries == {"a": None} and gpu_share.held_alone()
        saved.keep("b", [torch.zeros(1)])                # waits on the device
        let_write.set()
        saved.save()    # waits for a's write before b's copy, the hold kept; then for b's, the hold lent
        assert gpu_share.held_alone()
    assert held_while_waiting == [True, False]
    assert list(saved.entries) == ["a", "b"] and saved.writes.running == []
    for name, value in (("a", torch.ones(5)), ("b", torch.zeros(1))):
        assert torch.equal(wire.read_values(tmp_path / saved.entries[name]["file"])[0], value)


def test_an_output_whose_write_raises_is_reported_as_its_error(tmp_path, monkeypatch):
    from mkevolve.verify import harness

    def failing_write(scratch, name, host):
        raise OSError("disk gone")

    monkeypatch.setattr(harness, "_write", failing_write)
    saved = harness._SavedOutputs(str(tmp_path), {"phases": {}})
    saved.keep("a", [torch.ones(2)])
    saved.save()
    assert saved.entries == {"a": {"error": "OSError while saving"}}


def test_value_files_ignore_a_patched_tensor_property(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "dtype", property(lambda self: torch.float64), raising=False)
    wire.write_values(tmp_path / "v.mkv", [torch.ones(3, dtype=torch.float16)])
    monkeypatch.undo()
    assert wire.read_values(tmp_path / "v.mkv")[0].dtype == torch.float16


def test_own_builtins_survive_a_patched_builtin():
    import builtins

    from mkevolve.workers import harden

    namespace = {"len": "mine"}
    harden.own_builtins(namespace)
    original = builtins.isinstance
    builtins.isinstance = lambda *args: True  # restored at once: pytest itself needs the real one
    try:
        answer = namespace["isinstance"](1, str)
    finally:
        builtins.isinstance = original
    assert answer is False and namespace["len"] == "mine"


def test_harness_drops_the_package_from_sys_modules_before_the_import():
    import subprocess
    import sys

    code = ("import sys; from mkevolve.verify import harness; harness._forget_trusted_modules(); "
            "print(sorted(m for m in sys.modules if m == 'mkevolve' or m.startswith('mkevolve.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- the torch.compile baseline: measured once per key ------------------------------------------------------

@pytest.mark.slow
def test_concurrent_baselines_measure_once(tmp_path):
    """Four processes ask for one key at the same moment: one measures, the others read its result."""
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from mkevolve.verify.result import Timing\n"
        "from mkevolve.verify.timing import cached_baseline\n"
        "cache = Path(sys.argv[1])\n"
        "def measure():\n"
        "    with open(cache / 'measured', 'a') as log: log.write('x')\n"
        "    time.sleep(0.5)\n"
        "    return Timing(median_ms=2.0, p10_ms=1.0, p20_ms=1.5, p80_ms=2.5, p90_ms=3.0, runs=100)\n"
        "print(cached_baseline(cache, 'k', measure).median_ms)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outputs == ["2.0"] * 4
    assert (tmp_path / "measured").read_text() == "x"


def test_a_triton_compile_error_points_at_the_kernel_line(tmp_path):
    import ast

    from triton.compiler.errors import CompilationError

    from mkevolve.verify import harness

    solution = tmp_path / "solution.py"
    solution.write_text("import triton\n\n\n@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n"
                        "    offs = tl.arange(0, BLOCK)\n    y = tl.load(x_ptr + offs) @ 3\n")
    src = "def k(x_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n    y = tl.load(x_ptr + offs) @ 3\n"
    node = ast.parse("y").body[0]
    node.lineno = 3  # Triton counts from the kernel's def
    err = CompilationError(src, node, "ValueError('matmul needs 2-D operands')")
    message, line = harness._kernel_compile_error(err, str(solution))
    assert line == 7 and "`y = tl.load(x_ptr + offs) @ 3`" in message and "matmul needs 2-D" in message
    assert harness._kernel_compile_error(ValueError("plain"), str(solution)) is None


def test_timed_and_late_calls_get_shifts_of_their_own_and_their_checks_say_which():
    plan = plan_calls(5, timed=True, on_gpu=True, rng=random.Random(3))
    shifts = [c.shift for c in plan.calls if not c.inputs.startswith("trial")]
    assert all(c.shift == 0 for c in plan.calls if c.inputs.startswith("trial"))
    assert 0 not in shifts and len(set(shifts)) == len(shifts)            # no two calls see the same values
    by_save = {c.save: c.shift for c in plan.calls if c.save}
    assert all(check.shift == by_save[check.save] for check in plan.checks)


def test_the_harness_shifts_inputs_as_the_trusted_side_does():
    """The candidate's copies (TensorBase's C methods) and the reference's (problem.shifted_values) hold the
    same values, so a checked timed call is compared with the reference on its own inputs."""
    from mkevolve.problem import shifted_values
    from mkevolve.verify.harness import _shifted_copies

    values = [torch.randn(3, 5), torch.arange(6), torch.randn(4, 6).t(), 2.5, torch.randn(1)]
    for shift in (1, 7, 15, 16, 1 << 40):
        ours, theirs = _shifted_copies(values, shift), shifted_values(values, shift)
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(ours, theirs))
        assert ours[0].flatten()[0] == values[0].flatten()[shift % 15]          # moved toward the front
        assert torch.equal(ours[1], values[1]) and torch.equal(ours[2], values[2])  # ints, non-contiguous: as given
        assert ours[0].data_ptr() != values[0].data_ptr() and ours[1].data_ptr() != values[1].data_ptr()
    unshifted = _shifted_copies(values, 0)                                  # shift 0: plain copies
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(unshifted, values))
    assert all(torch.equal(a, b) for a, b in zip(shifted_values(values, 0), values) if isinstance(a, torch.Tensor))
