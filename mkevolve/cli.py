"""The `mkevolve` command line: subcommands and their flags only; each hands off to its module."""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.metadata
import sys

from mkevolve.config import ConfigError, add_config_flags
from mkevolve.exit_codes import ExitCode
from mkevolve.problem_error import ProblemError
from mkevolve.workers.prestart import prestarted_workers

VERIFY_FLAGS = ["trials", "timeout", "memory_limit_gb", "eval_mode", "atol", "rtol", "precision_vs_eager", "workers",
                "seed"]
SEARCH_FLAGS = ["model", "api_base", "budget", "beam_width", "expansion", "llm_parallel", "llm_timeout"]

# Settings that mean something else per command, so each command's --help says what they do there.
# --out is always a parent folder, as it has always been for `run`: one YAML `out:` serves every command
# and every problem, and each command names its own folder under OUT/<problem>/.
SOLVE_HELP = {
    "budget": "LLM calls in total, all for the one kernel of the whole problem",
    "beam_width": "beam width of the one search",
    "search": "search for the whole problem's kernel: beam search, parallel sampling or MCTS",
    "out": "parent folder: solution.py and the candidates go to OUT/<problem>/solve-<search>-<time>/",
}
RUN_HELP = {"out": "parent folder: the run directory is OUT/<problem>/<run-id>/"}
PORT_HELP = {
    "budget": "LLM calls for the one iteration that evolves the subproblems not reused, shared among them",
    "out": "parent folder: the ported run directory is OUT/<variant>/<run-id>/",
}
DECOMPOSE_HELP = {"out": "parent folder: the decomposition is written to OUT/<problem>/decomposition/"}

PROBLEM_HELP = "KernelBench-style problem file (a Model, get_inputs and get_init_inputs)"
SOLUTION_DIR_HELP = "a solution folder: a run's best/ or a copy of it"


def _subcommands(sub) -> None:
    p = sub.add_parser("check", help="verify one KernelBench-style solution (ModelNew in one file)")
    p.add_argument("problem", help=PROBLEM_HELP)
    p.add_argument("solution", help="the solution file: a ModelNew and its Triton kernels")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(p, VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.verify.verifier:check_command")

    p = sub.add_parser("decompose", help="decompose a problem into subproblems and check the result")
    p.add_argument("problem", help=PROBLEM_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(p, ["model", "api_base", "decompose_attempts", "retries", "out"] + VERIFY_FLAGS,
                     DECOMPOSE_HELP)
    p.set_defaults(handler="mkevolve.agents.decompose:decompose_command")

    p = sub.add_parser("solve", help="monolithic baseline: search one kernel for the whole problem")
    p.add_argument("problem", help=PROBLEM_HELP)
    add_config_flags(p, SEARCH_FLAGS + ["search", "out"] + VERIFY_FLAGS, SOLVE_HELP)
    p.set_defaults(handler="mkevolve.solve:solve_command")

    p = sub.add_parser("run", help="MKEvolve end to end: decompose, evolve subkernels, compose the best")
    p.add_argument("problem", nargs="?", help=PROBLEM_HELP + "; with --resume, optional and checked "
                                              "against the run's")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue an interrupted or finished run; flags given change its saved config")
    add_config_flags(p, ["model", "api_base", "judge", "iterations", "budget", "beam_width", "expansion",
                         "refine_every", "fuse", "swap", "tau", "search", "decompose_attempts", "retries",
                         "llm_parallel", "llm_timeout", "executor", "time_budget", "out"] + VERIFY_FLAGS, RUN_HELP)
    p.set_defaults(handler="mkevolve.orchestrator:run_command")

    p = sub.add_parser("eval", help="re-verify and profile a solution folder, per subkernel and end to end")
    p.add_argument("solution_dir", help=SOLUTION_DIR_HELP)
    p.add_argument("--problem", default=None, help="the original problem (default: the manifest's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(p, VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.evaluate:eval_command")

    p = sub.add_parser("swap", help="replace one subkernel: a file, 'pytorch', or a candidate id")
    p.add_argument("solution_dir", help=SOLUTION_DIR_HELP)
    p.add_argument("subkernel", help="the subkernel to replace, as named in manifest.yaml")
    p.add_argument("replacement", help="a kernel file, 'pytorch', or a candidate id from the run")
    p.add_argument("--problem", default=None, help="the original problem (default: the manifest's)")
    add_config_flags(p, VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.swap:swap_command")

    p = sub.add_parser("port", help="adapt a solution to an architecture variant, reusing matching subkernels")
    p.add_argument("solution_dir", help=SOLUTION_DIR_HELP)
    p.add_argument("variant_problem", help="the variant's problem file (the same network, changed in places)")
    add_config_flags(p, SEARCH_FLAGS + ["out", "decompose_attempts", "retries"] + VERIFY_FLAGS, PORT_HELP)
    p.set_defaults(handler="mkevolve.port:port_command")

    p = sub.add_parser("pack", help="flatten a solution folder into one KernelBench-compatible file")
    p.add_argument("solution_dir", help=SOLUTION_DIR_HELP)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the one file to write")
    p.set_defaults(handler="mkevolve.pack:pack_command")

    p = sub.add_parser("report", help="write report.html for a run directory")
    p.add_argument("run_dir", help="a run directory, OUT/<problem>/<run-id>/")
    p.set_defaults(handler="mkevolve.report:report_command")

    p = sub.add_parser("capture", help="profile a model, rank its regions by time share, write the top as problems")
    p.add_argument("model_file", metavar="MODEL.py",  # not `model`: that is the LLM setting
                   help="a model file: get_model() and get_inputs(), or a KernelBench problem file")
    p.add_argument("--top", type=int, default=5, metavar="K", help="write problem files for the top K regions "
                                                                   "(default: 5)")
    p.add_argument("--runs", type=int, default=20, help="timed forward passes; times are medians (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed forward passes first (default: 3)")
    add_config_flags(p, ["out", "seed", "eval_mode"],
                     {"out": "parent folder: capture.json and the problem files go to OUT/<model>/capture/"})
    p.set_defaults(handler="mkevolve.capture:capture_command")

    p = sub.add_parser("integrate", help="put runs' best solutions for captured regions into the model, guarded")
    p.add_argument("model_file", metavar="MODEL.py", help="the model file given to `capture`")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="`run` directories of problems `capture` wrote")
    p.add_argument("-o", "--output", default=None, metavar="FILE.json",
                   help="the JSON report (default: OUT/<model>/integrate/integrate.json)")
    p.add_argument("--accept-untimed", action="store_true",
                   help="without a GPU, use correct replacements without a speed check (nothing can be timed)")
    p.add_argument("--runs", type=int, default=20, help="timed calls; times are medians (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default: 3)")
    add_config_flags(p, ["out", "seed", "eval_mode"],
                     {"out": "parent folder: the report goes to OUT/<model>/integrate/integrate.json"})
    p.set_defaults(handler="mkevolve.integration:integrate_command")


def _version() -> str:
    try:
        return importlib.metadata.version("mkevolve")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from mkevolve import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mkevolve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"mkevolve {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse exits 2 on usage errors, 0 on --help
        return int(stop.code or 0)
    with prestarted_workers(args):   # before the handler's imports, which its workers' then overlap
        return _handle(args)


def _handle(args: argparse.Namespace) -> int:
    module_name, _, func = args.handler.partition(":")
    handler = getattr(importlib.import_module(module_name), func)
    try:
        return handler(args)
    except (ProblemError, ConfigError) as err:
        print(f"mkevolve {args.command}: error: {err}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        print(f"mkevolve {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        print(f"mkevolve {args.command}: error: {err.filename or 'a file'}: no space left on device",
              file=sys.stderr)
        return ExitCode.FAILED
