"""What a score directory was scored with, checked before a rerun adds to it, and which directories it must not be.

A rerun of ``score`` adds its batch to the sums of the earlier ones (:mod:`.batches`), so every batch must have
been scored alike: with another seasonality (MASE's scale and both baselines) or another context length (the
seasonal-quantile baseline's seasons), one metric would silently pool two definitions. The first run records
them in ``scored/settings.json`` (with the actuals it read, for the record: the actuals may move as they grow, a
daily export say, so another location is not refused); a later run with other ones is refused, naming each
difference, as ``backtest`` refuses a folder of another run. A directory scored before the record existed gets
it on its next run.

``--output`` must not be a backtest's output directory either: ``score`` writes ``metrics.parquet``,
``leaderboard.parquet``, ``summary.json`` and ``report.html``, the names a backtest writes, and would overwrite
them; nor a folder of anything else (``backtest`` refuses the same: the one check
:func:`~distributed_onnx.evaluation.output_checks.check_own_folder`), only a new or empty one or its own.
"""

from __future__ import annotations

import json
from typing import Any

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.output_checks import check_own_folder
from distributed_onnx.evaluation.outputs import FORECASTS_DIR, MANIFEST
from distributed_onnx.live.score.batches import SCORED_DIR
from distributed_onnx.live.score.settings import SCORE_ENTRIES, ScoreSettings
from distributed_onnx.location import Location

SETTINGS_FILE = "settings.json"
#: The settings that define the metrics: a rerun must have the recorded ones.
DEFINING = ("seasonality", "context_length")


def recorded_settings(settings: ScoreSettings) -> dict[str, Any]:
    """What the numbers of a score directory depend on (the actuals' location without its secrets)."""
    return {
        "actuals": str(settings.actuals),
        "seasonality": settings.seasonality,
        "context_length": settings.context_length,
    }


def check_output(settings: ScoreSettings, has_batches: bool) -> None:
    """Refuse (:class:`ConfigError`) an output that is a backtest's, or was scored with other settings."""
    output = settings.output
    if not has_batches and (
        storage.is_file(storage.join(output, MANIFEST)) or _has_folder(storage.join(output, FORECASTS_DIR))
    ):
        raise ConfigError(
            f"--output {output} is a backtest's output directory (it holds {MANIFEST} or "
            f"{FORECASTS_DIR}/): score would overwrite its metrics, leaderboard, summary and report. Give score "
            "a directory of its own (and the backtest as --backtest).",
            key="output",
        )
    check_own_folder(output, "Score", record=None, own=SCORE_ENTRIES)  # the check backtest makes: no one's files
    path = storage.join(output, SCORED_DIR, SETTINGS_FILE)
    if not has_batches or not storage.is_file(path):
        return
    try:
        recorded = json.loads(storage.read_bytes(path))
    except ValueError as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); restore or delete it.") from exc
    wanted = recorded_settings(settings)
    differences = [
        f"{name} {recorded.get(name)!r} there, {value!r} now"
        for name, value in wanted.items()
        if name in DEFINING and recorded.get(name) != value
    ]
    if differences:
        raise ConfigError(
            f"--output {output} was scored with other settings ({'; '.join(differences)}): adding "
            "to it would mix two definitions in one metric. Rerun with the recorded settings, or score into "
            "another --output.",
            key="output",
        )


def record_settings(settings: ScoreSettings) -> None:
    """Write ``scored/settings.json`` (once: a later run has been checked to match it)."""
    path = storage.join(settings.output, SCORED_DIR, SETTINGS_FILE)
    if storage.is_file(path):
        return
    storage.make_dirs(storage.join(settings.output, SCORED_DIR))
    storage.write_bytes(path, json.dumps(recorded_settings(settings), indent=2, sort_keys=True).encode())


def _has_folder(location: Location) -> bool:
    local = location.local_path
    if local is not None:
        return local.is_dir()
    return bool(storage.list_files(location, "", ""))
