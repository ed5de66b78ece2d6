"""The on-disk records keep their format: state.json and a candidate's <id>.json written by earlier versions
load into the typed records (beams as Beam, statuses as enums), and a status outside its set is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mkevolve.run_state import RunState, StateError, SubkernelStatus
from mkevolve.search.beam import Beam, CandidateRecord, PromptKind
from mkevolve.solution import MANIFEST, EntryStatus, Manifest, SolutionError, SubkernelEntry
from mkevolve.verify.result import Status

# A beam member as state.json holds it; the judge, like the beam's exhausted/codeless/debug_rounds, came later.
OLD_MEMBER = {"id": "c0001", "subproblem": "relu", "parent": None, "kind": "generate", "source": "# kernel\n",
              "result": {"status": "ok", "reason": "", "speedup": 1.5},
              "tokens": {"prompt": 10, "completion": 20, "reasoning": 0}, "cached": False, "accepted": True}
OLD_BEAM = {"width": 4, "members": [OLD_MEMBER], "next_seq": 2, "input_shapes": ["(8, 16)"]}


def old_state(status: str = "failing") -> dict:
    record = {"index": 1, "refinement": "initial", "subproblems": ["relu", "conv"], "budget": {"relu": 2, "conv": 2},
              "subkernels": {"relu": {"status": "ok", "speedup": 1.5, "runtime_ms": None, "candidate": "c0001",
                                      "origin": "builtin", "precision": None, "reason": "", "candidates": 2},
                             "conv": {"status": status, "speedup": None, "runtime_ms": None, "candidate": None,
                                      "origin": "pytorch", "precision": None, "reason": "no kernel", "candidates": 2}},
              "e2e_status": "ok", "e2e_reason": "", "e2e_speedup": None, "runtime_ms": {}, "seconds": 1.0,
              "kept": True, "pytorch": ["conv"], "e2e_ran": True, "e2e_not_run": "", "asked": ""}
    return {"problem": "p.py", "run_id": "r", "iteration": 1, "step": "evaluated",
            "beams": {"relu": OLD_BEAM, "conv": {"width": 4, "members": [], "next_seq": 2, "input_shapes": None}},
            "beam_sources": {"relu": "h1", "conv": "h2"}, "evolved": ["relu", "conv"], "history": [record],
            "best_iteration": 1, "best_score": 1.0, "needs_total_fuse": False, "refinement": "initial",
            "asked": "", "budget": {"relu": 2, "conv": 2}, "made": {"relu": 2, "conv": 2}, "stop": "", "version": 1}


def test_an_old_state_file_loads_beams_as_beam_objects(tmp_path: Path):
    (tmp_path / "state.json").write_text(json.dumps(old_state()))
    state = RunState.load(tmp_path)
    relu, conv = state.beams["relu"], state.beams["conv"]
    assert isinstance(relu, Beam) and relu.best.id == "c0001" and relu.best.kind is PromptKind.GENERATE
    assert (relu.exhausted, relu.codeless, relu.debug_rounds, relu.best.judge) == (None, "", 0, None)
    assert conv.members == [] and conv.next_seq == 2
    assert state.history[0].subkernels["conv"].status is SubkernelStatus.FAILING
    assert state.history[0].subkernels["relu"].status is SubkernelStatus.OK


def test_state_json_keeps_its_format(tmp_path: Path):
    """Saved again, an old file reads back the same JSON, apart from the fields added since (defaults)."""
    (tmp_path / "state.json").write_text(json.dumps(old_state()))
    RunState.load(tmp_path).save(tmp_path)
    saved = json.loads((tmp_path / "state.json").read_text())
    expected = old_state()
    expected["beams"]["relu"].update(exhausted=None, codeless="", debug_rounds=0)
    expected["beams"]["relu"]["members"][0]["judge"] = None
    expected["beams"]["conv"].update(exhausted=None, codeless="", debug_rounds=0)
    record = expected["history"][0]
    record.update(e2e_error_vs_fp64=None, e2e_eager_error_vs_fp64=None)   # measured precision, added since
    for sub in record["subkernels"].values():
        sub.update(error_vs_fp64=None, eager_error_vs_fp64=None)
    assert saved["beams"]["relu"]["members"][0]["result"]["status"] == "ok"
    saved["beams"]["relu"]["members"][0]["result"] = OLD_MEMBER["result"]  # the verdict's defaults filled in
    assert saved == expected
    assert list(saved) == list(expected)  # the keys in the order earlier versions wrote them


def test_a_subkernel_status_outside_the_set_is_refused_on_load(tmp_path: Path):
    (tmp_path / "state.json").write_text(json.dumps(old_state(status="passing")))
    with pytest.raises(StateError) as err:
        RunState.load(tmp_path)
    message = str(err.value)
    assert "state.json" in message and "'conv'" in message and "unknown status 'passing'" in message
    assert "'ok', 'failing'" in message


def test_an_old_candidate_record_loads(tmp_path: Path):
    """A record as evolve wrote it before the judge: the code in <id>.py beside it, "source" naming that file."""
    record = {**OLD_MEMBER, "source": "c0001.py", "problem_sha256": "abc"}
    (tmp_path / "c0001.json").write_text(json.dumps(record, indent=1))
    (tmp_path / "c0001.py").write_text("# kernel\n")
    loaded = CandidateRecord.read(tmp_path / "c0001.json")
    assert loaded.problem_sha256 == "abc" and loaded.reply_excerpt is None and loaded.ported_from is None
    assert loaded.candidate.source == "# kernel\n" and loaded.candidate.result.status is Status.OK
    assert loaded.candidate.judge is None and loaded.candidate.accepted is True
    loaded.write(tmp_path)
    assert json.loads((tmp_path / "c0001.json").read_text()) == {**record, "judge": None,
                                                                  "result": loaded.candidate.result.to_dict()}


def test_a_codeless_candidate_record_keeps_its_reply_excerpt(tmp_path: Path):
    record = {**OLD_MEMBER, "id": "c0002", "source": None, "problem_sha256": "abc", "reply_excerpt": "no code"}
    (tmp_path / "c0002.json").write_text(json.dumps(record))
    loaded = CandidateRecord.read(tmp_path / "c0002.json")
    assert loaded.candidate.source == "" and loaded.reply_excerpt == "no code"
    assert loaded.to_dict()["source"] is None and loaded.to_dict()["reply_excerpt"] == "no code"


def test_a_manifest_status_outside_the_set_is_refused(tmp_path: Path):
    Manifest(problem="p.py", device="cpu", status="ok",
             subkernels={"relu": SubkernelEntry(origin="builtin"),
                         "conv": SubkernelEntry(origin="pytorch", status=EntryStatus.PYTORCH)}).write(tmp_path)
    written = yaml.safe_load((tmp_path / MANIFEST).read_text())
    assert [e["status"] for e in written["subkernels"].values()] == ["ok", "pytorch"]  # plain strings, as before
    assert Manifest.read(tmp_path).subkernels["conv"].status is EntryStatus.PYTORCH
    written["subkernels"]["conv"]["status"] = "failing"
    (tmp_path / MANIFEST).write_text(yaml.safe_dump(written))
    with pytest.raises(SolutionError, match="unknown status 'failing'"):
        Manifest.read(tmp_path)
