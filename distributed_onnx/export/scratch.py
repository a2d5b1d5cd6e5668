"""An export's temporary files, removed however it ends: its one scratch folder, and SIGTERM as an interrupt.

``--random-weights`` builds a model's weights in a temporary folder, and ONNX Runtime's quantizer writes its own;
an error, Ctrl-C or a killed process must not leave either behind. The dispatch wraps the whole export in
:func:`sigterm_interrupts`, so every ``finally`` and ``with`` of it (each removing its folder) runs on SIGTERM too.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def scratch_folder(what: str) -> Iterator[Path]:
    """The one temporary folder an export makes (``--random-weights``: the model built for it), removed however
    the block ends (an error, Ctrl-C, or SIGTERM under :func:`sigterm_interrupts`)."""
    with tempfile.TemporaryDirectory(prefix=f"distributed-onnx-{what}-") as folder:
        yield Path(folder)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM as an interrupt for the block (an export), the handler that was there restored afterwards.

    Python's default SIGTERM ends the process at once, without running a ``finally``: a killed export left its
    temporary folder (:func:`scratch_folder`: a built model's weights) behind, and ONNX Runtime's quantizer its
    own. As an interrupt, every ``finally`` and ``with`` runs (each removes its folder) and the command ends with
    exit 130, "interrupted by SIGTERM". Only the main thread can set a handler: elsewhere (an export run from a
    thread) SIGTERM is left as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("interrupted by SIGTERM; the export's temporary files were removed")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
