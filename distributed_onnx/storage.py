"""Where a backtest reads its data and writes its run directory: a local path or a URL every node can reach.

A *location* is a :class:`~distributed_onnx.location.Location`: a path on this machine, or a URL that
``pyarrow.fs.FileSystem.from_uri`` understands (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``, ``file://``);
other schemes go through fsspec when it is installed. Every function takes a Location, parsed once where the user
gave it (the settings, a command's argument), never again here: a path or a string is refused by the type
checker, not parsed on each call. The URL's whole text, credentials included, is read only by
:func:`filesystem`, to hand it to pyarrow or fsspec, and every message is built from the Location, which shows
itself redacted. On a cluster the driver reads the data and writes the run's
summary files, and every actor writes the forecast parts it computed, so the run directory must be one place
that *every node* and the user can reach under the same name: shared storage or an object store, never a
node's own temp directory.

Writes are atomic either way: a local file is written under a temporary name, fsynced and renamed into place
(so a killed run never leaves a half-written file under a final name); an object is uploaded from memory under a
temporary name and copied into place by the store, since pyarrow publishes a stream that failed part-way.
``file://`` URLs are local paths. What ``http(s)://`` takes beyond fsspec's own reading (a server's silence, its
refusals, a file it sends only as a stream, the read timeout) is :mod:`distributed_onnx.storage_http`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distributed_onnx import redact as _redaction
from distributed_onnx.errors import ConfigError, DataError, MissingExtraError, StorageError
from distributed_onnx.location import Location
from distributed_onnx.redact import redact_text
from distributed_onnx.storage_http import (
    AnsweringFSSpecHandler,
    NoAnswerError,
    RefusedError,
    StreamOnlyError,
    fsspec_options,
)
from distributed_onnx.storage_unanswered import unanswered

logger = logging.getLogger(__name__)

# The one redaction (redact.py), for documents and free text; a Location shows itself redacted.
redact = _redaction.redact
redacted = _redaction.redacted
T = TypeVar("T")

_CHUNK_BYTES = 1 << 20
#: Waits between attempts at a read that failed for a reason other than a missing file (an S3 SlowDown, an NFS
#: EIO): about 15 s in all before :func:`read_retrying` gives up.
READ_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)


#: The schemes pyarrow's own filesystems read (:func:`filesystem` goes to fsspec for the others).
_ARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs", "file", "mock"})


def join(location: Location, *parts: str) -> Location:
    """``location / part / ...`` for a path or a URL (:meth:`Location.join`).

    A URL's options stay options: ``s3://bucket/run?endpoint_override=host:9000`` joined with ``forecasts``
    is ``s3://bucket/run/forecasts?endpoint_override=host:9000`` (appending to the whole string put every file
    inside the query, where pyarrow either refused it or read the bucket's root).
    """
    return location.join(*parts)


def filesystem(location: Location) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of ``location`` and the path inside it.

    The one place a URL's whole text (credentials, options) is read (:meth:`Location.reveal`): it goes to pyarrow
    or fsspec, and every message here is built from the Location itself, redacted.
    """
    if location.local_path is not None:  # absolute: pyarrow reads a relative ``user:pw@host/dir`` as a URI
        return pafs.LocalFileSystem(), str(location.local_path.absolute())
    scheme = location.scheme
    try:
        return pafs.FileSystem.from_uri(location.reveal())
    except OSError as exc:
        if scheme in {"hdfs", "viewfs"} and ("libjvm" in str(exc) or "libhdfs" in str(exc)):
            raise MissingExtraError(  # pyarrow's message lists every path it tried: dozens of lines
                f"Cannot open {location}: pyarrow's HDFS client needs Java and libhdfs, and could not load them "
                "(set JAVA_HOME, HADOOP_HOME and ARROW_LIBHDFS_DIR on every node)."
            ) from None
        raise
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as arrow_error:
        if scheme in _ARROW_SCHEMES and isinstance(arrow_error, pa.ArrowInvalid):
            # pyarrow knows the scheme and refused the URL (an option it does not take, such as ?secret_key=):
            # fsspec would only answer "install s3fs", which does not help. Credentials go in the environment.
            raise ConfigError(
                f"Cannot open {location}: {location.scrub(str(arrow_error))}. pyarrow's {scheme}:// URLs take "
                "options such as region, endpoint_override and scheme; give credentials in the environment "
                "(e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or the URL's user-info, not as options.",
                location=str(location),
            ) from None
        try:
            import fsspec  # type: ignore[import-untyped]
        except ImportError:
            if scheme in _ARROW_SCHEMES:
                raise MissingExtraError(
                    f"pyarrow cannot open {location}: {location.scrub(str(arrow_error))}. Install a pyarrow build "
                    "with that filesystem."
                ) from None
            raise ConfigError(
                f"Cannot open {location}: pyarrow does not know the scheme {scheme}:// and fsspec is not "
                "installed. Use a local path, an s3:// / gs:// URL, or `pip install fsspec`.",
                location=str(location),
            ) from None
        try:
            spec_fs, path = fsspec.core.url_to_fs(location.reveal(), **fsspec_options(scheme))
        except ImportError as exc:  # fsspec knows the scheme; its implementation's package is missing
            raise MissingExtraError(
                f"Cannot open {location}: {location.scrub(str(exc))} (fsspec's implementation of {scheme}:// is not "
                "installed)."
            ) from None
        except ValueError as exc:  # fsspec does not know the scheme either, or refused the URL
            raise ConfigError(f"Cannot open {location}: {location.scrub(str(exc))}.", location=str(location)) from None
        return pafs.PyFileSystem(AnsweringFSSpecHandler(spec_fs)), str(path)


class StorageNotAnsweringError(StorageError, ConnectionError):
    """A store that did not answer a write (refused, unreachable, timed out): the command's line names the location
    in the storage's own words (exit 3). Also a ``ConnectionError``, so every caller that retries a write on an
    ``OSError`` (an actor's part: :mod:`~distributed_onnx.evaluation.actor.part`) still does."""


def _file_info(location: Location, what: str = "") -> pafs.FileInfo:
    """What the store says is at ``location`` (a file, a folder, nothing); a store that does not answer is one
    :class:`StorageError` naming the location (exit 3), whichever command asked
    (:class:`~distributed_onnx.storage_http.AnsweringFSSpecHandler`; pyarrow's own stores raise their ``OSError``
    directly: that becomes a :class:`StorageNotAnsweringError`, still an ``OSError`` for a caller that retries on
    one)."""
    fs, inner = filesystem(location)
    doing = f"read {what}".strip()
    try:
        return fs.get_file_info(inner)
    except NoAnswerError as exc:
        raise not_answering(location, doing, exc, StorageError) from exc
    except RefusedError as exc:
        raise StorageError(
            f"Cannot {doing} {location}: the server refuses access ({location.scrub(str(exc))}). Check the URL's "
            "credentials and the server's permissions.",
            path=str(location),
        ) from exc
    except OSError as exc:
        if unanswered(exc):
            raise not_answering(location, doing, exc) from exc
        raise


def not_answering(
    location: Location, doing: str, exc: BaseException, error: type[StorageError] = StorageNotAnsweringError
) -> StorageError:
    """The one line of a store that did not answer (``doing``: ``read data file``, ``write``): what failed at
    ``location`` (redacted), the client's words (the location's secrets masked in them), what to do."""
    return error(
        f"Cannot {doing} {location}: the storage does not answer ({location.scrub(_redaction.quoted(exc))}). "
        "Check the URL's endpoint and the network, and rerun when the storage answers.",
        path=str(location),
    )


def is_file(location: Location, what: str = "") -> bool:
    """True for an existing file; ``what`` (``"data file"``) names it in the error of a store that does not answer."""
    path = location.local_path
    if path is not None:
        return path.is_file()
    return bool(_file_info(location, what).type == pafs.FileType.File)


def is_dir(location: Location) -> bool:
    """True for an existing folder (on a store: a prefix some object is under)."""
    path = location.local_path
    if path is not None:
        return path.is_dir()
    return bool(_file_info(location).type == pafs.FileType.Directory)


def file_size(location: Location) -> int | None:
    """The size of a file in bytes, or None when there is no file."""
    path = location.local_path
    if path is not None:
        return path.stat().st_size if path.is_file() else None
    info = _file_info(location)
    return int(info.size) if info.type == pafs.FileType.File else None


def make_dirs(location: Location) -> None:
    path = location.local_path
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        return
    fs, inner = filesystem(location)
    with _writable(location):
        try:
            fs.create_dir(inner, recursive=True)
        except OSError as exc:
            if unanswered(exc):
                raise not_answering(location, "write", exc) from exc
            raise


@contextmanager
def _writable(location: Location) -> Iterator[None]:
    """A filesystem that reads only (fsspec's ``https://``) refuses a write with a bare ``NotImplementedError``
    (a traceback and exit 4): one :class:`ConfigError` naming the location instead."""
    try:
        yield
    except NotImplementedError:
        raise ConfigError(
            f"Cannot write to {location}: {location.scheme}:// is read-only here. Write to a local path or an object "
            "store (s3://, gs://, abfs://...).",
            location=str(location),
        ) from None


def list_files(directory: Location, prefix: str, suffix: str) -> list[Location]:
    """Files directly in ``directory`` named ``prefix*suffix``, sorted by name; empty if it does not exist."""
    path = directory.local_path
    if path is not None:
        return [Location(found) for found in sorted(path.glob(f"{prefix}*{suffix}"))] if path.is_dir() else []
    fs, inner = filesystem(directory)
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    names = sorted(
        info.base_name
        for info in infos
        if info.type == pafs.FileType.File and info.base_name.startswith(prefix) and info.base_name.endswith(suffix)
    )
    return [join(directory, name) for name in names]


def entries(directory: Location) -> dict[str, bool]:
    """The names directly in ``directory``, each with whether it is a folder (on a store: a prefix some object is
    under); empty if it does not exist. One listing: one request on a store."""
    path = directory.local_path
    if path is not None:
        return {entry.name: entry.is_dir() for entry in path.iterdir()} if path.is_dir() else {}
    fs, inner = filesystem(directory)
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    return {info.base_name: info.type == pafs.FileType.Directory for info in infos}


def delete(location: Location) -> None:
    path = location.local_path
    if path is not None:
        path.unlink(missing_ok=True)
        return
    fs, inner = filesystem(location)
    if fs.get_file_info(inner).type == pafs.FileType.File:
        fs.delete_file(inner)


def read_bytes(location: Location) -> bytes:
    path = location.local_path
    if path is not None:
        return path.read_bytes()
    fs, inner = filesystem(location)
    with fs.open_input_stream(inner) as stream:
        return bytes(stream.read())


def open_input_file(location: Location) -> Any:
    """A seekable pyarrow file (Parquet and CSV readers take it), or the local path itself."""
    path = location.local_path
    if path is not None:
        return path
    fs, inner = filesystem(location)
    try:
        return fs.open_input_file(inner)
    except StreamOnlyError:
        raise DataError(
            f"Cannot read {location} by ranges: the server sends it only as a stream (no size, or no range "
            "requests), and Parquet is read from its end first. Download it and give the local path, or serve it "
            "from a server that takes range requests."
        ) from None


def open_input_stream(location: Location) -> Any:
    """A pyarrow stream read from start to end (a CSV, a copy), or the local path itself: unlike
    :func:`open_input_file`, it takes a file a server sends only as a stream."""
    path = location.local_path
    if path is not None:
        return path
    fs, inner = filesystem(location)
    return fs.open_input_stream(inner)


def read_parquet(location: Location, columns: list[str] | None = None, filters: Any = None) -> pa.Table:
    """Read a Parquet file (``filters``: a ``pyarrow.compute`` expression; row groups it excludes are skipped).

    Without filters the file is read directly (``ParquetFile``): ``pq.read_table`` goes through
    ``pyarrow.dataset``, whose import pulls in pandas when it is installed, 0.3-0.6 s of the driver's CPU.
    """
    source = open_input_file(location)
    try:
        if filters is None:
            return pq.ParquetFile(source).read(columns=columns)
        return pq.read_table(source, columns=columns, filters=filters)
    finally:
        if not isinstance(source, Path):
            source.close()


def read_parquet_metadata(location: Location) -> Any:
    """The footer of a Parquet file (rows, row groups, key-value metadata) without reading its data."""
    source = open_input_file(location)
    if isinstance(source, Path):
        return pq.read_metadata(source)
    with source:
        return pq.read_metadata(source)


@contextmanager
def _replaced_atomically(path: Path) -> Iterator[str]:
    """A temporary name beside ``path`` to write to; renamed onto ``path`` only if the block succeeds.

    The temporary file is made new (``O_EXCL``, never an existing name) and the rename replaces the *entry* at
    ``path``: a symbolic or hard link planted there is replaced by the file, and what it pointed to is untouched.
    Every file a command writes at a fixed name (``run.json``, ``summary.json``, ``metrics.parquet``...) goes
    through here; the run's lock, which must stay one file, refuses such an entry instead
    (:mod:`distributed_onnx.evaluation.run_lock`).

    The file gets the mode a plain ``open`` would give it, ``0666`` less the process's umask (a temporary file
    starts as 0600): outputs and checkpoints are shared data where the umask says so, and private where it does
    not (``umask 077``), as the directories already were.
    """
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".tmp-{path.name}.", delete=False)
    handle.close()
    try:
        yield handle.name
        os.chmod(handle.name, 0o666 & ~_umask())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask: from ``/proc`` on Linux, where reading it does not set it (the writer threads of a
    replica write at the same time), else by setting it and back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _upload_atomically(location: Location, payload: bytes) -> None:
    """Upload to a temporary object beside ``location``, then copy it into place (server-side) and delete it.

    pyarrow closes an output stream that an exception left (and one that is garbage collected), and closing
    *publishes* what was uploaded so far: a torn object under the final name (measured on an S3 server: a
    1,000-byte object after an exception inside ``with open_output_stream(...)``). So the final name only ever
    receives a whole object, by a copy; a failed upload leaves at most a ``.tmp-`` object, deleted here or by
    the next run (:func:`distributed_onnx.evaluation.output_cleanup.clean_partials`).
    """
    fs, inner = filesystem(location)
    directory, _, name = inner.rpartition("/")
    temporary = f"{directory}/.tmp-{name}.{uuid.uuid4().hex}" if directory else f".tmp-{name}.{uuid.uuid4().hex}"
    answered = True
    try:
        with _writable(location), fs.open_output_stream(temporary) as stream:
            stream.write(payload)
        fs.copy_file(temporary, inner)
    except OSError as exc:
        if unanswered(exc):
            answered = False  # no delete then: it would wait out the client's retries again, on the same silence
            raise not_answering(location, "write", exc) from exc
        raise
    finally:
        if answered:
            with contextlib.suppress(Exception):  # best effort: a leftover is cleaned by the next run
                fs.delete_file(temporary)


def write_bytes(location: Location, payload: bytes) -> int:
    """Write ``payload`` atomically (see the module docstring), flushed to disk before the rename; returns its size."""
    path = location.local_path
    if path is None:
        _upload_atomically(location, payload)
        return len(payload)
    with _replaced_atomically(path) as temporary, open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    return len(payload)


def write_parquet(location: Location, table: pa.Table, **options: Any) -> int:
    """Write ``table`` as Parquet atomically and durably; returns the file's size in bytes.

    ``options`` go to ``pyarrow.parquet.write_table``. Locally the file is written, fsynced, then renamed into
    place, so a crash leaves either the whole file under its final name or nothing there.
    """
    return _write_encoded(location, lambda out: pq.write_table(table, out, **options))


def write_parquet_tables(location: Location, schema: pa.Schema, tables: Iterable[pa.Table], **options: Any) -> int:
    """Write ``tables`` (each of ``schema``) one after the other as one Parquet file, atomically and durably, without
    holding more than one of them; returns the file's size in bytes.

    The file reads back as ``pyarrow.concat_tables(tables)`` written by :func:`write_parquet` would (the same rows,
    values and schema; its row groups end where each table ends). ``options`` go to ``pyarrow.parquet.ParquetWriter``.
    A URL gets the encoded file in memory first (compressed: a fraction of the tables), then one upload.
    """

    def encode(out: Any) -> None:
        with pq.ParquetWriter(out, schema, **options) as writer:
            for table in tables:
                writer.write_table(table)

    return _write_encoded(location, encode)


def _write_encoded(location: Location, encode: Callable[[Any], None]) -> int:
    """Run ``encode`` (it writes one whole file to the stream it is given) into ``location`` atomically.

    Locally into a temporary file, fsynced, then renamed into place; a URL gets the file serialized in memory
    first, because a stream that failed half-way must not be closed into a published object. Returns the size.
    """
    path = location.local_path
    if path is not None:
        with _replaced_atomically(path) as temporary, open(temporary, "wb") as handle:
            encode(handle)
            handle.flush()
            os.fsync(handle.fileno())
            return handle.tell()
    sink = pa.BufferOutputStream()
    encode(sink)
    return write_bytes(location, sink.getvalue().to_pybytes())


def sha256(location: Location) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    path = location.local_path
    if path is not None:
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                digest.update(chunk)
        return digest.hexdigest()
    fs, inner = filesystem(location)
    with fs.open_input_stream(inner) as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_error(exc: BaseException, location: Location, what: str) -> StorageError | None:
    """A :class:`StorageError` (exit 3: the environment) naming ``what`` at ``location`` when ``exc`` says the
    storage did not answer (:func:`~distributed_onnx.storage_unanswered.unanswered`); None when it answered, the
    caller's own error then applies (a missing or unreadable file: exit 2)."""
    if not unanswered(exc):
        return None
    return not_answering(location, f"read {what}", exc, StorageError)


def read_retrying(
    read: Callable[[], T],
    what: str,
    *,
    delays_s: Sequence[float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """``read()``, retried with backoff while it raises an ``OSError`` that is not a missing file.

    A missing file (``FileNotFoundError``) is an answer and passes through at once; any other ``OSError`` says
    only that the storage did not answer now, so it is retried, then raised as one :class:`StorageError` naming
    ``what``. Callers that decide from a read whether to delete something (the resume) must delete nothing then.
    """
    delays_s = READ_RETRY_DELAYS_S if delays_s is None else delays_s
    sleep = sleep or time.sleep
    for attempt, delay in enumerate([*delays_s, None], start=1):
        try:
            return read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if delay is None:
                raise StorageError(
                    f"Cannot read {what} ({attempt} attempts over {sum(delays_s):.0f} s): {exc}. Nothing was "
                    "deleted; rerun when the storage answers again.",
                    path=what,
                ) from exc
            logger.warning("Reading %s failed (%s); retrying in %.1f s", redact(what), redact_text(str(exc)), delay)
            sleep(delay)
    raise AssertionError("unreachable")  # the loop returns or raises
