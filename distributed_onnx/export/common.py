"""What the families' exporters share: export-only patches, the graph and checkpoint writing, the parity report.

Upstream code that does not export (``torch.nanmean`` has no ONNX symbolic; TiRex runs its recurrence in
bfloat16, which ONNX Runtime's CPU MatMul lacks) is replaced only inside :func:`patched`, for the duration
of the export, by code computing the same values from ops that export; the upstream package itself is never
changed. Each replacement is checked by the parity report: upstream's own pipeline, unpatched, against ONNX
Runtime through this package's :class:`~distributed_onnx.model.worker.InferenceWorker`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, DataError, DistributedOnnxError, MissingExtraError, ParityError
from distributed_onnx.export.parity import parity_statistics
from distributed_onnx.export.request import ExportRequest, ExportResult
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import CheckpointMetadata, default_metadata_path, write_checkpoint
from distributed_onnx.model.horizons import NUM_OUTPUT_PATCHES

logger = logging.getLogger(__name__)

#: ``(context [W, C] float32 with NaN, horizon) -> [W, horizon, n_native]``: the upstream pipeline's forecast.
UpstreamForecast = Callable[[np.ndarray, int], np.ndarray]
#: When the export began (:func:`start_progress`), for the elapsed seconds of each phase's line.
_STARTED: contextvars.ContextVar[float | None] = contextvars.ContextVar("export_started", default=None)
#: The largest ``max_rel_diff`` (the largest absolute difference over the largest upstream value) a parity
#: report passes with: the families' graphs reproduce upstream to float32 rounding (1e-7 to 1e-5 measured on the
#: tiny and published models), so 1e-3 only fails a graph that computes something else, or non-finite values.
PARITY_TOLERANCE = 1e-3
#: What a ``--random-weights`` checkpoint's description starts with and what ``export`` warns at its start and end.
MEANINGLESS = "random weights: forecasts are meaningless; for trying the pipeline and benchmarks"


def start_progress() -> None:
    """Start the clock of :func:`phase`'s elapsed seconds (one export)."""
    _STARTED.set(time.perf_counter())


def phase(what: str) -> None:
    """One line on stderr (the log) per phase of an export, with the seconds since it began: a published
    TiRex takes minutes, and the user sees which phase it is in rather than nothing."""
    started = _STARTED.get()
    if started is None:
        start_progress()
        started = _STARTED.get()
    assert started is not None
    logger.info("export: %s (%.1f s)", what, time.perf_counter() - started)


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


@contextlib.contextmanager
def pretrained_folder(request: ExportRequest, family: str) -> Iterator[None]:
    """Loading ``--from-pretrained`` and reading its config: what fails here is the folder's (exit 2, naming it).

    Upstream's loaders raise whatever their parsers raise on a folder that is not theirs: ``OSError`` on a
    ``config.json`` that is not JSON (which read as "I/O error ... rerun"), ``SafetensorError`` on corrupt
    weights, ``AttributeError`` on another family's folder, pydantic's error on a config with context 0.
    """
    phase(f"loading the {family} model from {request.folder}")
    try:
        yield
    except DistributedOnnxError:
        raise
    except MemoryError:
        raise
    except Exception as exc:
        from pydantic import ValidationError

        from distributed_onnx.errors import describe_validation

        seen = describe_validation(exc.errors()) if isinstance(exc, ValidationError) else str(exc).strip()
        seen = " ".join(seen.splitlines()[0].split())[:300] if seen else ""
        raise ConfigError(
            f"--from-pretrained {request.folder} cannot be exported as {family} ({type(exc).__name__}: "
            f"{seen}); give the folder of a {family} model as its package saves it.",
            key="from_pretrained",
        ) from exc


def require_torch() -> Any:
    """``torch``, or the install hint of the extra that brings it."""
    try:
        import torch
    except ImportError as exc:
        raise MissingExtraError.for_package("torch", "export", exc) from exc
    return torch


@contextlib.contextmanager
def patched(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    """``owner.name = replacement`` for the duration of the block (an export), restored afterwards."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The loggers ``names`` at WARNING for the block (the exporter's log every rewrite at INFO), then as they were."""
    with contextlib.ExitStack() as restore:
        for each in map(logging.getLogger, names):
            restore.callback(each.setLevel, each.level)
            each.setLevel(logging.WARNING)
        yield


def observed_mean(x: Any) -> Any:
    """``torch.nanmean(x, dim=-1, keepdim=True)`` without ``nanmean`` (no ONNX symbolic): the sum of the non-NaN
    values over their count; NaN for a row without any, as ``nanmean`` gives."""
    torch = require_torch()
    observed = ~torch.isnan(x)
    count = observed.sum(dim=-1, keepdim=True).to(x.dtype)
    return torch.where(observed, x, torch.zeros_like(x)).sum(dim=-1, keepdim=True) / count


def context_module(model: Any, call: Callable[[Any, Any], Any]) -> Any:
    """The module the exporter traces: ``context -> call(model, context)``, ``model`` its submodule (weights)."""
    torch = require_torch()

    class OneCall(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, context: Any) -> Any:
            return call(self.model, context)

    # In eval mode, as ``model`` is: a new module is in training mode, which the exporter warned about
    # ("Exporting a model while it is in training mode") although every weight-bearing submodule was in eval.
    return OneCall().eval()


def export_context_graph(
    module: Any, sample: np.ndarray, output: Path, output_name: str, output_patches: int | None = None
) -> None:
    """Export ``module(context) -> output_name`` with a dynamic batch axis; weights as external data. With
    ``output_patches``, ``module(context, num_output_patches)``: the graph also takes that 0-d int64 (the output
    patches a call asks, ``model/horizons.py``), traced at ``output_patches`` (its most).

    The dynamo exporter (``torch.export``) is used: the TorchScript one traces Chronos-Bolt's register token
    to a float index (an invalid ``Gather``) and TiRex's batch size into its reshapes.
    """
    torch = require_torch()
    output.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1)
    inputs: tuple[Any, ...] = (torch.from_numpy(sample),)
    dynamic: dict[str, Any] = {"context": {0: batch}}
    if output_patches is not None:
        inputs = (*inputs, torch.tensor(output_patches, dtype=torch.int64))
        dynamic[NUM_OUTPUT_PATCHES] = None
    # The exporter's optimizer logs every rewrite at INFO (hundreds of lines); its warnings stay.
    with quiet_loggers("onnx_ir", "onnxscript"), torch.no_grad():
        phase("tracing and exporting the graph")
        program = torch.onnx.export(
            module,
            inputs,
            input_names=list(dynamic),
            output_names=[output_name],
            dynamic_shapes=dynamic,
            dynamo=True,
            verbose=False,
            optimize=False,  # done below, as its own phase (what export(optimize=True) does)
        )
        save_program(program, output)


def save_program(program: Any, output: Path) -> None:
    """Optimize the exported program (constant folding, redundancies removed) and write it: each a phase."""
    with quiet_loggers("onnx_ir", "onnxscript"):
        phase("optimizing the graph")
        program.optimize()
        phase(f"writing {output} and its weights")
        for stale in (output, output.with_name(output.name + ".data")):
            stale.unlink(missing_ok=True)
        # Every initializer in MODEL.onnx.data beside the graph: a published model's weights stay out of the
        # protobuf (2 GiB limit) and the graph file stays small enough to hash and copy.
        program.save(str(output), external_data=True)


def export_context_model(
    request: ExportRequest,
    metadata: CheckpointMetadata,
    module: Any,
    patches_context: contextlib.AbstractContextManager[Any],
    upstream: UpstreamForecast,
) -> ExportResult:
    """The export of a family whose graph takes ``context`` (and, where its metadata lists it,
    ``num_output_patches``): the graph (under the family's export-only ``patches_context``), its metadata, and the
    parity report over ``--horizon`` (default: two calls' horizon)."""
    metadata = described(request, metadata)
    windows, source = parity_windows(request, metadata.context_length, metadata.resolution_minutes)
    # At least two rows: traced on one, the exporter fixes the batch axis at 1 (a one-series --data gave TiRex a
    # graph that refused every batch of the backtest).
    sample = windows[:2] if windows.shape[0] >= 2 else np.repeat(windows[:1], 2, axis=0)
    # A graph taking the call's output patches (``num_output_patches``) is traced at its most.
    patches = metadata.horizon_patches if NUM_OUTPUT_PATCHES in metadata.input_names else None
    with patches_context:
        export_context_graph(module, sample, request.output, metadata.output_name, patches)
    metadata_path = write_metadata(request.output, metadata)
    horizon = request.horizon or 2 * metadata.horizon_length
    parity = parity_report(upstream, request.output, windows, horizon, source)
    return finish(request, metadata_path, parity)


def described(request: ExportRequest, metadata: CheckpointMetadata) -> CheckpointMetadata:
    """``metadata``, its description saying first that the weights are random when they are (``--random-weights``):
    whoever finds the checkpoint later (a report, ``inspect``) is told its forecasts mean nothing."""
    if request.random_size is None:
        return metadata
    note = f"{MEANINGLESS} ({request.random_size} architecture, seeded)"
    upstream = (metadata.description or "").replace(str(request.folder), "random weights")  # not a temp folder
    return metadata.model_copy(update={"description": f"{note}. {upstream}".strip()})


def resolution_of(request: ExportRequest) -> int:
    """The resolution to write: ``--resolution-minutes``, else the smallest step of ``--data``'s first series.

    Neither is refused (exit 2): an assumed 60 minutes once made a backtest of checkpoints exported without
    ``--data`` on half-hourly data fail afterwards ("checkpoints must share one resolution").
    """
    if request.resolution_minutes is not None:
        return request.resolution_minutes
    if request.data is None:
        raise ConfigError(
            "export needs the data's sampling interval for the checkpoint's metadata: give --resolution-minutes M "
            "(e.g. --resolution-minutes 60 for hourly data) or --data PATH to infer it from your table",
            key="resolution_minutes",
        )
    import pyarrow.compute as pc

    from distributed_onnx.evaluation.data.columns import check_columns
    from distributed_onnx.evaluation.data.table import read_table, timestamps_us

    source = str(request.data)
    table = read_table(request.data)
    check_columns(table.column_names, (), source)  # the backtest's own checks and messages, naming the file
    ids = table["series_id"].drop_null()
    if len(ids) == 0:
        raise DataError(f"{source}: the data has no rows with a series_id.", path=source)
    stamps = np.sort(timestamps_us(table.filter(pc.equal(table["series_id"], ids[0]))["timestamp"], source))
    steps = np.diff(stamps)
    steps = steps[steps > 0]
    if not steps.size:
        raise DataError(
            f"{source}: cannot infer the sampling interval from --data (its first series has fewer than two "
            "timestamps); give --resolution-minutes M",
            path=source,
        )
    return max(1, int(steps.min()) // 60_000_000)


#: The size of a checkpoint's files from which the export hashes them itself (:func:`remember_digests`): below it,
#: hashing when first asked costs less than the export's wait for the racy window (sha256 runs at hundreds of MB/s).
KEEP_DIGESTS_FROM_BYTES = 64 << 20


def remember_digests(weights_path: Path) -> None:
    """Hash the written checkpoint's files now, into this machine's digest cache (:mod:`~..model.file_digests`).

    Every command that runs a checkpoint asks for its identity, which covers the sha256 of its external weights
    (:mod:`~..model.identity`); hashed by the first backtest after the export, a gigabyte of weights was seconds of
    that backtest's planning. The export has just written the files, and minutes of it make seconds of hashing
    small: the next command finds the digests kept. A file written less than :data:`~..model.file_digests.RACY_S`
    ago is not kept (its version could not tell a second write in the same tick), so the export waits out that
    rest first (a tiny model's parity can end sooner). Weights smaller than :data:`KEEP_DIGESTS_FROM_BYTES` are
    left to the first command that asks (hashing them then costs less than that wait: every tiny export of the
    test suite waited it, twice with an int8 variant). Best effort: what cannot be hashed or kept now is hashed
    when first asked for, as before.
    """
    from distributed_onnx.model.checkpoint import LocalCheckpoint
    from distributed_onnx.model.external_data import external_data_locations
    from distributed_onnx.model.file_digests import RACY_S
    from distributed_onnx.model.identity import identity_of

    try:
        files = [weights_path, *(weights_path.parent / each for each in external_data_locations(weights_path))]
        if sum(each.stat().st_size for each in files) < KEEP_DIGESTS_FROM_BYTES:
            return
        newest_ns = max(each.stat().st_mtime_ns for each in files)
        time.sleep(max(0.0, RACY_S + 0.1 - (time.time_ns() - newest_ns) / 1e9))
        identity_of(LocalCheckpoint(path=weights_path).resolve())
    except (OSError, DistributedOnnxError) as exc:
        logger.debug("Digests of %s not kept now (%s); the first command to need them hashes them", weights_path, exc)


def write_metadata(output: Path, metadata: CheckpointMetadata) -> Path:
    """The metadata JSON beside ``output``, with the graph file's sha256 (its external data is not hashed)."""
    write_checkpoint(output, output.read_bytes(), metadata)
    return default_metadata_path(output)


def parity_windows(request: ExportRequest, context_length: int, resolution_minutes: int) -> tuple[np.ndarray, str]:
    """``[W, context_length]`` float32 windows for the parity report, and where they came from.

    From ``--data``: the last ``context_length`` steps of its first ``parity_windows`` series (NaN where a
    series is shorter or has gaps). Otherwise seeded sample windows: a daily and a weekly cycle, a trend and
    noise at several levels, with scattered gaps, a run of missing steps and a short history.
    """
    count = request.parity_windows
    if request.data is not None:
        from distributed_onnx.evaluation.data.table import load_series

        source = str(request.data)  # the parity report records it: a URL's secrets stay in the URL
        table = load_series(request.data, resolution_minutes)
        windows = np.full((min(count, len(table.series)), context_length), np.nan, dtype=np.float32)
        for row, series in enumerate(table.series[: windows.shape[0]]):
            tail = np.asarray(series.values[-context_length:], dtype=np.float32)
            windows[row, context_length - tail.size :] = tail
        if not windows.shape[0]:
            raise ConfigError(f"--data {source} holds no series to compare on", key="data")
        return windows, source
    rng = np.random.default_rng(0)
    steps = np.arange(context_length)
    level = rng.uniform(-50.0, 500.0, size=(count, 1))
    cycles = rng.uniform(1.0, 30.0, size=(count, 1)) * np.sin(2 * np.pi * steps / 24) + 5.0 * np.sin(
        2 * np.pi * steps / 168
    )
    windows = (level + cycles + 0.01 * steps + rng.normal(0.0, 2.0, size=(count, context_length))).astype(np.float32)
    windows[rng.random(windows.shape) < 0.05] = np.nan  # scattered gaps
    windows[0, context_length // 3 : context_length // 3 + 10] = np.nan  # a run of missing steps
    if count > 1:
        windows[1, : context_length - min(context_length, 40)] = np.nan  # a short history
    return windows, "sample windows (seeded)"


def parity_report(
    upstream: UpstreamForecast, weights: Path, windows: np.ndarray, horizon: int, source: str
) -> dict[str, Any]:
    """Upstream's forecast against ONNX Runtime through this package's worker on the same windows."""
    from distributed_onnx.model.backend.providers import CpuProvider
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    phase(f"parity on {windows.shape[0]} windows (horizon {horizon}): ONNX Runtime against the upstream pipeline")
    worker = InferenceWorker.from_config(WorkerConfig(checkpoint=weights, providers=[CpuProvider()]))
    try:
        levels = worker.metadata.native_quantiles
        ours = worker.forecast(windows, horizon, levels).astype(np.float64)
    finally:
        worker.close()
    theirs = np.asarray(upstream(windows, horizon), dtype=np.float64)
    return {
        "windows": int(windows.shape[0]),
        "source": source,
        "context_length": int(windows.shape[1]),
        "missing_values": int(np.isnan(windows).sum()),
        "horizon": horizon,
        "calls": -(-horizon // worker.metadata.horizon_length),
        **parity_statistics(ours, theirs, "upstream"),
    }


def finish(request: ExportRequest, metadata_path: Path, parity: dict[str, Any]) -> ExportResult:
    """Write the parity report beside the graph and describe what was written; a parity that fails (beyond
    :data:`PARITY_TOLERANCE`, or not finite) removes the checkpoint, keeps the report and raises."""
    passed = bool(np.isfinite(parity["max_abs_diff"]) and parity["max_rel_diff"] <= PARITY_TOLERANCE)
    parity = {**parity, "tolerance": PARITY_TOLERANCE, "passed": passed}
    parity_path = request.output.with_suffix(".parity.json")
    document = {
        key: None if isinstance(value, float) and not np.isfinite(value) else value for key, value in parity.items()
    }
    storage.write_bytes(
        Location(parity_path), (json.dumps(document, indent=2) + "\n").encode("utf-8")
    )  # strict JSON: no NaN
    if not passed:
        for written in (request.output, Path(f"{request.output}.data"), metadata_path):
            written.unlink(missing_ok=True)
        raise ParityError(
            f"export of {request.output.name} failed its parity: ONNX Runtime differs from the upstream pipeline "
            f"by max_abs_diff {parity['max_abs_diff']} (max_rel_diff {parity['max_rel_diff']}, tolerance "
            f"{PARITY_TOLERANCE}); the checkpoint was removed, the report is {parity_path}. Check the pretrained "
            "folder's weights (non-finite values?).",
            key="from_pretrained",
        )
    logger.info("Exported %s: parity max abs diff %.3g", request.output, parity["max_abs_diff"])
    return ExportResult(
        weights_path=request.output, metadata_path=metadata_path, parity_path=parity_path, parity=parity
    )
