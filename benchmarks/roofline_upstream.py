"""The six families at their published shapes for ``roofline.py``: each built once (random weights, exported as the
published-shape benchmarks export it) and each upstream package's own forecasting pass at a batch, on torch.

A family here is what the roofline needs of it: how it is exported (:data:`EXPORT_ARGS`, the published
benchmarks' own flags: ``published_defaults.py``, ``published_moirai2.py``, ``published_timesfm.py``,
``published_toto.py``) and the call a user's script makes per batch of windows (:func:`upstream_pass`): the
same pass the published benchmarks time on the upstream side, here on a batch of random-walk windows so that
torch's profile sits beside ONNX Runtime's at the same rows.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from distributed_onnx import export
from distributed_onnx.export.random_weights import write_random_pretrained
from distributed_onnx.model import families

#: The horizon of every published-shape benchmark (``published_defaults.HORIZON``).
HORIZON = 64
FAMILIES = ("chronos_bolt", "chronos2", "tirex", "timesfm", "moirai2", "toto")
#: ``distributed-onnx export FAMILY`` flags, as the published benchmarks export each family (parity on few
#: windows: the roofline measures cost; the parity tests and the export's own report check the forecasts).
EXPORT_ARGS: dict[str, list[str]] = {
    "chronos_bolt": ["--resolution-minutes", "60"],
    "chronos2": ["--horizon", str(HORIZON), "--resolution-minutes", "60"],
    "tirex": ["--resolution-minutes", "60"],
    "timesfm": ["--resolution-minutes", "60"],  # one output patch (128 steps): the runner asks 64
    "moirai2": ["--horizon", str(HORIZON), "--resolution-minutes", "60"],
    "toto": ["--resolution-minutes", "60"],
}
PARITY_WINDOWS = "2"


def checkpoint_path(workdir: Path, family: str) -> Path:
    return workdir / family / "model" / f"{family}.onnx"


def pretrained_path(workdir: Path, family: str) -> Path:
    return workdir / family / "pretrained"


def exporters_digest() -> str:
    """sha256 of the exporters' code (``distributed_onnx/export/*.py``): a build by other code is built again."""
    digest = hashlib.sha256()
    for path in sorted((Path(export.__file__).parent).glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def build(workdir: Path, family: str) -> tuple[Path, float | None]:
    """The family's published-shape checkpoint under ``workdir/FAMILY`` (the pretrained folder built once; exported
    again whenever the exporters' code changed since) and the seconds the export took now (None: it was there)."""
    output = checkpoint_path(workdir, family)
    stamp = output.with_name("exported-by.sha256")
    digest = exporters_digest()
    if output.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return output, None
    pretrained = pretrained_path(workdir, family)
    started = time.perf_counter()
    if not pretrained.exists():
        write_random_pretrained(families.family(family), "published", pretrained)
    argv = [str(Path(sys.executable).parent / "distributed-onnx"), "export", family, "--from-pretrained"]
    argv += [str(pretrained), "--output", str(output), "--parity-windows", PARITY_WINDOWS, *EXPORT_ARGS[family]]
    subprocess.run(argv, check=True)
    stamp.write_text(digest)
    return output, time.perf_counter() - started


def upstream_pass(family: str, pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    """``windows [rows, context_length] -> upstream's forecast`` for a horizon of :data:`HORIZON` steps: the call
    the published benchmark's upstream script makes per batch, with the same model the checkpoint was exported
    from. Quantile levels 0.1/0.5/0.9 where the pipeline takes them."""
    return _PASSES[family](pretrained, context_length)


def _chronos_bolt(pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    import torch
    from chronos import ChronosBoltPipeline

    pipeline = ChronosBoltPipeline.from_pretrained(
        str(pretrained), local_files_only=True, device_map="cpu", dtype=torch.float32
    )
    return lambda windows: pipeline.predict(torch.from_numpy(windows), prediction_length=HORIZON)


def _chronos2(pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    import torch
    from chronos.chronos2.pipeline import Chronos2Pipeline

    pipeline = Chronos2Pipeline.from_pretrained(str(pretrained), local_files_only=True)

    def run(windows: np.ndarray) -> Any:
        rows = [torch.from_numpy(row[None, :].copy()) for row in windows]
        return pipeline.predict(rows, prediction_length=HORIZON, batch_size=len(rows))

    return run


def _tirex(pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    import torch
    from tirex.models.tirex import TiRexZero

    from distributed_onnx.export.tirex import checkpoint_file

    model = TiRexZero.from_pretrained(str(checkpoint_file(pretrained)), backend="torch", device="cpu").eval()
    return lambda windows: model.forecast(torch.from_numpy(windows), prediction_length=HORIZON)


def _timesfm(pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    import timesfm

    from distributed_onnx.export.timesfm import DEFAULT_FORECAST, load_model

    model = load_model(pretrained)
    flags = {key: value for key, value in DEFAULT_FORECAST.items() if key != "max_context"}
    batch: dict[str, int] = {}

    def run(windows: np.ndarray) -> Any:
        if batch.get("rows") != windows.shape[0]:  # compile as the user's script does: its batch, its horizon
            config = timesfm.ForecastConfig(
                max_context=context_length, max_horizon=HORIZON, per_core_batch_size=windows.shape[0], **flags
            )
            model.compile(config)
            batch["rows"] = windows.shape[0]
        return model.forecast(horizon=HORIZON, inputs=list(windows))

    return run


def _moirai2(pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    from distributed_onnx.export.moirai2 import forecaster, load_module

    model = forecaster(load_module(pretrained), context_length, HORIZON)
    return lambda windows: model.predict([row.copy() for row in windows])


def _toto(pretrained: Path, context_length: int) -> Callable[[np.ndarray], Any]:
    """``TotoForecaster.forecast`` without samples (``num_samples=None``: one pass, upstream's cheapest call, the
    mean only): the published benchmark's floor for upstream."""
    import torch
    from toto.data.util.dataset import MaskedTimeseries
    from toto.inference.forecaster import TotoForecaster

    from distributed_onnx.export.toto import load_model

    forecaster = TotoForecaster(load_model(pretrained).model)

    def run(windows: np.ndarray) -> Any:
        rows, length = windows.shape
        series = torch.from_numpy(np.ascontiguousarray(windows))[:, None, :]
        inputs = MaskedTimeseries(
            series=series,
            padding_mask=torch.ones_like(series, dtype=torch.bool),
            id_mask=torch.zeros_like(series, dtype=torch.int),
            timestamp_seconds=(torch.arange(length, dtype=torch.int) * 3600).expand(rows, 1, length),
            time_interval_seconds=torch.full((rows, 1), 3600, dtype=torch.int),
        )
        return forecaster.forecast(inputs, prediction_length=HORIZON, num_samples=None, use_kv_cache=True)

    return run


_PASSES: dict[str, Callable[[Path, int], Callable[[np.ndarray], Any]]] = {
    "chronos_bolt": _chronos_bolt,
    "chronos2": _chronos2,
    "tirex": _tirex,
    "timesfm": _timesfm,
    "moirai2": _moirai2,
    "toto": _toto,
}
