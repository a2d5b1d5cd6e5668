"""The log's failures table: every request the service did not answer, with why, for whom and when (no body).

A forecast answered is a set of rows in the forecasts' partitions (:mod:`.layout`); a request that failed has no
forecast to put there, so it is one row of a table of its own, beside them and partitioned the same way::

    LOG/_failures/day=2026-12-01/model=taylor_chronos2_patchtst/part-20261201T101500123456-<writer>-000003.parquet
    LOG/_failures/day=2026-12-01/model=__HIVE_DEFAULT_PARTITION__/part-...parquet   (the model was not known)

Kept apart rather than as rows of the forecast schema so that the forecasts' readers (``score``, anyone reading
``day=*/model=*``) are untouched: the folder starts with ``_`` (as ``_log_state``), outside the forecasts' glob,
so a reader that predates it never sees it. Each row (:data:`FAILURE_FIELDS`): ``request_time``, ``request_id``
(the client's id, as data, cut to :data:`~.layout.MAX_REQUEST_ID_CHARS`), ``model`` (null when the request never
named a served model: a body refused before it was read, malformed JSON, an unknown name), ``kind`` (one of
:data:`KINDS`), ``reason`` (a short code), ``message`` (the error's first line, URLs redacted, at most
:data:`MAX_MESSAGE_CHARS` characters; never the request body, though it may quote the field or parameter it
names), ``status`` (the HTTP status of the shared error mapping), ``grpc_status`` (the gRPC code's name over
gRPC, else null), ``protocol`` (``http`` / ``grpc``) and ``endpoint`` (``forecast``, ``infer``, ``grpc_infer``).

The recorder (:class:`FailureLog`) is here too, so that a failure record has one home: the serving side wraps
each request in :meth:`FailureLog.watch`; an exception leaving it (the 4xx of validation, the 503 of admission, a
model's 500, anything else) is described by the serving side's ``classify`` (what kind, why, which HTTP status:
:func:`distributed_onnx.serve.wire.failure_kinds.describe`), turned into a row (a short reason code, the error's
one-line message with URLs redacted, never the body) and handed to the log's queue, then re-raised unchanged: the
client gets exactly the answer it would have got without the log. Recording is a few string operations and a
queue put (constant time: the file is written by the log's thread, off the event loop), and it can never change
the answer: any error while recording is counted, warned about at most once a minute, and swallowed.

The failure *rate* is not read from this table but from the writers' counters (``_log_state``: requests
answered and failed per model, :mod:`.writer`), which count every request even when the log had to drop its
record; a log whose records carry no :data:`~.writer.LOG_FORMAT` of 2 or more predates them (no rate known).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol, TypeVar
from urllib.parse import quote

import pyarrow as pa

from distributed_onnx import storage
from distributed_onnx.live.log.layout import MAX_REQUEST_ID_CHARS, TIMESTAMP, log_files, now_us, relative_name
from distributed_onnx.live.log.throttled import ThrottledWarning
from distributed_onnx.location import Location
from distributed_onnx.redact import redact_text

T = TypeVar("T")

FAILURES_DIR = "_failures"
#: The partition of failures whose model is not known (Hive's name for a null partition value).
UNKNOWN_MODEL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: The longest message kept (its first line; longer ones are cut, ending in ``...``).
MAX_MESSAGE_CHARS = 240

#: The request was refused as invalid (4xx but overload): malformed JSON, wrong fields or tensors, unknown model,
#: a body or response too large, values the model cannot forecast finitely.
VALIDATION = "validation"
#: The replica was full (503 + Retry-After: requests or their memory in flight).
ADMISSION = "admission"
#: A repository model did not load (its checkpoint is broken, or the repository does not answer): 503, its reason
#: the error's class (``CheckpointCorruptError``) or ``repository_unavailable``.
LOAD = "load"
#: The model failed on valid input (its session raised, or its backend is closed).
MODEL_ERROR = "model_error"
#: Anything else the service answered 5xx for (a bug): still counted, never hidden.
INTERNAL = "internal"
#: The client went away (or Serve's request timeout cut the request) before the answer.
CANCELLED = "cancelled"
KINDS = (VALIDATION, ADMISSION, LOAD, MODEL_ERROR, INTERNAL, CANCELLED)

FAILURE_FIELDS = [
    pa.field("request_time", TIMESTAMP),
    pa.field("request_id", pa.string()),
    pa.field("model", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("reason", pa.string()),
    pa.field("message", pa.string()),
    pa.field("status", pa.int32()),
    pa.field("grpc_status", pa.string()),
    pa.field("protocol", pa.string()),
    pa.field("endpoint", pa.string()),
]
FAILURE_SCHEMA = pa.schema(FAILURE_FIELDS)


@dataclass(frozen=True)
class LoggedFailure:
    """One failed request, as the serving side hands it to the log (cheap to build: a few strings)."""

    request_time_us: int
    request_id: str
    model: str | None
    kind: str
    reason: str
    message: str
    status: int
    protocol: str
    endpoint: str
    grpc_status: str | None = None

    @property
    def day(self) -> str:
        return datetime.fromtimestamp(self.request_time_us / 1e6, UTC).strftime("%Y-%m-%d")

    def bounded(self) -> LoggedFailure:
        """This failure as the table keeps it: its message one line (:func:`one_line`), its request id cut."""
        return replace(self, request_id=self.request_id[:MAX_REQUEST_ID_CHARS], message=one_line(self.message))


def one_line(message: str) -> str:
    """``message`` as the table keeps it: its first line, URLs redacted (:func:`redact_text`), cut short."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = redact_text(line)
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."


def failure_rows(items: Sequence[LoggedFailure]) -> pa.Table:
    """The table rows of ``items``, one per failed request, in :data:`FAILURE_SCHEMA`."""
    columns = {
        "request_time": [item.request_time_us for item in items],
        "request_id": [item.request_id for item in items],
        "model": [item.model for item in items],
        "kind": [item.kind for item in items],
        "reason": [item.reason for item in items],
        "message": [item.message for item in items],
        "status": [item.status for item in items],
        "grpc_status": [item.grpc_status for item in items],
        "protocol": [item.protocol for item in items],
        "endpoint": [item.endpoint for item in items],
    }
    return pa.table({field.name: pa.array(columns[field.name], field.type) for field in FAILURE_FIELDS})


def failure_partition(root: Location, day: str, model: str | None) -> Location:
    """The folder of one (day, model) partition of the failures table (unknown model: the Hive null partition)."""
    name = UNKNOWN_MODEL_PARTITION if model is None else quote(model, safe="")
    return storage.join(root, FAILURES_DIR, f"day={day}", f"model={name}")


def failure_files(root: Location) -> list[Location]:
    """Every file of the failures table under ``root``, sorted; empty for a log without one (older logs)."""
    return log_files(storage.join(root, FAILURES_DIR))


def read_failures(root: Location) -> tuple[pa.Table, dict[str, str]]:
    """The whole failures table of the log at ``root`` and the files that could not be read (name: why).

    An unreadable file (torn, foreign) is named and left out, as ``score`` leaves out an unreadable forecast file.
    """
    tables = []
    unreadable: dict[str, str] = {}
    for path in failure_files(root):
        try:
            table = storage.read_parquet(path)
            tables.append(table.select([field.name for field in FAILURE_FIELDS]).cast(FAILURE_SCHEMA))
        except Exception as exc:  # any unreadable file: named, the rest read
            unreadable[relative_name(root, path)] = f"{type(exc).__name__}: {exc}"
    return (pa.concat_tables(tables) if tables else FAILURE_SCHEMA.empty_table()), unreadable


@dataclass(frozen=True)
class FailureCause:
    """What an exception means for its row: the serving side's description of a failed request."""

    kind: str
    reason: str
    status: int
    message: str
    grpc_status: str | None = None


class FailureSink(Protocol):
    """Where the recorder hands a failure's row: the forecast log (:meth:`.writer.ForecastLog.submit_failure`).

    All the recorder needs of the log, named here so that this module does not import the writer, which imports
    this module for the table's rows and partitions.
    """

    def submit_failure(self, item: LoggedFailure) -> bool:
        """Queue ``item``'s row; False when it was dropped (the recorder survives one that raises)."""
        ...


class FailureLog:
    """A replica's recorder of failed requests (nothing is recorded without a forecast log).

    ``describe`` tells what an exception means on the wire (``describe(exc, protocol)``); it is the serving side's,
    since the log knows no HTTP or gRPC.
    """

    def __init__(
        self,
        log: FailureSink | None,
        describe: Callable[[BaseException, str], FailureCause],
        warn_period_s: float = 60.0,
    ) -> None:
        self.log = log
        self.describe = describe
        #: Failures that could not be recorded (a bug here, never the client's answer): counted, warned about.
        self.unrecorded = 0
        self._warning = ThrottledWarning(warn_period_s)

    async def watch(
        self,
        answer: Awaitable[T],
        *,
        protocol: str,
        endpoint: str,
        model: Callable[[], str | None],
        request_id: Callable[[], str],
        received_us: int | None = None,
    ) -> T:
        """``answer``'s result; when it raises, the failure is recorded and the same exception re-raised.

        ``model`` and ``request_id`` are read only on failure (the model may become known while the request runs).
        """
        received = now_us() if received_us is None else received_us
        try:
            return await answer
        except BaseException as exc:
            self.record(exc, protocol=protocol, endpoint=endpoint, model=model, request_id=request_id, at_us=received)
            raise

    def record(
        self,
        exc: BaseException,
        *,
        protocol: str,
        endpoint: str,
        model: Callable[[], str | None],
        request_id: Callable[[], str],
        at_us: int,
    ) -> None:
        """Hand ``exc``'s row to the log; never raises (a failure to record must not change the answer)."""
        if self.log is None:
            return
        try:
            cause = self.describe(exc, protocol)
            row = LoggedFailure(
                request_time_us=at_us,
                request_id=request_id(),
                model=model(),
                kind=cause.kind,
                reason=cause.reason,
                message=cause.message,
                status=cause.status,
                protocol=protocol,
                endpoint=endpoint,
                grpc_status=cause.grpc_status,
            ).bounded()
            self.log.submit_failure(row)
        except Exception as problem:  # the answer stands as it is; the record is what is lost
            self.unrecorded += 1
            self._warning.warn("A failed request could not be recorded: %s: %s", type(problem).__name__, problem)
