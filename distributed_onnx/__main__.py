"""The ``distributed-onnx`` command (the console script) and ``python -m distributed_onnx``.

Its first code, before the CLI is imported: a Ctrl-C or a SIGTERM while the CLI and its dependencies import (a
second or more on a loaded node) is the same line and exit 130 as at any later moment (:mod:`.interrupts`), where
it was Python's traceback, or for SIGTERM a bare exit 143. This module imports nothing heavy itself, nor does the
package's root (its public names are imported when first asked for).
"""

from __future__ import annotations

import sys
from typing import NoReturn

from distributed_onnx.interrupts import (
    EXIT_INTERRUPTED,
    RESUMING_COMMANDS,
    command_given,
    forget,
    interrupt_on_sigint,
    interrupt_on_sigterm,
    interrupted_line,
)


def run() -> NoReturn:
    """Interrupts handled from here on, then the CLI (:func:`distributed_onnx.cli.run`, which exits)."""
    resumes = command_given(sys.argv[1:]) in RESUMING_COMMANDS
    try:
        interrupt_on_sigint()
        interrupt_on_sigterm(resumes=resumes)
        from distributed_onnx.cli import run as run_command

        run_command()
    except KeyboardInterrupt as interrupted:  # before the command's own handling began (imports, its arguments)
        forget()
        print(f"error: {interrupted_line(interrupted, resumes=resumes)}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    run()
