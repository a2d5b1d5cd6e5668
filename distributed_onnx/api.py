"""The Python API of the backtest: ``distributed_onnx.backtest(data, ...)``, tables in and tables out.

A forecaster in a notebook holds a DataFrame, not a file, and wants tables back (as Nixtla's
``cross_validation(df, h=..., n_windows=..., step_size=...)`` gives them). This is the command's run
(:func:`distributed_onnx.evaluation.backtest.run_backtest`) behind one call: the same settings model, validation,
errors and numbers. The arguments are the settings (no environment variables or files apply here).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_onnx.errors import ConfigError, DataError, DistributedOnnxError, RayStartError

if TYPE_CHECKING:
    import pyarrow as pa

    from distributed_onnx.location import Location

#: Where in-memory data is written inside the run directory (the run's fingerprint hashes the data file).
INPUTS_DIR = "inputs"  # outputs.py's INPUTS_DIR, which evaluation/output_checks.py exempts from the folder check
_SORT_KEYS = [("model", "ascending"), ("series_id", "ascending"), ("origin", "ascending"), ("lead", "ascending")]


@dataclass(frozen=True)
class Backtest:
    """What :func:`backtest` returns. ``.to_pandas()`` turns either table into a DataFrame."""

    #: One row per (model, window, lead): ``series_id, window_id, origin, cutoff, timestamp, lead, y, q0.1, ...,
    #: model`` (the checkpoint's file stem: several checkpoints share the table), ordered by model, series,
    #: origin and lead.
    forecasts: pa.Table
    #: The long metrics table: ``model, scope, series_id, lead, metric, quantile, value, n, convention``.
    metrics: pa.Table
    #: What ``summary.json`` holds: settings, checkpoint, windows, actors, timing.
    summary: dict[str, Any]
    #: The run directory (report.html is there): a Path, or the Location of a URL (shown redacted); None when it
    #: was a temporary one, now deleted.
    output: Path | Location | None


def backtest(
    data: str | os.PathLike[str] | Any,
    *,
    checkpoint: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    horizon: int | None = None,
    n_windows: int | None = None,
    stride: int | None = None,
    quantiles: Sequence[float] | None = None,
    output: str | os.PathLike[str] | None = None,
    **settings: Any,
) -> Backtest:
    """Backtest ``checkpoint`` (one path, or a list to compare several in one run) on ``data``.

    ``data`` is a path or URL of a Parquet/CSV file, a ``pyarrow.Table``, a pandas DataFrame, or anything
    with the Arrow stream interface (polars...), in the long format of docs/inputs.md (``series_id``,
    ``timestamp``, ``y``, covariates; another tool's names with ``id_col="unique_id", time_col="ds"``...,
    the tables returned keep the project's). In-memory data is written as Parquet to ``output/inputs/`` (named by
    its digest, so rerunning the same call on the same ``output`` resumes). ``settings`` are the other
    fields of :class:`~distributed_onnx.evaluation.settings.BacktestSettings` (``actors=2``,
    ``rows_per_batch=512``, ``start=..., end=...``...); a None argument means "the default", as an absent flag.

    Runs on the Ray this process is connected to (``ray.init(address=...)`` first for a cluster), else on an
    embedded local Ray bound to 127.0.0.1, which stays up for the next call (``ray.shutdown()`` stops it).
    With ``output=None`` the run happens in a temporary directory that is deleted once the tables are read:
    only on a single machine, since actors on other nodes could not write there.

    Raises what the command reports: :class:`~distributed_onnx.errors.RayStartError` when Ray cannot be started
    or joined, :class:`~distributed_onnx.errors.ConfigError` for settings,
    :class:`~distributed_onnx.errors.DataError` for the table, :class:`~distributed_onnx.errors.BatchError`
    when parts failed (after everything else was written).

    Two windows of the bundled data, forecast by the bundled checkpoint (the defaults) and scored:

    >>> import distributed_onnx
    >>> from distributed_onnx.resources import REFERENCE_DATASET
    >>> result = distributed_onnx.backtest(
    ...     REFERENCE_DATASET, horizon=48, n_windows=2, stride=48, quantiles=[0.1, 0.5, 0.9], actors=1,
    ...     progress=False)
    >>> result.forecasts.num_rows  # one series, 2 windows, 48 leads
    96
    >>> result.forecasts.column_names[:7], result.forecasts.column_names[-4:]
    (['series_id', 'window_id', 'origin', 'cutoff', 'timestamp', 'lead', 'y'], ['q0.1', 'q0.5', 'q0.9', 'model'])
    >>> sorted(set(result.metrics.column("model").to_pylist()))  # the checkpoint and the two baselines
    ['seasonal_naive', 'seasonal_quantiles', 'taylor_chronos2_patchtst']
    >>> result.output is None  # a temporary directory, already deleted
    True

    A setting the backtest does not know is refused before anything runs:

    >>> distributed_onnx.backtest(REFERENCE_DATASET, colour="red")
    Traceback (most recent call last):
    ...
    distributed_onnx.errors.ConfigError: Invalid backtest settings: colour: Extra inputs are not permitted ...
    """
    from distributed_onnx.evaluation.backtest import run_backtest
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.evaluation.up_front import check_backtest
    from distributed_onnx.runtime.local_ray import alive_nodes

    table = None if isinstance(data, str | os.PathLike) else _as_arrow(data)
    if checkpoint is not None and not isinstance(checkpoint, str | os.PathLike):
        checkpoint = [os.fspath(each) for each in checkpoint]
    given: dict[str, Any] = {"checkpoint": checkpoint, "horizon": horizon, "n_windows": n_windows, "stride": stride}
    given |= {"quantiles": list(quantiles) if quantiles is not None else None, **settings}
    with tempfile.TemporaryDirectory(prefix="distributed-onnx-") as scratch:
        run_dir = _location(Path(scratch) / "run" if output is None else output)
        data_location = _location(data if table is None else "<in-memory table>")
        given |= {"output": run_dir, "data": data_location}
        run_settings = BacktestSettings.from_sources(given, source="backtest() arguments")
        check_backtest(run_settings)  # what the whole run would be refused for, before Ray starts
        _connect(run_settings.address)  # kept up after the run: the next call reuses it
        if output is None and alive_nodes() > 1:
            raise ConfigError(
                "output=None runs in a temporary directory on this machine, which actors on other nodes cannot "
                "write to: pass output= a shared path or a URL (s3://...)",
                key="output",
            )
        if table is not None:
            written = write_input(table, run_settings.output)
            run_settings = run_settings.model_copy(update={"data": written})
            try:
                result = run_backtest(run_settings)
            except DataError as exc:
                raise _naming_the_table(exc, written, data) from exc
        else:
            result = run_backtest(run_settings)
        forecasts = read_forecasts(run_settings.output)
        metrics = result.read_metrics()  # the whole table, read before a temporary directory goes
    kept = None if output is None else run_settings.output.local_path or run_settings.output
    return Backtest(forecasts, metrics, result.summary, kept)


def _connect(address: str | None) -> None:
    """Join ``address`` or start the embedded Ray; a failure is one :class:`RayStartError`, not Ray's traceback.

    On a loaded machine ``ray.init`` can fail outright (``RaySystemError: Failed to connect to GCS``, seen in a
    notebook as a page of Ray's internals): the caller gets what failed and what to do, and the cause chained.
    """
    from distributed_onnx.runtime.local_ray import connect

    try:
        connect(address)
    except DistributedOnnxError:
        raise
    except Exception as exc:  # Ray raises RaySystemError, ConnectionError, RuntimeError, TimeoutError... here
        where = f"the Ray at {address}" if address else "an embedded local Ray on 127.0.0.1"
        problem = " ".join(str(exc).split())[:500] or type(exc).__name__
        raise RayStartError(
            f"Could not start or join {where}: {type(exc).__name__}: {problem}. Nothing was run; retry when the "
            "machine is less loaded (or check the address and that the cluster is up), or call ray.init() "
            "yourself first."
        ) from exc


def read_forecasts(output: Location | Path | str) -> pa.Table:
    """Every model's forecasts of a run directory as one table (``forecasts/`` is a Hive dataset, ``model`` a
    column), ordered by model, series, origin and lead."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from distributed_onnx import storage
    from distributed_onnx.evaluation.outputs import FORECASTS_DIR, MODEL_KEY
    from distributed_onnx.location import Location

    fs, inner = storage.filesystem(storage.join(Location.parse(output), FORECASTS_DIR))
    try:
        partitioning = ds.partitioning(pa.schema([(MODEL_KEY, pa.string())]), flavor="hive")
        table = ds.dataset(inner, filesystem=fs, format="parquet", partitioning=partitioning).to_table()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{output} holds no readable forecasts: {exc}", key="output") from exc
    if table.num_rows == 0:
        raise ConfigError(f"{output} holds no forecast parts", key="output")
    return table.sort_by(_SORT_KEYS)


def _naming_the_table(exc: DataError, written: Location, data: Any) -> DataError:
    """``exc`` with the file :func:`write_input` wrote named as what the caller passed ("the pandas DataFrame
    passed as data"): the caller never saw that file, and its path inside the run directory reads as ours."""
    kind = type(data).__qualname__
    what = {"DataFrame": f"the {type(data).__module__.split('.')[0]} DataFrame", "Table": "the pyarrow Table"}
    shown = f"{what.get(kind, f'the {kind}')} passed as data"
    fields = {key: (shown if value == str(written) else value) for key, value in exc.fields.items()}
    return DataError(exc.message.replace(str(written), shown), suggestions=exc.suggestions, **fields)


def _location(value: str | os.PathLike[str]) -> Location:
    """What the caller passed, parsed once (a URL stays a URL: ``os.fspath`` of a Path never made one)."""
    from distributed_onnx.location import Location

    return Location.parse(value if isinstance(value, str | Path) else os.fspath(value))


def write_input(table: pa.Table, run_dir: Location) -> Location:
    """``table`` as Parquet at ``run_dir/inputs/table-<sha256 prefix>.parquet``; an identical file is kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distributed_onnx import storage

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    payload = sink.getvalue().to_pybytes()
    path = storage.join(run_dir, INPUTS_DIR, f"table-{hashlib.sha256(payload).hexdigest()[:16]}.parquet")
    if not storage.is_file(path):  # same bytes, same name: a rerun leaves it alone
        storage.make_dirs(storage.join(run_dir, INPUTS_DIR))
        storage.write_bytes(path, payload)
    return path


def _as_arrow(data: Any) -> pa.Table:
    """A pyarrow Table from a Table, a pandas DataFrame (without importing pandas) or an Arrow stream."""
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    pandas = sys.modules.get("pandas")  # a DataFrame means pandas is imported already
    if pandas is not None and isinstance(data, pandas.DataFrame):
        # The index is not data: a default RangeIndex would otherwise become an undeclared column.
        return pa.Table.from_pandas(data, preserve_index=False)
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise ConfigError(
        f"data must be a path or URL, a pyarrow.Table, a pandas DataFrame or an Arrow stream; "
        f"got {type(data).__module__}.{type(data).__qualname__}",
        key="data",
    )


def fev_benchmark(
    benchmark: Any,
    *,
    checkpoint: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    output: str | os.PathLike[str],
    **settings: Any,
) -> Any:
    """Run a fev benchmark (a ``fev.Benchmark``, a list of ``fev.Task`` or a benchmark YAML's path) against
    ``checkpoint`` (one path or several; default the bundled reference one), as ``distributed-onnx fev`` does.

    Returns :class:`~distributed_onnx.evaluation.fev_tasks.runner.FevResult`: ``.summaries`` are fev's own
    ``Task.evaluation_summary`` dicts (``fev.leaderboard(result.summaries, baseline_model=...)`` reads them),
    ``.pairs`` says which task x checkpoint was done, resumed, skipped, rejected or failed (with its reason). ``output``
    holds ``summaries.jsonl`` and the run directories of the tasks planned together (docs/fev.md); rerunning
    resumes. ``settings`` are
    the backtest's execution settings (``actors=2``, ``rows_per_batch=512``, ``address=...``,
    ``clamp_quantiles=True``). Needs the ``fev`` extra. Raises :class:`~distributed_onnx.errors.ConfigError` before
    anything runs for what no run could get past (a checkpoint's name, an output that is a file, no task, a task's
    own settings: docs/fev.md), and after writing everything :class:`~distributed_onnx.errors.BatchError` if a
    pair failed (a rerun retries it) or was rejected (no rerun gets past it: fix or drop the task).
    """
    from distributed_onnx.evaluation.fev_tasks.runner import run_benchmark

    paths = [] if checkpoint is None else [checkpoint] if isinstance(checkpoint, str | os.PathLike) else checkpoint
    checkpoints = [Path(os.fspath(each)) for each in paths]
    # Ray is joined or started (and kept up, as backtest() keeps it) before the first run that needs a backtest.
    connect = lambda: _connect(settings.get("address"))  # noqa: E731
    return run_benchmark(benchmark, checkpoints, _location(output), settings, connect=connect)
