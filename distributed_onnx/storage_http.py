"""What reading an ``http(s)://`` location takes beyond fsspec's own HTTP filesystem: answers told from silence.

:func:`~distributed_onnx.storage.filesystem` reads ``http(s)://`` through fsspec, whose HTTP filesystem says "no
such file" for a server that is down, that failed (5xx) or that refused this client (401, 403), waits minutes on a
server that never sends a byte, and opens a file a server sends only as a stream as if it could be read by ranges.
Those are http(s) specifics, apart from the location reads and writes (:mod:`distributed_onnx.storage`) that
every scheme shares: the handler pyarrow reads fsspec through (:class:`AnsweringFSSpecHandler`), the read timeout
(:data:`HTTP_READ_TIMEOUT_VARIABLE`), and the errors it raises for :mod:`~distributed_onnx.storage` to word.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs

from distributed_onnx import redact as _redaction
from distributed_onnx.errors import ConfigError
from distributed_onnx.storage_unanswered import unanswered

#: The environment variable that sets :data:`HTTP_READ_TIMEOUT_S` (seconds; docs/backtest.md).
HTTP_READ_TIMEOUT_VARIABLE = "DISTRIBUTED_ONNX_HTTP_READ_TIMEOUT_S"
#: The longest an ``http(s)://`` location may stay silent: to connect, and between two reads of its answer (the
#: headers, each chunk of a body). A server that accepts the connection and never sends a byte held a command for
#: fsspec's HEAD then its GET, each under aiohttp's own bound (5 minutes for the whole request); a slow server that
#: keeps sending passes however long the whole file takes (no bound on the total).
HTTP_READ_TIMEOUT_S = 30.0


def http_read_timeout_s() -> float:
    """:data:`HTTP_READ_TIMEOUT_S`, or the seconds :data:`HTTP_READ_TIMEOUT_VARIABLE` gives (read at each open, so a
    test or a driver process may set it); a :class:`ConfigError` (exit 2) for a value that is not a positive number."""
    text = os.environ.get(HTTP_READ_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return HTTP_READ_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(
            f"{HTTP_READ_TIMEOUT_VARIABLE}={text!r} is not a number of seconds above 0: give one such as "
            f"{HTTP_READ_TIMEOUT_S:g}, or unset it for that default.",
            key=HTTP_READ_TIMEOUT_VARIABLE,
        )
    return seconds


def fsspec_options(scheme: str) -> dict[str, Any]:
    """The options :func:`~distributed_onnx.storage.filesystem` gives fsspec for ``scheme``: for ``http(s)://``,
    aiohttp's waits bounded by :func:`http_read_timeout_s` (to connect, for each read) instead of its default, with
    no bound on a whole answer."""
    if scheme not in {"http", "https"}:
        return {}
    import aiohttp

    bound = http_read_timeout_s()
    return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=bound, sock_read=bound)}}


class NoAnswerError(ConnectionError):
    """The store did not answer a look at a path that fsspec would have called missing (see below)."""


class AnsweringFSSpecHandler(pafs.FSSpecHandler):  # type: ignore[misc]
    """pyarrow's handler of an fsspec filesystem, except that a server that does not answer is not "no such file".

    fsspec's HTTP filesystem raises ``FileNotFoundError`` for a refused connection too (the connection error is its
    cause), and for a server's own failure (a 5xx status), and pyarrow's handler turns every ``FileNotFoundError``
    into a missing file: ``--data https://...`` at a host that is down would say "not found" (exit 2) where the
    storage did not answer (exit 3, rerun later).
    """

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            try:
                info = self.fs.info(path)
            except FileNotFoundError as exc:
                cause = exc.__cause__
                if cause is not None and (unanswered(cause) or _server_failed(cause)):
                    raise NoAnswerError(self._no_answer(cause)) from cause
                if cause is not None and getattr(cause, "status", None) in REFUSED_STATUSES:
                    raise RefusedError(_redaction.quoted(cause)) from cause
                infos.append(pafs.FileInfo(path, pafs.FileType.NotFound))
            else:
                infos.append(self._create_file_info(path, info))
        return infos

    def open_input_file(self, path: str) -> Any:
        """The file, read by ranges; one a server sends only as a stream (no size, or no range requests) is refused
        here: Parquet is read from its footer back, and fsspec's stream failed at the first seek (exit 4)."""
        from pyarrow import PythonFile

        if not self.fs.isfile(path):
            raise FileNotFoundError(path)
        opened = self.fs.open(path, mode="rb")
        if not _takes_ranges(opened):
            opened.close()
            raise StreamOnlyError(path)
        return PythonFile(opened, mode="r")

    def _no_answer(self, cause: BaseException) -> str:
        """What the store's silence was: a timeout of an ``http(s)://`` server says its bound and what sets it."""
        said = _redaction.quoted(cause)
        if isinstance(cause, TimeoutError) and "http" in self.fs.protocol:
            bound = f"nothing within {http_read_timeout_s():g} s, the wait {HTTP_READ_TIMEOUT_VARIABLE} sets"
            return f"{said}: {bound}" if said else bound
        return said


#: HTTP statuses of a server that answers but refuses this client: not "no such file".
REFUSED_STATUSES = (401, 403)


class RefusedError(PermissionError):
    """The server refused access to a path (401, 403) that fsspec would have called missing."""


class StreamOnlyError(OSError):
    """The server sends the file only as a stream (fsspec's ``HTTPStreamFile``): it cannot be read by ranges."""


def _takes_ranges(opened: Any) -> bool:
    """Whether an fsspec file can seek (fsspec opens an http(s) file a server gives no size or ranges for as a
    stream, whose ``seek`` raises)."""
    return type(opened).__name__ != "HTTPStreamFile"


def _server_failed(exc: BaseException) -> bool:
    """An HTTP answer of the server's own failure (5xx, aiohttp's ``ClientResponseError.status``): not "no file"."""
    status = getattr(exc, "status", None)
    return isinstance(status, int) and status >= 500
