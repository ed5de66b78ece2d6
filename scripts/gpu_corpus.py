"""The attack corpus through `check` on a GPU, and what isolated evaluation costs per candidate.

Part 1 runs every file of tests/corpus (cheats, honest solutions, faults) through the verifier, timed,
and records whether each got the verdict its file declares. GPU-only cheats (kernels hidden from the
dispatcher, host copies, low-precision MMA, timing-phase behaviour) are judged here for real.

Part 2 takes KernelBench problems at full size, has the builtin agent write one solution for each
(`mkevolve solve --model builtin`), and checks copies of it that differ by a comment in each kernel
(so Triton compiles every one anew, as it does each new candidate of a search) with this tree and with
an older tree given by --old-tree (the design before isolated evaluation), one Verifier each. The
difference of their wall times after the first check is the per-candidate overhead of the new design.

    PYTHONPATH=. python3 scripts/gpu_corpus.py --out scripts/results/gpu_corpus_<gpu>_<date>.json \
        --kernelbench DIR --problems level2/63_Gemm_ReLU_Divide.py ... --old-tree DIR
    PYTHONPATH=. python3 scripts/gpu_corpus.py --out OUT.json --only precision honest   # part of the corpus
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import triton

from mkevolve.config import RunConfig
from mkevolve.verify.verifier import Verifier

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
REPEATS = 4  # default checks of one solution per tree; the first pays for references, baseline and compilation


def constants(path: Path) -> dict[str, object]:
    """The upper-case constants of a corpus file, read without importing it."""
    found = {}
    try:
        body = ast.parse(path.read_text()).body
    except SyntaxError:  # the syntax-error fault
        return found
    for node in body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    found[target.id] = node.value.value
    return found


def corpus_cases() -> list[dict]:
    cases = []
    for kind in ("cheats", "honest", "faults"):
        for path in sorted((CORPUS / kind).rglob("*.py")):
            meta = constants(path)
            if kind == "faults" and path.stem == "problem":
                continue
            problem = (CORPUS / "faults" / "problem.py" if kind == "faults" and "PROBLEM" not in meta
                       else CORPUS / "problems" / f"{meta.get('PROBLEM', path.stem)}.py")
            expected = meta.get("EXPECTED_STATUS") or {"cheats": "cheating", "honest": "ok"}.get(kind)
            rule = meta.get("EXPECTED_RULE") if expected == "cheating" else None
            cases.append({"kind": kind, "file": str(path.relative_to(CORPUS)), "problem": str(problem),
                          "expected_status": expected, "expected_rule": rule,
                          "may_instead_be": meta.get("MAY_INSTEAD_BE"), "caught_by": meta.get("CAUGHT_BY")})
    return cases


def run_corpus(workers: int, only: list[str]) -> list[dict]:
    cases = [c for c in corpus_cases() if not only or any(part in c["file"] for part in only)]
    config = RunConfig(trials=5, timeout=60, workers=workers, memory_limit_gb=2.5)
    started = time.perf_counter()
    with Verifier(config) as verifier:
        results = verifier.check_kernels([(Path(c["problem"]), CORPUS / c["file"]) for c in cases], timed=True)
    for case, result in zip(cases, results):
        case.update(status=result.status.value, rule=result.rule, reason=result.reason[:300],
                    speedup=result.speedup, wall_s=round(result.wall_s, 3), peak_rss_mb=result.peak_rss_mb)
        case["as_expected"] = ((case["expected_status"] in (None, result.status.value)
                                and case["expected_rule"] in (None, result.rule))
                               or case["may_instead_be"] == result.status.value)
    print(f"corpus: {sum(c['as_expected'] for c in cases)}/{len(cases)} as expected "
          f"in {time.perf_counter() - started:.0f} s")
    for case in cases:
        if not case["as_expected"]:
            print(f"  UNEXPECTED {case['file']}: {case['status']} {case['rule']} {case['reason'][:160]}")
    return cases


# ---- overhead at KernelBench sizes --------------------------------------------------------------------------

_CHECK_DRIVER = """
import json, sys, time
from pathlib import Path
from mkevolve.config import RunConfig
from mkevolve.verify.verifier import Verifier
problem, solutions = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
runs = []
with Verifier(RunConfig(trials=5, timeout=600, workers=1)) as verifier:
    for solution in solutions:
        started = time.perf_counter()
        result = verifier.check_kernel(problem, solution)
        runs.append({"wall_s": time.perf_counter() - started, "status": result.status.value,
                     "reason": result.reason[:200], "speedup": result.speedup,
                     "runtime_ms": result.runtime.median_ms if result.runtime else None,
                     "phases_s": {k: round(v, 3) for k, v in result.phases.items()}})
print("RESULT " + json.dumps(runs))
"""


def checks_with_tree(tree: Path, problem: Path, solutions: list[Path], cache: Path) -> list[dict]:
    """One Verifier of `tree` checks each solution in turn; the first check also pays for the baseline."""
    env = dict(os.environ, PYTHONPATH=str(tree), MKEVOLVE_CACHE=str(cache))
    proc = subprocess.run([sys.executable, "-c", _CHECK_DRIVER, str(problem), *map(str, solutions)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"check with {tree} failed: {proc.stderr[-2000:]}")


def builtin_solution(problem: Path, out: Path) -> Path | None:
    subprocess.run([sys.executable, "-m", "mkevolve", "solve", str(problem), "--model", "builtin",
                    "--budget", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                   timeout=1200)
    return next(out.glob("*/solve-*/solution.py"), None)  # solve writes OUT/<problem>/solve-<search>-<time>/


def fresh_variants(solution: Path, folder: Path, count: int) -> list[Path]:
    """Copies of a solution whose kernels differ by a comment, so Triton compiles each anew, as it does
    every new candidate of a search (its cache key hashes the kernel's source)."""
    lines = solution.read_text().splitlines()
    defs = [i for i, line in enumerate(lines) if line.startswith("def ") and i and "jit" in lines[i - 1]]
    variants = []
    for n in range(count):
        text = list(lines)
        for i in reversed(defs):
            indent = text[i + 1][:len(text[i + 1]) - len(text[i + 1].lstrip())]
            text.insert(i + 1, f"{indent}# variant {n}")
        path = folder / f"{solution.stem}_v{n}.py"
        path.write_text("\n".join(text) + "\n")
        variants.append(path)
    return variants


def measure_overhead(kernelbench: Path, problems: list[str], old_tree: Path | None, record: dict,
                     out: Path, given: Path | None = None, repeats: int = REPEATS) -> list[dict]:
    rows = record.setdefault("overhead", [])
    for name in problems:
        problem = (kernelbench / name).resolve()
        with tempfile.TemporaryDirectory() as scratch:
            solution = given or builtin_solution(problem, Path(scratch) / "solve")
            if solution is None:
                rows.append({"problem": name, "error": "the builtin agent wrote no passing solution"})
                continue
            kept = ROOT / ".bench_solutions"
            kept.mkdir(exist_ok=True)
            variants = fresh_variants(solution, kept, 2 * repeats)
            row = {"problem": name, "new": checks_with_tree(ROOT, problem, variants[:repeats], Path(scratch) / "new")}
            if old_tree is not None:
                row["old"] = checks_with_tree(old_tree.resolve(), problem, variants[repeats:], Path(scratch) / "old")
                warm = lambda runs: statistics.median(r["wall_s"] for r in runs[1:])  # noqa: E731
                row["warm_wall_s"] = {"new": round(warm(row["new"]), 3), "old": round(warm(row["old"]), 3)}
                row["overhead_s"] = round(row["warm_wall_s"]["new"] - row["warm_wall_s"]["old"], 3)
                print(f"{name}: warm check {row['warm_wall_s']['new']:.2f} s new, "
                      f"{row['warm_wall_s']['old']:.2f} s old, overhead {row['overhead_s']:+.2f} s")
            rows.append(row)
            out.write_text(json.dumps(record, indent=1))  # a part that fits the time limit is kept
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-corpus", action="store_true")
    parser.add_argument("--only", nargs="*", default=[], help="corpus files whose path holds one of these")
    parser.add_argument("--kernelbench", type=Path)
    parser.add_argument("--problems", nargs="*", default=[])
    parser.add_argument("--old-tree", type=Path)
    parser.add_argument("--solution", type=Path, help="check this solution instead of having the builtin "
                                                      "agent write one (one problem only)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="checks of one solution per tree")
    args = parser.parse_args()
    record = {"date": date.today().isoformat(),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
              "cpus": os.cpu_count()}
    if not args.skip_corpus:
        record["corpus"] = run_corpus(args.workers, args.only)
        Path(args.out).write_text(json.dumps(record, indent=1))
    if args.problems:
        measure_overhead(args.kernelbench, args.problems, args.old_tree, record, Path(args.out), args.solution,
                         args.repeats)
    Path(args.out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
