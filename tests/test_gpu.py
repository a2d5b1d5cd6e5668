"""OnnxBackend on CUDA: CUDA-graph replay per bucket, every input path, the load-time checks; skipped without CUDA.

Run on a GPU machine with ``pytest -m gpu`` (``scripts/gpu_check.py`` runs it first and records the outcome).
The same bookkeeping runs on CPU in tests/test_graph_runner.py; what only a GPU shows is here: that ORT
captures and replays the graphs, that pinned and device inputs take their paths, and the CPU/GPU parity.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from capture_graphs import group_feed, write_control_flow, write_dynamic_steps, write_group_count

from distributed_onnx.errors import GraphCaptureError
from distributed_onnx.model.backend.policy import HostCapabilities
from distributed_onnx.model.backend.providers import CpuProvider, CudaProvider, ExecutionProvider
from distributed_onnx.model.checkpoint import CheckpointMetadata, LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.resources import REFERENCE_CHECKPOINT

ort = pytest.importorskip("onnxruntime")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(), reason="no CUDAExecutionProvider here"
    ),
]

#: CPU/GPU parity (docs/gpu.md): max |gpu - cpu| / max |cpu| with TF32 on; measured in benchmarks/results/gpu.md.
TF32_TOLERANCE = 1e-3


def backend(checkpoint: ResolvedCheckpoint, chain: list[ExecutionProvider] | None = None, **kwargs: Any) -> Any:
    from distributed_onnx.model.backend.onnx import OnnxBackend

    return OnnxBackend.from_checkpoint(checkpoint, chain, **kwargs)


def cuda(checkpoint: ResolvedCheckpoint, **options: Any) -> Any:
    return backend(checkpoint, [CudaProvider(**options), CpuProvider()])


def reference() -> ResolvedCheckpoint:
    return LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve()


def feed(rows: int, context: int = 512, horizon: int = 96, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "context": rng.normal(size=(rows, context)).astype(np.float32),
        "attention_mask": np.ones((rows, context), np.float32),
        "group_ids": np.arange(rows, dtype=np.int64) // 2,  # pairs of rows share a group
        "future_covariates": np.zeros((rows, horizon), np.float32),
        "future_covariates_mask": np.zeros((rows, horizon), np.float32),
    }


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here: the torch transfer path is not checked")
    return torch


class ChainPolicy:
    """A policy that picks a given chain: the graceful (policy) rules with chosen CUDA options."""

    def __init__(self, chain: list[ExecutionProvider]) -> None:
        self.chain = chain

    def select(self, metadata: CheckpointMetadata, host: HostCapabilities) -> list[ExecutionProvider]:
        return list(self.chain)


def test_reference_checkpoint_replays_cuda_graphs_within_the_stated_parity() -> None:
    checkpoint = reference()
    cpu = backend(checkpoint, [CpuProvider()])
    gpu = cuda(checkpoint)
    assert gpu.providers[0] == "CUDAExecutionProvider" and gpu.uses_cuda_graphs
    for rows in (1, 37, 64, 100):  # buckets 16, 64, 64 (new data, replayed), 128
        inputs = feed(rows, seed=rows)
        expected = cpu.run(inputs)["quantile_preds"]
        error = relative_error(gpu.run(inputs)["quantile_preds"], expected)
        assert error <= TF32_TOLERANCE, f"{rows} rows: relative error {error:.2e}"


def test_tf32_off_is_closer_to_the_cpu() -> None:
    checkpoint = reference()
    inputs = feed(64)
    expected = backend(checkpoint, [CpuProvider()]).run(inputs)["quantile_preds"]
    error = relative_error(cuda(checkpoint, use_tf32=False).run(inputs)["quantile_preds"], expected)
    assert error <= 1e-4, f"relative error {error:.2e} with TF32 off"


def test_replay_equals_a_plain_cuda_run() -> None:
    checkpoint = reference()
    plain = cuda(checkpoint, cuda_graph=False)
    graphs = cuda(checkpoint)
    assert not plain.uses_cuda_graphs
    for rows in (16, 50, 16):
        inputs = feed(rows, seed=rows + 7)
        np.testing.assert_allclose(
            graphs.run(inputs)["quantile_preds"], plain.run(inputs)["quantile_preds"], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("transfers", ["auto", "ort"])
def test_padding_rows_form_a_group_of_their_own_on_the_gpu(tmp_path: Path, transfers: str) -> None:
    checkpoint = write_group_count(tmp_path)
    cpu = backend(checkpoint, [CpuProvider()])
    gpu = backend(checkpoint, [CudaProvider(batch_buckets=(16,)), CpuProvider()], transfers=transfers)
    assert gpu.uses_cuda_graphs
    for rows, groups in [(5, 3), (7, 1), (16, 4), (3, 2)]:
        inputs = group_feed(rows, groups, seed=rows)
        got, expected = gpu.run(inputs), cpu.run(inputs)
        np.testing.assert_array_equal(got["group_size"], expected["group_size"])
        np.testing.assert_allclose(got["y"], expected["y"], rtol=1e-6)


@pytest.mark.parametrize("transfers", ["auto", "ort"])
def test_outputs_survive_the_next_call_and_inputs_can_be_refilled(transfers: str) -> None:
    gpu = backend(reference(), [CudaProvider(), CpuProvider()], transfers=transfers)
    plain = cuda(reference(), cuda_graph=False)
    first_inputs, second_inputs = feed(40, seed=1), feed(40, seed=2)
    first = gpu.run(first_inputs)["quantile_preds"]
    kept = first.copy()
    first_inputs["context"][:] = 0.0  # the worker refills its buffers while the next batch runs
    second = gpu.run(second_inputs)["quantile_preds"]
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(second, plain.run(second_inputs)["quantile_preds"], rtol=1e-5, atol=1e-5)


def test_transfers_use_torch_when_it_has_cuda_and_ort_alone_agrees() -> None:
    torch_cuda()
    checkpoint = reference()
    with_torch, ort_only = cuda(checkpoint), backend(checkpoint, [CudaProvider(), CpuProvider()], transfers="ort")
    assert (with_torch.graph_transfers, ort_only.graph_transfers) == ("torch", "ort")
    inputs = feed(100)
    np.testing.assert_array_equal(with_torch.run(inputs)["quantile_preds"], ort_only.run(inputs)["quantile_preds"])


def test_pinned_host_arrays_are_copied_straight_to_the_device() -> None:
    torch = torch_cuda()
    gpu = cuda(reference())
    inputs = feed(64)
    pinned = {name: gpu.empty_host_array(value.shape, value.dtype) for name, value in inputs.items()}
    for name, value in inputs.items():
        pinned[name][...] = value
    assert all(torch.from_numpy(value).is_pinned() for value in pinned.values())
    np.testing.assert_array_equal(gpu.run(pinned)["quantile_preds"], gpu.run(inputs)["quantile_preds"])


def test_device_tensors_run_and_their_outputs_stay_on_the_device() -> None:
    torch = torch_cuda()
    gpu = cuda(reference())
    host = feed(48)
    on_device: Mapping[str, Any] = {name: torch.from_numpy(value).cuda() for name, value in host.items()}
    first = gpu.run_on_device(on_device)["quantile_preds"]
    assert first.is_cuda and tuple(first.shape) == (48, 9, 96)
    kept = first.clone()
    shifted = {name: tensor + 1 if tensor.is_floating_point() else tensor for name, tensor in on_device.items()}
    gpu.run_on_device(shifted)
    assert torch.equal(first, kept)  # the next call wrote its bucket's buffers, not this result
    np.testing.assert_array_equal(gpu.run(on_device)["quantile_preds"], gpu.run(host)["quantile_preds"])
    np.testing.assert_array_equal(first.cpu().numpy(), gpu.run(host)["quantile_preds"])


def test_a_batch_above_the_buckets_is_refused_strict_and_run_gracefully(caplog: pytest.LogCaptureFixture) -> None:
    checkpoint = reference()
    small = [CudaProvider(batch_buckets=(16,)), CpuProvider()]
    with pytest.raises(GraphCaptureError, match="batch of 17 rows is larger than the largest CUDA-graph bucket"):
        backend(checkpoint, small).run(feed(17))
    graceful = backend(checkpoint, None, ChainPolicy(small))
    expected = cuda(checkpoint, cuda_graph=False).run(feed(17))["quantile_preds"]
    with caplog.at_level(logging.WARNING):
        got = graceful.run(feed(17))["quantile_preds"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert "above the largest CUDA-graph bucket (16)" in caplog.text


@pytest.mark.parametrize(
    ("write", "reason"),
    [(write_control_flow, "control flow"), (write_dynamic_steps, "axis 1 is dynamic")],
)
def test_uncapturable_checkpoints_are_refused_strict_and_fall_back_gracefully(
    tmp_path: Path, write: Any, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = write(tmp_path)
    with pytest.raises(GraphCaptureError, match=reason):
        cuda(checkpoint)
    with caplog.at_level(logging.WARNING):
        graceful = backend(checkpoint, None, ChainPolicy([CudaProvider(), CpuProvider()]))
    assert "CUDA graphs are off" in caplog.text and reason in caplog.text
    assert graceful.providers[0] == "CUDAExecutionProvider" and not graceful.uses_cuda_graphs
    x = np.ones((3, 4), np.float32)
    expected = backend(checkpoint, [CpuProvider()]).run({"x": x})["y"]
    np.testing.assert_allclose(graceful.run({"x": x})["y"], expected)


def test_the_plugin_ep_warning_stays_out_of_the_logs(capfd: pytest.CaptureFixture[str]) -> None:
    cuda(reference()).run(feed(4))
    captured = capfd.readouterr()
    assert "No registered plugin EP device found" not in captured.out + captured.err


def test_a_worker_forecasts_the_same_on_cuda_graphs_as_on_cpu() -> None:
    from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

    on_gpu = InferenceWorker.from_config(WorkerConfig(checkpoint=REFERENCE_CHECKPOINT, providers=[CudaProvider()]))
    on_cpu = InferenceWorker.from_config(WorkerConfig(checkpoint=REFERENCE_CHECKPOINT, providers=[CpuProvider()]))
    on_gpu.warm_up()
    context = np.random.default_rng(3).normal(1000, 50, size=(21, 600)).astype(np.float32)
    got = on_gpu.forecast(context, 96, [0.1, 0.5, 0.9])
    expected = on_cpu.forecast(context, 96, [0.1, 0.5, 0.9])
    assert relative_error(got, expected) <= TF32_TOLERANCE
