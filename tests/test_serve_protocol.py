"""Unit tier of the online deployment: v2 tensor codecs, the forecast codec, batching and settings (no Ray, no ORT)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import pytest

from distributed_onnx.errors import ConfigError, InferenceError, InputValidationError
from distributed_onnx.model.backend.validation import TensorSpec
from distributed_onnx.serve.operations.health import ModelHealth
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.binary import binary_outputs, encode_response, slice_inputs, split_body
from distributed_onnx.serve.wire.forecasting import (
    ForecastJob,
    check_finite_forecasts,
    forecast_timestamps,
    history_block,
    plan_job,
    run_jobs,
)
from distributed_onnx.serve.wire.http import HttpError, install_error_handlers, parse_body, status_of
from distributed_onnx.serve.wire.protocol import (
    decode_inputs,
    decode_tensor,
    encode_outputs,
    select_outputs,
    tensor_metadata,
)
from distributed_onnx.serve.wire.schemas import (
    ForecastRequest,
    InferInputTensor,
    InferRequest,
    RequestedOutput,
    SeriesHistory,
)

SPECS = [
    TensorSpec("context", np.dtype(np.float32), ("rows", 4)),
    TensorSpec("group_ids", np.dtype(np.int64), ("rows",)),
]


def tensor(name: str, shape: list[int], datatype: str, data: list[object]) -> InferInputTensor:
    return InferInputTensor.model_validate({"name": name, "shape": shape, "datatype": datatype, "data": data})


def test_flat_and_nested_data_decode_to_the_declared_shape_and_dtype() -> None:
    flat = decode_tensor(tensor("context", [2, 2], "FP32", [1, 2, 3, 4.5]))
    nested = decode_tensor(tensor("context", [2, 2], "FP32", [[1, 2], [3, 4.5]]))
    assert flat.dtype == np.float32 and flat.shape == (2, 2)
    np.testing.assert_array_equal(flat, nested)
    assert decode_tensor(tensor("m", [2], "BOOL", [True, False])).dtype == np.bool_


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        (tensor("x", [2, 2], "FP32", [1, 2, 3]), "holds 4 values, 'data' has 3"),
        (tensor("x", [2], "INT64", [1.5, 2]), "takes integers"),
        (tensor("x", [1], "BOOL", [1]), "takes true/false"),
        (tensor("x", [2], "FP32", ["a", "b"]), "strings"),
        (tensor("x", [1], "INT8", [300]), "out of range"),
        (tensor("x", [2, 2], "FP32", [[1, 2, 3], [4]]), "rectangular"),
        (tensor("x", [2, 2], "FP32", [[1, 2, 3, 4]]), "nested"),
    ],
)
def test_bad_tensors_name_the_tensor(item: InferInputTensor, needle: str) -> None:
    with pytest.raises(InputValidationError, match=needle) as caught:
        decode_tensor(item)
    assert "'x'" in str(caught.value)


def test_inputs_are_checked_against_the_model() -> None:
    good = [tensor("context", [1, 4], "FP32", [0, 1, 2, 3]), tensor("group_ids", [1], "INT64", [0])]
    assert set(decode_inputs(good, SPECS)) == {"context", "group_ids"}
    with pytest.raises(InputValidationError, match="'context' has datatype FP64"):
        decode_inputs([tensor("context", [1, 4], "FP64", [0, 1, 2, 3]), good[1]], SPECS)
    with pytest.raises(InputValidationError, match="missing"):
        decode_inputs(good[:1], SPECS)
    with pytest.raises(InputValidationError, match="more than once"):
        decode_inputs([good[0], good[0], good[1]], SPECS)
    # Values are the model family's rule (its adapter), not the protocol's: NaN and -inf decode as sent.
    sent = decode_inputs([tensor("context", [1, 4], "FP32", [0, float("-inf"), float("nan"), 3]), good[1]], SPECS)
    assert np.isneginf(sent["context"][0, 1]) and np.isnan(sent["context"][0, 2])
    with pytest.raises(InputValidationError, match="binary"):
        decode_inputs([good[0].model_copy(update={"parameters": {"binary_data_size": 16}}), good[1]], SPECS)


def test_metadata_and_outputs_use_v2_datatypes() -> None:
    assert tensor_metadata(SPECS[0]).model_dump() == {"name": "context", "datatype": "FP32", "shape": [-1, 4]}
    (out,) = encode_outputs({"y": np.arange(6, dtype=np.float32).reshape(2, 3)}, ["y"])
    assert (out.datatype, out.shape, out.data) == ("FP32", [2, 3], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert select_outputs(["a", "b"], None) == ["a", "b"]
    with pytest.raises(InputValidationError, match="nope"):
        select_outputs(["a"], [RequestedOutput(name="nope")])


# ------------------------------------------------------------------------------ binary tensor data extension


def binary_tensor(name: str, shape: list[int], datatype: str, size: object) -> InferInputTensor:
    return InferInputTensor.model_validate(
        {"name": name, "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}
    )


def test_split_body_takes_the_json_header_and_refuses_a_length_beyond_the_body() -> None:
    assert split_body(b'{"a": 1}xyz', "8") == (b'{"a": 1}', b"xyz")
    assert split_body(b"{}", "2") == (b"{}", b"")
    for length in ("12", "0", "-1", "abc", ""):
        with pytest.raises(InputValidationError, match="Inference-Header-Content-Length"):
            split_body(b'{"a": 1}xyz', length)


def test_mixed_binary_and_json_inputs_decode_like_json_ones() -> None:
    context = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    groups = np.array([0, 1], dtype=np.int64)
    tensors = [binary_tensor("context", [2, 4], "FP32", 32), tensor("group_ids", [2], "INT64", [0, 1])]
    raw = slice_inputs(tensors, context.astype("<f4").tobytes())
    assert raw == [context.tobytes(), None]
    arrays = decode_inputs(tensors, SPECS, raw)
    np.testing.assert_array_equal(arrays["context"], context)
    np.testing.assert_array_equal(arrays["group_ids"], groups)
    assert arrays["context"].dtype == np.float32 and arrays["context"].flags.writeable
    # both binary, in input order; the same arrays as JSON data give the same result
    both = [tensors[0], binary_tensor("group_ids", [2], "INT64", 16)]
    payload = context.tobytes() + groups.astype("<i8").tobytes()
    decoded = decode_inputs(both, SPECS, slice_inputs(both, payload))
    as_json = decode_inputs([tensor("context", [2, 4], "FP32", context.ravel().tolist()), tensors[1]], SPECS)
    for name in ("context", "group_ids"):
        np.testing.assert_array_equal(decoded[name], as_json[name])
    assert decode_tensor(binary_tensor("m", [3], "BOOL", 3), b"\x01\x00\x01").tolist() == [True, False, True]


@pytest.mark.parametrize(
    ("tensors", "payload", "needle"),
    [
        ([binary_tensor("x", [2, 2], "FP32", 12)], b"\0" * 12, "'x': binary_data_size is 12 bytes"),
        ([binary_tensor("x", [2], "FP32", 8)], b"\0" * 4, "'x': binary_data_size 8 runs past the end"),
        ([binary_tensor("x", [2], "FP32", 8)], b"\0" * 10, r"2 bytes after the binary data of input\(s\) \['x'\]"),
        ([binary_tensor("x", [2], "FP32", "8")], b"\0" * 8, "'x': binary_data_size must be a byte count"),
        ([binary_tensor("x", [2], "FP32", -1)], b"", "'x': binary_data_size must be a byte count"),
        ([binary_tensor("x", [1], "BYTES", 5)], b"\0\0\0\0\0", "'x': datatype BYTES is not supported"),
        (
            [tensor("x", [1], "FP32", [1.0]).model_copy(update={"parameters": {"binary_data_size": 4}})],
            b"\0" * 4,
            "'x' has both 'data' and binary_data_size",
        ),
    ],
    ids=["size-vs-shape", "past-the-end", "leftover", "size-string", "size-negative", "bytes", "data-and-binary"],
)
def test_bad_binary_framing_names_the_tensor(tensors: list[InferInputTensor], payload: bytes, needle: str) -> None:
    with pytest.raises(InputValidationError, match=needle):
        slice_inputs(tensors, payload)


def test_bad_binary_values_name_the_tensor() -> None:
    with pytest.raises(InputValidationError, match="'m': BOOL binary data"):
        decode_tensor(binary_tensor("m", [1], "BOOL", 1), b"\x02")
    with pytest.raises(InputValidationError, match="'x': 3 bytes of binary data"):
        decode_tensor(binary_tensor("x", [1], "FP32", 3), b"\0\0\0")
    with pytest.raises(InputValidationError, match="'x': datatype BYTES is not supported"):
        decode_tensor(tensor("x", [1], "BYTES", ["a"]))
    shared = tensor("x", [1], "FP32", [1.0]).model_copy(update={"parameters": {"shared_memory_region": "r"}})
    with pytest.raises(InputValidationError, match="'x': shared-memory"):
        decode_tensor(shared)
    with pytest.raises(InputValidationError, match="'x' has no 'data'"):
        decode_tensor(InferInputTensor.model_validate({"name": "x", "shape": [1], "datatype": "FP32"}))
    nan = np.array([[0, np.nan, 0, 0]], dtype=np.float32).tobytes()
    sent = decode_inputs(
        [binary_tensor("context", [1, 4], "FP32", 16), tensor("group_ids", [1], "INT64", [0])], SPECS, [nan, None]
    )
    assert np.isnan(sent["context"][0, 1])  # the family's adapter decides (test_adapters.py)


def test_binary_outputs_follow_binary_data_output_and_each_outputs_override() -> None:
    def request(parameters: object = None, outputs: object = None) -> InferRequest:
        body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
        return InferRequest.model_validate(body | {"parameters": parameters, "outputs": outputs})

    assert binary_outputs(request(), ["a", "b"]) == set()
    assert binary_outputs(request({"binary_data_output": True}), ["a", "b"]) == {"a", "b"}
    outputs = [{"name": "a", "parameters": {"binary_data": True}}, {"name": "b"}]
    assert binary_outputs(request(None, outputs), ["a", "b"]) == {"a"}
    outputs = [{"name": "a", "parameters": {"binary_data": False}}, {"name": "b"}]
    assert binary_outputs(request({"binary_data_output": True}, outputs), ["a", "b"]) == {"b"}
    with pytest.raises(InputValidationError, match=r"'a'.*binary_data"):
        binary_outputs(request(None, [{"name": "a", "parameters": {"binary_data": "yes"}}]), ["a"])


def test_encode_response_puts_binary_outputs_after_the_json_header() -> None:
    outputs = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True, False])}
    body, length = encode_response({"model_name": "m"}, outputs, ["a", "b"], set())
    assert length is None and json.loads(body)["outputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    body, length = encode_response({"model_name": "m", "id": "r"}, outputs, ["a", "b"], {"a"})
    assert length is not None
    header = json.loads(body[:length])
    assert header["id"] == "r"
    binary, plain = header["outputs"]
    assert binary == {"name": "a", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}}
    assert plain["data"] == [True, False]
    np.testing.assert_array_equal(np.frombuffer(body[length:], dtype="<f4").reshape(2, 3), outputs["a"])


def test_history_block_keeps_the_last_context_values_and_pads_on_the_left() -> None:
    series = [SeriesHistory(series_id="a", y=[1.0, None, 3.0, 4.0, 5.0]), SeriesHistory(series_id="b", y=[7.0])]
    block = history_block(series, context_length=3)
    assert block.dtype == np.float32
    np.testing.assert_array_equal(block, [[3.0, 4.0, 5.0], [np.nan, np.nan, 7.0]])
    with pytest.raises(InputValidationError, match=r"series\[0\]\.y"):
        history_block([SeriesHistory(series_id="a", y=[1.0, None, None])], context_length=2)


class RecordingForecast:
    """A fake ``InferenceWorker.forecast``: the forecast of each row is its last observed value."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, int], int, tuple[float, ...]]] = []

    def __call__(self, context: np.ndarray, horizon: int, quantiles: Sequence[float]) -> np.ndarray:
        self.calls.append((context.shape, horizon, tuple(quantiles)))
        last = np.array([row[np.isfinite(row)][-1] for row in context], dtype=np.float32)
        return np.broadcast_to(last[:, None, None], (len(context), horizon, len(quantiles))).copy()


def test_run_jobs_merges_jobs_with_the_same_settings_and_splits_results_in_order() -> None:
    jobs = [
        ForecastJob(np.array([[1.0, 2.0]], dtype=np.float32), 4, (0.5,)),
        ForecastJob(np.array([[3.0], [4.0]], dtype=np.float32), 4, (0.5,)),
        ForecastJob(np.array([[5.0]], dtype=np.float32), 2, (0.1, 0.9)),
    ]
    fake = RecordingForecast()
    results = run_jobs(fake, jobs, rows_per_batch=64)
    assert fake.calls == [((3, 2), 4, (0.5,)), ((1, 1), 2, (0.1, 0.9))]
    assert [r.shape for r in results] == [(1, 4, 1), (2, 4, 1), (1, 2, 2)]
    assert [float(r[i, 0, 0]) for r in results for i in range(len(r))] == [2.0, 3.0, 4.0, 5.0]


def test_run_jobs_splits_merged_work_into_calls_of_at_most_rows_per_batch() -> None:
    rng = np.random.default_rng(3)
    sizes = [5, 1, 7, 3]
    jobs = [ForecastJob(rng.standard_normal((n, 2 + i)).astype(np.float32), 4, (0.5,)) for i, n in enumerate(sizes)]
    fake = RecordingForecast()
    results = run_jobs(fake, jobs, rows_per_batch=4)
    assert [shape[0] for shape, _, _ in fake.calls] == [4, 4, 4, 4]  # 16 rows, chunks cut across requests
    assert all(shape[0] <= 4 for shape, _, _ in fake.calls)
    whole = run_jobs(RecordingForecast(), jobs, rows_per_batch=1000)
    for chunked, merged, job in zip(results, whole, jobs, strict=True):
        assert chunked.shape == (job.context.shape[0], 4, 1)
        np.testing.assert_array_equal(chunked, merged)
        np.testing.assert_array_equal(chunked[:, 0, 0], job.context[:, -1])  # each row got its own forecast


def test_a_failing_model_call_fails_the_whole_batch_naming_its_requests() -> None:
    def broken(context: np.ndarray, horizon: int, quantiles: Sequence[float]) -> np.ndarray:
        raise InferenceError("session exploded")

    jobs = [ForecastJob(np.ones((2, 3), dtype=np.float32), 4, (0.5,)) for _ in range(3)]
    with pytest.raises(InferenceError, match=r"a batch of 3 requests \(6 series\): session exploded"):
        run_jobs(broken, jobs, rows_per_batch=64)


def test_non_finite_forecasts_fail_only_the_request_whose_values_caused_them() -> None:
    """Issue 17: NaN/inf forecasts are the request's values' fault (422 for it alone), not the batch's (500)."""

    def overflowing(context: np.ndarray, horizon: int, quantiles: Sequence[float]) -> np.ndarray:
        last = np.nan_to_num(context[:, -1], nan=0.0).astype(np.float32)
        with np.errstate(over="ignore"):
            values = last * last  # inf where the history is too large for the model's arithmetic
        return np.broadcast_to(values[:, None, None], (len(context), horizon, len(quantiles))).copy()

    jobs = [
        ForecastJob(np.array([[1.0, 2.0]], dtype=np.float32), 4, (0.5,)),
        ForecastJob(np.array([[1.0, 3e30], [1.0, 2.0]], dtype=np.float32), 4, (0.5,)),
        ForecastJob(np.array([[3.0]], dtype=np.float32), 4, (0.5,)),
    ]
    results = run_jobs(overflowing, jobs, rows_per_batch=64)  # the merged call does not fail
    request = ForecastRequest.model_validate({"series": [{"series_id": "a", "y": [1.0]}, {"series_id": "b", "y": [2]}]})
    check_finite_forecasts(results[0], ForecastRequest.model_validate({"series": [{"series_id": "a", "y": [1]}]}))
    with pytest.raises(InputValidationError, match=r"NaN or infinite forecasts for series\[0\] \('a'\)") as caught:
        check_finite_forecasts(results[1], request)
    assert status_of(caught.value) == 422
    assert float(results[2][0, 0, 0]) == 9.0


def test_a_value_beyond_float32_is_refused_at_validation_naming_it() -> None:
    request = ForecastRequest.model_validate(
        {"series": [{"series_id": "ok", "y": [1.0]}, {"series_id": "x", "y": [1.0, 1e39]}]}
    )
    from graphs import tiny_chronos2_metadata

    with pytest.raises(InputValidationError, match=r"series\[1\]\.y\[1\] \(series_id 'x'\) is 1e\+39") as caught:
        plan_job(request, tiny_chronos2_metadata())
    assert status_of(caught.value) == 422
    with pytest.raises(InputValidationError, match=r"Input 'context'.*1e\+39.*FP32") as caught:
        decode_tensor(tensor("context", [1, 2], "FP32", [1.0, 1e39]))
    assert status_of(caught.value) == 422
    assert decode_tensor(tensor("context", [1, 2], "FP64", [1.0, 1e39]))[0, 1] == 1e39  # FP64 holds it


def test_model_health_turns_not_ready_after_consecutive_failures_only() -> None:
    health = ModelHealth(max_consecutive_failures=2)
    health.failed(InferenceError("one"))
    assert health.ready
    health.succeeded()
    health.failed(InferenceError("two"))
    assert health.ready
    health.failed(InferenceError("three"))
    assert not health.ready
    assert "last 2 calls" in health.reason and "three" in health.reason
    health.succeeded()
    assert health.ready


def test_a_start_whose_forecast_leaves_the_calendar_is_refused_naming_the_series() -> None:
    from graphs import tiny_chronos2_metadata

    late = ForecastRequest.model_validate(
        {"series": [{"series_id": "a", "y": [1.0]}, {"series_id": "b", "y": [1.0], "start": "9999-12-31T23:00:00"}]}
    )
    with pytest.raises(InputValidationError, match=r"series\[1\]\.start.*9999"):
        plan_job(late, tiny_chronos2_metadata())
    fine = ForecastRequest.model_validate({"series": [{"series_id": "a", "y": [1.0], "start": "9999-01-01T00:00:00"}]})
    assert plan_job(fine, tiny_chronos2_metadata()).context.shape == (1, 1)


def test_unexpected_errors_are_json_500s() -> None:
    import asyncio

    import httpx
    from fastapi import FastAPI

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    async def bug() -> None:
        raise OverflowError("date value out of range")

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.get("/bug")

    response = asyncio.run(get())
    assert response.status_code == 500
    assert response.json() == {"error": "Internal error (OverflowError): date value out of range"}


def test_timestamps_follow_the_history() -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    assert forecast_timestamps(start, 2, 2, 30) == ["2024-01-01T01:00:00Z", "2024-01-01T01:30:00Z"]


def test_parse_body_maps_json_and_schema_errors() -> None:
    with pytest.raises(HttpError, match="not valid JSON") as caught:
        parse_body(b"{", ForecastRequest)
    assert caught.value.status_code == 400
    with pytest.raises(HttpError, match=r"quantiles") as caught:
        parse_body(b'{"series": [{"series_id": "a", "y": [1]}], "quantiles": [1.5]}', ForecastRequest)
    assert caught.value.status_code == 422


def test_settings_size_the_queue_for_batches_and_reject_unknown_keys() -> None:
    assert ServeSettings(max_batch_size=64).ongoing_requests == 128
    assert ServeSettings(max_batch_size=1).ongoing_requests == 64
    options = ServeSettings(gpus_per_replica=0.5, replicas=2).deployment_options()
    assert options["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert options["backpressure_config"].retry_after_s == 1.0
    assert ServeSettings().host == "127.0.0.1"
    with pytest.raises(ConfigError, match="colour"):
        ServeSettings.from_sources({"colour": "red"})
    with pytest.raises(
        ConfigError, match=r"Invalid serve settings: grpc_port: is 9000, the same port as --port \(HTTP\)"
    ):
        ServeSettings.from_sources({"port": 9000, "grpc_port": 9000})
    with pytest.raises(ConfigError, match="ingress"):
        ServeSettings.from_sources({"ingress": "nginx"})
    limits = ServeSettings(max_ongoing_requests=4, max_queued_requests=6)
    assert limits.admission_limit == 10
    options = limits.deployment_options()  # Serve's own limits above the replica's, so the replica answers
    assert options["max_ongoing_requests"] > 10 and options["max_queued_requests"] > 10


# ------------------------------------------------------------------------------------------ KServe v2 over gRPC


def test_grpc_requests_decode_like_http_ones_from_contents_and_raw_bytes() -> None:
    from distributed_onnx.serve.wire.grpc_api import infer_inputs, model_infer_response, requested_outputs
    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest

    context = np.arange(8, dtype=np.float32).reshape(2, 4)
    typed = ModelInferRequest(model_name="m")
    tensor = typed.inputs.add(name="context", datatype="FP32", shape=[2, 4])
    tensor.contents.fp32_contents.extend(context.ravel().tolist())
    typed.inputs.add(name="group_ids", datatype="INT64", shape=[2]).contents.int64_contents.extend([0, 1])
    typed.outputs.add(name="group_ids")
    raw = ModelInferRequest(model_name="m")
    raw.inputs.add(name="context", datatype="FP32", shape=[2, 4])
    raw.inputs.add(name="group_ids", datatype="INT64", shape=[2])
    raw.raw_input_contents.extend([context.tobytes(), np.array([0, 1], dtype="<i8").tobytes()])
    for request in (typed, raw):
        tensors, payload = infer_inputs(request)
        arrays = decode_inputs(tensors, SPECS, payload)
        np.testing.assert_array_equal(arrays["context"], context)
        np.testing.assert_array_equal(arrays["group_ids"], [0, 1])
    assert requested_outputs(typed) == [RequestedOutput(name="group_ids")] and requested_outputs(raw) is None
    response = model_infer_response("m", "r1", {"q": context}, ["q"])
    assert (response.id, response.outputs[0].datatype, list(response.outputs[0].shape)) == ("r1", "FP32", [2, 4])
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4").reshape(2, 4), context)


def test_bad_grpc_requests_name_the_tensor() -> None:
    from distributed_onnx.serve.wire.grpc_api import infer_inputs
    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest

    request = ModelInferRequest(model_name="m")
    request.inputs.add(name="context", datatype="FP32", shape=[1, 4])
    request.inputs.add(name="group_ids", datatype="INT64", shape=[1])
    request.raw_input_contents.append(b"\0" * 16)
    with pytest.raises(InputValidationError, match="raw_input_contents has 1 entries for 2 inputs"):
        infer_inputs(request)
    request.inputs[1].datatype = "FP99"
    del request.raw_input_contents[:]
    with pytest.raises(InputValidationError, match=r"inputs\.1\.datatype"):
        infer_inputs(request)
    short = ModelInferRequest(model_name="m")
    short.inputs.add(name="context", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1.0, 2.0])
    tensors, payload = infer_inputs(short)
    with pytest.raises(InputValidationError, match="'context'"):
        decode_inputs(tensors, SPECS[:1], payload)


# ------------------------------------------------------------------------------------------ defect 4 of issue 29


def test_a_shape_that_holds_no_values_is_refused_before_any_array_is_built() -> None:
    """``[0, 10**30]`` holds no values, so no data check caught it and numpy's reshape raised (a 500)."""
    for shape in ([0, 10**30], [0, 2**62], [2, 0], [0, 4]):
        with pytest.raises(InputValidationError, match="holds no values"):
            decode_tensor(tensor("context", shape, "FP32", []))
        with pytest.raises(InputValidationError, match="holds no values"):
            slice_inputs([binary_tensor("context", shape, "FP32", 0)], b"")


def test_the_header_length_takes_ascii_digits_only() -> None:
    """``str.isdigit`` accepts ``²``, which ``int`` then refused (a 500); only ASCII digits are a byte count."""
    for length in ("²", "١٢", "8²", " ²"):
        with pytest.raises(InputValidationError, match="must be a byte count"):
            split_body(b'{"a": 1}xyz', length)
    assert split_body(b'{"a": 1}xyz', " 8 ") == (b'{"a": 1}', b"xyz")


def test_a_grpc_shape_of_no_values_is_refused_as_over_http() -> None:
    from distributed_onnx.serve.wire.grpc_api import infer_inputs
    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest

    request = ModelInferRequest(model_name="m")
    request.inputs.add(name="context", datatype="FP32", shape=[0, 2**62])
    request.inputs.add(name="group_ids", datatype="INT64", shape=[0])
    tensors, payload = infer_inputs(request)
    with pytest.raises(InputValidationError, match="holds no values"):
        decode_inputs(tensors, SPECS, payload)
