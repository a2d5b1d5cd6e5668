"""What the command leaves for whoever diagnoses it: its version line (``--version``), its log lines (URLs'
secrets masked) and, for an internal error, the file holding the traceback.

Apart from the entry point (:mod:`.cli`) and the error mapping (:mod:`.cli_errors`): these are the command's
only writes besides its own work's, and each one goes through :func:`~distributed_onnx.redact.redact_text`.
"""

from __future__ import annotations

import logging
import platform
import sys
from importlib import metadata

from distributed_onnx.redact import redact_text
from distributed_onnx.version import __version__


def write_traceback(exc: BaseException) -> str:
    """Write ``exc``'s traceback to a new log file in the temporary directory and return its path."""
    import tempfile
    import traceback

    handle, path = tempfile.mkstemp(prefix="distributed-onnx-error-", suffix=".log")
    with open(handle, "w", encoding="utf-8") as log:
        log.write(f"{version_text()}\ncommand: {redact_text(' '.join(sys.argv))}\n\n")
        log.write(redact_text("".join(traceback.format_exception(exc))))
    return path


def configure_logging(*, verbose: bool) -> None:
    """Log lines at INFO; ours at DEBUG with ``--verbose`` (other libraries stay at INFO: matplotlib's DEBUG
    font search alone is hundreds of lines). Ray's own logging is the commands' business (``local_ray``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # every line logged here, a library's too, without URL secrets
        if not isinstance(handler.formatter, RedactingFormatter):
            handler.setFormatter(RedactingFormatter(handler.formatter))
    logging.getLogger("distributed_onnx").setLevel(logging.DEBUG if verbose else logging.INFO)


class RedactingFormatter(logging.Formatter):
    """A handler's formatter whose lines (message, traceback) have every URL :func:`redact_text`-ed."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(self.inner.format(record))


def version_text() -> str:
    """``distributed-onnx X (python Y; onnxruntime Z, ray W)`` from installed metadata, without importing them."""
    runtimes = []
    for label, distributions in (("onnxruntime", ("onnxruntime", "onnxruntime-gpu")), ("ray", ("ray",))):
        found = "not installed"
        for distribution in distributions:
            try:
                found = metadata.version(distribution) + ("" if distribution == label else f" ({distribution})")
                break
            except metadata.PackageNotFoundError:
                continue
        runtimes.append(f"{label} {found}")
    return f"distributed-onnx {__version__} (python {platform.python_version()}; {', '.join(runtimes)})"
