"""The CUDA-graph data path's bookkeeping on real ONNX Runtime CPU sessions (integration tier, no GPU).

:class:`GraphRunner` with ``device_type="cpu"`` runs exactly what it runs on CUDA (bucket choice, buffers bound
once per bucket, padding and un-padding, staging, copies out of reused buffers, the fallback for large
batches) with both transfer strategies; only the graph capture itself needs a GPU (tests/test_gpu.py).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from capture_graphs import group_feed, write_group_count
from graphs import write_tiny_context_quantiles

from distributed_onnx import OnnxBackend
from distributed_onnx.errors import GraphCaptureError, InputValidationError
from distributed_onnx.model.backend.cuda.buckets import BucketPlan
from distributed_onnx.model.backend.cuda.graph_runner import GraphRunner
from distributed_onnx.model.backend.cuda.transfers import TransferOptions
from distributed_onnx.model.checkpoint import ResolvedCheckpoint

pytestmark = pytest.mark.integration

TRANSFERS = ["ort", "torch"]


def batch(rows: int) -> dict[str, np.ndarray]:
    """A batch for the tiny Chronos-2 graph (16 context steps, 8 horizon steps), rows in groups of two."""
    rng = np.random.default_rng(rows)
    return {
        "context": rng.normal(size=(rows, 16)).astype(np.float32),
        "attention_mask": np.ones((rows, 16), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.int64) // 2,
        "future_covariates": rng.normal(size=(rows, 8)).astype(np.float32),
        "future_covariates_mask": np.ones((rows, 8), dtype=np.float32),
    }


def runner(
    checkpoint: ResolvedCheckpoint,
    transfers: str,
    buckets: tuple[int, ...] = (4, 16),
    strict: bool = True,
    copy_threads: int = 1,
) -> tuple[ort.InferenceSession, GraphRunner]:
    session = ort.InferenceSession(str(checkpoint.weights_path), providers=["CPUExecutionProvider"])
    specs = OnnxBackend(checkpoint.metadata, session)
    plan = BucketPlan(buckets, strict=strict)
    graphs = GraphRunner(
        session,
        ort,
        specs.input_specs,
        specs.output_specs,
        plan,
        transfer=TransferOptions(kind=transfers, device_type="cpu", copy_threads=copy_threads),  # type: ignore[arg-type]
    )
    return session, graphs


@pytest.fixture
def group_checkpoint(tmp_path: Path) -> ResolvedCheckpoint:
    return write_group_count(tmp_path)


@pytest.mark.parametrize("transfers", TRANSFERS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16])
def test_padded_batches_equal_plain_runs(tiny_checkpoint: ResolvedCheckpoint, transfers: str, rows: int) -> None:
    session, graphs = runner(tiny_checkpoint, transfers)
    assert graphs.transfers == transfers
    inputs = batch(rows)
    expected = session.run(None, inputs)[0]
    got = graphs.run(inputs)["quantile_preds"]
    assert got.shape == expected.shape == (rows, 9, 8)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert graphs.captured_buckets == [4 if rows <= 4 else 16]


@pytest.mark.parametrize("transfers", TRANSFERS)
def test_padding_rows_form_a_group_of_their_own(group_checkpoint: ResolvedCheckpoint, transfers: str) -> None:
    session, graphs = runner(group_checkpoint, transfers, buckets=(16,))
    for rows, groups in [(5, 3), (7, 1), (16, 4)]:
        inputs = group_feed(rows, groups)
        inputs["group_ids"] += 100  # labels that do not start at 0
        expected_y, expected_sizes = session.run(None, inputs)
        outputs = graphs.run(inputs)
        np.testing.assert_array_equal(outputs["group_size"], expected_sizes)  # padding joined no real group
        np.testing.assert_array_equal(outputs["y"], expected_y)


@pytest.mark.parametrize("transfers", TRANSFERS)
def test_outputs_are_not_overwritten_and_inputs_not_kept(tiny_checkpoint: ResolvedCheckpoint, transfers: str) -> None:
    session, graphs = runner(tiny_checkpoint, transfers)
    first_inputs, second_inputs = batch(3), batch(3)
    second_inputs["context"] += 50.0
    first = graphs.run(first_inputs)["quantile_preds"]
    kept = first.copy()
    first_inputs["context"][:] = -1e6  # the caller refills its buffer after run returned (double buffering)
    second = graphs.run(second_inputs)["quantile_preds"]
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(second, session.run(None, second_inputs)[0], rtol=1e-6)
    assert not np.shares_memory(first, second)


@pytest.mark.parametrize("transfers", TRANSFERS)
def test_strict_plan_refuses_a_batch_above_the_largest_bucket(
    tiny_checkpoint: ResolvedCheckpoint, transfers: str
) -> None:
    _, graphs = runner(tiny_checkpoint, transfers, buckets=(4,), strict=True)
    with pytest.raises(GraphCaptureError, match=r"batch of 5 rows is larger than the largest CUDA-graph bucket \(4"):
        graphs.run(batch(5))


@pytest.mark.parametrize("transfers", TRANSFERS)
def test_policy_plan_runs_a_large_batch_without_graph_and_says_so_once(
    tiny_checkpoint: ResolvedCheckpoint, transfers: str, caplog: pytest.LogCaptureFixture
) -> None:
    session, graphs = runner(tiny_checkpoint, transfers, buckets=(4,), strict=False)
    with caplog.at_level(logging.WARNING):
        for rows in (5, 9):
            inputs = batch(rows)
            np.testing.assert_allclose(graphs.run(inputs)["quantile_preds"], session.run(None, inputs)[0], rtol=1e-6)
    assert [record.message.count("above the largest CUDA-graph bucket (4)") for record in caplog.records] == [1]
    assert graphs.captured_buckets == []


@pytest.mark.parametrize("transfers", TRANSFERS)
def test_an_empty_batch_gives_empty_outputs(tiny_checkpoint: ResolvedCheckpoint, transfers: str) -> None:
    _, graphs = runner(tiny_checkpoint, transfers)
    assert graphs.run(batch(0))["quantile_preds"].shape == (0, 9, 8)


def test_large_inputs_are_staged_by_several_threads(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    session, graphs = runner(write_tiny_context_quantiles(tmp_path), "torch", buckets=(20_000,), copy_threads=3)
    context = np.random.default_rng(0).normal(size=(17_000, 16)).astype(np.float32)  # 1.1 MB: split three ways
    np.testing.assert_array_equal(
        graphs.run({"context": context})["quantiles"], session.run(None, {"context": context})[0]
    )
    graphs.close()


@pytest.mark.parametrize("transfers", TRANSFERS)
def test_concurrent_callers_each_get_their_own_outputs(tiny_checkpoint: ResolvedCheckpoint, transfers: str) -> None:
    session, graphs = runner(tiny_checkpoint, transfers)
    feeds = [batch(3) | {"context": batch(3)["context"] + 10.0 * index} for index in range(4)]
    expected = [session.run(None, feed)[0] for feed in feeds]

    def call(index: int) -> bool:
        return all(
            np.allclose(graphs.run(feeds[index])["quantile_preds"], expected[index], rtol=1e-6) for _ in range(25)
        )

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, range(4)))


def test_inputs_disagreeing_on_rows_are_refused(tiny_checkpoint: ResolvedCheckpoint) -> None:
    _, graphs = runner(tiny_checkpoint, "ort")
    inputs = batch(3)
    inputs["group_ids"] = inputs["group_ids"][:2]
    with pytest.raises(InputValidationError, match="disagree on the batch axis"):
        graphs.run(inputs)


def test_torch_tensors_and_host_buffers_are_inputs_too(tiny_checkpoint: ResolvedCheckpoint) -> None:
    torch = pytest.importorskip("torch")
    session, graphs = runner(tiny_checkpoint, "torch")
    inputs = batch(3)
    expected = session.run(None, inputs)[0]
    as_tensors = {name: torch.from_numpy(value.copy()) for name, value in inputs.items()}
    np.testing.assert_allclose(graphs.run(as_tensors)["quantile_preds"], expected, rtol=1e-6)
    host = {name: graphs.empty_host_array(value.shape, value.dtype) for name, value in inputs.items()}
    for name, value in inputs.items():
        host[name][...] = value
    np.testing.assert_allclose(graphs.run(host)["quantile_preds"], expected, rtol=1e-6)


def test_a_cpu_backend_keeps_the_plain_path(tiny_checkpoint: ResolvedCheckpoint) -> None:
    backend = OnnxBackend.from_checkpoint(tiny_checkpoint)
    assert not backend.uses_cuda_graphs and backend.graph_transfers is None
    array = backend.empty_host_array((2, 16), np.float32)
    assert type(array) is np.ndarray and array.shape == (2, 16) and array.dtype == np.float32
