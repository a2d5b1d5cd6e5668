"""How fast can each family's fp32 graph run on this machine at all: multiply-adds per window against one core's
measured matrix-multiply peak, the runner against two bare threads, ONNX Runtime's profile beside torch's.

A runner can only beat a pipeline by doing the same arithmetic faster or by doing less of it. Per family, at its
published shape (random weights, exported as the published-shape benchmarks export it: ``roofline_upstream.py``),
with ONNX Runtime itself and the runner's own session settings (``ENABLE_EXTENDED``, one thread, no spinning):

- **peak**: one ORT thread on one large fp32 ``MatMul`` (``[1024, 512] x [512, 2048]``, MLAS's best case), in
  multiply-adds per second; and the same ``MatMul`` quantized as ``export --quantize int8`` quantizes;
- **work**: the graph's multiply-adds per window at the benchmarks' horizon (64 steps), counted from what ran:
  one profiled call of ``--rows`` windows, every ``MatMul``/``Gemm`` node's output shape times its inner
  dimension as ORT's profiler records them (attention's products included; element-wise work left out, so the
  count is a floor), times the calls a 64-step horizon takes;
- **one bare thread**: windows/s of ``session.run`` alone on the adapter's feeds, one thread; times the work over
  the peak, the share of the peak the graph reaches (the issue's "graph at least 0.8 of the MatMul peak");
- **two bare threads**: two sessions on two threads at once (what the runner's two one-thread actors could do
  with nothing else to do); with ``--backtest-windows N`` the runner's own windows/s on the published
  benchmarks' data (``published_defaults.write_data``, N windows of 64 steps, the command at its defaults) over
  it: the runner's own overhead;
- **the worker**: windows/s of ``InferenceWorker.forecast`` on one thread (adapter included: Toto's mixture
  quantiles, the unroll of a long horizon);
- **profiles**: ORT's time by operator and by MatMul shape; with ``--torch`` the upstream package's own pass
  (``roofline_upstream.upstream_pass``) at the same rows on one torch thread, its windows/s and
  ``torch.profiler``'s time by operator: where the two spend differently.

Written per family to ``benchmarks/results/roofline_FAMILY.json`` (``--out-dir``), with the CPU's model and the
flags that decide MLAS's kernels (``machine.cpu_facts``), and the load average before and after.

Reproduce (2 quiet cores; the first run builds and exports each family into ``--workdir``, minutes each)::

    .venv/bin/python benchmarks/roofline.py --family all --torch --backtest-windows 600

``--checkpoint PATH ...`` measures any checkpoints instead (an int8 variant, an older export), without the torch
side, written as ``roofline_STEM.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_facts
from roofline_upstream import FAMILIES, HORIZON, build, pretrained_path, upstream_pass

from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.checkpoint import CheckpointMetadata, LocalCheckpoint
from distributed_onnx.model.horizons import call_metadata
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

RESULTS = Path(__file__).resolve().parent / "results"
#: The products whose multiply-adds are counted (an int8 variant's included).
PRODUCTS = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "DynamicQuantizeMatMul"}
PRODUCTS |= {"MatMulIntegerToFloat", "QLinearMatMul", "MatMulNBits"}


def session_options(profile_prefix: str | None = None) -> ort.SessionOptions:
    """The runner's session: ``ENABLE_EXTENDED`` (its optimized-graph cache's level), one thread, no spinning."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


def _session(path: str, profile_prefix: str | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(path, session_options(profile_prefix), providers=["CPUExecutionProvider"])


def timed(run: Any, seconds: float) -> float:
    """Calls per second of ``run`` over at least ``seconds`` and two calls (after one untimed call)."""
    run()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or calls < 2:
        run()
        calls += 1
    return calls / (time.perf_counter() - started)


def matmul_peaks(seconds: float, inner: int = 512) -> tuple[float, float]:
    """Multiply-adds per second of one ORT thread on a large MatMul: fp32, and the same graph quantized as
    ``export --quantize int8`` quantizes (``quantize_dynamic``, int8 weights, activations quantized per call)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rows, cols = 1024, 2048
    weight = helper.make_tensor("w", TensorProto.FLOAT, [inner, cols], np.random.rand(inner, cols).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "peak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
        [weight],
    )
    x = np.random.rand(rows, inner).astype(np.float32)
    peaks = []
    with tempfile.TemporaryDirectory() as folder:
        fp32, int8 = str(Path(folder) / "peak.onnx"), str(Path(folder) / "peak-int8.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fp32)
        quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)
        for path in (fp32, int8):
            session = _session(path)
            peaks.append(timed(lambda session=session: session.run(None, {"x": x}), seconds) * rows * inner * cols)
    return peaks[0], peaks[1]


def random_walk(rows: int, length: int) -> np.ndarray:
    """NaN-free windows, as the published benchmarks feed them."""
    rng = np.random.default_rng(0)
    return (100 + np.cumsum(rng.normal(0, 2, (rows, length)), axis=1)).astype(np.float32)


def call_feeds(metadata: CheckpointMetadata, windows: np.ndarray) -> tuple[dict[str, np.ndarray], int]:
    """The graph's feeds for one call of a :data:`HORIZON`-step forecast, as the worker builds them (the call's
    output patches: ``model/horizons.py``), and the calls that horizon takes (a graph shorter than it unrolls)."""
    call = call_metadata(metadata, HORIZON)
    feeds, _ = adapter_for(call).build_inputs(windows, None)
    return feeds, max(1, -(-HORIZON // metadata.horizon_length))


def _macs_of(event: dict[str, Any]) -> int:
    """Multiply-adds of one profiled product: its output's elements x the inner dimension (the first input's
    last; the profiler records the activations' shapes, not the weights')."""
    args = event["args"]
    inputs = [next(iter(each.values())) for each in args.get("input_type_shape", [])]
    outputs = [next(iter(each.values())) for each in args.get("output_type_shape", [])]
    if not inputs or not inputs[0] or not outputs:
        return 0
    return int(np.prod(outputs[0])) * int(inputs[0][-1])


def window_macs(nodes: list[dict[str, Any]], rows: int) -> float:
    """The products' multiply-adds per window of one profiled call of ``rows`` windows."""
    return sum(_macs_of(event) for event in nodes if event["args"].get("op_name") in PRODUCTS) / rows


def profile(path: Path, feeds: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """ORT's node events of one profiled call (after one unprofiled warm-up call in the same session)."""
    with tempfile.TemporaryDirectory() as folder:
        session = _session(str(path), profile_prefix=str(Path(folder) / "profile"))
        session.run(None, feeds)
        trace = json.loads(Path(session.end_profiling()).read_text())
    # The first run's events are the warm-up; keep the last run's (events carry no run index: split at the gap).
    nodes = [e for e in trace if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    runs = [e for e in trace if e.get("name") == "model_run"]
    if len(runs) >= 2:
        last = runs[-1]
        nodes = [e for e in nodes if e["ts"] >= last["ts"]]
    return nodes


def by_operator(nodes: list[dict[str, Any]], rows: int, top: int = 15) -> list[dict[str, Any]]:
    """Time per operator type, largest first: share of the call, multiply-adds per window, G multiply-adds/s."""
    time_us: collections.Counter[str] = collections.Counter()
    macs: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for event in nodes:
        op = event["args"].get("op_name", "?")
        time_us[op] += event["dur"]
        count[op] += 1
        if op in PRODUCTS:
            macs[op] += _macs_of(event)
    total = sum(time_us.values()) or 1
    return [
        {
            "op": op,
            "nodes": count[op],
            "share_of_time": round(us / total, 4),
            "ms_per_call": round(us / 1e3, 3),
            "gmacs_per_window": round(macs[op] / rows / 1e9, 4) if macs[op] else None,
            "gmacs_per_s": round(macs[op] / us / 1e3, 2) if macs[op] and us else None,
        }
        for op, us in time_us.most_common(top)
    ]


def by_product_shape(nodes: list[dict[str, Any]], top: int = 12) -> list[dict[str, Any]]:
    """The products grouped by their input shapes, largest time first: which shapes run far from the peak."""
    time_us: collections.Counter[str] = collections.Counter()
    macs: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for event in nodes:
        args = event["args"]
        if args.get("op_name") not in PRODUCTS:
            continue
        shapes = [next(iter(each.values())) for each in args.get("input_type_shape", [])]
        key = f"{args['op_name']} {' x '.join(str(shape) for shape in shapes[:2])}"
        time_us[key] += event["dur"]
        macs[key] += _macs_of(event)
        count[key] += 1
    return [
        {"product": key, "nodes": count[key], "ms_per_call": round(us / 1e3, 3), "gmacs_per_s": _rate(macs[key], us)}
        for key, us in time_us.most_common(top)
    ]


def _rate(macs: int, us: float) -> float | None:
    return round(macs / us / 1e3, 2) if us else None


def _runner(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> Any:
    return lambda: session.run(None, feeds)


def two_threads(path: Path, feeds: dict[str, np.ndarray], seconds: float) -> float:
    """Calls per second of two one-thread sessions running at once on two threads (ORT releases the GIL)."""
    sessions = [_session(str(path)) for _ in range(2)]
    for session in sessions:
        session.run(None, feeds)
    done = [0, 0]
    stop = threading.Event()

    def loop(index: int) -> None:
        while not stop.is_set():
            sessions[index].run(None, feeds)
            done[index] += 1

    threads = [threading.Thread(target=loop, args=(index,)) for index in range(2)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - started)


def worker_rate(path: Path, windows: np.ndarray, levels: list[float], seconds: float) -> float:
    """Windows per second of ``InferenceWorker.forecast`` (adapter included) on one thread."""
    options = SessionOptionsConfig(graph_optimization_level="ENABLE_EXTENDED", intra_op_num_threads=1)
    config = WorkerConfig(
        checkpoint=path, providers=[CpuProvider()], session_options=options.model_copy(update={"allow_spinning": False})
    )
    worker = InferenceWorker.from_config(config)
    try:
        return timed(lambda: worker.forecast(windows, HORIZON, levels), seconds) * windows.shape[0]
    finally:
        worker.close()


def torch_side(family: str, workdir: Path, windows: np.ndarray, seconds: float, threads: int) -> dict[str, Any]:
    """The upstream pass on ``threads`` torch threads: windows/s, and torch.profiler's time by operator."""
    import torch

    torch.set_num_threads(threads)
    run = upstream_pass(family, pretrained_path(workdir, family), windows.shape[1])
    with torch.no_grad():
        rate = timed(lambda: run(windows), seconds) * windows.shape[0]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False) as prof:
            run(windows)
    averages = prof.key_averages()
    total = sum(each.self_cpu_time_total for each in averages) or 1
    ops = sorted(averages, key=lambda each: each.self_cpu_time_total, reverse=True)[:15]
    return {
        "threads": threads,
        "windows_per_s": round(rate, 3),
        "by_operator": [
            {
                "op": each.key,
                "calls": each.count,
                "share_of_time": round(each.self_cpu_time_total / total, 4),
                "ms_per_call": round(each.self_cpu_time_total / 1e3, 3),
            }
            for each in ops
        ],
    }


def backtest(checkpoint: Path, context_length: int, windows: int, workdir: Path) -> dict[str, Any]:
    """The runner at its defaults on the published benchmarks' data: its windows/s and whole-process seconds."""
    from published_defaults import WINDOW_SHAPES, run_ours, write_data

    n_series, cutoffs = WINDOW_SHAPES[windows]
    data = workdir / f"data-{context_length}-{windows}.parquet"
    if not data.exists():
        write_data(data, context_length, n_series, cutoffs)
    result = run_ours(checkpoint, data, workdir / f"run-{checkpoint.stem}-{windows}", cutoffs)
    return {key: result[key] for key in ("windows", "windows_per_s", "wall_s", "first_forecast_s")}


def measure(path: Path, export_s: float | None, args: argparse.Namespace, *, published: bool) -> dict[str, Any]:
    """Every figure of one checkpoint; ``published``: one of ``--workdir``'s builds (its upstream pass is known)."""
    load_before = os.getloadavg()[0]
    peak, int8_peak = matmul_peaks(args.seconds)  # per checkpoint: a long run's machine may change under it
    metadata = LocalCheckpoint(path=path).resolve().metadata
    family = metadata.model_family
    windows = random_walk(args.rows, metadata.context_length)
    feeds, calls = call_feeds(metadata, windows)
    nodes = profile(path, feeds)
    macs = window_macs(nodes, args.rows) * calls
    one = timed(_runner(_session(str(path)), feeds), args.seconds) * args.rows / calls
    two = two_threads(path, feeds, args.seconds) * args.rows / calls
    result: dict[str, Any] = {
        "family": family,
        "checkpoint": str(path),
        "export_s": export_s,
        "context_length": metadata.context_length,
        "horizon": HORIZON,
        "graph_steps_per_call": call_metadata(metadata, HORIZON).horizon_length,
        "calls_per_window": calls,
        "rows_per_call": args.rows,
        "matmul_peak_gmacs_per_core": round(peak / 1e9, 2),
        "int8_matmul_peak_gmacs_per_core": round(int8_peak / 1e9, 2),
        "window_gmacs": round(macs / 1e9, 4),
        "ort_one_thread_windows_per_s": round(one, 3),
        "share_of_peak": round(one * macs / peak, 3),
        "ort_two_threads_windows_per_s": round(two, 3),
        "two_threads_over_one": round(two / one, 3),
        "worker_one_thread_windows_per_s": round(worker_rate(path, windows, [0.1, 0.5, 0.9], args.seconds), 3),
        "ort_by_operator": by_operator(nodes, args.rows),
        "ort_by_product_shape": by_product_shape(nodes),
    }
    result["worker_over_bare"] = round(result["worker_one_thread_windows_per_s"] / one, 3)
    if args.torch and published:
        side = torch_side(family, args.workdir, windows, args.seconds, args.torch_threads)
        result["torch"] = side
        if args.torch_threads == 1:
            result["ort_over_torch_one_thread"] = round(one / side["windows_per_s"], 3)
    for count in args.backtest_windows:
        run = backtest(path, metadata.context_length, count, args.workdir)
        run["over_two_bare_threads"] = round(run["windows_per_s"] / two, 3)
        result.setdefault("backtest", {})[str(count)] = run
    result["machine"] = {**cpu_facts(), "ort": ort.__version__}
    result["load_before"], result["load_after"] = load_before, os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=[], choices=["all", *FAMILIES], help="published builds")
    parser.add_argument(
        "--checkpoint", type=Path, nargs="+", default=[], help="any checkpoints (an int8 variant...): no torch side"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/roofline-work"), help="builds, kept across runs")
    parser.add_argument("--rows", type=int, default=8, help="windows a call (the upstream scripts' batch)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of each timed measurement")
    parser.add_argument("--torch", action="store_true", help="also time and profile the upstream pass on torch")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--backtest-windows", type=int, nargs="*", default=[], choices=[32, 600])
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not args.family and not args.checkpoint:
        parser.error("give --family (all, or names) or --checkpoint")
    chosen = FAMILIES if "all" in args.family else tuple(args.family)
    args.workdir.mkdir(parents=True, exist_ok=True)
    runs = [(*build(args.workdir, family), True) for family in chosen]
    runs += [(path, None, False) for path in args.checkpoint]
    for path, export_s, published in runs:
        result = measure(path, export_s, args, published=published)
        print(json.dumps({k: v for k, v in result.items() if not k.startswith(("ort_by", "torch"))}, indent=2))
        name = result["family"] if published else path.stem
        (args.out_dir / f"roofline_{name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
