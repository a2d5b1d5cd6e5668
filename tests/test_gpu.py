"""OnnxBackend on CUDA (IOBinding), compared with CPU; skipped without CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_onnx.checkpoint import ResolvedCheckpoint

ort = pytest.importorskip("onnxruntime")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDAExecutionProvider here"
    ),
]


def _feed(rows: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "context": rng.normal(size=(rows, 16)).astype(np.float32),
        "attention_mask": np.ones((rows, 16), np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, 8), np.float32),
        "future_covariates_mask": np.zeros((rows, 8), np.float32),
    }


def test_cuda_iobinding_matches_cpu(tiny_checkpoint: ResolvedCheckpoint) -> None:
    from distributed_onnx.backend.onnx import OnnxBackend
    from distributed_onnx.backend.providers import CpuProvider, CudaProvider

    cpu = OnnxBackend.from_checkpoint(tiny_checkpoint, [CpuProvider()])
    cuda = OnnxBackend.from_checkpoint(tiny_checkpoint, [CudaProvider(), CpuProvider()])
    assert cuda.providers[0] == "CUDAExecutionProvider" and cuda.uses_io_binding
    feed = _feed()
    expected = cpu.run(feed)["quantile_preds"]
    np.testing.assert_allclose(cuda.run(feed)["quantile_preds"], expected, rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA: run_on_device not checked")
    on_device = cuda.run_on_device({k: torch.from_numpy(v).cuda() for k, v in feed.items()})["quantile_preds"]
    assert on_device.is_cuda
    np.testing.assert_allclose(on_device.cpu().numpy(), expected, rtol=1e-5, atol=1e-5)
