"""The ``distributed-onnx`` command: ``inspect``, ``export``, ``tune``, ``backtest``, ``fev``, ``serve`` and ``score``.

Thin entry points: each command's arguments are generated from its settings model (:data:`COMMANDS`,
:mod:`distributed_onnx.settings_sources`), so a new field is a new flag with its description as help, an
environment variable and a ``--config`` key; each handler is settings -> one call -> print. What an error
suggests doing is rendered with the running command's own flags (:func:`command_flags`): a suggestion naming a
setting the command has no flag for is not shown.

Every error a user can cause or meet is one line on stderr and an exit code (the README's table):
0 done, 1 a run in which some parts failed (resumable), 2 bad input or settings, 3 the environment failed
(storage that does not answer, Ray or the cluster: out of disk, a cancelled task, workers that could not
start; rerunning resumes), 4 an internal error: one line naming the log file that holds the traceback (a bug
to report), 130 interrupted.

This module is the command line and its flow: the parser, :func:`main` (parse, run the handler, map what it
raised to a code and a line) and :func:`run` (the prompt exit). The commands themselves (settings models,
handlers) are :mod:`.cli_commands`'; the mapping of an error to its code and line :mod:`.cli_errors`'; the
version line, the log's format and the traceback file :mod:`.cli_diagnostics`'.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from distributed_onnx.cli_commands import COMMANDS, Command
from distributed_onnx.cli_diagnostics import configure_logging, version_text, write_traceback
from distributed_onnx.cli_errors import (
    EXIT_BAD_INPUT,
    EXIT_DONE,
    EXIT_ENVIRONMENT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PARTS_FAILED,
    describe_error,
    interrupted_line,
)
from distributed_onnx.cli_words import normalized_words, parse_words
from distributed_onnx.interrupts import RESUMING_COMMANDS, command_given, forget, raise_if_arrived
from distributed_onnx.location import Location
from distributed_onnx.redact import shown
from distributed_onnx.runtime import ray_console

#: The entry point's names; the exit codes and the error mapping are :mod:`.cli_errors`', the commands
#: :mod:`.cli_commands`'.
__all__ = [
    "COMMANDS",
    "EXIT_BAD_INPUT",
    "EXIT_DONE",
    "EXIT_ENVIRONMENT",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_PARTS_FAILED",
    "RESUMING_COMMANDS",
    "command_flags",
    "describe_error",
    "main",
    "run",
]

logger = logging.getLogger("distributed_onnx")


def run() -> NoReturn:
    """:func:`main`, then a prompt exit: what the console script (and ``python -m distributed_onnx``) runs once it
    has set its interrupts (:mod:`distributed_onnx.__main__`).

    After a backtest, the interpreter's own teardown (freeing every module and object, Ray's native core
    worker included) took up to several seconds of wall time after the last file was written
    (``benchmarks/results/time_to_results.md``). By then every output is written and closed, so the
    command runs its exit handlers (``atexit``: logging's flush, Ray's shutdown), flushes its streams and
    leaves without the teardown; unless a non-daemon thread is still running, which the normal exit joins.
    """
    code = main()
    others = [thread for thread in threading.enumerate() if thread is not threading.main_thread()]
    if any(thread.is_alive() and not thread.daemon for thread in others):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    words = normalized_words(sys.argv[1:] if argv is None else argv)
    parser = _parser(words)
    args = parse_words(parser, words)
    configure_logging(verbose=args.verbose)
    ray_console.choose(quiet=not args.verbose)  # Ray's own lines only with -v, wherever a command starts Ray
    flags = command_flags(parser, args.command)
    try:
        raise_if_arrived()  # an interrupt during the imports above that was swallowed (interrupts.py)
        result: int = args.handler(args)
    except KeyboardInterrupt as interrupted:  # a command's own words when it has them (serve's start: no resume)
        forget()
        print(f"error: {interrupted_line(interrupted, resumes=args.command in RESUMING_COMMANDS)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # every error ends here as one line and a code: see the module docstring
        code, line = describe_error(exc, resumes=args.command in RESUMING_COMMANDS, flags=flags)
        if code == EXIT_INTERNAL:
            line = f"{line} The traceback is in {write_traceback(exc)}; please report it."
        if args.verbose and code != EXIT_INTERNAL:
            logger.debug("Traceback of the error below", exc_info=exc)
        print(f"error: {shown(line)}", file=sys.stderr)  # no URL's secret, no file's control bytes (redact.py)
        return code
    return result


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line, every subcommand generated from its settings model (:data:`COMMANDS`). Only the command
    given gets its flags: each model costs its imports (the backtest's data layer, Serve's settings) and its flags'
    generation, ~0.1 s before a backtest starts Ray."""
    from distributed_onnx.cli_words import PointingParser, plain_text

    given = command_given(normalized_words(sys.argv[1:] if argv is None else argv))
    parser = PointingParser(prog="distributed-onnx", description=plain_text(__doc__.splitlines()[0]))
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, Ray's own logging included (anywhere on the line)"
    )
    commands = parser.add_subparsers(required=True, dest="command")
    for command in COMMANDS:
        if command.name == given:
            _settings_command(commands, command)
        else:
            commands.add_parser(command.name, help=command.summary)
    return parser


def _settings_command(commands: Any, command: Command) -> None:
    """The subcommand's arguments generated from its settings model, plus ``--config`` and its extras."""
    from distributed_onnx.cli_words import plain_help, plain_text
    from distributed_onnx.settings_flags import add_flags
    from distributed_onnx.settings_sources import ENV_PREFIX

    model = command.settings()
    parser = commands.add_parser(
        command.name,
        help=command.summary,
        description=plain_text(model.__doc__ or command.summary),
        epilog=f"Precedence: flags > {ENV_PREFIX}<SETTING> environment variables > --config YAML > "
        + ("--tuned file > " if command.name == "backtest" else "")
        + "defaults.",
    )
    parser.add_argument(
        "--config",
        type=Location.parse,
        metavar="FILE.yaml",
        help="YAML file of these settings (keys: the names with underscores)",
    )
    add_flags(parser, model)
    if command.extra is not None:
        command.extra(parser)
    plain_help(parser)
    parser.set_defaults(handler=command.handler)


def command_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """The flags of ``command`` in ``parser``, by setting name (an argument's ``dest``): what a suggestion in an
    error may name (:meth:`~distributed_onnx.errors.DistributedOnnxError.render`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            chosen: argparse.ArgumentParser = action.choices[command]
            return {
                each.dest: each.option_strings[0]
                for each in chosen._actions
                if each.option_strings and each.option_strings[0].startswith("--")
            }
    return {}
