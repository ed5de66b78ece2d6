"""The `mkevolve` command line: subcommands and their flags only; each hands off to its module."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from mkevolve.config import ConfigError, add_config_flags
from mkevolve.problem import ProblemError

# Exit codes shared by every command.
EXIT_OK, EXIT_REJECTED, EXIT_BAD_INPUT = 0, 1, 2

VERIFY_FLAGS = ["trials", "timeout", "memory_limit_gb", "eval_mode", "workers", "seed"]
SEARCH_FLAGS = ["model", "api_base", "budget", "beam_width", "expansion", "llm_parallel", "llm_timeout"]


def _subcommands(sub) -> None:
    p = sub.add_parser("check", help="verify one KernelBench-style solution (ModelNew in one file)")
    p.add_argument("problem")
    p.add_argument("solution")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(p, VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.verify.verifier:check_command")

    p = sub.add_parser("decompose", help="decompose a problem into subproblems and check the result")
    p.add_argument("problem")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dir", dest="out_dir", default=None, help="write the decomposition here")
    add_config_flags(p, ["model", "api_base", "decompose_attempts", "retries"] + VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.agents.decompose:decompose_command")

    p = sub.add_parser("solve", help="monolithic baseline: search one kernel for the whole problem")
    p.add_argument("problem")
    p.add_argument("--dir", dest="out_dir", default=None, help="write solution.py and candidates here")
    add_config_flags(p, SEARCH_FLAGS + ["search"] + VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.search.solve:solve_command")

    p = sub.add_parser("run", help="MKEvolve end to end: decompose, evolve subkernels, compose the best")
    p.add_argument("problem", nargs="?", help="KernelBench-style problem file")
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue an interrupted run")
    p.add_argument("--config", metavar="FILE.yaml", default=None, help="config file (CLI flags override it)")
    add_config_flags(p, ["model", "api_base", "iterations", "budget", "beam_width", "expansion",
                         "refine_every", "fuse", "swap", "tau", "search", "decompose_attempts", "retries",
                         "llm_parallel", "llm_timeout", "executor", "out"] + VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.orchestrator:run_command")

    p = sub.add_parser("eval", help="re-verify and profile a solution folder, per subkernel and end to end")
    p.add_argument("solution_dir")
    p.add_argument("--problem", default=None, help="the original problem (default: the manifest's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_config_flags(p, VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.evaluate:eval_command")

    p = sub.add_parser("swap", help="replace one subkernel: a file, 'pytorch', or a candidate id")
    p.add_argument("solution_dir")
    p.add_argument("subkernel")
    p.add_argument("replacement", help="a kernel file, 'pytorch', or a candidate id from the run")
    p.add_argument("--problem", default=None, help="the original problem (default: the manifest's)")
    add_config_flags(p, VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.swap:swap_command")

    p = sub.add_parser("port", help="adapt a solution to an architecture variant, reusing matching subkernels")
    p.add_argument("solution_dir")
    p.add_argument("variant_problem")
    add_config_flags(p, SEARCH_FLAGS + ["out", "decompose_attempts", "retries"] + VERIFY_FLAGS)
    p.set_defaults(handler="mkevolve.port:port_command")

    p = sub.add_parser("pack", help="flatten a solution folder into one KernelBench-compatible file")
    p.add_argument("solution_dir")
    p.add_argument("-o", "--output", required=True, help="the file to write")
    p.set_defaults(handler="mkevolve.pack:pack_command")

    p = sub.add_parser("report", help="write report.html for a run directory")
    p.add_argument("run_dir")
    p.set_defaults(handler="mkevolve.report:report_command")


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
    module_name, _, func = args.handler.partition(":")
    handler = getattr(importlib.import_module(module_name), func)
    try:
        return handler(args)
    except (ProblemError, ConfigError) as err:
        print(f"mkevolve {args.command}: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"mkevolve {args.command}: interrupted", file=sys.stderr)
        return 130
