"""Worker processes a command starts before its own imports, for the pools that will ask for them.

`mkevolve run` imports the orchestrator, and with it torch (3.2 s on the H200), before it makes its first pool;
each worker then starts and imports torch again (2.7 s), and the builtin agent's first reply and the first checks
wait for it. Started here, from the parsed flags and before those imports, the workers' imports overlap the
command's own. A pool is handed to the first owner that asks for the same pool (pool.take_pool); one that no
owner took when the command returns is stopped.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from mkevolve.config import BUILTIN_MODEL, ConfigError, config_from_args
from mkevolve.workers.executor import prestart_executor
from mkevolve.workers.pool import close_prestarted, prestart_pool

BUILTIN_AGENT_WORKERS = 1   # the builtin agent answers in one worker without a GPU (llm.providers.BuiltinProvider)


@contextmanager
def prestarted_workers(args: argparse.Namespace) -> Iterator[None]:
    """For a new `mkevolve run`: the verifier's workers and, with the builtin model, the builtin agent's, started
    when the block begins; those not taken are stopped when it ends. Other commands start nothing here."""
    try:
        if getattr(args, "command", None) == "run" and not getattr(args, "resume", None):
            _prestart_run(args)
        yield
    finally:
        close_prestarted()


def _prestart_run(args: argparse.Namespace) -> None:
    try:
        config = config_from_args(args)
    except ConfigError:
        return  # the command reports it, before it starts anything
    prestart_executor(config.executor, config.workers)
    if config.model == BUILTIN_MODEL:
        prestart_pool(BUILTIN_AGENT_WORKERS)
