"""How an error that ended a command becomes its exit code and its one line on stderr (the exit codes of
:mod:`.cli`'s docstring).

Pure (an exception in, a code and a line out; Ray's exception classes are looked for only when Ray is already
imported), apart from the entry point that prints the line (:func:`.cli.main`), so that each error's code and
words are tested alone (tests/test_cli_errors.py).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.interrupts import EXIT_INTERRUPTED, interrupted_line
from distributed_onnx.local_paths import name_too_long_error
from distributed_onnx.redact import one_line

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_DONE",
    "EXIT_ENVIRONMENT",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_PARTS_FAILED",
    "describe_error",
    "interrupted_line",
]

EXIT_DONE = 0
EXIT_PARTS_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 4


def describe_error(
    exc: BaseException, *, resumes: bool = True, flags: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """The exit code and the one line (without ``error:``) for an exception that ended a command; ``resumes``:
    whether rerunning the command resumes it (a backtest, a score), else the line says only to rerun; ``flags``:
    the command's flags by setting name, the only ones an error's suggestions may name (none: Python's words)."""
    cause = _own_cause(exc)
    if isinstance(cause, DistributedOnnxError):  # the class says (errors.py: the tree, grouped by exit code)
        return cause.exit_code, _one_line(cause.render(flags) if flags is not None else cause)
    ray_exceptions = sys.modules.get("ray.exceptions")  # a Ray error needs Ray imported: never import it here
    # A task's own exception (RayTaskError) is ours: a bug, below.
    if (
        ray_exceptions is not None
        and isinstance(exc, ray_exceptions.RayError)
        and not isinstance(exc, ray_exceptions.RayTaskError)
    ):
        kept = "Finished parts are kept; fix" if resumes else "Fix"
        again = "rerun the same command to resume" if resumes else "rerun"
        return EXIT_ENVIRONMENT, (
            f"Ray failed: {type(exc).__name__}: {_one_line(exc)}. {kept} the cluster (disk, memory, nodes) and {again}."
        )
    too_long = name_too_long_error(exc)  # a name over the file system's limit: bad input, never a rerun (local_paths)
    if too_long is not None:
        return too_long.exit_code, _one_line(too_long)
    aiohttp = sys.modules.get("aiohttp")  # fsspec's http(s) client: its failures are the store's, as OSError's are
    if isinstance(exc, OSError) or (aiohttp is not None and isinstance(exc, aiohttp.ClientError)):
        # storage or the system (a full disk, a store that stopped answering, a server that closed mid-answer)
        again = "Finished parts are kept; rerun the same command to resume." if resumes else "Fix it and rerun."
        return EXIT_ENVIRONMENT, f"I/O error: {type(exc).__name__}: {_one_line(exc)}. {again}"
    if isinstance(exc, MemoryError):
        again = "finished parts are kept, rerun to resume" if resumes else "free memory and rerun"
        return EXIT_ENVIRONMENT, f"out of memory (MemoryError); {again}."
    return EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {_one_line(exc)}."


def _own_cause(exc: BaseException) -> BaseException:
    """Our own error inside a Ray task error (``RayTaskError.cause``), else ``exc`` itself."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, DistributedOnnxError) else exc


def _one_line(exc: BaseException | str) -> str:
    """The error's text on one bounded line (:func:`~distributed_onnx.redact.one_line`): a long value in it (a
    5,000-byte path) shortened to its start and end, its reason and what to do whole."""
    return one_line(str(exc)) or type(exc).__name__
