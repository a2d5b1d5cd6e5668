"""``summary.json``: what a run planned, did and measured, and which run computed the parts it reports.

A rerun that resumes keeps the record of the invocations that computed parts (``computed_by``: actors,
providers, throughput), so re-running a finished run changes no number and still says who computed them.
Throughput has one definition, shared with the progress line (:mod:`._progress`): windows
computed by this invocation / seconds from the first part dispatched to the last receipt.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np

from distributed_onnx import storage
from distributed_onnx.errors import BatchError
from distributed_onnx.evaluation.data.vintages import REALIZED_SUFFIX
from distributed_onnx.evaluation.driver._failures import nonfinite_error
from distributed_onnx.evaluation.driver.clock import driver_cpu_s, peak_rss_mb
from distributed_onnx.evaluation.sums import IN_SAMPLE
from distributed_onnx.location import Location
from distributed_onnx.version import __version__

if TYPE_CHECKING:
    from distributed_onnx.evaluation.driver._outcome import RunOutcome
    from distributed_onnx.evaluation.driver.clock import PhaseClock
    from distributed_onnx.evaluation.driver.run import RunScores
    from distributed_onnx.evaluation.planning import RunPlan


def versions() -> dict[str, str | None]:
    """The versions that made the numbers (read from package metadata: the driver never imports ORT)."""

    def installed(*names: str) -> str | None:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    return {
        "distributed_onnx": __version__,
        "onnxruntime": installed("onnxruntime", "onnxruntime-gpu"),
        "ray": installed("ray"),
        "pyarrow": installed("pyarrow"),
        "python": platform.python_version(),
    }


def summarize(
    scores: RunScores,
    tuned: Mapping[str, Any] | None,
    covariates: dict[str, Any],
    nonfinite: dict[str, list[str]],
    nonfinite_path: Location,
) -> tuple[dict[str, Any], BatchError | None]:
    """The run's summary as the report draws it (``timing`` covers the phases marked so far; the report stage adds
    what the leaderboard says and the final timing), and the error of non-finite forecasts, raised at the end.

    ``covariates``: :func:`~._vintage_summary.covariates_found`'s record; ``nonfinite``: per model, the windows
    holding NaN or infinite forecasts (``nonfinite_windows.json``, at ``nonfinite_path``); ``tuned``: what
    ``backtest --tuned`` did with a tuned file's choice between a checkpoint and its variants
    (``distributed_onnx/tune_variants.py``), kept as ``summary["tuned"]`` and said in a note, so that a variant
    run in place of its parent is never silent."""
    plan = scores.plan
    summary = build_summary(plan, scores.outcome, scores.ending.clock, scores.earlier.summary)
    summary["covariates"] = covariates
    # The windows at or before a checkpoint's training_data_end, counted.
    if plan.in_sample_end_us is not None:
        windows = scores.in_sample_windows
        summary["in_sample"] = {
            "training_data_end": str(np.datetime64(plan.in_sample_end_us, "us")) + "Z",
            "windows": windows,
            "in_leaderboard": plan.settings.include_in_sample,
            "scope": IN_SAMPLE,
        }
        if windows and not plan.settings.include_in_sample:
            summary["notes"].append(
                f"{windows} in-sample window(s) (origin at or before the training data's end "
                f"{summary['in_sample']['training_data_end']}) are scored apart (scope {IN_SAMPLE}) and left out of "
                "the leaderboard; the setting include_in_sample keeps them in"
            )
    # The models: fingerprints, identities, pairs scored and left out, parts computed per model.
    summary["models"] = plan.model_records()
    if tuned is not None:  # the tuned file's choice of checkpoint: said, never silent
        summary["tuned"] = dict(tuned)
        summary["notes"].append(str(tuned["said"]))
    for twin in plan.realized_models:  # --compare-realized: the same checkpoint on the realized covariates
        summary["models"][twin] = {
            "realized_of": twin.removesuffix(REALIZED_SUFFIX),
            "fingerprint": plan.model_fingerprints[twin],
        }
    summary["pairs"] = scores.scores.left_out()
    summary["parts"]["computed_by_model"] = dict(
        Counter(name for receipt in scores.outcome.receipts for name in receipt.models_computed)
    )
    error = nonfinite_error(nonfinite, nonfinite_path)
    if error is not None:
        summary["notes"].append(str(error))
    return summary, error


def build_summary(
    plan: RunPlan, outcome: RunOutcome, clock: PhaseClock, earlier: dict[str, Any] | None
) -> dict[str, Any]:
    """The summary of one invocation; ``timing`` covers the phases marked so far (see :func:`driver_timing`)."""
    receipts, failures, workers = outcome.receipts, outcome.failures, outcome.workers
    computed = outcome.windows_computed
    dispatch_s = clock.wall_s.get("dispatch", 0.0)
    dispatch_cpu_s = clock.cpu_s.get("dispatch", 0.0)
    rate = computed / dispatch_s if computed and dispatch_s > 0 else None
    record = None
    if computed:
        record = {
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "windows": computed,
            "parts": len(receipts),
            "windows_per_s": rate,
            "dispatch_s": dispatch_s,
            "actors": len(workers),
            "providers": sorted({", ".join(info.providers) for info in workers}),
        }
    computed_by = [*((earlier or {}).get("computed_by") or []), *([record] if record else [])]
    stages = Counter[str]()
    for receipt in receipts:
        stages.update(receipt.seconds)
    done_parts, done_windows = outcome.parts_done_before, outcome.windows_done_before
    return {
        "model": plan.checkpoint.name,
        "checkpoint": storage.redact(plan.checkpoint.weights_path),
        "checkpoint_sha256": plan.checkpoint.metadata.sha256,
        "data": str(plan.settings.data),  # a URL's secrets stay in the URL (report.html shows these)
        "run_fingerprint": plan.run_fingerprint,
        "settings": storage.redacted(plan.settings.model_dump(mode="json")),
        "versions": versions(),
        "resolved": {
            "context_length": plan.spec.context_length,
            "horizon": plan.spec.horizon,
            "quantiles": plan.quantiles,
            "seasonality": plan.seasonality,
            "series": len(plan.table.series),
            "windows_per_part": plan.windows_per_part,
            "rows_per_batch": plan.rows_per_batch,
        },
        "windows": {
            "planned": plan.windows.planned,
            "skipped_context_coverage": plan.windows.skipped,
            "capped_n_windows": plan.windows.capped,
            "done_before": done_windows,
            "run_now": computed,
            "failed": outcome.windows_failed,
        },
        "parts": {
            "planned": outcome.parts_planned,
            "done_before": done_parts,
            "computed_now": len(receipts),
            "failed": len(failures),
            **outcome.dispatch_stats.as_record(),
        },
        "actors": [info.model_dump() for info in workers],
        "timing": {
            "total_s": clock.elapsed_s(),
            "dispatch_s": dispatch_s,
            "first_forecast_s": outcome.first_result_s,  # from the start of the job, Ray start-up included
            "windows_per_s": rate,
            "driver_cpu_dispatch_s": dispatch_cpu_s,
            "driver_cpu_dispatch_us_per_window": 1e6 * dispatch_cpu_s / computed if computed else None,
            # The dispatch phase's CPU per part run now: what one more part costs the driver (docs/driver.md).
            "driver_cpu_dispatch_us_per_part": 1e6 * dispatch_cpu_s / len(receipts) if receipts else None,
            "actor_stage_s": {stage: round(seconds, 3) for stage, seconds in stages.items()},
        },
        "transport": {
            **outcome.transport,
            "receipt_bytes": max((len(receipt.model_dump_json()) for receipt in receipts), default=None),
            "part_bytes": sum(receipt.part_bytes for receipt in receipts),
            "sums_bytes": sum(receipt.sums_bytes for receipt in receipts),
            "parts_by_node": dict(Counter(str(receipt.node_id) for receipt in receipts)),
        },
        "resume": {
            "resumed": done_windows > 0,
            "parts_done_before": done_parts,
            "windows_done_before": done_windows,
        },
        "computed_by": computed_by,
        "quantile_clamping": [level.as_record() for level in plan.clamped],
        "notes": list(plan.notes),
        "failed_parts": [failure.as_record() for failure in failures],
    }


def driver_timing(clock: PhaseClock, windows_computed: int = 0) -> dict[str, Any]:
    """The driver's own cost, taken last (after Ray stopped): CPU in all (and per window computed now), and
    wall and CPU per phase."""
    cpu_s = driver_cpu_s()
    return {
        "driver_cpu_s": cpu_s,
        "driver_cpu_us_per_window": 1e6 * cpu_s / windows_computed if windows_computed else None,
        "driver_cpu_phases_s": {phase: round(seconds, 4) for phase, seconds in clock.cpu_s.items()},
        "driver_wall_phases_s": {phase: round(seconds, 4) for phase, seconds in clock.wall_s.items()},
        "driver_peak_rss_mb": peak_rss_mb(),
    }
