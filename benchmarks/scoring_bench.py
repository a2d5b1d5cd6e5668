"""The scoring stage against the model stage, in-process (no Ray): what an actor spends per part on each.

Builds the run's :class:`~distributed_onnx.evaluation.part.PartRunner` in this process, exactly as an actor
does (the bundled reference checkpoint copied K times, 1 ONNX Runtime thread like a 1-CPU actor, rows per
batch 256), runs every part of the plan and sums the receipts' stage seconds: ``score / model`` is the share
issue 18 budgets (at most 3%). With ``--profile`` the scoring of one extra run is profiled with cProfile and
the top functions under ``PartRunner._score`` are printed.

Reproduce (a minute per tree on a 2-core machine); ``PYTHONPATH`` picks the tree measured, so a checkout of
the commit before the change measures "before" with the same script::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_bench.py --ks 1,4 --n-windows 2000 --repeats 3
    PYTHONPATH=$PWD .venv/bin/python benchmarks/scoring_bench.py --ks 1 --repeats 1 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_once(checkpoints: list[Path], output: Path, n_windows: int, profile: bool) -> dict[str, Any]:
    """Every part of one run by one in-process runner; the summed receipt seconds."""
    from distributed_onnx.evaluation import outputs
    from distributed_onnx.evaluation.data.series_source import SeriesStore
    from distributed_onnx.evaluation.part import PartRunner
    from distributed_onnx.evaluation.plan import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings
    from distributed_onnx.model.backend.providers import SessionOptionsConfig
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    settings = BacktestSettings(
        checkpoint=checkpoints, output=output, n_windows=n_windows, rows_per_batch=256, progress=False
    )
    plan = prepare(settings)
    outputs.prepare_output(settings.output, plan.run_fingerprint, {})
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
    for part in plan.parts():
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


def main() -> None:
    from compare_bench import copies  # the same K copies of the reference checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-windows", type=int, default=1000)
    parser.add_argument("--ks", default="1,4")
    parser.add_argument("--repeats", type=int, default=2, help="runs per K; the median share is reported")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scoring-bench-") as scratch:
        base = Path(scratch)
        ks = [int(k) for k in args.ks.split(",")]
        models = copies(base, max(ks))
        for k in ks:
            runs = [
                run_once(models[:k], base / f"run-{k}-{i}", args.n_windows, args.profile and i == 0)
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
