"""The scoring stage against the model stage, in-process (no Ray): what an actor spends per part on each.

Builds the run's :class:`~distributed_onnx.evaluation.actor.part.PartRunner` in this process, exactly as an actor
does (the bundled reference checkpoint copied K times, 1 ONNX Runtime thread like a 1-CPU actor, rows per
batch 256), runs every part of the plan and sums the receipts' stage seconds: ``score / model`` is the share
issue 18 budgets (at most 3%). With ``--profile`` the scoring of one extra run is profiled with cProfile and
the top functions under ``PartRunner._score`` are printed.

Reproduce (a minute per tree on a 2-core machine); ``PYTHONPATH`` picks the tree measured, so a checkout of
the commit before the change measures "before" with the same script::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_bench.py --ks 1,4 --n-windows 2000 --repeats 3
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_bench.py --ks 1 --repeats 1 --profile
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_bench.py --many-series   # scale + history, 128 series
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_bench.py --ks 1 --repeats 1 --series 100 --n-windows 2960 \
        --max-parts 8    # the 5-minute run's parts: several series each, on one time grid
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_once(
    checkpoints: list[Path],
    output: Path,
    n_windows: int,
    profile: bool,
    data: Path | None = None,
    max_parts: int | None = None,
) -> dict[str, Any]:
    """Every part of one run (the first ``max_parts``) by one in-process runner; the summed receipt seconds.

    ``data``: another dataset than the bundled series (``--series``)."""
    from distributed_onnx.evaluation import run_manifest
    from distributed_onnx.evaluation.actor.part import PartRunner
    from distributed_onnx.evaluation.data.series_source import SeriesStore
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.model.backend.providers import SessionOptionsConfig
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    extra = {"data": data} if data is not None else {}
    settings = BacktestSettings(
        checkpoint=checkpoints, output=output, n_windows=n_windows, rows_per_batch=256, progress=False, **extra
    )
    plan = prepare(settings)
    run_manifest.prepare_output(settings.output, plan.run_fingerprint, {})
    options = SessionOptionsConfig(intra_op_num_threads=1, inter_op_num_threads=1)
    workers = {
        each.name: InferenceWorker.from_config(WorkerConfig(checkpoint=each.weights_path, session_options=options))
        for each in plan.checkpoints
    }
    runner = PartRunner(workers, plan.job(SeriesStore.from_table(plan.table)))
    totals: dict[str, float] = {}
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        original = runner._score

        def profiled(*args: Any, **kwargs: Any) -> None:
            profiler.enable()
            try:
                original(*args, **kwargs)
            finally:
                profiler.disable()

        runner._score = profiled  # type: ignore[method-assign]
    windows = 0
    for part in plan.parts()[:max_parts]:
        receipt = runner.run(part)
        windows += receipt.windows
        for stage, seconds in receipt.seconds.items():
            totals[stage] = totals.get(stage, 0.0) + seconds
    for worker in workers.values():
        worker.close()
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(25)
    return {"windows": windows, "stages": totals, "score_share": totals["score"] / totals["model"]}


def many_series(repeats: int = 20) -> dict[str, float]:
    """A batch of 256 windows over 128 short series: scale and history per series (the old loop) vs flat."""
    import numpy as np

    from distributed_onnx.evaluation.actor.part_history import gather_history
    from distributed_onnx.evaluation.data.packing import gather_blocks
    from distributed_onnx.evaluation.data.table import SeriesArrays
    from distributed_onnx.evaluation.scoring.naive import SeasonalScaler, flat_seasonal_scales

    rng = np.random.default_rng(0)
    n_series, length, m, steps = 128, 260, 24, 168
    offsets = np.arange(n_series + 1, dtype=np.int64) * length
    values = rng.normal(size=n_series * length)
    source = SeriesArrays(
        tuple(f"s{i}" for i in range(n_series)),
        np.zeros(n_series, np.int64),
        offsets,
        values,
        np.empty((0, values.size)),
        3_600_000_000,
    )
    series_index = np.repeat(np.arange(n_series), 2).astype(np.int64)
    origins = np.tile([length - 48, length - 24], n_series).astype(np.int64)

    def per_series() -> tuple[np.ndarray, np.ndarray]:
        scale, history = np.empty(series_index.size), np.empty((series_index.size, steps))
        for rows in np.split(np.arange(series_index.size), np.flatnonzero(np.diff(series_index)) + 1):
            one = values[offsets[series_index[rows[0]]] : offsets[series_index[rows[0]] + 1]]
            scale[rows] = SeasonalScaler(one, m).scales(origins[rows])  # every series new to the actor
            history[rows] = gather_blocks(one, origins[rows], steps, 0)
        return scale, history

    def flat() -> tuple[np.ndarray, np.ndarray]:
        scales = flat_seasonal_scales(values, offsets, series_index, origins, m)
        assert scales is not None
        return scales, gather_history(source, series_index, origins, steps)

    assert all(np.array_equal(a, b) for a, b in zip(per_series(), flat(), strict=True))
    out = {}
    for name, function in (("per_series_ms", per_series), ("flat_ms", flat)):
        started = time.perf_counter()
        for _ in range(repeats):
            function()
        out[name] = (time.perf_counter() - started) / repeats * 1e3
    return out


def main() -> None:
    from compare_bench import copies  # the same K copies of the reference checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-windows", type=int, default=1000)
    parser.add_argument("--ks", default="1,4")
    parser.add_argument("--repeats", type=int, default=2, help="runs per K; the median share is reported")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--many-series", action="store_true", help="only the many-short-series batch")
    parser.add_argument(
        "--series",
        type=int,
        help="score N noisy copies of the bundled series (the long runs' data, time_to_results.py) instead of it: "
        "with --n-windows 2960 and N=100, the 5-minute run's parts, several series each",
    )
    parser.add_argument("--max-parts", type=int, help="run only the first parts of the plan")
    args = parser.parse_args()
    if args.many_series:
        print(json.dumps(many_series()))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="scoring-bench-") as scratch:
        base = Path(scratch)
        ks = [int(k) for k in args.ks.split(",")]
        models = copies(base, max(ks))
        data = None
        if args.series:
            from backtest_bench import make_dataset

            data = base / "series.parquet"
            make_dataset(data, args.series * args.n_windows, args.series)
        for k in ks:
            runs = [
                run_once(
                    models[:k], base / f"run-{k}-{i}", args.n_windows, args.profile and i == 0, data, args.max_parts
                )
                for i in range(args.repeats)
            ]
            runs.sort(key=lambda run: run["score_share"])
            middle = runs[len(runs) // 2]
            row = {"k": k, "windows": middle["windows"], **middle, "shares": [r["score_share"] for r in runs]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out is not None:
        import distributed_onnx

        document = {"code": str(Path(distributed_onnx.__file__).parent), "rows": rows}
        args.out.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
