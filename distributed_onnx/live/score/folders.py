"""The folders ``distributed-onnx score`` is given, checked before anything is scored or written.

A mistyped ``--forecasts`` used to surface as an I/O error about a temporary file deep in the output (exit 3,
"rerun to resume": rerunning changed nothing), and an empty log as a run that "wrote scored/" that was not
there. Here, before any scoring:

- ``--forecasts`` must be a forecast log: a folder with at least one ``day=*/model=*/part-*.parquet`` file (what
  ``serve --forecast-log`` writes); missing, a file, empty or holding something else is one line naming it
  (exit 2);
- ``--backtest``, when given, lends its resolved settings: ``seasonality`` and ``context_length`` default to the
  backtest's, so the live baselines and scale are the backtest's; a flag that disagrees is refused, because the
  live-versus-backtest comparison would then set scores on different baselines side by side;
- the output is one score can write (``evaluation/output_checks.py``: not ``ftp://``, ``-`` nor ``s3:/x``), and
  its folder is created.

Per-file checks (a torn or foreign file inside a log that is one) belong to the log reader, not here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow.fs as pafs

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.output_checks import check_output_reachable, check_writable_folder
from distributed_onnx.live.log.layout import log_files
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.local_paths import not_a_file
from distributed_onnx.location import Location

__all__ = ["BORROWED_SETTINGS", "check_forecast_log", "prepare_score"]

logger = logging.getLogger(__name__)

#: The score settings a backtest's ``summary.json`` (``resolved``) also holds, and so lends.
BORROWED_SETTINGS = ("seasonality", "context_length")
_EXPECTED = "expected the folder `distributed-onnx serve --forecast-log` writes (day=*/model=*/part-*.parquet)"


def prepare_score(settings: ScoreSettings) -> tuple[ScoreSettings, list[str]]:
    """The settings to score with, and a note per setting taken from ``--backtest`` (see the module docstring)."""
    check_output_reachable(settings.output)  # ftp://, -, s3:/x: refused before anything is read or written
    check_forecast_log(settings.forecasts)
    notes: list[str] = []
    if settings.backtest is not None:
        settings, notes = _borrow_from_backtest(settings)
    output = settings.output.local_path
    if output is not None and output.exists() and not output.is_dir():  # was exit 3 "I/O error ... rerun"
        raise ConfigError(
            f"--output {settings.output} is a file; give a folder (new, or one score wrote before).", key="output"
        )
    check_writable_folder(settings.output)  # a new folder under a read-only one: exit 3 at the make, else
    storage.make_dirs(settings.output)
    return settings, notes


def check_forecast_log(root: Location) -> None:
    """Raise :class:`ConfigError` (exit 2) unless ``root`` holds at least one forecast log file."""
    local = root.local_path
    if local is not None and not local.is_dir():
        there = not_a_file(local)  # a link in a loop or to nothing, a device: said as every input's (local_paths)
        if there is None:
            there = "is a file, not a folder" if local.exists() else "does not exist"
        raise ConfigError(f"--forecasts {root} {there} ({_EXPECTED}).", key="forecasts")
    if log_files(root):
        return
    found = _some_entries(root)
    if not found:
        raise ConfigError(
            f"--forecasts {root} is empty: no forecast has been logged there ({_EXPECTED}). Is `distributed-onnx "
            "serve --forecast-log` pointing there, and has it answered a request?",
            key="forecasts",
        )
    if found == ["_log_state"]:
        raise ConfigError(
            f"--forecasts {root} holds a log's state but no forecast yet: serve has not logged a forecast there; "
            "send it a request and rerun (give it a second to flush).",
            key="forecasts",
        )
    raise ConfigError(
        f"--forecasts {root} is not a forecast log: it holds {', '.join(found[:5])}"
        f"{' ...' if len(found) > 5 else ''} and no day=*/model=*/part-*.parquet file ({_EXPECTED}).",
        key="forecasts",
    )


def _some_entries(root: Location) -> list[str]:
    """The names of the entries directly in ``root`` (sorted), empty when there are none or it does not exist."""
    local = root.local_path
    if local is not None:
        return sorted(entry.name for entry in local.iterdir())
    fs, inner = storage.filesystem(root)
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    return sorted(info.base_name for info in infos)


def _borrow_from_backtest(settings: ScoreSettings) -> tuple[ScoreSettings, list[str]]:
    """``settings`` with what ``--backtest``'s ``summary.json`` resolved for each of :data:`BORROWED_SETTINGS`.

    A summary that cannot be read is left to the backtest reader, which names what is wrong with the folder.
    """
    assert settings.backtest is not None
    try:
        summary = json.loads(storage.read_bytes(storage.join(settings.backtest, "summary.json")))
        resolved: dict[str, Any] = dict(summary["resolved"])
    except (OSError, ValueError, KeyError, TypeError):
        return settings, []
    update: dict[str, int] = {}
    notes: list[str] = []
    for name in BORROWED_SETTINGS:
        theirs = resolved.get(name)
        if not isinstance(theirs, int):
            continue
        ours = getattr(settings, name)
        flag = "--" + name.replace("_", "-")
        if ours is None:
            update[name] = theirs
            notes.append(f"{flag} {theirs}: the backtest's ({settings.backtest / 'summary.json'})")
        elif ours != theirs:
            raise ConfigError(
                f"{flag} {ours} differs from the backtest's {theirs} ({settings.backtest / 'summary.json'}): the live "
                f"baselines would not be the backtest's, so their skills could not be compared. Drop {flag} to "
                "use the backtest's, or score without --backtest.",
                key=name,
            )
    for note in notes:
        logger.info("Scoring with %s", note)
    return settings.model_copy(update=update), notes
