"""Batch buckets, padding and the load-time CUDA-graph checks and fallback rules (unit tier: no ORT, no GPU)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from distributed_onnx.errors import GraphCaptureError, InputValidationError
from distributed_onnx.model.backend.cuda.buckets import (
    BucketPlan,
    bucket_shape,
    effective_buckets,
    fill_padding,
    fixed_batch,
    padding_label,
)
from distributed_onnx.model.backend.cuda.graph_capture import (
    capture_problems,
    capture_refusal,
    graph_chain,
    settle,
    without_graphs,
)
from distributed_onnx.model.backend.providers import CpuProvider, CudaProvider, TensorRTProvider
from distributed_onnx.model.backend.session_info import captures
from distributed_onnx.model.backend.validation import TensorSpec

F32, I64 = np.dtype(np.float32), np.dtype(np.int64)


def spec(name: str, *shape: int | str | None, dtype: np.dtype = F32) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype, shape=tuple(shape))


CHRONOS_INPUTS = [
    spec("context", "rows", 512),
    spec("attention_mask", "rows", 512),
    spec("group_ids", "rows", dtype=I64),
    spec("future_covariates", "rows", 96),
]
CHRONOS_OUTPUTS = [spec("quantile_preds", "rows", 9, 96)]


@pytest.mark.parametrize(
    ("rows", "bucket"), [(1, 16), (16, 16), (17, 64), (64, 64), (65, 1024), (1024, 1024), (1025, None), (0, None)]
)
def test_a_batch_runs_in_the_smallest_bucket_that_holds_it(rows: int, bucket: int | None) -> None:
    assert BucketPlan((16, 64, 1024)).select(rows) == bucket


def test_every_bucket_has_its_own_graph_id() -> None:
    plan = BucketPlan((16, 64, 1024))
    assert [plan.graph_id(bucket) for bucket in plan.buckets] == [0, 1, 2]
    assert plan.largest == 1024


@pytest.mark.parametrize("buckets", [(), (0, 4), (8, 4)])
def test_a_plan_needs_increasing_positive_buckets(buckets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="increasing order"):
        BucketPlan(buckets)


def test_a_fixed_batch_axis_is_the_only_bucket() -> None:
    fixed = [spec("context", 8, 512), spec("group_ids", 8, dtype=I64)]
    assert fixed_batch(fixed) == 8
    assert fixed_batch(CHRONOS_INPUTS) is None
    assert effective_buckets((16, 64), 8) == (8,)
    assert effective_buckets((64, 16, 16), None) == (16, 64)


def test_bucket_shapes_put_the_bucket_on_axis_0() -> None:
    assert bucket_shape(CHRONOS_OUTPUTS[0], 64) == (64, 9, 96)
    assert bucket_shape(CHRONOS_INPUTS[2], 64) == (64,)
    with pytest.raises(ValueError, match="dynamic axes besides the batch"):
        bucket_shape(spec("x", "rows", "steps"), 4)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        (np.array([3, 1, 2], np.int64), 4),
        (np.array([], np.int64), 0),
        (np.array([127, 5], np.int8), 4),  # the max is the dtype's max: one below the min
        (np.array([255, 0, 2], np.uint8), 1),  # both ends taken: the first gap
    ],
)
def test_padding_labels_are_fresh(labels: np.ndarray, expected: int) -> None:
    label = padding_label(labels)
    assert label == expected and label not in labels.tolist()
    assert np.iinfo(labels.dtype).min <= label <= np.iinfo(labels.dtype).max


def test_padding_needs_a_free_label() -> None:
    with pytest.raises(InputValidationError, match="every value"):
        padding_label(np.arange(256, dtype=np.int16).astype(np.uint8))


def test_fill_padding_zeroes_floats_and_relabels_integers() -> None:
    floats = np.full((4, 2), 7.0, np.float32)
    labels = np.array([5, 9, 9, 9], np.int64)
    flags = np.ones(4, np.bool_)
    for buffer in (floats, labels, flags):
        fill_padding(buffer, 2)
    np.testing.assert_array_equal(floats, [[7, 7], [7, 7], [0, 0], [0, 0]])
    np.testing.assert_array_equal(labels, [5, 9, 10, 10])
    np.testing.assert_array_equal(flags, [True, True, False, False])
    fill_padding(labels, 4)  # a full bucket has no padding
    np.testing.assert_array_equal(labels, [5, 9, 10, 10])


def test_the_reference_contract_can_be_captured() -> None:
    assert capture_problems(CHRONOS_INPUTS, CHRONOS_OUTPUTS) == []


def test_dynamic_axes_besides_the_batch_cannot_be_captured() -> None:
    problems = capture_problems([spec("x", "rows", "steps"), spec("s")], [spec("y", "rows", None)])
    assert problems == [
        "input 'x' axis 1 is dynamic (steps): a CUDA graph replays fixed shapes and only the batch axis (axis 0) "
        "is bucketed",
        "input 's' is a scalar: it has no batch axis to bucket",
        "output 'y' axis 1 is dynamic (?): a CUDA graph replays fixed shapes and only the batch axis (axis 0) "
        "is bucketed",
    ]


def test_inputs_must_agree_on_a_fixed_batch_axis() -> None:
    problems = capture_problems([spec("a", 8, 2), spec("b", "rows", 2)], [])
    assert problems == ["the inputs disagree on the batch axis (axis 0): ['8', 'rows']"]
    assert capture_problems([spec("a", 8, 2), spec("b", 8)], []) == []


@pytest.mark.parametrize(
    "message",
    [
        # ORT 1.2x-1.3x, as raised by InferenceSession(...) with enable_cuda_graph
        "[ONNXRuntimeError] : 1 : FAIL : This session cannot use the graph capture feature as requested by the "
        "user as the model has control flow nodes which can't be supported by CUDAExecutionProvider",
        "[ONNXRuntimeError] : 1 : FAIL : This session cannot use the graph capture feature as requested by the "
        "user as all compute graph nodes have not been partitioned to the CUDAExecutionProvider",
    ],
)
def test_ort_refusing_capture_is_recognised(message: str) -> None:
    reason = capture_refusal(message)
    assert reason is not None and reason.startswith("This session cannot use the graph capture feature")


def test_other_load_errors_are_not_capture_refusals() -> None:
    assert capture_refusal("[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from x.onnx failed") is None


def test_strict_chains_raise_and_policy_chains_warn(caplog: pytest.LogCaptureFixture) -> None:
    assert settle([], strict=True, checkpoint="m.onnx")
    with pytest.raises(GraphCaptureError, match=r"m\.onnx cannot be captured: input 'x' .*cuda_graph=False") as info:
        settle(["input 'x' axis 1 is dynamic"], strict=True, checkpoint="m.onnx")
    assert info.value.problems == ["input 'x' axis 1 is dynamic"]
    with caplog.at_level(logging.WARNING):
        assert not settle(["control flow"], strict=False, checkpoint="m.onnx")
    assert "CUDA graphs are off for m.onnx" in caplog.text and "control flow" in caplog.text


def test_graphs_belong_to_a_leading_cuda_provider_only() -> None:
    chain, graphs = graph_chain([CudaProvider(), CpuProvider()])
    assert graphs == CudaProvider() and chain == [CudaProvider(), CpuProvider()]
    chain, graphs = graph_chain([TensorRTProvider(), CudaProvider(), CpuProvider()])  # CUDA takes TRT's leftovers
    assert graphs is None and chain[1] == CudaProvider(cuda_graph=False)
    assert graph_chain([CudaProvider(cuda_graph=False)])[1] is None
    assert graph_chain([CpuProvider()]) == ([CpuProvider()], None)
    assert without_graphs([CudaProvider(device_id=1), CpuProvider()]) == [
        CudaProvider(device_id=1, cuda_graph=False),
        CpuProvider(),
    ]


class FakeSession:
    """The two session facts ``captures`` reads (pure logic)."""

    def __init__(self, providers: list[str], options: dict[str, dict[str, str]]) -> None:
        self._providers, self._options = providers, options

    def get_providers(self) -> list[str]:
        return self._providers

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return self._options


def test_a_session_captures_when_cuda_leads_with_graphs_enabled() -> None:
    cuda = "CUDAExecutionProvider"
    assert captures(FakeSession([cuda, "CPUExecutionProvider"], {cuda: {"enable_cuda_graph": "1"}}))
    assert not captures(FakeSession([cuda], {cuda: {"enable_cuda_graph": "0"}}))
    assert not captures(FakeSession(["CPUExecutionProvider"], {"CPUExecutionProvider": {}}))
