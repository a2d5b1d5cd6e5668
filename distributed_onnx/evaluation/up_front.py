"""What a backtest and a fev benchmark refuse before Ray starts: the run-wide checks, defined once for both.

A backtest starts Ray and its pool while it plans, a fev benchmark before its first run; a setting wrong for the
whole run must be refused before either, in one line (exit 2), and never become a failed part or a failed
task x checkpoint pair that a rerun fails again. Each check reads only the settings, the checkpoints' file names
and metadata (no graph, no digest of the weights) and what the output path is:

- :func:`check_checkpoint_names`: every checkpoint's name (its file stem) by the names rule
  (:mod:`distributed_onnx.names`), no two alike (their forecasts share one folder per name);
- :func:`levels_problem`: the quantile levels asked of a checkpoint inside its native range, unless clamping is
  asked for (a clamped level comes back under its own name holding the nearest native level's values);
- the output: a folder, new or existing, never an existing file nor a link to nothing, writable, with nothing in the
  way of what the run writes there (:func:`~distributed_onnx.evaluation.output_checks.check_run_output`, all in one
  place); for a command whose
  output is one file (``tune``), :func:`check_output_file`: not an existing folder, in a folder that can be made
  and written;
- the seasonality (at least one step) and every other bound: the settings model's own fields
  (:class:`~distributed_onnx.evaluation.settings.BacktestSettings`), which a fev task's values are validated
  against too.

:func:`check_backtest` runs them for a backtest's settings; the fev runner calls each for its tasks; ``tune``
checks its output file before it measures anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

from distributed_onnx import names, storage
from distributed_onnx.errors import ConfigError, StorageError, Suggestion
from distributed_onnx.evaluation.output_checks import FoundAtOutput, check_output_reachable, check_run_output
from distributed_onnx.evaluation.outputs import COVARIATE_AGES
from distributed_onnx.evaluation.settings import BacktestSettings
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import CheckpointMetadata, peek_metadata
from distributed_onnx.model.quantiles import clamped_levels
from distributed_onnx.own_inputs import Read, Written, check_own_inputs, checkpoint_files

#: What a backtest writes in its ``--output`` folder (its other contents are left alone).
RUN_ENTRIES = (
    "forecasts",
    "scores",
    "removed",
    "run.json",
    "metrics.parquet",
    "leaderboard.parquet",
    "summary.json",
    "report.html",
)
#: What a backtest writes there only with ``--covariate-data``: apart from :data:`RUN_ENTRIES`, which the own-inputs
#: check reads for every run and would then refuse ``--data DIR/covariate_ages.parquet`` where no run writes it.
COVARIATE_ENTRIES = (COVARIATE_AGES,)

__all__ = [
    "CLAMP",
    "check_backtest",
    "check_checkpoint_names",
    "check_output_file",
    "levels_problem",
    "peek_metadata",
    "run_entries",
]

#: What to do about levels outside a checkpoint's range, besides asking for levels inside it.
CLAMP = Suggestion(
    "Or give {} to forecast each as the nearest native level (its interval is then narrower than its name says).",
    (("clamp_quantiles", True),),
)


def run_entries(settings: BacktestSettings) -> tuple[str, ...]:
    """What this backtest writes in its ``--output`` folder: :data:`RUN_ENTRIES`, and :data:`COVARIATE_ENTRIES`
    with ``--covariate-data`` (read by the own-inputs check and by the command's ``wrote`` line)."""
    return RUN_ENTRIES + (COVARIATE_ENTRIES if settings.covariate_data is not None else ())


def check_backtest(settings: BacktestSettings) -> FoundAtOutput:
    """Everything :mod:`this module <.up_front>` checks, for one backtest's settings (exit 2 on the first found);
    returns what the output folder was found to hold (looked at once: the early start reads it)."""
    check_checkpoint_names(settings.checkpoint)
    check_own_inputs(
        [Written("output", settings.output, run_entries(settings))],
        [*(checkpoint_files(path, "checkpoint") for path in settings.checkpoint), Read("data", settings.data)],
    )
    at_output = check_run_output(settings.output)
    if settings.clamp_quantiles:
        return at_output
    found = [(path.stem, peek_metadata(path)) for path in settings.checkpoint]
    first = found[0][1]
    levels = settings.quantiles or (first.native_quantiles if first is not None else None)  # the run's default
    for name, metadata in found:
        problem = None if metadata is None or levels is None else levels_problem(name, levels, metadata)
        if problem is not None:
            raise ConfigError(f"{problem}. Request levels inside it.", key="quantiles", suggestions=(CLAMP,))
    return at_output


def check_output_file(output: Location, example: str) -> None:
    """Refuse an output *file* that cannot be written, before the command does its work (exit 2; exit 3 for a
    store that does not answer): an existing folder in its place, a folder on its way that is a file, a place
    that refuses a write (read-only, no permission, a store's credentials). Its folder is made (as the command
    would), and a probe file is written beside it and removed: only a write says whether a write works.
    ``example`` is a file name the message offers inside a folder given in its place. A place no write could
    reach (``ftp://``, ``-``) is refused first, as a backtest's output is (:func:`check_output_reachable`)."""
    check_output_reachable(output, what="file")
    if storage.is_dir(output):
        raise ConfigError(
            f"--output {output} is a folder; give the file to write (e.g. {output / example}).", key="output"
        )
    probe = output.parent / f".{output.name}.probe-{uuid.uuid4().hex[:12]}"
    try:
        storage.make_dirs(output.parent)
        storage.write_bytes(probe, b"")
    except ConfigError as exc:  # a store that reads only (https://): its own words, after ours
        raise ConfigError(f"--output {output} cannot be written: {exc}", key="output") from None
    except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        raise ConfigError(
            f"--output {output} cannot be written: {type(exc).__name__}: {output.scrub(str(exc))}. Give a file in "
            "a folder you can write.",
            key="output",
        ) from None
    except OSError as exc:
        raise StorageError(
            f"--output {output} cannot be written: {type(exc).__name__}: {output.scrub(str(exc))}. Check the "
            "location and its credentials, or give a local file.",
            path=str(output),
        ) from None
    storage.delete(probe)


def check_checkpoint_names(checkpoints: Sequence[Path]) -> None:
    """Each checkpoint's name (its file stem) by the names rule, and no two alike."""
    stems = [path.stem for path in checkpoints]
    for stem in stems:
        fix = "a checkpoint's name is its file's stem: rename the file"
        names.check(stem, what="checkpoint name", key="checkpoint", fix=fix)
    twice = sorted({stem for stem in stems if stems.count(stem) > 1})
    if twice:
        raise ConfigError(
            f"checkpoints must have distinct file stems (each names its model); {twice} given more than once: "
            "rename or copy one of them",
            key="checkpoint",
        )


def levels_problem(name: str, levels: Sequence[float], metadata: CheckpointMetadata) -> str | None:
    """Why checkpoint ``name`` cannot forecast ``levels`` without clamping (some lie outside its native range),
    or None."""
    native = metadata.native_quantiles
    clamped = clamped_levels(levels, native)
    if not clamped:
        return None
    shown = ", ".join(f"{level.requested:g}" for level in clamped)
    return (
        f"quantile level(s) {shown} lie outside {name}'s native range {native[0]:g}..{native[-1]:g}: the graph "
        "forecasts nothing there"
    )
