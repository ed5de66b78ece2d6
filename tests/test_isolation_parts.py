"""The parts of isolated evaluation that need no candidate: the raw-bytes wire, signed reports, the zygote,
the call plan."""

import json
import os
import random
import struct
import time
from pathlib import Path

import pytest
import torch

from mkevolve.verify.candidate_run import LATE_CALLS_UNTIMED, TIMING_SETS, plan_calls
from mkevolve.verify.timing import TIMED_RUNS, WARMUP_RUNS
from mkevolve.workers import wire
from mkevolve.workers.zygote import Zygote


# ---- value files ---------------------------------------------------------------------------------------------

def test_values_round_trip_with_dtypes_shapes_and_scalars(tmp_path):
    values = [torch.randn(3, 4), torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.zeros(0, 5),
              torch.tensor([True, False]), torch.randn(2, 2).to(torch.bfloat16), 7, 2.5, None, "mean",
              (3, [1, 2]), torch.float16, torch.randn(4, 4).t()]
    wire.write_values(tmp_path / "v.mkv", values)
    back = wire.read_values(tmp_path / "v.mkv")
    assert len(back) == len(values)
    for a, b in zip(values, back):
        if isinstance(a, torch.Tensor):
            assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a.contiguous(), b)
        else:
            assert a == b and type(a) is type(b)


def test_digest_matches_the_file(tmp_path):
    digest = wire.write_values(tmp_path / "v.mkv", [torch.ones(3)])
    assert digest == wire.file_digest(tmp_path / "v.mkv")


def test_objects_other_than_plain_values_cannot_be_sent(tmp_path):
    with pytest.raises(wire.WireError, match="cannot be sent"):
        wire.write_values(tmp_path / "v.mkv", [object()])


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
    tampered = signed.replace(b'"launches": 3', b'"launches": 4')
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


# ---- the call plan ---------------------------------------------------------------------------------------------

def test_untimed_plan_checks_every_call_and_puts_trial_zero_first():
    plan = plan_calls(5, timed=False, on_gpu=False, rng=random.Random(1))
    assert plan.length == 5 + LATE_CALLS_UNTIMED
    assert plan.calls[0].inputs == "trial0"
    assert [c.trial for c in plan.checks if c.trial is not None] == [0, 1, 2, 3, 4]
    assert len(plan.checks) == plan.length and all(c.guard for c in plan.calls)
    assert set(plan.set_names()) == {f"trial{i}" for i in range(5)} | set(TIMING_SETS[:LATE_CALLS_UNTIMED])


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
