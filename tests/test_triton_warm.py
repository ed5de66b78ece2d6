"""The warm Triton cache of candidate processes: only trusted code writes it, and what candidates report
into it is checked (mkevolve/verify/triton_warm.py)."""

import json
import os
from pathlib import Path

import pytest

from mkevolve.config import RunConfig
from mkevolve.verify import triton_warm
from mkevolve.verify.candidate_run import parse_report
from mkevolve.verify.verifier import Verifier

KERNELS = Path(__file__).resolve().parents[1] / "scripts" / "kernels"

LAUNCH = "*fp32,*fp32,i32,constexpr"


def _report(**fields) -> dict:
    body = {"denials": [], "error": None, "violations": [], "launches": 1, "activities": [], "times_ms": [],
            "outputs": {}, "skipped": [], "changed_inputs": []}
    return body | fields


@pytest.mark.parametrize("reported, kept", [
    ([LAUNCH, "*bf16,i64"], [LAUNCH, "*bf16,i64"]),
    ([LAUNCH, "x); system(\"rm\"", 7, "", "*FP32"], [LAUNCH]),   # C text, non-strings, empty, capitals
    ("*fp32", []),                                               # not a list
    (None, []),
])
def test_only_lists_of_type_names_are_kept_from_a_report(reported, kept):
    assert parse_report(_report(launcher_signatures=reported)).launcher_signatures == kept


def test_a_report_without_the_field_still_parses():
    assert parse_report(_report()).launcher_signatures == []


def test_one_report_adds_at_most_max_reported_signatures():
    many = [f"*fp32,i{n}" for n in range(40)]
    assert len(triton_warm.valid_signatures(many)) == triton_warm.MAX_REPORTED


def test_learn_puts_new_signatures_first_and_keeps_the_store_bounded(tmp_path):
    triton_warm.learn(["*fp32,i32"], tmp_path)
    triton_warm.learn([LAUNCH, "*fp32,i32"], tmp_path)
    assert triton_warm.read_signatures(tmp_path) == [LAUNCH, "*fp32,i32"]
    triton_warm.learn([f"*fp16,i{n}" for n in range(2 * triton_warm.MAX_SIGNATURES)], tmp_path)
    assert len(triton_warm.read_signatures(tmp_path)) == triton_warm.MAX_SIGNATURES


def test_a_damaged_store_reads_as_empty_or_as_its_valid_part(tmp_path):
    (tmp_path / triton_warm.SIGNATURES_FILE).write_text("{not json")
    assert triton_warm.read_signatures(tmp_path) == []
    (tmp_path / triton_warm.SIGNATURES_FILE).write_text(json.dumps([LAUNCH, "a b", 3]))
    assert triton_warm.read_signatures(tmp_path) == [LAUNCH]


def test_the_copy_skips_triton_temporaries_and_the_store(tmp_path, monkeypatch):
    warm, own = tmp_path / "warm", tmp_path / "own"
    (warm / "KEY" / "tmp.pid_1_abc").mkdir(parents=True)
    (warm / "KEY" / "tmp.pid_1_abc" / "half.so").write_bytes(b"partial")
    (warm / "KEY" / "__triton_launcher.so").write_bytes(b"built")
    (warm / triton_warm.SIGNATURES_FILE).write_text("[]")
    monkeypatch.setenv(triton_warm.WARM_DIR_ENV, str(warm))
    triton_warm.copy_warm_cache(own)
    assert (own / "KEY" / "__triton_launcher.so").read_bytes() == b"built"
    assert not (own / "KEY" / "tmp.pid_1_abc").exists() and not (own / triton_warm.SIGNATURES_FILE).exists()
    (own / "KEY" / "__triton_launcher.so").write_bytes(b"changed by the candidate")
    assert (warm / "KEY" / "__triton_launcher.so").read_bytes() == b"built"   # a copy, not a link


def test_without_a_warm_cache_the_candidate_starts_empty(tmp_path, monkeypatch):
    monkeypatch.delenv(triton_warm.WARM_DIR_ENV, raising=False)
    triton_warm.copy_warm_cache(tmp_path / "own")
    assert (tmp_path / "own").is_dir() and not any((tmp_path / "own").iterdir())


def test_a_shared_folder_open_to_others_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setattr(triton_warm.tempfile, "gettempdir", lambda: str(tmp_path))
    shared = tmp_path / f"mkevolve-triton-warm-{os.getuid()}"
    assert triton_warm.warm_dir() == shared                       # created private: used
    shared.chmod(0o777)
    elsewhere = triton_warm.warm_dir()
    assert elsewhere != shared and elsewhere.is_dir() and not elsewhere.stat().st_mode & 0o077


def test_recorded_launchers_are_the_signatures_triton_built(monkeypatch):
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    built = []
    monkeypatch.setattr(driver, "make_launcher", lambda c, s, t: built.append(s) or "src", raising=False)
    seen = triton_warm.record_launchers()
    assert driver.make_launcher({}, {"x": "*fp32", "n": "i32", "B": "constexpr"}, None) == "src"
    driver.make_launcher({}, {"x": "*fp16"}, [])                          # no descriptors, as Triton 3.6 says
    driver.make_launcher({}, {"t": ("*fp32", "i32")}, None)               # a tuple: not recorded
    driver.make_launcher({}, {"d": "tensordesc<fp32[16]>"}, [None])        # a descriptor: not recorded
    assert seen == ["*fp32,i32,constexpr", "*fp16"] and len(built) == 4


def test_a_launcher_that_cannot_be_built_is_logged_not_raised(monkeypatch, capsys):
    driver = pytest.importorskip("triton.backends.nvidia.driver")

    def refuse(constants, signature, tensordesc_meta):
        raise KeyError(signature[0])

    monkeypatch.setattr(driver, "make_launcher", refuse, raising=False)
    triton_warm.build_launchers(["*fp99"])
    assert "no launcher for *fp99" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_launcher_is_built_from_a_learned_signature(tmp_path, monkeypatch):
    from triton.backends.nvidia import driver

    if not hasattr(driver, "make_launcher"):
        pytest.skip("this Triton's launcher is generic: nothing is built per signature")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    triton_warm.build_launchers([LAUNCH])
    assert list(tmp_path.rglob("__triton_launcher*"))


@pytest.mark.gpu
def test_a_checked_candidate_teaches_the_store_its_signatures():
    from triton.backends.nvidia import driver

    if not hasattr(driver, "make_launcher"):
        pytest.skip("this Triton's launcher is generic: nothing is built per signature")
    with Verifier(RunConfig(workers=1, trials=2, timeout=600.0)) as verifier:
        result = verifier.check_kernel(KERNELS / "silu_large.py", KERNELS / "silu_large_honest.py")
    assert result.passed, result.reason
    assert any(s.startswith("*fp32,*fp32") for s in triton_warm.read_signatures(triton_warm.warm_dir()))
