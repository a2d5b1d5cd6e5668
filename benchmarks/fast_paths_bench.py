"""Each fast path of the scoring against its removal, side by side: what an actor's score stage gains by it.

A run's batches are forecast once by the actors' :class:`~distributed_onnx.evaluation.actor.part.PartRunner` in this
process (the reference checkpoint, 1 ONNX Runtime thread, 256 rows a batch); their scoring (``PartRunner._score``,
everything an actor does per batch after the model) is then replayed part after part, with a 64 MB array touched
before each batch so that the caches are as cold as after a model call. A round replays every batch with the
fast paths (``kept``) and with one of them removed (``removed``: the general path only, patched in this process),
the order alternating from round to round; the result is the median of the rounds' paired ratios of the score
stage's CPU time (``removed / kept``: above 1 the fast path gains). ``same`` pairs the code with itself: the spread
of its ratios is the noise.

Three workloads: ``long`` (the bundled series, 2,000 windows: every batch one series, origins ascending),
``short`` (200 noisy copies, 20 windows each: a dozen series a batch, their origins repeating from one series to
the next) and ``grid`` (20 copies, 600 windows each, the last 2 parts of 2,400 windows: 4 series a part, each batch one
series, a part's next series repeating the origins of the one before); ``fresh`` is ``short`` with each part's
series scalers built again in every replay, as an actor meeting them for the first time does. Each result also
gives the median's 95% bootstrap interval (:mod:`paired_ratios`).

Reproduce (a few minutes on a 2-core machine)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fast_paths_bench.py --rounds 9 --out fast_paths.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/fast_paths_bench.py --rounds 9 --workloads grid \
        --only fev_append,fev_binary_search,fev_both,one_series_group_sum --out fast_paths_grid.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: Replays of every batch on each side of a pair (a replay of the long workload is ~0.1 s of scoring).
REPLAYS = 3
sys.path.insert(0, str(ROOT / "benchmarks"))


def capture(
    output: Path, data: Path | None, n_windows: int, max_parts: int | None = None, windows_per_part: int | None = None
) -> tuple[Any, list[tuple[Any, list[Any]]], float]:
    """Run every part once; the runner, each part's batches (planned, batch, forecast copies), model seconds."""
    from distributed_onnx.evaluation import outputs
    from distributed_onnx.evaluation.actor.part import PartRunner
    from distributed_onnx.evaluation.data.series_source import SeriesStore
    from distributed_onnx.evaluation.driver.plan import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.model.backend.providers import SessionOptionsConfig
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    extra: dict[str, Any] = {"data": data} if data is not None else {}
    if windows_per_part is not None:
        extra["windows_per_part"] = windows_per_part
    settings = BacktestSettings(
        checkpoint=[REFERENCE_CHECKPOINT], output=output, n_windows=n_windows, rows_per_batch=256, progress=False,
        **extra,
    )  # fmt: skip
    plan = prepare(settings)
    outputs.prepare_output(settings.output, plan.run_fingerprint, {})
    options = SessionOptionsConfig(intra_op_num_threads=1, inter_op_num_threads=1)
    workers = {
        each.name: InferenceWorker.from_config(WorkerConfig(checkpoint=each.weights_path, session_options=options))
        for each in plan.checkpoints
    }
    runner = PartRunner(workers, plan.job(SeriesStore.from_table(plan.table)))
    captured: list[Any] = []
    original = runner._score

    def keep(planned: Any, batch: Any, forecasts: dict[str, np.ndarray], **kwargs: Any) -> None:
        captured.append((planned, batch, {name: np.copy(f, order="K") for name, f in forecasts.items()}))
        original(planned, batch, forecasts, **kwargs)

    runner._score = keep  # type: ignore[method-assign]
    parts, model_s = [], 0.0
    chosen = plan.parts() if max_parts is None else plan.parts()[-max_parts:]  # the last: full-sized parts
    for part in chosen:
        captured = []
        receipt = runner.run(part)
        model_s += receipt.seconds["model"]
        parts.append((part, captured))
    runner._score = original  # type: ignore[method-assign]
    return runner, parts, model_s


def replay(runner: Any, parts: list[tuple[Any, list[Any]]], cold: np.ndarray, fresh_scalers: bool = False) -> float:
    """CPU seconds of this thread in ``_score`` over every captured batch (fresh sums per part, as an actor).

    ``fresh_scalers``: each part's series scalers built again, as by an actor that meets a part's series for the
    first time (many series, each in one part); else they stay cached from the replay before."""
    from distributed_onnx.evaluation.fans import FanCollector
    from distributed_onnx.evaluation.scoring.pairs import BASELINES, PairScores

    job, spent = runner.job, 0.0
    for part, batches in parts:
        runner._source = runner._part_source(part)
        runner.history.source = runner._source
        if fresh_scalers:
            runner.history._scalers.clear()
        scores = PairScores([*runner.workers, *BASELINES], job.quantiles, job.spec.horizon, runner._scratch)
        fans = FanCollector(frozenset(job.fan_series), job.quantiles, job.spec.horizon)
        for planned, batch, forecasts in batches:
            cold += 1.0  # the model's call evicts the caches
            started = time.thread_time()
            runner._score(planned, batch, forecasts, scores=scores, fans=fans)
            spent += time.thread_time() - started
    return spent


@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


def removals() -> dict[str, Callable[[], contextlib.AbstractContextManager[None]]]:
    """Each fast path's removal: the general path only, the rest unchanged."""
    from distributed_onnx.evaluation import fans
    from distributed_onnx.evaluation.actor import part_history
    from distributed_onnx.evaluation.scoring import batch_pairs, conventions, metrics, naive, pairs

    def group_sum_general(codes: Any, values: Any, n_groups: int) -> Any:
        width = values.shape[1]
        index = (codes[:, None] * width + np.arange(width)).ravel()
        sums = np.bincount(index, weights=values.ravel().astype(np.float64), minlength=n_groups * width)
        return np.asarray(sums, dtype=np.float64).reshape(n_groups, width)

    def finite_general(forecast: Any) -> Any:
        if isinstance(forecast, batch_pairs.CellForecast):
            return forecast.finite()
        return np.asarray(np.isfinite(forecast).all(axis=2))

    def several_series_path(self: Any, planned: Any) -> Any:  # scales_and_cells without its one-series branch
        m, n_windows, history_steps = self.seasonality, planned.n_windows, self.history_steps
        source, horizon = self.source, self.spec.horizon
        positions = part_history.cell_positions(planned, m)
        if isinstance(source, part_history.SeriesArrays):
            series_index = np.asarray(planned.series_index, dtype=np.int64)
            origins = np.asarray(planned.origin_index, dtype=np.int64)
            history = part_history.gather_history(source, series_index, origins, history_steps)
            flat = part_history.flat_seasonal_scales(source.values, source.offsets, series_index, origins, m)
            if flat is not None:
                return flat, part_history.season_cells(history, m, horizon, positions)
        else:
            history = np.empty((n_windows, history_steps))
        scale = np.empty(n_windows)
        for rows in np.split(np.arange(n_windows), np.flatnonzero(np.diff(planned.series_index)) + 1):
            one = int(planned.series_index[rows[0]])
            scale[rows] = self._scaler(one).scales(planned.origin_index[rows])
            if not isinstance(source, part_history.SeriesArrays):
                values = source.series(one).values
                history[rows] = part_history.gather_blocks(values, planned.origin_index[rows], history_steps, 0)
        return scale, part_history.season_cells(history, m, horizon, positions)

    def copied_point(point: Any, n_quantiles: int, copy: bool = True) -> Any:
        return naive.broadcast_quantiles(point, n_quantiles, copy=True)

    def materialized_quantiles(cells: Any, quantiles: Any) -> Any:
        return naive.cell_quantiles(cells, quantiles).materialized()

    def never(*args: Any) -> bool:
        return False

    general_common_pairs = _without_early_return(pairs.common_pairs)

    return {
        "same": contextlib.nullcontext,
        "one_series_group_sum": lambda: patched(metrics, "_group_sum", group_sum_general),
        "fev_append": lambda: patched(conventions, "_after", never),
        "fev_binary_search": lambda: patched(conventions, "_distinct", never),
        "fev_both": lambda: _both(patched(conventions, "_after", never), patched(conventions, "_distinct", never)),
        "one_series_cells": lambda: patched(part_history.SeriesHistory, "scales_and_cells", several_series_path),
        "finite_fast_pass": lambda: _both(
            patched(pairs, "finite_pairs", finite_general), patched(batch_pairs, "finite_pairs", finite_general)
        ),
        "point_scored_once": lambda: patched(pairs, "broadcast_quantiles", copied_point),
        "cells_gathered_by_chunk": lambda: patched(pairs, "cell_quantiles", materialized_quantiles),
        "flat_scales": lambda: patched(part_history, "flat_seasonal_scales", lambda *args: None),
        "one_series_codes": lambda: patched(batch_pairs.SeriesCodes, "of_indices", classmethod(_of_indices_general)),
        "common_pairs_early": lambda: patched(pairs, "common_pairs", general_common_pairs),
        "full_quantiles": lambda: patched(naive, "_nan_quantiles", _nan_quantiles_general),
        "dense_distinct_cells": lambda: patched(naive, "_distinct_cells", _distinct_cells_sorted),
        "fans_one_series": lambda: patched(fans.FanCollector, "touches", _touches_general),
    }


def _of_indices_general(cls: Any, series_index: Any, series_ids: Any) -> Any:  # without the one-series branch
    index = np.asarray(series_index).ravel()
    numbers, local = np.unique(index, return_inverse=True)
    ids = [str(series_ids[int(number)]) for number in numbers]
    order = sorted(range(len(ids)), key=ids.__getitem__)
    rank = np.empty(len(ids), dtype=np.intp)
    rank[order] = np.arange(len(ids), dtype=np.intp)
    return cls([ids[i] for i in order], rank[local.ravel()], int(index.size))


def _nan_quantiles_general(values: Any, levels: Any) -> Any:  # without the every-value-observed branch
    ordered = np.sort(values, axis=1)
    count = np.isfinite(ordered).sum(axis=1)
    position = (np.maximum(count, 1) - 1)[..., None] * levels
    low = np.floor(position).astype(np.intp)
    high = np.minimum(low + 1, np.maximum(count, 1)[..., None] - 1)
    weight = position - low
    below = np.take_along_axis(ordered[:, :, :, None], low[:, None], axis=1)[:, 0]
    above = np.take_along_axis(ordered[:, :, :, None], high[:, None], axis=1)[:, 0]
    difference = above - below
    result = np.where(weight >= 0.5, above - difference * (1 - weight), below + difference * weight)
    result[count == 0] = np.nan
    return result


def _distinct_cells_sorted(keys: Any) -> Any:  # np.unique only, no dense pass
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first.astype(np.intp), inverse.ravel().astype(np.intp)


def _touches_general(self: Any, series_index: Any) -> bool:
    if series_index.size == 0 or not self.fan_series:
        return False
    return bool(np.isin(series_index, list(self.fan_series)).any())


def _without_early_return(common_pairs: Callable[..., Any]) -> Callable[..., Any]:
    """``pairs.common_pairs`` without its all-valid early return: the counts and failures always computed."""
    from distributed_onnx.evaluation.scoring.batch_pairs import finite_pairs
    from distributed_onnx.evaluation.scoring.pairs import REASONS

    def general(actual: Any, forecasts: Any, baselines: Any) -> Any:
        observed = np.isfinite(actual)
        finite = {name: finite_pairs(values) for name, values in forecasts.items()}
        baseline_ok, model_ok = np.ones_like(observed), np.ones_like(observed)
        for name, ok in finite.items():
            if name in baselines:
                baseline_ok &= ok
            else:
                model_ok &= ok
        valid = observed & baseline_ok & model_ok
        excluded = {
            REASONS[0]: int((~observed).sum()),
            REASONS[1]: int((observed & ~baseline_ok).sum()),
            REASONS[2]: int((observed & baseline_ok & ~model_ok).sum()),
        }
        nonfinite = {name: ~np.asarray(ok.all(axis=1)) for name, ok in finite.items() if name not in baselines}
        return valid, excluded, nonfinite

    return general


@contextlib.contextmanager
def _both(*managers: contextlib.AbstractContextManager[None]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


def measure(
    runner: Any,
    parts: list[tuple[Any, list[Any]]],
    cold: np.ndarray,
    removal: Callable[[], contextlib.AbstractContextManager[None]],
    rounds: int,
    model_s_per_batch: float,
    fresh_scalers: bool = False,
) -> dict[str, Any]:
    """``rounds`` alternating pairs (kept, removed), each side :data:`REPLAYS` replays of every batch."""
    from paired_ratios import summary
    from time_to_results import alternating_pairs

    batches = sum(len(batches) for _, batches in parts)

    def kept() -> dict[str, Any]:
        return {"score_s": sum(replay(runner, parts, cold, fresh_scalers) for _ in range(REPLAYS))}

    def removed() -> dict[str, Any]:
        with removal():
            return kept()

    pairs = alternating_pairs(rounds, kept, removed)
    ratios = [two["score_s"] / one["score_s"] for one, two in pairs]
    per_batch = batches * REPLAYS / 1e3
    return {
        "median_ratio": statistics.median(ratios),
        "ratios": ratios,
        "summary": summary(ratios),
        "kept_ms_per_batch": statistics.median(one["score_s"] for one, _ in pairs) / per_batch,
        "removed_ms_per_batch": statistics.median(two["score_s"] for _, two in pairs) / per_batch,
        "model_ms_per_batch": model_s_per_batch * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", help="comma-separated removals (default: all)")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--workloads", default="long,short", help="comma-separated, of long, short, grid, fresh (short, scalers new)"
    )
    args = parser.parse_args()
    from backtest_bench import make_dataset

    cold = np.zeros(8 << 20)  # 64 MB
    results: dict[str, Any] = {"rounds": args.rounds, "load_average_start": os.getloadavg(), "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="fast-paths-") as scratch:
        base = Path(scratch)
        short, grid = base / "short.parquet", base / "grid.parquet"
        make_dataset(short, 200 * 20, 200)
        make_dataset(grid, 20 * 600, 20)
        workloads = {
            "long": (None, 2000, None, None),
            "short": (short, 20, None, None),
            "grid": (grid, 600, 2, 2400),
            "fresh": (short, 20, None, None),
        }
        for workload in args.workloads.split(","):
            source, n_windows, max_parts, windows_per_part = workloads[workload]
            runner, parts, model_s = capture(base / workload, source, n_windows, max_parts, windows_per_part)
            batches = sum(len(batches) for _, batches in parts)
            fresh = workload == "fresh"
            kept_s = replay(runner, parts, cold, fresh)
            entry: dict[str, Any] = {"batches": batches, "model_s": model_s, "score_s_first": kept_s, "removals": {}}
            for name, removal in removals().items():
                if args.only and name not in [*args.only.split(","), "same"]:
                    continue
                try:
                    with removal():
                        pass
                except AttributeError:  # a fast path removed from the tree measured (run it on the tree before)
                    print(workload, name, "not in this tree", flush=True)
                    continue
                entry["removals"][name] = measure(runner, parts, cold, removal, args.rounds, model_s / batches, fresh)
                print(workload, name, json.dumps(entry["removals"][name]), flush=True)
            results["workloads"][workload] = entry
    results["load_average_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
