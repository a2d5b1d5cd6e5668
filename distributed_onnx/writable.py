"""Where a command's output can be written: the one rule every output is asked by, before anything starts.

Every output a command writes (a backtest's, ``fev``'s, ``score``'s and ``tune``'s ``--output``, serve's
``--forecast-log``) is refused here if no write could reach it or no later command could read it. Kept apart from
:class:`~distributed_onnx.location.Location`, which says what a location is, not where this package writes; serve
and the backtest's output checks both read it (serve may not import the backtest).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from distributed_onnx.location import Location

__all__ = [
    "LOOKS_LIKE_A_URL",
    "PROCESS_LOCAL_SCHEMES",
    "READ_ONLY_SCHEMES",
    "STANDARD_OUTPUT",
    "WRITABLE_SCHEMES",
    "looks_like_a_url",
    "unwritable_problem",
    "url_without_slashes_problem",
]

#: A local path that starts as a store's URL with its ``//`` left out (``s3:/bucket``): taken as a local folder, it
#: made a folder ``s3:`` in the working directory (a forecast log, ``s3:/K:S@b/log?token=T``, wrote there, its
#: credentials in a path on disk) and a run failed at its end. Written ``./s3:/bucket`` it is a local folder (a
#: Location keeps that ``./``). The one rule of every output written (a backtest's ``--output``, serve's
#: ``--forecast-log``): :func:`looks_like_a_url`.
LOOKS_LIKE_A_URL = re.compile(r"^(s3|gs|gcs|abfs|abfss|az|adl|hdfs|http|https|file|memory):", re.IGNORECASE)
#: The stores an output is written to besides local folders (and ``file://`` URLs, which are local): the
#: filesystems pyarrow writes itself (``storage.filesystem``). Any other scheme went to fsspec, which either lacks
#: it or reached a server only once the run had started (``ftp://``: Ray's start, then an I/O error naming no URL).
WRITABLE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")
#: Stores this package reads and never writes (``storage``: a write there is refused, after Ray's start).
READ_ONLY_SCHEMES = frozenset({"http", "https"})
#: fsspec's stores that live inside one process: what one process writes there, no other sees.
PROCESS_LOCAL_SCHEMES = frozenset({"memory"})
#: What the dash means on most command lines: standard output, which a command's files cannot go to.
STANDARD_OUTPUT = "-"


def looks_like_a_url(location: Location) -> bool:
    """True for a local path written as a store's URL with its ``//`` left out (:data:`LOOKS_LIKE_A_URL`):
    what an output, written there, refuses (:func:`url_without_slashes_problem`)."""
    written = location.reveal()
    return location.local_path is not None and "://" not in written and LOOKS_LIKE_A_URL.match(written) is not None


def url_without_slashes_problem(location: Location, kind: str = "folder") -> str:
    """What a refusal of a :func:`looks_like_a_url` output says after its flag, and what to do: write the URL
    whole, or write ``./`` before a local ``kind`` (``folder``, ``file``) of that name; shown redacted."""
    return (
        f"{location} looks like a URL without its // (SCHEME://BUCKET/PATH); write it whole, or give a local {kind} "
        f"of that name as ./{location}"
    )


def unwritable_problem(location: Location, kind: str = "folder") -> str | None:
    """Why no output can be written at ``location``, after its flag, and what to do (redacted); None where one can.
    The one rule of every output a command writes (a backtest's ``--output``, ``tune``'s, serve's
    ``--forecast-log``), asked before anything starts: ``-`` (standard output elsewhere; here a ``kind`` named
    ``-``), fsspec's ``memory://`` (a store inside one process), a URL without its ``//`` (:func:`looks_like_a_url`),
    an ``http(s)://`` server (read only), a scheme this package does not write (``ftp://``;
    :data:`WRITABLE_SCHEMES`), a URL with no bucket. ``kind`` is what the output is (``folder``, or ``file`` for
    ``tune``)."""
    supported = f"give a local {kind} or a URL of " + ", ".join(f"{scheme}://" for scheme in WRITABLE_SCHEMES)
    written, scheme = location.reveal(), location.scheme
    if location.local_path is not None and "://" not in written and written == STANDARD_OUTPUT:
        return (
            f"- is not standard output here: the command writes a {kind}, and would make one named '-'; "
            f"give a {kind} (./- for one of that name)"
        )
    if scheme in PROCESS_LOCAL_SCHEMES:
        return (
            f"{location} is a store inside one process ({scheme}://): the actors, other processes, cannot "
            f"write there and no later command could read it; {supported}"
        )
    if looks_like_a_url(location):
        return url_without_slashes_problem(location, kind)
    if scheme in READ_ONLY_SCHEMES:
        return f"{location} is an {scheme}:// server, which is read here, never written; {supported}"
    if location.is_url and scheme not in WRITABLE_SCHEMES:
        return f"{location}: this package does not write to {scheme}:// locations; {supported}"
    if location.is_url and not urlsplit(written).netloc:
        return f"{location} names no bucket or host (a URL is SCHEME://BUCKET/PATH); give one"
    return None
