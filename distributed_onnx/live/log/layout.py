"""The forecast log's format: the backtest's forecast schema plus who answered, when, and for which request.

A log is a folder (local, or an object-store URL through :mod:`distributed_onnx.storage`) of Parquet files,
Hive-partitioned by the request's UTC day and the model::

    LOG/day=2026-12-01/model=taylor_chronos2_patchtst/part-20261201T101500123456-<writer>-000007.parquet
    LOG/_log_state/<writer>.json        each writer's own record: forecasts logged and dropped, and why

Each row is one (window, lead) as in the backtest's ``forecasts/part-*.parquet`` (``series_id, window_id,
origin, cutoff, timestamp, lead, y`` and one float column per quantile, ``q0.1`` ...), plus :data:`EXTRA_FIELDS`:
``request_time``, ``request_id``, ``model``, ``checkpoint_sha256``, ``role`` (``served``: the answer the client
got; ``shadow``: a forecast only logged) and ``resolution_minutes``. ``y`` is always null here: the actuals
have not happened yet; ``score`` joins them in. A request without ``start`` has no timestamps: its rows have
null ``origin``, ``cutoff`` and ``timestamp`` (logged anyway, and counted by ``score`` as not placeable).

A *window* of the log is one series of one request: its ``window_id`` is a digest of the request's *key* and
the series' position in the request, so a shadow model's forecast of the same window carries the same id as the
served one, and the two can be scored on the same pairs. The key is drawn by the server for each answered
request (:attr:`LoggedForecast.request_key`, 128 random bits), never taken from the client: a client's
``X-Request-ID`` (or v2 ``id``) is kept as data in ``request_id`` (at most :data:`MAX_REQUEST_ID_CHARS`
characters), so reusing one, or sending the shadow's model an id a later request reuses, can neither merge two
requests' windows nor make one request's windows collide with another's.

Files of one partition may hold different quantile columns (requests may ask for other levels); every file is
written whole and atomically, never appended to. Each file holds one set of levels, so read it file by file (as
``score`` does), or merge the files' schemas: ``pyarrow.dataset`` and ``pandas.read_parquet`` of the whole folder
take the first file's columns and silently drop the levels only other files have.

A requested level outside the model's native range is served clamped, holding the nearest native level's values
(:func:`distributed_onnx.model.quantiles.clamped_levels`, as the response's ``quantile_clamping`` says): a
``q0.05`` column may hold the model's 0.1. Each file records which of its levels are, in its Parquet schema's
metadata under :data:`CLAMPING_KEY` (``b"distributed_onnx.quantile_clamping"``): a JSON list of
``{"requested": 0.05, "served_by": 0.1}``, the form a backtest's ``summary.json`` records (empty: none clamped),
and the model's native levels under :data:`NATIVE_KEY`. ``pyarrow.parquet.read_schema(path).metadata`` reads them.
:data:`CONTEXT_KEY` records the context length of the checkpoint that forecast the file's windows (a JSON integer;
absent in files written before it was recorded): how many seasons ``score``'s seasonal-quantile baseline looks
back over, as a backtest of that checkpoint takes it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt

from distributed_onnx import storage
from distributed_onnx.errors import DataError
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import ClampedLevel, clamped_levels, quantile_column_name

TIMESTAMP = pa.timestamp("us", tz="UTC")


def now_us() -> int:
    """Now as the log's timestamps keep it: microseconds since the epoch (:data:`TIMESTAMP`)."""
    return time.time_ns() // 1000


STATE_DIR = "_log_state"
#: The keys of a log file's Parquet schema metadata: its levels served clamped (JSON list of
#: :meth:`ClampedLevel.as_record`), and the native levels of the model that forecast them (JSON list).
CLAMPING_KEY = b"distributed_onnx.quantile_clamping"
NATIVE_KEY = b"distributed_onnx.native_quantiles"
#: The key of the context length (steps) of the checkpoint that forecast a log file's windows (JSON integer).
CONTEXT_KEY = b"distributed_onnx.context_length"
_US_PER_MINUTE = 60_000_000
_FILE = re.compile(r"part-.*\.parquet$")

Role = Literal["served", "shadow"]

#: The longest client request id the log keeps (longer ones are cut); series ids are bounded at the routes
#: (:data:`distributed_onnx.bounds.MAX_SERIES_ID_BYTES`, the backtest's bound too).
MAX_REQUEST_ID_CHARS = 128

#: What the log adds after the quantile columns.
EXTRA_FIELDS = [
    pa.field("request_time", TIMESTAMP),
    pa.field("request_id", pa.string()),
    pa.field("model", pa.string()),
    pa.field("checkpoint_sha256", pa.string()),
    pa.field("role", pa.string()),
    pa.field("resolution_minutes", pa.int32()),
]


@dataclass(frozen=True)
class LoggedForecast:
    """One model's forecasts for one request: what the serving side hands the log (cheap to build).

    ``origins_us[i]`` is series ``i``'s first forecast timestamp (microseconds since the epoch, UTC), or None
    when the request gave no ``start``; ``forecasts`` is ``[series, horizon, quantiles]``. ``request_key`` names
    the answered request in the windows' ids (the server's, shared by the primary and its shadows); empty, the
    ids are derived from ``request_id`` (logs written before the key existed, and in-process callers).
    ``native_quantiles``: the levels the model predicts, which say which of ``quantiles`` were served clamped
    (:attr:`clamped`); empty when not known (no level is then recorded as clamped). ``context_length``: the
    checkpoint's context length in steps, which ``score``'s seasonal-quantile baseline looks back over (0: not
    known, nothing recorded).
    """

    model: str
    checkpoint_sha256: str
    role: Role
    request_id: str
    request_time_us: int
    resolution_minutes: int
    series_ids: Sequence[str]
    origins_us: Sequence[int | None]
    quantiles: tuple[float, ...]
    forecasts: np.ndarray
    request_key: str = ""
    native_quantiles: tuple[float, ...] = ()
    context_length: int = 0

    @property
    def clamped(self) -> tuple[ClampedLevel, ...]:
        """The requested levels served clamped, each with the native level whose values it holds."""
        return tuple(clamped_levels(self.quantiles, self.native_quantiles)) if self.native_quantiles else ()

    @property
    def n_windows(self) -> int:
        return int(self.forecasts.shape[0])

    @property
    def day(self) -> str:
        """The request's UTC day, ``YYYY-MM-DD``: the log's first partition."""
        return datetime.fromtimestamp(self.request_time_us / 1e6, UTC).strftime("%Y-%m-%d")


def window_id(request_key: str, position: int) -> str:
    """16 hex digits naming series ``position`` of the request keyed ``request_key`` (the same for every model)."""
    return hashlib.blake2b(f"{request_key}\x00{position}".encode(), digest_size=8).hexdigest()


def forecast_rows(items: LoggedForecast | Sequence[LoggedForecast]) -> pa.Table:
    """The log rows of one or many :class:`LoggedForecast` of the same quantile levels (and native ones): one per
    (series, lead), in the backtest's column order; the schema's metadata records the levels served clamped.

    Built column by column over the whole batch (the writer thread's work, off the request path): per window
    only its id, series and origin are touched in Python; every per-row column is one numpy or Arrow operation.
    """
    batch = [items] if isinstance(items, LoggedForecast) else list(items)
    if not batch:
        raise ValueError("no forecasts to tabulate")
    levels, native, context = batch[0].quantiles, batch[0].native_quantiles, batch[0].context_length
    series: list[str] = []
    ids: list[str] = []
    origins: list[int] = []
    known: list[bool] = []
    horizons: list[int] = []
    steps: list[int] = []
    owner: list[int] = []
    values = []
    for index, item in enumerate(batch):
        n_windows, horizon, n_quantiles = item.forecasts.shape
        if n_windows != len(item.series_ids) or n_windows != len(item.origins_us):
            raise ValueError(
                f"{n_windows} forecasts for {len(item.series_ids)} series ids and {len(item.origins_us)} origins"
            )
        if n_quantiles != len(item.quantiles) or item.quantiles != levels:
            raise ValueError(f"forecasts hold {n_quantiles} quantiles of levels {item.quantiles}; expected {levels}")
        if item.native_quantiles != native:
            raise ValueError(f"forecasts of native levels {item.native_quantiles}; expected {native}")
        if item.context_length != context:
            raise ValueError(f"forecasts of a checkpoint of context length {item.context_length}; expected {context}")
        series.extend(item.series_ids)
        key = item.request_key or item.request_id
        ids.extend(window_id(key, position) for position in range(n_windows))
        origins.extend(origin if origin is not None else 0 for origin in item.origins_us)
        known.extend(origin is not None for origin in item.origins_us)
        horizons.extend([horizon] * n_windows)
        steps.extend([item.resolution_minutes * _US_PER_MINUTE] * n_windows)
        owner.extend([index] * n_windows)
        values.append(np.asarray(item.forecasts, dtype=np.float32).reshape(n_windows * horizon, n_quantiles))
    horizon_w = np.asarray(horizons, dtype=np.int64)
    row_window = np.repeat(np.arange(horizon_w.size), horizon_w)
    first_row = np.cumsum(horizon_w) - horizon_w
    lead = (np.arange(row_window.size) - first_row[row_window] + 1).astype(np.int32)
    origin_row = np.asarray(origins, dtype=np.int64)[row_window]
    step_row = np.asarray(steps, dtype=np.int64)[row_window]
    unknown = ~np.asarray(known, dtype=bool)[row_window]
    take = pa.array(row_window)
    owner_row = pa.array(np.asarray(owner, dtype=np.int64)[row_window])

    def stamps(values_us: np.ndarray) -> pa.Array:
        return pa.array(values_us, TIMESTAMP, mask=unknown)

    columns: dict[str, pa.Array] = {
        "series_id": pa.array(series, pa.string()).take(take),
        "window_id": pa.array(ids, pa.string()).take(take),
        "origin": stamps(origin_row),
        "cutoff": stamps(origin_row - step_row),
        "timestamp": stamps(origin_row + (lead.astype(np.int64) - 1) * step_row),
        "lead": pa.array(lead),
        "y": pa.nulls(row_window.size, pa.float64()),
    }
    flat = np.concatenate(values)
    for position, level in enumerate(levels):
        columns[quantile_column_name(level)] = pa.array(np.ascontiguousarray(flat[:, position]))
    per_item: dict[str, list[object]] = {
        "request_time": [item.request_time_us for item in batch],
        "request_id": [item.request_id for item in batch],
        "model": [item.model for item in batch],
        "checkpoint_sha256": [item.checkpoint_sha256 for item in batch],
        "role": [item.role for item in batch],
        "resolution_minutes": [item.resolution_minutes for item in batch],
    }
    for field in EXTRA_FIELDS:
        columns[field.name] = pa.array(per_item[field.name], field.type).take(owner_row)
    clamping = [level.as_record() for level in batch[0].clamped]
    metadata = {CLAMPING_KEY: json.dumps(clamping).encode(), NATIVE_KEY: json.dumps(list(native)).encode()}
    if context:
        metadata[CONTEXT_KEY] = json.dumps(context).encode()
    return pa.table(columns).replace_schema_metadata(metadata)


def clamping_of(metadata: dict[bytes, bytes] | None) -> tuple[ClampedLevel, ...]:
    """The levels a log file records as served clamped (its schema's :data:`CLAMPING_KEY`); none in a file
    written before they were recorded. A record of another shape is a ``ValueError`` (the file is not a log's)."""
    records = json.loads((metadata or {}).get(CLAMPING_KEY, b"[]"))
    return tuple(ClampedLevel(float(record["requested"]), float(record["served_by"])) for record in records)


def context_length_of(metadata: dict[bytes, bytes] | None) -> int | None:
    """The checkpoint's context length a log file records (its schema's :data:`CONTEXT_KEY`); None in a file
    written before it was recorded. A record that is not a positive integer is a ``ValueError`` (the file is not
    a log's)."""
    raw = (metadata or {}).get(CONTEXT_KEY)
    if raw is None:
        return None
    value = json.loads(raw)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{CONTEXT_KEY.decode()} {value!r} is not a context length (a positive whole number)")
    return value


def partition(root: Location, day: str, model: str) -> Location:
    """The folder of one (day, model) partition (the model name quoted, so any name is one path segment)."""
    return storage.join(root, f"day={day}", f"model={quote(model, safe='')}")


def file_name(first_request_time_us: int, writer_id: str, sequence: int) -> str:
    """A file name that sorts by time and never collides between writers (replicas) or flushes."""
    moment = datetime.fromtimestamp(first_request_time_us / 1e6, UTC).strftime("%Y%m%dT%H%M%S%f")
    return f"part-{moment}-{writer_id}-{sequence:06d}.parquet"


def state_path(root: Location, writer_id: str) -> Location:
    return storage.join(root, STATE_DIR, f"{writer_id}.json")


def log_files(root: Location) -> list[Location]:
    """Every log file under ``root`` (any partition), sorted by path; empty when the log does not exist yet."""
    base = Location.parse(root)
    path = base.local_path
    if path is not None:
        if not path.is_dir():
            return []
        return [Location(found) for found in sorted(path.glob("day=*/model=*/part-*.parquet")) if found.is_file()]
    fs, inner = storage.filesystem(base)
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    found_urls = []
    for info in infos:
        relative = info.path[len(inner.rstrip("/")) + 1 :]
        pieces = relative.split("/")
        if (
            info.type == pafs.FileType.File
            and len(pieces) == 3
            and pieces[0].startswith("day=")
            and pieces[1].startswith("model=")
            and _FILE.match(pieces[2])
        ):
            found_urls.append(base.join(*pieces))
    return sorted(found_urls, key=str)


def relative_name(root: Location, path: Location) -> str:
    """``path`` (a file :func:`log_files` found under ``root``) named from ``root``: how ``score`` names a file."""
    return Location.parse(path).relative_to(Location.parse(root))


def read_states(root: Location) -> list[dict[str, Any]]:
    """Every writer's state record (see :mod:`.writer`), unreadable ones left out (a writer replaces its record
    atomically, but a store may still serve a torn one); a readable record of another shape is a
    :class:`DataError` naming the file (scoring it failed later with exit 4)."""
    from pydantic import ValidationError

    from distributed_onnx.errors import describe_validation

    records = []
    for path in storage.list_files(storage.join(root, STATE_DIR), "", ".json"):
        try:
            record = json.loads(storage.read_bytes(path))
        except (OSError, ValueError):
            continue
        try:
            _StateRecord.model_validate(record)
        except ValidationError as exc:
            raise DataError(
                f"{path}: not a forecast log writer's record ({describe_validation(exc.errors())}); move it out of "
                f"{STATE_DIR}/, or restore it, and rerun",
                path=str(path),
            ) from None
        records.append(record)
    return records


class _Counts(BaseModel):
    """What scoring reads of one model's (or the unattributed requests') counts in a writer's record."""

    model_config = ConfigDict(extra="allow")

    dropped: dict[str, NonNegativeInt] | None = None
    shadow_failed: NonNegativeInt | None = None
    shadow_nonfinite: NonNegativeInt | None = None
    requests_answered: NonNegativeInt | None = None
    requests_failed: dict[str, NonNegativeInt] | None = None
    failures_logged: NonNegativeInt | None = None
    failures_dropped: NonNegativeInt | None = None


class _StateRecord(BaseModel):
    """The shape of ``_log_state/<writer>.json`` that scoring reads (other keys are the writer's own)."""

    model_config = ConfigDict(extra="allow")

    format: PositiveInt | None = None
    models: dict[str, _Counts] | None = None
    unattributed: _Counts | None = None
