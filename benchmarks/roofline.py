"""How fast can an fp32 graph run on this machine at all: a checkpoint's multiply-adds per window against the
cores' measured matrix-multiply peak.

A runner can only beat a pipeline by doing the same arithmetic faster or by doing less of it. This measures
the first bound on this machine, with ONNX Runtime itself:

- **peak**: one ORT thread on one large fp32 ``MatMul`` (``[1024, K] x [K, 2048]``, MLAS's best case), in
  multiply-adds per second; and the same ``MatMul`` quantized as ``export --quantize int8`` quantizes
  (dynamic int8): the most an int8 variant can gain over fp32 on this CPU;
- **work**: the checkpoint's multiply-adds per window, counted from what ran: one profiled ORT run of
  ``--rows`` windows, every ``MatMul``/``Gemm`` node's output shape times its inner dimension as ORT's profiler
  records them (the attention's products of activations included; element-wise work left out, so the count is
  a floor);
- **attained**: the checkpoint's windows per second on one ORT thread at ``--rows`` rows a call, times its
  work: the share of the peak the graph already reaches.

Then ``cores x peak / work`` is the most windows per second any fp32 execution of this graph can reach on this
machine's cores; against the upstream pipeline's own windows per second (``--upstream-windows-per-s``, measured
by ``published_defaults.py`` on the same machine) it bounds the ratio a runner can show without removing
arithmetic. Windows go in NaN-free (a random walk), the way the published-shape benchmarks feed them.

Reproduce (2 quiet cores)::

    .venv/bin/python benchmarks/roofline.py --checkpoint W/model/chronos_bolt.onnx --upstream-windows-per-s 18.4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import CheckpointMetadata, LocalCheckpoint

RESULTS = Path(__file__).resolve().parent / "results"


def _session(path: str, *, profile_prefix: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _timed(run: Any, seconds: float) -> float:
    """Calls per second of ``run`` over at least ``seconds`` (after one untimed call)."""
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
            peaks.append(_timed(lambda session=session: session.run(None, {"x": x}), seconds) * rows * inner * cols)
    return peaks[0], peaks[1]


def _inputs(metadata: CheckpointMetadata, context: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's feeds for ``context``, as the family's own adapter builds them (the worker's path)."""
    feeds, _ = adapter_for(metadata).build_inputs(context, None)
    return feeds


def _macs_of(event: dict[str, Any]) -> int:
    """Multiply-adds of one profiled MatMul/Gemm: its output's elements x the inner dimension (the first input's
    last; the profiler records the activations' shapes, not the weights')."""
    args = event["args"]
    inputs = [next(iter(each.values())) for each in args.get("input_type_shape", [])]
    outputs = [next(iter(each.values())) for each in args.get("output_type_shape", [])]
    if not inputs or not inputs[0] or not outputs:
        return 0
    return int(np.prod(outputs[0])) * int(inputs[0][-1])


def window_macs(checkpoint: Path, metadata: CheckpointMetadata, rows: int) -> int:
    """The checkpoint's MatMul/Gemm multiply-adds per window, from one profiled run of ``rows`` windows."""
    with tempfile.TemporaryDirectory() as folder:
        session = _session(str(checkpoint), profile_prefix=str(Path(folder) / "profile"))
        session.run(None, _inputs(metadata, _context(rows, metadata.context_length)))
        trace = json.loads(Path(session.end_profiling()).read_text())
    ops = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "DynamicQuantizeMatMul"}
    ops |= {"MatMulIntegerToFloat", "QLinearMatMul"}  # an int8 variant's products
    total = sum(
        _macs_of(event)
        for event in trace
        if event.get("cat") == "Node"
        and event.get("name", "").endswith("_kernel_time")
        and event.get("args", {}).get("op_name") in ops
    )
    return total // rows


def _context(rows: int, length: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (100 + np.cumsum(rng.normal(0, 2, (rows, length)), axis=1)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=8, help="windows a call (the upstream script's batch)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of each timed measurement")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--upstream-windows-per-s", type=float, help="the upstream pipeline's, same machine")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    metadata = LocalCheckpoint(path=args.checkpoint).resolve().metadata
    context_length = metadata.context_length
    load_before = os.getloadavg()[0]
    peak, int8_peak = matmul_peaks(args.seconds)
    macs = window_macs(args.checkpoint, metadata, args.rows)
    session = _session(str(args.checkpoint))
    feeds = _inputs(metadata, _context(args.rows, context_length))
    windows_per_s = _timed(lambda: session.run(None, feeds), args.seconds) * args.rows
    ceiling = args.cores * peak / macs
    result = {
        "checkpoint": args.checkpoint.name,
        "family": metadata.model_family,
        "context_length": context_length,
        "rows_per_call": args.rows,
        "matmul_peak_gmacs_per_core": round(peak / 1e9, 2),
        "int8_matmul_peak_gmacs_per_core": round(int8_peak / 1e9, 2),
        "int8_peak_over_fp32_peak": round(int8_peak / peak, 3),
        "window_gmacs": round(macs / 1e9, 4),
        "ort_one_thread_windows_per_s": round(windows_per_s, 3),
        "attained_share_of_peak": round(windows_per_s * macs / peak, 3),
        "attained_share_of_int8_peak": round(windows_per_s * macs / int8_peak, 3),  # for an int8 variant
        "cores": args.cores,
        "ceiling_windows_per_s": round(ceiling, 3),
        "upstream_windows_per_s": args.upstream_windows_per_s,
        "ceiling_over_upstream": round(ceiling / args.upstream_windows_per_s, 3)
        if args.upstream_windows_per_s
        else None,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "ort": ort.__version__},
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=2))
    out = args.out or RESULTS / f"roofline_{metadata.model_family}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
