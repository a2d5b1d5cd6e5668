"""Time to results: what a user waits for, whole processes measured from outside, side by side in one run.

Four comparisons (issue "Time to results"), each mode in its own subprocess:

1. ``make_backtest``: the command ``make backtest`` runs (913 windows of the reference checkpoint, embedded Ray,
   `.[cpu]` install in ``.venv-cli``) against a plain ORT loop on the same windows, in rounds (the first not
   counted: warm file caches, as a user's second run), each command run followed by a rerun on its finished
   directory; the command's seconds over the loop's per round. ``--attach``: also the command with ``--address
   auto`` joining a ``ray start`` head started once (docs/cluster.md). With ``--baseline-tree DIR`` the same
   command also runs from another checkout (its package first on PYTHONPATH, for the driver and Ray's workers):
   before and after in one run.
2. ``one_minute``: the whole CLI process (2 actors x 1 CPU) against the plain 1-thread loop (the actors' own
   part runner in one process, no Ray) on the same windows of the reference checkpoint: 59,200 windows, 20
   series of 2,960. ``five_minutes`` (not in the default set: ~10 minutes) is the same comparison at 5x the
   work, 296,000 windows: 100 series of 2,960 windows. Every series is a copy of the bundled Taylor series
   (4,032 half-hours), scaled by a random factor in [0.5, 1.5] with Gaussian noise (sd 200) added
   (``backtest_bench.make_dataset``, seed 0); ``--scale`` above 1 adds series, never longer ones (the bundled
   history caps a series at 3,936 windows).
3. ``many_series``: tens of thousands of short hourly series (260 points, 2 windows each, a tiny model): the
   whole CLI process against a plain pandas-groupby + ONNX Runtime loop (read, group, window, run, write
   Parquet; no scoring) at the first ``--series`` count, ``--rounds`` pairs in alternating order (the median
   pair's ratio), report.html's size, and the driver's peak RSS at the other counts. ``million_series`` (not in
   the default set) is the command alone on 1,000,000 such series of 1 window each (``--million``): that it
   ends, the driver's peak RSS, the whole process's seconds and CPU, report.html's size.
4. ``first_forecast``: seconds from process start to the first forecast, CLI against Ray Data ``map_batches``
   (tiny model; Ray Data needs the ``bench`` extra: ray[data], pandas).

Reproduce (2 cores: about 15 minutes unloaded)::

    .venv/bin/python benchmarks/time_to_results.py [--scale 0.25] [--baseline-tree ../main]
    .venv/bin/python benchmarks/time_to_results.py --only make_backtest --rounds 4 --attach --baseline-tree ../main \
        --name time_to_results_make_backtest      # the main job: 3 counted rounds, embedded and attached
    .venv/bin/python benchmarks/time_to_results.py --only one_minute --rounds 4 \
        --name time_to_results_one_minute         # ~1 minute of work, 4 alternating pairs
    .venv/bin/python benchmarks/time_to_results.py --only many_series --series 40000 --rounds 5 \
        --name time_to_results_many_series        # 40,000 series x 2 windows against the pandas loop, 5 pairs
    .venv/bin/python benchmarks/time_to_results.py --only million_series \
        --name time_to_results_million_series     # 1,000,000 series x 1 window: the driver's peak RSS

Results go to benchmarks/results/<name>.json (``--name``), and by hand into time_to_results.md, the current
figures of each comparison (git keeps the earlier ones); every timing is wall clock, and the ratios are
between modes run one after the other in the same invocation (say in the results whether the machine was
shared: ``load_average`` is recorded before and after). Each process tree's CPU is sampled from ``/proc``
(``process_cpu.py``): by role (driver, actors, Ray's GCS, raylet, agents, log monitor) for each of the
command's phases, with what the rest of the machine used meanwhile (``outside_tree_cpu_s``: other users' load,
measured) and each actor's CPU share and idle tail in the dispatch phase.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# This checkout's package, for this process, its children and Ray's workers (not a venv's editable install).
# A child measuring the baseline tree (``--baseline-tree``) gets that tree's package first instead.
PACKAGE_ROOT = os.environ.get("TIME_TO_RESULTS_PACKAGE", str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
sys.path[:0] = [PACKAGE_ROOT, str(ROOT / "benchmarks"), str(ROOT / "tests")]

from backtest_bench import CLI, ensure_cli_venv, make_dataset, run_loop, run_ray_data, two_actor_arguments  # noqa: E402
from machine import cpu_facts, started_head  # noqa: E402
from process_cpu import ProcessTreeCpu, actors_between, between  # noqa: E402

from distributed_onnx.evaluation.driver.clock import peak_rss_mb  # noqa: E402

ROWS_PER_BATCH = 256
#: ~1 minute of plain 1-thread model work on 2 cores (reference checkpoint): 20 series x 2,960 windows.
ONE_MINUTE_WINDOWS = 59_200
#: Windows per series of the long runs (``one_minute``, ``five_minutes``): the 1-minute scenario's.
WINDOWS_PER_SERIES = 2_960
SERIES_POINTS = 260
#: Series of the ``million_series`` run (``--million``).
MILLION_SERIES = 1_000_000
#: Series generated (and written) at a time by :func:`write_many_series`.
MANY_SERIES_PER_CHUNK = 20_000
#: The command's argv prefix; ``--cli-from-this-python`` replaces it (see benchmarks/cli_no_pandas.py).
#: ``python -m distributed_onnx``, not the console script: the script's entry point is fixed when the venv is
#: installed, while ``-m`` runs the entry of whichever tree is first on PYTHONPATH (this one, or the baseline).
CLI_COMMAND = [str(Path(CLI).parent / "python"), "-P", "-m", "distributed_onnx"]  # -P: not the working directory first


def cli_process(
    args: list[str], output: Path, env: dict[str, str] | None = None, *, fresh: bool = True
) -> dict[str, Any]:
    """Run ``distributed-onnx backtest ... --output output`` and return wall, summary timing and report size;
    ``fresh``: on an empty directory (else on what is there: a rerun of a finished run)."""
    if fresh and output.exists():
        shutil.rmtree(output)
    command = [*CLI_COMMAND, "backtest", "--output", str(output), "--no-progress", *args]
    load_before = os.getloadavg()
    completed, wall_s, cpu = measured_run(command, env)
    if completed.returncode != 0:
        return {"error": completed.stderr[-2000:]}
    summary = json.loads((output / "summary.json").read_text())
    timing = summary["timing"]
    report = output / "report.html"
    return {
        "cpu_by_phase": cpu_by_phase(cpu, timing.get("driver_wall_phases_s") or {}),
        "process_s": wall_s,
        "total_s": timing.get("total_s"),
        "first_forecast_s": timing.get("first_forecast_s"),
        "dispatch_s": timing.get("dispatch_s"),
        "windows": summary["windows"]["run_now"],
        "wall_phases_s": timing.get("driver_wall_phases_s"),
        "driver_peak_rss_mb": timing.get("driver_peak_rss_mb"),
        "actor_stage_s": timing.get("actor_stage_s"),
        "report_bytes": report.stat().st_size if report.exists() else None,
        "series_transport": summary.get("transport", {}).get("series_transport"),
        # who drew report.html: a side whose report process failed is drawn by its driver, and slower for it
        "report_drawn_by": timing.get("report_drawn_by"),
        "load_average": [load_before, os.getloadavg()],
    }


def measured_run(
    command: list[str], env: dict[str, str] | None
) -> tuple[subprocess.CompletedProcess[str], float, dict[str, Any]]:
    """Run ``command`` to its end: the completed process, its wall seconds, and its tree's CPU by role.

    It runs in the folder of the tree it comes from (``PYTHONPATH``'s first entry for a baseline): a child started
    with ``python -m`` puts its working directory first on its path, and a baseline run from this tree's folder had
    its report process import this tree's package, fail, and leave the drawing to its driver (a slower baseline)."""
    started = time.perf_counter()
    tree = (env or {}).get("PYTHONPATH", "").split(os.pathsep)[0] or str(ROOT)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tree, env=env)
    sampler = ProcessTreeCpu(process.pid)
    stdout, stderr = process.communicate(timeout=3600)
    wall_s = time.perf_counter() - started
    sampler.stop()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), wall_s, sampler.result()


def cpu_by_phase(cpu: dict[str, Any], phases_s: dict[str, float]) -> dict[str, Any]:
    """The whole run's CPU by role, and each phase's (the driver's wall phases, consecutive from the start)."""
    timeline = cpu.pop("timeline")
    result: dict[str, Any] = {"whole": cpu}
    start = 0.0
    for phase, seconds in phases_s.items():
        result[phase] = between(timeline, start, start + seconds)
        if phase == "dispatch":
            result["actors_in_dispatch"] = actors_between(timeline, start, start + seconds)
        start += seconds
    return result


def make_backtest(output: Path, baseline_tree: str | None, rounds: int = 2, *, attach: bool = False) -> dict[str, Any]:
    """`make backtest`'s command against a plain ORT loop on the same 913 windows, ``rounds`` times, the order of
    the sides reversed every other round; each command run is followed by a rerun on its finished directory.

    Sides: the command (embedded Ray), the plain loop (``plain_pandas_loop``: read, window, one 1-thread ORT
    session, Parquet out), with ``attach`` the command with ``--address auto`` joining a ``ray start`` head
    started once before the rounds (``machine.started_head``), and with ``baseline_tree`` the command from another
    checkout. The first round warms the file caches (a user's second run) and is not counted; per counted round
    each command's seconds over the plain loop's are kept (``over_plain_s``), as are its phases.
    """
    from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET

    arguments = ["--n-windows", "913", "--stride", "1"]
    commands: dict[str, tuple[list[str], dict[str, str] | None]] = {"this tree": (arguments, None)}
    if baseline_tree:
        commands["baseline"] = (arguments, {**os.environ, "PYTHONPATH": str(Path(baseline_tree).resolve())})
    plain_args = argparse.Namespace(
        data=str(REFERENCE_DATASET), checkpoint=str(REFERENCE_CHECKPOINT), n_windows_per_series=913
    )
    with started_head() if attach else nullcontext({}) as attach_env:
        if attach:
            commands["attached"] = ([*arguments, "--address", "auto"], {**attach_env})
        counted: dict[str, list[dict[str, Any]]] = {name: [] for name in [*commands, "plain loop"]}
        for round_ in range(1, max(rounds, 2) + 1):
            sides = [*commands, "plain loop"]
            for name in sides if round_ % 2 else sides[::-1]:
                if name == "plain loop":
                    result = child("pandas_loop", plain_args, output / "plain")
                else:
                    flags, env = commands[name]
                    folder = output / name.replace(" ", "_")
                    result = cli_process(flags, folder, env)
                    result["rerun"] = cli_process(flags, folder, env, fresh=False)  # nothing left to compute
                if round_ > 1:
                    counted[name].append(result)
                print(f"make_backtest {name} round {round_}: {result}", flush=True)
    results: dict[str, Any] = {name: runs[-1] for name, runs in counted.items()}  # the last round in full
    plain = counted["plain loop"]
    for name, runs in counted.items():
        walls = [run["process_s"] for run in runs if "process_s" in run]
        record: dict[str, Any] = {"process_s": walls, "median_process_s": float(np.median(walls)) if walls else None}
        if name != "plain loop":
            over = [a["process_s"] - b["process_s"] for a, b in zip(runs, plain, strict=True) if _both(a, b)]
            reruns = [run["rerun"].get("process_s") for run in runs if "rerun" in run]
            record |= {
                "over_plain_s": over,
                "median_over_plain_s": float(np.median(over)) if over else None,
                "total_s": [run.get("total_s") for run in runs],
                "first_forecast_s": [run.get("first_forecast_s") for run in runs],
                "wall_phases_s": [run.get("wall_phases_s") for run in runs],
                "rerun_process_s": reruns,
                "rerun_wall_phases_s": [run["rerun"].get("wall_phases_s") for run in runs if "rerun" in run],
            }
        results[f"{name} rounds"] = record
    if baseline_tree:
        pairs = zip(counted["this tree"], counted["baseline"], strict=True)
        ratios = [a["process_s"] / b["process_s"] for a, b in pairs if _both(a, b)]
        results["paired_ratio_this_over_baseline"] = ratios
        results["median_paired_ratio"] = float(np.median(ratios)) if ratios else None
    return results


def _both(one: dict[str, Any], other: dict[str, Any]) -> bool:
    return "process_s" in one and "process_s" in other


def long_run_series(n_windows: int) -> int:
    """Series for ``n_windows`` of the long-run comparison: 20, or more at :data:`WINDOWS_PER_SERIES` each.

    The bundled series (4,032 half-hours) gives at most 3,936 windows; ~1 minute of work is 20 series of 2,960
    windows, and more work adds series of the same length and windows (never longer histories), so that every
    series is planned, packed and scored the same way at every scale.
    """
    return max(20, -(-n_windows // WINDOWS_PER_SERIES))


def alternating_pairs(
    rounds: int, first: Callable[[], dict[str, Any]], second: Callable[[], dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``rounds`` pairs (first's result, second's), ``first`` run first in odd rounds and second in even ones:
    on a shared 2-core machine whichever runs right after the other may find the machine in another state."""
    pairs = []
    for round_ in range(1, max(rounds, 1) + 1):
        if round_ % 2:
            one = first()
            two = second()
        else:
            two = second()
            one = first()
        pairs.append((one, two))
    return pairs


def median_pair(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]],
    ratio: Callable[[dict[str, Any], dict[str, Any]], float | None],
) -> tuple[int, float | None]:
    """The median of the pairs' ratios (those defined), and the index of the pair whose ratio it is (the lower
    middle for an even count): the pair reported in full."""
    defined = sorted((value, index) for index, pair in enumerate(pairs) if (value := ratio(*pair)) is not None)
    if not defined:
        return 0, None
    return defined[(len(defined) - 1) // 2][1], float(np.median([value for value, _ in defined]))


def _loop_over_cli(loop: dict[str, Any], cli: dict[str, Any]) -> float | None:
    return loop["process_s"] / cli["process_s"] if "process_s" in loop and "process_s" in cli else None


def _first_forecast_ratio(cli: dict[str, Any], ray_data: dict[str, Any]) -> float | None:
    ours, theirs = cli.get("first_forecast_s"), ray_data.get("first_forecast_s")
    return ours / theirs if ours and theirs else None


def one_minute(output: Path, n_windows: int, rounds: int = 1) -> dict[str, Any]:
    """The whole CLI process against the plain 1-thread loop on the same windows of the reference checkpoint.

    ``rounds`` pairs, the order alternating (loop first in odd rounds, the command first in even ones): on a
    shared 2-core machine one pair's ratio moved by 0.2 between consecutive runs, so the result is the median of
    the paired ratios, and the pair reported in full is the one whose ratio is that median (the lower middle
    for an even count). Every pair's times are kept under ``rounds``.
    """
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    data = output / "data.parquet"
    output.mkdir(parents=True, exist_ok=True)
    n_series, per_series = make_dataset(data, n_windows, long_run_series(n_windows))
    loop_args = argparse.Namespace(
        checkpoint=str(REFERENCE_CHECKPOINT), data=str(data), n_windows_per_series=per_series
    )
    cli_args = two_actor_arguments(str(REFERENCE_CHECKPOINT), str(data), per_series, ROWS_PER_BATCH)
    pairs = alternating_pairs(
        rounds,
        lambda: child("loop_1_thread", loop_args, output / "loop"),
        lambda: cli_process(cli_args, output / "cli"),
    )
    index, median = median_pair(pairs, _loop_over_cli)
    loop, cli = pairs[index]
    return {
        "windows": n_series * per_series,
        "loop_1_thread": loop,
        "cli_2_actors": cli,
        "cli_vs_loop": median,
        "rounds": [
            {
                "order": "loop first" if index % 2 == 0 else "command first",
                "loop_process_s": pair_loop.get("process_s"),
                "cli_process_s": pair_cli.get("process_s"),
                "ratio": _loop_over_cli(pair_loop, pair_cli),
                "cli_wall_phases_s": pair_cli.get("wall_phases_s"),
                "loop_model_s": pair_loop.get("stage_s", {}).get("model"),
                "actors_model_s": (pair_cli.get("actor_stage_s") or {}).get("model"),
            }
            for index, (pair_loop, pair_cli) in enumerate(pairs)
        ],
    }


def write_many_series(directory: Path, n_series: int) -> tuple[Path, Path]:
    """``n_series`` hourly series of :data:`SERIES_POINTS` points and a tiny hourly model (context 32, horizon 24).

    Written :data:`MANY_SERIES_PER_CHUNK` series at a time, each chunk from its own seed (``SeedSequence(0)``
    spawned per chunk), so that 1,000,000 series (260 M rows) are written without holding them, and the first
    series of every count are the same.
    """
    from graphs import tiny_chronos2_metadata, tiny_chronos2_model, write_checkpoint

    directory.mkdir(parents=True, exist_ok=True)
    sizes = {"context_length": 32, "output_patch_size": 4, "horizon_patches": 6}
    checkpoint = write_checkpoint(
        directory / "tiny.onnx",
        tiny_chronos2_model(**sizes).SerializeToString(),
        tiny_chronos2_metadata(**sizes, resolution_minutes=60),
    )
    steps = np.arange(SERIES_POINTS)
    timestamps = np.datetime64("2024-01-01T00:00", "us") + steps * np.timedelta64(3600, "s")
    schema = pa.schema([("series_id", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC")), ("y", pa.float64())])
    data = directory / "data.parquet"
    chunks = -(-n_series // MANY_SERIES_PER_CHUNK)
    with pq.ParquetWriter(data, schema) as writer:
        for chunk, seed in enumerate(np.random.SeedSequence(0).spawn(chunks)):
            rng = np.random.default_rng(seed)
            first = chunk * MANY_SERIES_PER_CHUNK
            count = min(MANY_SERIES_PER_CHUNK, n_series - first)
            names = pa.array([f"meter_{i:07d}" for i in range(first, first + count)], pa.string())
            daily = np.sin(steps * 2 * np.pi / 24)[None, :] * rng.uniform(1, 5, (count, 1))
            y = (daily + rng.normal(0, 0.3, (count, SERIES_POINTS))).ravel()
            table = pa.table(
                {
                    "series_id": names.take(pa.array(np.repeat(np.arange(count), SERIES_POINTS))),
                    "timestamp": pa.array(np.tile(timestamps, count), pa.timestamp("us", tz="UTC")),
                    "y": y,
                },
                schema=schema,
            )
            writer.write_table(table, row_group_size=1_000_000)
    return data, checkpoint.weights_path


def plain_pandas_loop(data: Path, checkpoint: Path, n_windows: int, output: Path) -> dict[str, Any]:
    """The plain way: pandas reads and groups, numpy windows, one ORT session (1 thread), Parquet out."""
    import onnxruntime as ort
    import pandas as pd

    started = time.perf_counter()
    metadata = json.loads(checkpoint.with_suffix(".metadata.json").read_text())
    context, horizon = metadata["context_length"], metadata["output_patch_size"] * metadata["horizon_patches"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(checkpoint), options, providers=["CPUExecutionProvider"])
    frame = pd.read_parquet(data).sort_values(["series_id", "timestamp"])
    contexts, series_ids, origins = [], [], []
    for series_id, group in frame.groupby("series_id", sort=True):
        values = group["y"].to_numpy(dtype=np.float64)
        # As datetime64 (UTC), not the tz-aware column's default: an object array of Timestamps, built per series,
        # was half of this loop's time (measured), a cost of how the loop was written rather than of pandas.
        stamps = group["timestamp"].to_numpy(dtype="datetime64[us]")
        for back in range(n_windows - 1, -1, -1):
            origin = len(values) - horizon - back
            window = np.full(context, np.nan)
            history = values[max(origin - context, 0) : origin]
            window[context - history.size :] = history
            contexts.append(window)
            series_ids.append(series_id)
            origins.append(stamps[origin])
    block = np.asarray(contexts, dtype=np.float32)
    quantiles = []
    for start in range(0, len(block), ROWS_PER_BATCH):
        rows = block[start : start + ROWS_PER_BATCH]
        mask = np.isfinite(rows).astype(np.float32)
        feed = {
            "context": np.nan_to_num(rows),
            "attention_mask": mask,
            "group_ids": np.arange(len(rows), dtype=np.int64),
            "future_covariates": np.zeros((len(rows), horizon), np.float32),
            "future_covariates_mask": np.zeros((len(rows), horizon), np.float32),
        }
        quantiles.append(session.run(None, feed)[0])
    forecasts = np.concatenate(quantiles)  # [windows, Q, H]
    first_forecast_s = time.perf_counter() - started
    out = pd.DataFrame(
        {
            "series_id": np.repeat(series_ids, horizon),
            "origin": pd.to_datetime(np.repeat(origins, horizon), utc=True),
            "lead": np.tile(np.arange(1, horizon + 1), len(series_ids)),
        }
    )
    for k, level in enumerate(metadata["native_quantiles"]):
        out[f"q{level:g}"] = forecasts[:, k, :].ravel()
    output.mkdir(parents=True, exist_ok=True)
    out.to_parquet(output / "forecasts.parquet")
    return {
        "windows": len(series_ids),
        "process_s": time.perf_counter() - started,
        "first_forecast_s": first_forecast_s,
        "peak_rss_mb": peak_rss_mb(),
    }


def many_series(output: Path, counts: list[int], baseline_tree: str | None = None, rounds: int = 1) -> dict[str, Any]:
    """The CLI against the plain pandas loop at the first count, ``rounds`` alternating pairs; the CLI alone at
    the others (the driver's peak RSS as the series grow).

    At the first count each pair runs the loop and the command (2 windows per series, 2 actors) in the order of
    :func:`alternating_pairs`; the result is the median of the pairs' ``loop / command`` ratios (above 1: the
    command is faster), and the pair whose ratio it is is reported in full. With ``baseline_tree`` the CLI also
    runs from that checkout at every count (after this tree's), and both trees' planning alone (``prepare`` in a
    child process: reading, checking and planning the data) gives the data layer's own peak RSS apart from the
    merge and the report.
    """
    trees: dict[str, dict[str, str] | None] = {"this tree": None}
    if baseline_tree:
        tree = str(Path(baseline_tree).resolve())
        trees["baseline"] = {**os.environ, "PYTHONPATH": tree, "TIME_TO_RESULTS_PACKAGE": tree}
    runs: dict[str, Any] = {}
    for index, n_series in enumerate(counts):
        data, checkpoint = write_many_series(output / f"data_{n_series}", n_series)
        arguments = two_actor_arguments(str(checkpoint), str(data), 2, ROWS_PER_BATCH)
        args = argparse.Namespace(data=str(data), checkpoint=str(checkpoint), n_windows_per_series=2)
        entry: dict[str, Any] = {}
        if index == 0:
            pairs = alternating_pairs(
                rounds,
                lambda a=args, n=n_series: child("pandas_loop", a, output / f"pandas_{n}"),
                lambda a=arguments, n=n_series: cli_process(a, output / f"cli_{n}"),
            )
            middle, median = median_pair(pairs, _loop_over_cli)
            entry["plain_pandas_loop"], entry["cli_2_actors"] = pairs[middle]
            entry["cli_vs_plain"] = median  # the median pair's: plain loop's seconds over the command's
            entry["rounds"] = [
                {
                    "order": "loop first" if round_ % 2 == 0 else "command first",
                    "loop_process_s": loop.get("process_s"),
                    "cli_process_s": cli.get("process_s"),
                    "ratio": _loop_over_cli(loop, cli),
                    "cli_wall_phases_s": cli.get("wall_phases_s"),
                    "cli_driver_peak_rss_mb": cli.get("driver_peak_rss_mb"),
                    "loop_peak_rss_mb": loop.get("peak_rss_mb"),
                }
                for round_, (loop, cli) in enumerate(pairs)
            ]
        else:
            entry["cli_2_actors"] = cli_process(arguments, output / f"cli_{n_series}")
        print(f"many_series {n_series} this tree: {entry['cli_2_actors']}", flush=True)
        if baseline_tree:
            entry["baseline_cli_2_actors"] = cli_process(arguments, output / f"cli_{n_series}", trees["baseline"])
            for name, env in trees.items():
                key = "plan_only" if name == "this tree" else "baseline_plan_only"
                entry[key] = child("plan_only", args, output / "plan", env)
        runs[str(n_series)] = entry
        print(f"many_series {n_series}: {entry}", flush=True)
        shutil.rmtree(output / f"data_{n_series}", ignore_errors=True)
    return runs


def million_series(output: Path, n_series: int) -> dict[str, Any]:
    """The command alone on ``n_series`` short hourly series (1,000,000 by default), 1 window each, 2 actors: that
    it ends, the driver's peak RSS (``summary.json``), the whole process's wall seconds and its tree's CPU by role
    (``process_cpu.py``), its phases and report.html's size (bounded: the page never draws a row per series).

    The data (260 points a series: 2.2 GB of Parquet at 1,000,000) is written a chunk at a time
    (:func:`write_many_series`) and removed after the run; the run's own outputs are removed too.
    """
    data, checkpoint = write_many_series(output / "data", n_series)
    arguments = two_actor_arguments(str(checkpoint), str(data), 1, ROWS_PER_BATCH)
    result = cli_process(arguments, output / "cli")
    result["series"] = n_series
    result["data_bytes"] = data.stat().st_size
    print(f"million_series {n_series}: {result}", flush=True)
    shutil.rmtree(output, ignore_errors=True)
    return result


def plan_only(data: Path, checkpoint: Path, n_windows: int, output: Path) -> dict[str, Any]:
    """Read, check and plan the data as the CLI's driver does (``prepare``), nothing else: the data layer's RSS."""
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings

    started = time.perf_counter()
    settings = BacktestSettings.model_validate(
        {"checkpoint": checkpoint, "data": data, "output": output, "n_windows": n_windows, "progress": False}
    )
    plan = prepare(settings)
    return {
        "prepare_s": time.perf_counter() - started,
        "windows": plan.windows.planned,
        "series": len(plan.table.series),
        "layout": type(plan.table.series).__name__,
        "peak_rss_mb": peak_rss_mb(),
    }


def first_forecast(output: Path, n_windows: int, rounds: int = 1) -> dict[str, Any]:
    """Seconds to the first forecast from process start: the CLI against Ray Data, tiny model.

    ``rounds`` pairs, the order alternating as in :func:`one_minute`; the result is the median of the paired
    ratios, and the pair whose ratio is that median is reported in full.
    """
    from graphs import write_tiny_chronos2

    output.mkdir(parents=True, exist_ok=True)
    checkpoint = write_tiny_chronos2(output, context_length=16, output_patch_size=4).weights_path
    data = output / "data.parquet"
    n_series, per_series = make_dataset(data, n_windows, 50)
    arguments = two_actor_arguments(str(checkpoint), str(data), per_series, ROWS_PER_BATCH)
    args = argparse.Namespace(checkpoint=str(checkpoint), data=str(data), n_windows_per_series=per_series)
    pairs = alternating_pairs(
        rounds,
        lambda: cli_process(arguments, output / "cli"),
        lambda: child("ray_data", args, output / "ray_data"),
    )
    index, median = median_pair(pairs, _first_forecast_ratio)
    cli, ray_data = pairs[index]
    return {
        "windows": n_series * per_series,
        "cli_2_actors": cli,
        "ray_data_map_batches": ray_data,
        "cli_over_ray_data": median,
        "rounds": [
            {
                "order": "command first" if index % 2 == 0 else "Ray Data first",
                "cli_first_forecast_s": pair_cli.get("first_forecast_s"),
                "ray_data_first_forecast_s": pair_theirs.get("first_forecast_s"),
                "cli_wall_phases_s": pair_cli.get("wall_phases_s"),
            }
            for index, (pair_cli, pair_theirs) in enumerate(pairs)
        ],
    }


CHILD_MODES = {
    "loop_1_thread": lambda a, o: run_loop(a, o, 1),
    "ray_data": run_ray_data,
    "pandas_loop": lambda a, o: plain_pandas_loop(Path(a.data), Path(a.checkpoint), a.n_windows_per_series, o),
    "plan_only": lambda a, o: plan_only(Path(a.data), Path(a.checkpoint), a.n_windows_per_series, o),
}


def child(mode: str, args: argparse.Namespace, output: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``mode`` in a fresh Python process (its own RSS, its own imports); wall time measured from outside."""
    command = [sys.executable, __file__, "--child", mode, "--data", args.data, "--checkpoint", args.checkpoint]
    command += ["--n-windows-per-series", str(args.n_windows_per_series), "--output", str(output)]
    load_before = os.getloadavg()
    completed, wall_s, cpu = measured_run(command, env)
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            result = dict(json.loads(line.removeprefix("RESULT ")))
            result["process_s"] = wall_s  # the whole process, Python's start included, as for the CLI
            cpu.pop("timeline")
            result["cpu"] = cpu
            result["load_average"] = [load_before, os.getloadavg()]
            return result
    return {"error": completed.stderr[-2000:]}


def run_child(args: argparse.Namespace) -> None:
    output = Path(args.output)
    if output.exists():
        shutil.rmtree(output)
    result = CHILD_MODES[args.child](args, output)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    print("RESULT " + json.dumps(result, default=float))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the work of every comparison")
    parser.add_argument("--baseline-tree", help="another checkout to run make_backtest from, side by side")
    parser.add_argument("--only", nargs="*", help="comparisons to run (default: all)")
    parser.add_argument(
        "--rounds",
        type=int,
        help="make_backtest: runs per tree, the first not counted (default 2); one_minute, five_minutes, "
        "many_series, first_forecast: pairs of the two sides (default 1)",
    )
    parser.add_argument("--name", default="time_to_results", help="results file stem under benchmarks/results/")
    parser.add_argument(
        "--series",
        type=int,
        nargs="*",
        default=[40_000, 10_000, 100_000],
        help="many_series: the series counts; the first is compared with the pandas loop (--rounds pairs)",
    )
    parser.add_argument(
        "--million",
        type=int,
        default=MILLION_SERIES,
        help="million_series: how many series, 1 window each (default 1,000,000)",
    )
    parser.add_argument(
        "--cli-from-this-python",
        action="store_true",
        help="run the command with this interpreter, pandas hidden (benchmarks/cli_no_pandas.py), not .venv-cli",
    )
    parser.add_argument(
        "--attach",
        action="store_true",
        help="make_backtest: also the command with --address auto, joining a `ray start` head started once",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--n-windows-per-series", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args)
        return
    if args.cli_from_this_python:
        CLI_COMMAND[:] = [sys.executable, str(ROOT / "benchmarks" / "cli_no_pandas.py")]
    else:
        ensure_cli_venv()
    wanted = set(args.only or ["make_backtest", "one_minute", "many_series", "first_forecast"])
    report: dict[str, Any] = {
        "machine": cpu_facts(),
        "load_average_before": os.getloadavg(),
        "scale": args.scale,
        "cli": CLI_COMMAND,
    }
    rounds_of_long_runs = args.rounds or 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "make_backtest" in wanted:
            report["make_backtest"] = make_backtest(
                work / "make_backtest", args.baseline_tree, args.rounds or 2, attach=args.attach
            )
        if "one_minute" in wanted:
            report["one_minute"] = one_minute(
                work / "one_minute", int(ONE_MINUTE_WINDOWS * args.scale), rounds_of_long_runs
            )
            print(f"one_minute: {report['one_minute']}", flush=True)
        if "five_minutes" in wanted:
            report["five_minutes"] = one_minute(
                work / "five_minutes", int(5 * ONE_MINUTE_WINDOWS * args.scale), rounds_of_long_runs
            )
            print(f"five_minutes: {report['five_minutes']}", flush=True)
        if "many_series" in wanted:
            counts = [max(1, int(n * args.scale)) for n in args.series]
            report["many_series"] = many_series(work / "many_series", counts, args.baseline_tree, rounds_of_long_runs)
        if "million_series" in wanted:
            report["million_series"] = million_series(work / "million_series", max(1, int(args.million * args.scale)))
        if "first_forecast" in wanted:
            report["first_forecast"] = first_forecast(
                work / "first_forecast", int(150_000 * args.scale), rounds_of_long_runs
            )
            print(f"first_forecast: {report['first_forecast']}", flush=True)
    report["load_average_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    print(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()
