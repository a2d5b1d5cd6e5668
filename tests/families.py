"""The family tests' shared models, exports and data: one home for what several test modules build.

Small random-weight Chronos-Bolt and TiRex models built from their upstream packages' own classes. No download:
each is built from a config alone, seeded, and written as its package writes a pretrained folder
(``save_pretrained``'s ``config.json`` + ``model.safetensors``; TiRex's Lightning ``model.ckpt``). Also a
dataset with gaps whose windows the tests forecast both through the backtest and through the upstream pipeline.

The session fixtures at the end build each tiny model and export it (with its int8 variant) once per test session,
for every module that needs that export: an export costs seconds of tracing, and the same one was repeated by
several modules. They are registered in tests/conftest.py (imported there, so that one instance serves every
module; a test module must not import them, or it would build its own copy).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_onnx.export.random_weights import CHRONOS_BOLT, TIREX

LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
RESOLUTION_MINUTES = 30
STEP_US = RESOLUTION_MINUTES * 60 * 1_000_000
START_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
#: Tiny configs (distributed_onnx.export.random_weights): one call is BOLT_STEPS / TIREX_STEPS steps.
BOLT_CONTEXT, BOLT_STEPS = 64, 16
TIREX_CONTEXT, TIREX_STEPS = 32, 8
assert CHRONOS_BOLT["tiny"]["chronos_config"]["context_length"] == BOLT_CONTEXT
assert CHRONOS_BOLT["tiny"]["chronos_config"]["prediction_length"] == BOLT_STEPS
assert TIREX["tiny"]["hyper_parameters"]["train_ctx_len"] == TIREX_CONTEXT
assert TIREX["tiny"]["hyper_parameters"]["model_config"]["output_patch_size"] == TIREX_STEPS


def write_tiny_bolt(directory: Path, seed: int = 0) -> Path:
    """``ChronosBoltModelForForecasting`` (T5 encoder-decoder, 1 + 1 layers of 32) saved as a pretrained folder:
    ``export --random-weights --size tiny``'s model (one definition, in the package)."""
    from distributed_onnx.export.random_weights import write_chronos_bolt

    return write_chronos_bolt(directory, "tiny", seed)


def write_tiny_tirex(directory: Path, seed: int = 0) -> Path:
    """``TiRexZero`` (one sLSTM block of 16, patches of 8) saved as the hub's ``model.ckpt``: ``export
    --random-weights --size tiny``'s model."""
    from distributed_onnx.export.random_weights import write_tirex

    return write_tirex(directory, "tiny", seed)


def gappy_series(seed: int = 0) -> dict[str, np.ndarray]:
    """Three series on a 30-minute grid: cycles at different levels, scattered NaN, a run of NaN, one short."""
    rng = np.random.default_rng(seed)
    result = {}
    for offset, (name, length) in enumerate({"a": 140, "b": 120, "c": 70}.items()):
        steps = np.arange(length)
        values = 50.0 * (offset + 1) + 8.0 * np.sin(2 * np.pi * steps / 24) + rng.normal(0.0, 1.0, length)
        values[rng.choice(length, size=length // 8, replace=False)] = np.nan
        if name == "a":
            values[90:97] = np.nan
        values[[0, -1]] = rng.normal(50.0 * (offset + 1), 1.0, 2)
        result[name] = values
    return result


def write_gappy_dataset(path: Path, series: dict[str, np.ndarray]) -> Path:
    """The long table of ``series`` (NaN as null ``y``)."""
    ids, stamps, ys = [], [], []
    for name, values in series.items():
        ids += [name] * values.size
        stamps.append(START_US + np.arange(values.size) * STEP_US)
        ys.append(values)
    y = np.concatenate(ys)
    table = pa.table(
        {
            "series_id": pa.array(ids, pa.string()),
            "timestamp": pa.array(np.concatenate(stamps), pa.timestamp("us", tz="UTC")),
            "y": pa.array(y, mask=np.isnan(y)),
        }
    )
    pq.write_table(table, path)
    return path


def window_contexts(series: dict[str, np.ndarray], forecasts: pa.Table, context_length: int) -> dict[str, Any]:
    """Per backtest window (one row per window of ``forecasts``, lead 1): its context as the data holds it."""
    first = forecasts.filter(pa.compute.equal(forecasts["lead"], 1)).to_pylist()
    contexts, ids = [], []
    for row in first:
        origin = (int(row["origin"].timestamp() * 1_000_000) - START_US) // STEP_US
        values = series[row["series_id"]]
        context = np.full(context_length, np.nan, dtype=np.float32)
        start = origin - context_length
        kept = values[max(start, 0) : origin]
        context[context_length - kept.size :] = kept
        contexts.append(context)
        ids.append(row["window_id"])
    return {"window_ids": ids, "context": np.stack(contexts)}


def forecast_block(forecasts: pa.Table, window_ids: list[str], horizon: int, levels: list[float]) -> np.ndarray:
    """``[W, horizon, len(levels)]`` from a forecasts table, windows in ``window_ids`` order."""
    rows = {(row["window_id"], row["lead"]): row for row in forecasts.to_pylist()}
    leads = range(1, horizon + 1)
    names = [f"q{level}" for level in levels]
    return np.array([[[rows[(window, lead)][name] for name in names] for lead in leads] for window in window_ids])


#: The backtest flags the family tests share: three windows a series, one actor, small batches.
WINDOWS = ["--n-windows", "3", "--stride", "7", "--actors", "1", "--rows-per-batch", "4", "--no-progress"]


# The family tests' module fixtures, imported by each family's test module: its folder, the gappy series, their table.
@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))


@pytest.fixture(scope="module")
def series() -> dict[str, np.ndarray]:
    return gappy_series()


@pytest.fixture(scope="module")
def data(root: Path, series: dict[str, np.ndarray]) -> Path:
    return write_gappy_dataset(root / "gappy.parquet", series)


# --------------------------------------------------------------------------------------------- session fixtures
# Built once per session, shared by every module that asks. Their folders are READ-ONLY by convention: a test that
# edits a checkpoint, its metadata or a pretrained folder copies the folder first (shutil.copytree into its
# tmp_path) and edits the copy; a test writes its own outputs (runs, profiles, tune files) under its tmp_path.
# family_root checks the convention at the session's end: a shared folder changed fails there, naming it.


#: Each shared folder's files (name -> size, modification time) as built: :func:`family_root` checks at the end of
#: the session that no test changed one (the read-only convention, enforced).
_BUILT: dict[Path, dict[str, tuple[int, int]]] = {}


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _built(folder: Path) -> Path:
    """Record ``folder`` as built (see :data:`_BUILT`)."""
    _BUILT[folder] = _listing(folder)
    return folder


def _cli_export(family: str, output: Path, *flags: str) -> Path:
    """``distributed-onnx export FAMILY ... --output OUTPUT`` in process; exit 0 expected."""
    from distributed_onnx import cli

    assert cli.main(["export", family, "--output", str(output), *flags]) == 0
    _built(output.parent)
    return output


@pytest.fixture(scope="session")
def family_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's folder for the shared models and exports. At the session's end: every shared folder still
    holds what it was built with (a test that edited one would have changed what later tests were given)."""
    root = tmp_path_factory.mktemp("families")
    yield root
    changed = {str(folder): _listing(folder) for folder, built in _BUILT.items() if _listing(folder) != built}
    _BUILT.clear()
    assert not changed, f"a test changed the session's shared family folders (copy a folder to edit it): {changed}"


@pytest.fixture(scope="session")
def gappy_data(family_root: Path) -> Path:
    """:func:`gappy_series` as a table: the data the shared exports' parity and calibration windows come from
    (the same table each family module's ``data`` fixture writes)."""
    return write_gappy_dataset(family_root / "gappy.parquet", gappy_series())


@pytest.fixture(scope="session")
def tiny_bolt_pretrained(family_root: Path) -> Path:
    """:func:`write_tiny_bolt`'s folder (read-only: copy it to edit it)."""
    return _built(write_tiny_bolt(family_root / "bolt-pretrained"))


@pytest.fixture(scope="session")
def tiny_tirex_pretrained(family_root: Path) -> Path:
    """:func:`write_tiny_tirex`'s folder (read-only: copy it to edit it)."""
    return _built(write_tiny_tirex(family_root / "tirex-pretrained"))


@pytest.fixture(scope="session")
def bolt_export(family_root: Path, tiny_bolt_pretrained: Path) -> Path:
    """``export chronos_bolt --from-pretrained`` :func:`tiny_bolt_pretrained` ``--quantize int8`` (dynamic),
    parity on 4 random windows: ``bolt.onnx`` and ``bolt-int8.onnx`` beside it (read-only)."""
    flags = ["--from-pretrained", str(tiny_bolt_pretrained), "--quantize", "int8", "--parity-windows", "4"]
    output = family_root / "bolt" / "bolt.onnx"
    return _cli_export("chronos_bolt", output, *flags, "--resolution-minutes", str(RESOLUTION_MINUTES))


@pytest.fixture(scope="session")
def tirex_export(family_root: Path) -> Path:
    """``export tirex --random-weights --size tiny --quantize int8`` (dynamic), parity on 4 random windows:
    ``tirex.onnx`` and ``tirex-int8.onnx`` beside it (read-only). Its weights are :func:`tiny_tirex_pretrained`'s
    (the same seeded writer), which the tests compare it with."""
    flags = ["--random-weights", "--size", "tiny", "--quantize", "int8", "--parity-windows", "4"]
    output = family_root / "tirex" / "tirex.onnx"
    return _cli_export("tirex", output, *flags, "--resolution-minutes", str(RESOLUTION_MINUTES))


@pytest.fixture(scope="session")
def chronos2_random_export(family_root: Path) -> Path:
    """``export chronos2 --random-weights --size tiny --parity-windows 2 --resolution-minutes 60``: as a user
    first exports, without ``--horizon`` (up to the model's default prediction length) and without a variant
    (read-only). Its weights are ``write_chronos2(folder, "tiny")``'s, which tests/test_chronos2_pipeline.py's
    pipeline loads."""
    flags = ["--random-weights", "--size", "tiny", "--parity-windows", "2", "--resolution-minutes", "60"]
    return _cli_export("chronos2", family_root / "chronos2" / "chronos2-tiny.onnx", *flags)


def _random_weights_export(family: str, output: Path, data: Path, *flags: str) -> Path:
    """``export FAMILY --random-weights --size tiny``: the family's tiny model from its upstream package's classes
    (the same seeded weights as ``write_FAMILY(folder, "tiny")`` of distributed_onnx.export.random_weights), with
    its int8 variant (static: its activations calibrated on ``data``'s windows) beside it."""
    argv = ["--random-weights", "--size", "tiny", "--quantize", "int8", "--quantize-mode", "static"]
    argv += ["--data", str(data), "--resolution-minutes", str(RESOLUTION_MINUTES), *flags]
    return _cli_export(family, output, *argv)


def _pretrained_export(family: str, output: Path, pretrained: Path, data: Path, *flags: str) -> Path:
    """``export FAMILY --from-pretrained PRETRAINED``, as a user exports a downloaded model, with its int8 variant
    (static: its activations calibrated on ``data``'s windows) beside it."""
    argv = ["--from-pretrained", str(pretrained), "--quantize", "int8", "--quantize-mode", "static"]
    argv += ["--data", str(data), "--resolution-minutes", str(RESOLUTION_MINUTES), *flags]
    return _cli_export(family, output, *argv)


@pytest.fixture(scope="session")
def moirai2_random_export(family_root: Path, gappy_data: Path) -> Path:
    """Moirai 2's :func:`_random_weights_export` at its default horizon (one model call), parity on 2 windows of
    :func:`gappy_data` (read-only)."""
    pytest.importorskip("uni2ts.model.moirai2")
    return _random_weights_export(
        "moirai2", family_root / "moirai2" / "moirai2.onnx", gappy_data, "--parity-windows", "2"
    )


@pytest.fixture(scope="session")
def toto_pretrained(family_root: Path) -> Path:
    """The tiny ``Toto`` written as the hub's folder by ``write_toto`` (the builder ``--random-weights`` uses),
    read-only: what upstream's ``Toto.load_from_checkpoint`` and ``export --from-pretrained`` both read."""
    pytest.importorskip("toto.model.toto")
    from distributed_onnx.export.random_weights import write_toto

    return _built(write_toto(family_root / "toto-pretrained", "tiny"))


@pytest.fixture(scope="session")
def toto_export(family_root: Path, toto_pretrained: Path, gappy_data: Path) -> Path:
    """Toto's :func:`_pretrained_export` of :func:`toto_pretrained` (one call: one patch), parity on 4 windows of
    :func:`gappy_data` (read-only)."""
    output = family_root / "toto" / "toto.onnx"
    return _pretrained_export("toto", output, toto_pretrained, gappy_data, "--parity-windows", "4")


#: The horizon TimesFM's shared export is traced for: two output patches of 16, the second cut (the autoregressive
#: decode step in the graph; tests/test_family_timesfm.py compares it with upstream's ``forecast`` at that horizon).
TIMESFM_HORIZON = 16 + 8


@pytest.fixture(scope="session")
def timesfm_pretrained(family_root: Path) -> Path:
    """The tiny TimesFM 2.5 written by ``write_timesfm`` (``save_pretrained``; the builder ``--random-weights``
    uses), read-only: what the package's ``load_model`` and ``export --from-pretrained`` both read."""
    pytest.importorskip("timesfm")
    from distributed_onnx.export.random_weights import write_timesfm

    return _built(write_timesfm(family_root / "timesfm-pretrained", "tiny"))


@pytest.fixture(scope="session")
def timesfm_export(family_root: Path, timesfm_pretrained: Path, gappy_data: Path) -> Path:
    """TimesFM 2.5's :func:`_pretrained_export` of :func:`timesfm_pretrained` at ``--horizon``
    :data:`TIMESFM_HORIZON`, parity on 4 windows of :func:`gappy_data` (read-only)."""
    output = family_root / "timesfm" / "timesfm.onnx"
    flags = ["--horizon", str(TIMESFM_HORIZON), "--parity-windows", "4"]
    return _pretrained_export("timesfm", output, timesfm_pretrained, gappy_data, *flags)
