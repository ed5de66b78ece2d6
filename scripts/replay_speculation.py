"""How much wall time speculative evaluation saves: one search step of a replayed model, real checks.

    PYTHONPATH=. python3 scripts/replay_speculation.py --out scripts/results/speculation_replay_<device>_<date>.json

Four generations of `tests/fixtures/replay_kernels/relu_shift.py`, answered by a replay file the way a model
writes: a pause before the first token, then the reply line by line (the kernel first, then its
explanation). The same replies are replayed twice: streamed, so each kernel is checked once its code block
has closed, and whole, arriving at the moment the streamed reply ends. Checks are the real verifier's (on a
machine without a GPU, under the Triton interpreter). The difference of the two wall times is what
checking during the stream saves.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import triton

from mkevolve.agents.evolve import evolve_kernel
from mkevolve.config import RunConfig
from mkevolve.llm.client import make_client
from mkevolve.llm.parse import extract_code
from mkevolve.search.beam import Beam
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "replay_kernels"
PROBLEM = FIXTURES / "relu_shift.py"
REPLIES = ("refined.md", "debugged.md", "refined.md", "debugged.md")
EXPLANATION_LINES = 80  # after the kernel: about three quarters of each reply


def write_replay(folder: Path, first_token_s: float, stream_s: float, streamed: bool) -> Path:
    """The replay file: streamed replies, or whole ones that arrive when the streamed ones would end."""
    explanation = "".join(f"Line {i} of what the model says after its kernel.\n" for i in range(EXPLANATION_LINES))
    entries = []
    for sample, name in enumerate(REPLIES):
        reply = folder / f"reply{sample}.md"
        reply.write_text((FIXTURES / name).read_text() + explanation)
        timing = (f"delay_s: {first_token_s}, stream_s: {stream_s}" if streamed
                  else f"delay_s: {first_token_s + stream_s}")
        entries.append(f"  - {{agent: generate, sample: {sample}, {timing}, reply_file: {reply.name}}}\n")
    script = folder / ("streamed.yaml" if streamed else "whole.yaml")
    script.write_text("replies:\n" + "".join(entries))
    return script


def one_step(script: Path, verifier: Verifier, folder: Path) -> float:
    """Seconds for one search step of four generations, every reply checked."""
    config = RunConfig(model=f"replay:{script}", beam_width=len(REPLIES), search="parallel",
                       llm_parallel=len(REPLIES))
    started = time.perf_counter()
    beam = evolve_kernel("relu_shift", PROBLEM, Beam(width=len(REPLIES)), len(REPLIES), verifier,
                         make_client(config), config, folder)
    seconds = time.perf_counter() - started
    if not all(member.passed for member in beam.members):
        raise SystemExit(f"{script.name}: a replayed kernel failed its check, so the step is not comparable")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--first-token-s", type=float, default=2.0)
    parser.add_argument("--stream-s", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, Verifier(RunConfig(workers=args.workers, trials=2)) as verifier:
        warm = Path(tmp) / "warm.py"
        warm.write_text(extract_code((FIXTURES / "refined.md").read_text()))
        verifier.check_kernels([(PROBLEM, warm)] * args.workers)  # every worker started before either side is timed
        for streamed in (False, True):
            folder = Path(tmp) / ("streamed" if streamed else "whole")
            folder.mkdir()
            script = write_replay(folder, args.first_token_s, args.stream_s, streamed)
            rows["streamed" if streamed else "whole"] = round(one_step(script, verifier, folder / "candidates"), 2)
        device = verifier.device_name
    result = {"date": date.today().isoformat(), "device": device, "torch": torch.__version__,
              "triton": triton.__version__, "python": platform.python_version(), "workers": args.workers,
              "replies": len(REPLIES), "first_token_s": args.first_token_s, "stream_s": args.stream_s,
              "step_wall_s": rows, "saved_s": round(rows["whole"] - rows["streamed"], 2)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
