"""GPU checks for a lent GPU machine, as one standalone script (< 8 minutes); prints one JSON report.

Needs numpy + onnxruntime; uses distributed_onnx, torch and ray when importable and reports what is missing.
Checks: available providers; CUDA realized; IOBinding (``OnnxBackend.run`` on CUDA) vs a plain CPU-output
``session.run`` on the reference checkpoint at batch sizes 64/256/1024 (windows/s); TensorRT if present; a
GPU-pinned Ray actor that builds the backend with the policy chain and reports its providers.
Run: ``python scripts/gpu_check.py [--seconds-per-case 3]`` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
REFERENCE = (
    Path(__file__).resolve().parent.parent / "distributed_onnx/resources/reference/taylor_chronos2_patchtst.onnx"
)
BATCH_SIZES = (64, 256, 1024)


def _inputs(rows: int, context: int = 512, horizon: int = 96) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "context": rng.normal(size=(rows, context)).astype(np.float32),
        "attention_mask": np.ones((rows, context), np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, horizon), np.float32),
        "future_covariates_mask": np.zeros((rows, horizon), np.float32),
    }


def _rate(call: Any, rows: int, seconds: float) -> float:
    call()  # warm-up
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        count += 1
    return count * rows / (time.perf_counter() - started)


def _guard(report: dict[str, Any], key: str, check: Any) -> None:
    try:
        report[key] = check()
    except Exception as exc:
        report[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-1500:]}


def main() -> int:  # noqa: PLR0915 - one linear script of guarded checks
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds-per-case", type=float, default=3.0)
    seconds = parser.parse_args().seconds_per_case
    report: dict[str, Any] = {}
    try:
        import onnxruntime as ort
    except ImportError as exc:
        print(json.dumps({"onnxruntime": f"missing: {exc}"}))
        return 1
    report["onnxruntime"] = ort.__version__
    report["available_providers"] = ort.get_available_providers()
    try:
        import torch

        report["torch"] = {"version": torch.__version__, "cuda": torch.cuda.is_available()}
    except ImportError:
        torch = None
        report["torch"] = "missing"

    def backend_check() -> dict[str, Any]:
        from distributed_onnx.backend.onnx import OnnxBackend
        from distributed_onnx.backend.providers import CpuProvider, CudaProvider
        from distributed_onnx.checkpoint import LocalCheckpoint

        checkpoint = LocalCheckpoint(path=REFERENCE).resolve()
        result: dict[str, Any] = {}
        cuda = OnnxBackend.from_checkpoint(checkpoint, [CudaProvider(), CpuProvider()])
        result["cuda_realized"] = cuda.providers
        result["uses_io_binding"] = cuda.uses_io_binding
        plain = ort.InferenceSession(str(REFERENCE), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        output = checkpoint.metadata.output_name
        for rows in BATCH_SIZES:
            feed = _inputs(rows)
            a = cuda.run(feed)[output]
            b = plain.run([output], feed)[0]
            entry = {
                "iobinding_windows_per_s": _rate(lambda f=feed: cuda.run(f), rows, seconds),
                "plain_run_windows_per_s": _rate(lambda f=feed: plain.run([output], f), rows, seconds),
                "max_abs_diff": float(np.abs(a - b).max()),
            }
            if torch is not None and torch.cuda.is_available():
                device_feed = {k: torch.from_numpy(v).cuda() for k, v in feed.items()}
                entry["run_on_device_windows_per_s"] = _rate(
                    lambda f=device_feed: (cuda.run_on_device(f), torch.cuda.synchronize()), rows, seconds
                )
            result[f"batch_{rows}"] = entry
        return result

    def tensorrt_check() -> dict[str, Any]:
        if "TensorrtExecutionProvider" not in ort.get_available_providers():
            return {"skipped": "TensorrtExecutionProvider not available"}
        session = ort.InferenceSession(
            str(REFERENCE), providers=["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
        )
        feed = _inputs(256)
        name = session.get_outputs()[0].name
        return {
            "realized": session.get_providers(),
            "windows_per_s_256": _rate(lambda: session.run([name], feed), 256, seconds),
        }

    def ray_check() -> dict[str, Any]:
        import ray

        from distributed_onnx.actors import start_worker_actor
        from distributed_onnx.local_ray import use_loopback_only
        from distributed_onnx.worker import WorkerConfig

        use_loopback_only()
        ray.init(num_gpus=1, num_cpus=4, _node_ip_address="127.0.0.1", include_dashboard=False)
        try:
            actor = start_worker_actor(WorkerConfig(checkpoint=REFERENCE), 2, 1)  # policy chain (providers=None)
            return ray.get(actor.ready.remote(), timeout=300).model_dump()
        finally:
            ray.shutdown()

    if "CUDAExecutionProvider" in report["available_providers"]:
        _guard(report, "backend", backend_check)
        _guard(report, "tensorrt", tensorrt_check)
        _guard(report, "ray_gpu_actor", ray_check)
    else:
        report["backend"] = {"skipped": "CUDAExecutionProvider not available (install onnxruntime-gpu)"}
    print(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
