"""Where the time of an evaluation goes, phase by phase, from the `verdict` events of one or more runs.

    python scripts/eval_profile.py outputs/gemm_chain/<run-id>
    python scripts/eval_profile.py outputs/gemm_chain/<run-id>/events.jsonl --json profile.json
    python scripts/eval_profile.py outputs/kernelbench/runs          # every run under a folder, together

Every `verdict` event carries `wall_s` (seconds from the job's submission to its verdict, so queueing for
a worker is included) and `phases` (seconds per phase, as the verifier measured them):

    worker_start, load, reference, baseline, candidate, judge           top level: they add up to wall_s,
                                                                        less the time spent waiting
    candidate.setup, candidate.import, candidate.build,                 inside the candidate process, so
    candidate.first_call, candidate.gpu_wait,                           part of `candidate`; Triton's JIT
    candidate.other_calls, candidate.profiler_stop, candidate.save      and autotuning are in first_call;
                                                                        gpu_wait is the wait for the GPU
                                                                        lock before the trials and timed
                                                                        calls, which hold it alone
    candidate.spawn, candidate.exit                                     around the harness, seen from the
                                                                        worker: until the harness began
                                                                        (the zygote's standby child, its
                                                                        fork), and after its report until
                                                                        the process had ended
    candidate.spawn.late, candidate.spawn.prepare                       part of spawn, where a standby
                                                                        was prepared ahead: how long after
                                                                        the request it was still preparing,
                                                                        and how long preparing took
    judge.accounting, judge.read, judge.compare, judge.precision       part of `judge`: what ran on the
                                                                        GPU, reading and hashing the saved
                                                                        outputs, comparing them, and (part
                                                                        of compare) the last trial against
                                                                        the reference in fp64

Per phase the table gives how many evaluations had it, the median and p90 (linear interpolation between
ranks, as numpy's default) and the total, in seconds, and its share of the evaluations' summed wall
time. Two rows are derived, not measured:

    waiting                 wall_s minus the top-level phases: queueing for a worker, and the transfer
                            of the job and its verdict
    candidate.unaccounted   candidate minus its sub-phases: moving tensors in and out of the process,
                            and (for a verdict without spawn and exit) starting and ending it

A verdict event without `wall_s` or `phases` (a run written before they existed) is counted as
unprofiled and left out of every row, so the shares stay shares of the same wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, installed or not: the imports below need the path first

from mkevolve.event_records import EventFieldError, VerdictEvent, of_type, parse_events  # noqa: E402
from mkevolve.events import EventFilesError, find_event_files, read_event_lines  # noqa: E402

# The verifier's phases in the order they happen; a phase not named here is listed after these.
PHASE_ORDER = ("worker_start", "load", "reference", "baseline", "candidate", "candidate.spawn",
               "candidate.spawn.late", "candidate.spawn.prepare", "candidate.setup",
               "candidate.import", "candidate.build", "candidate.first_call", "candidate.gpu_wait",
               "candidate.other_calls", "candidate.profiler_stop", "candidate.save", "candidate.exit",
               "candidate.unaccounted",
               "judge", "judge.accounting", "judge.read", "judge.compare", "judge.precision", "waiting")
WAITING = "waiting"
CANDIDATE = "candidate"
UNACCOUNTED = "candidate.unaccounted"


@dataclass
class PhaseRow:
    phase: str
    count: int          # evaluations that have this phase
    median_s: float
    p90_s: float
    total_s: float
    share: float        # total_s / summed wall_s of the profiled evaluations (0..1)


@dataclass
class Profile:
    evaluations: int    # profiled verdict events
    unprofiled: int     # verdict events without wall_s or phases
    wall_total_s: float
    wall_median_s: float
    wall_p90_s: float
    rows: list[PhaseRow]


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between ranks; one value is its own quantile."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def read_verdicts(files: list[Path]) -> list[VerdictEvent]:
    """Every `verdict` event of the files; a line cut short by a killed run is skipped, an event with a
    field of the wrong type stops the script with the file's name."""
    verdicts = []
    for path in files:
        try:
            verdicts += of_type(parse_events(read_event_lines(path)), VerdictEvent)
        except EventFieldError as err:
            raise SystemExit(f"{path}: {err}") from err
    return verdicts


def as_verdicts(events: Iterable[VerdictEvent | dict]) -> list[VerdictEvent]:
    """Records as they are; a raw event (a dict as json.loads gives it) parsed into one."""
    return [e if isinstance(e, VerdictEvent) else VerdictEvent.from_json(e) for e in events]


def phase_seconds(verdict: VerdictEvent) -> dict[str, float]:
    """The verdict's phases plus the two derived ones. Rounding in the log (to 1 ms per phase) can make
    a derived rest slightly negative; it is clipped at zero. Only for a profiled verdict."""
    phases = dict(verdict.phases)
    top_level = sum(seconds for name, seconds in phases.items() if "." not in name)
    phases[WAITING] = max(0.0, verdict.wall_s - top_level)
    if CANDIDATE in phases:
        inside = sum(seconds for name, seconds in phases.items()
                     if name.startswith(CANDIDATE + ".") and name.count(".") == 1)   # not spawn.late: a part of spawn
        phases[UNACCOUNTED] = max(0.0, phases[CANDIDATE] - inside)
    return phases


def ordered_phases(names: set[str]) -> list[str]:
    """Known phases in the order they happen; unknown ones after their parent (or before `waiting`)."""
    known = [name for name in PHASE_ORDER if name in names]
    for name in sorted(names - set(PHASE_ORDER)):
        parent = name.rsplit(".", 1)[0] if "." in name else name
        after = max((i for i, known_name in enumerate(known)
                     if known_name == parent or known_name.startswith(parent + ".")),
                    default=len(known) - (1 if WAITING in known else 0) - 1)
        known.insert(after + 1, name)
    return known


def summarize(events: Iterable[VerdictEvent | dict]) -> Profile:
    verdicts = as_verdicts(events)
    profiled = [verdict for verdict in verdicts if verdict.profiled]
    walls = [verdict.wall_s for verdict in profiled]
    wall_total = sum(walls)
    per_phase: dict[str, list[float]] = {}
    for verdict in profiled:
        for name, seconds in phase_seconds(verdict).items():
            per_phase.setdefault(name, []).append(seconds)
    rows = [PhaseRow(phase=name, count=len(values), median_s=percentile(values, 0.5),
                     p90_s=percentile(values, 0.9), total_s=sum(values),
                     share=sum(values) / wall_total if wall_total else 0.0)
            for name in ordered_phases(set(per_phase)) for values in [per_phase[name]]]
    return Profile(evaluations=len(profiled), unprofiled=len(verdicts) - len(profiled), wall_total_s=wall_total,
                   wall_median_s=percentile(walls, 0.5) if walls else 0.0,
                   wall_p90_s=percentile(walls, 0.9) if walls else 0.0, rows=rows)


def by_problem(events: Iterable[VerdictEvent | dict]) -> dict[str, Profile]:
    """One profile per problem (a subproblem's file, or the problem of an end-to-end check), the problem
    whose evaluations took the most wall time first: which evaluations make a slow median or p90."""
    groups: dict[str, list[VerdictEvent]] = {}
    for verdict in as_verdicts(events):
        groups.setdefault(Path(verdict.problem).stem or "unknown", []).append(verdict)
    ordered = sorted(groups.items(), key=lambda item: -sum(v.wall_s or 0.0 for v in item[1]))
    return {name: summarize(verdicts) for name, verdicts in ordered}


def render_table(profile: Profile) -> str:
    """A plain fixed-width table; sub-phases are indented under their phase."""
    header = f"{'phase':<28} {'count':>6} {'median s':>9} {'p90 s':>9} {'total s':>9} {'share':>7}"
    lines = [header, "-" * len(header)]
    for row in profile.rows:
        name = "  " * row.phase.count(".") + row.phase
        lines.append(f"{name:<28} {row.count:>6} {row.median_s:>9.3f} {row.p90_s:>9.3f} "
                     f"{row.total_s:>9.3f} {100 * row.share:>6.1f}%")
    lines.append("-" * len(header))
    lines.append(f"{'evaluation (wall)':<28} {profile.evaluations:>6} {profile.wall_median_s:>9.3f} "
                 f"{profile.wall_p90_s:>9.3f} {profile.wall_total_s:>9.3f} "
                 f"{100.0 if profile.evaluations else 0.0:>6.1f}%")
    if profile.unprofiled:
        lines.append(f"{profile.unprofiled} verdict event(s) without wall_s or phases were left out")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Profile of evaluations, phase by phase, from events.jsonl.",
                                     epilog=__doc__.split("\n\n", 2)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="a run directory, an events.jsonl, or a folder with runs below it (several allowed)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the profile as JSON to FILE")
    parser.add_argument("--composite", choices=("all", "only", "none"), default="all",
                        help="end-to-end evaluations of a composed solution: include (all), only them, or none")
    parser.add_argument("--by-problem", action="store_true",
                        help="one table per problem, the one whose evaluations took longest first")
    args = parser.parse_args(argv)
    try:
        verdicts = read_verdicts(find_event_files(args.paths))
    except EventFilesError as err:
        raise SystemExit(str(err)) from None
    if args.composite != "all":
        verdicts = [v for v in verdicts if v.composite == (args.composite == "only")]
    if not verdicts:
        print("no verdict events found", file=sys.stderr)
        return 1
    if args.by_problem:
        profiles = by_problem(verdicts)
        print("\n\n".join(f"== {name}\n{render_table(profile)}" for name, profile in profiles.items()))
        data = {name: asdict(profile) for name, profile in profiles.items()}
    else:
        profile = summarize(verdicts)
        print(render_table(profile))
        data = asdict(profile)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
