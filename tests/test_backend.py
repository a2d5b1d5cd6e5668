"""OnnxBackend on real ONNX Runtime sessions over real .onnx files (integration tier, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from graphs import (
    QUANTILE_OFFSETS,
    tiny_chronos2_metadata,
    tiny_chronos2_model,
    write_additive_mask,
    write_tiny_chronos2,
    write_unsigned_inputs,
)

from distributed_onnx import (
    CpuProvider,
    CudaProvider,
    HostCapabilities,
    InferenceBackend,
    LocalCheckpoint,
    OnnxBackend,
    SessionOptionsConfig,
)
from distributed_onnx.errors import (
    BackendClosedError,
    CheckpointCorruptError,
    CheckpointGraphMismatchError,
    InputValidationError,
    ProviderNotAllowedError,
    ProviderUnavailableError,
)
from distributed_onnx.model.backend.onnx import detect_host
from distributed_onnx.model.checkpoint import ResolvedCheckpoint, write_checkpoint

pytestmark = pytest.mark.integration


def batch(rows: int = 2, context_length: int = 16, horizon: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "context": rng.normal(size=(rows, context_length)).astype(np.float32),
        "attention_mask": np.ones((rows, context_length), dtype=np.float32),
        "group_ids": np.arange(rows, dtype=np.int64),
        "future_covariates": np.zeros((rows, horizon), dtype=np.float32),
        "future_covariates_mask": np.zeros((rows, horizon), dtype=np.float32),
    }


def test_runs_and_matches_the_graph(tiny_checkpoint: ResolvedCheckpoint) -> None:
    with OnnxBackend.from_checkpoint(tiny_checkpoint) as backend:
        assert isinstance(backend, InferenceBackend)
        assert backend.providers == ["CPUExecutionProvider"]
        inputs = batch(rows=3)
        out = backend.run(inputs)["quantile_preds"]
    assert out.shape == (3, 9, 8)
    expected = inputs["context"].mean(axis=1)[:, None] + QUANTILE_OFFSETS[None, :]
    np.testing.assert_allclose(out[:, :, 0], expected, rtol=1e-5)


def test_session_options_are_applied(
    tiny_checkpoint: ResolvedCheckpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every field reaches the session ONNX Runtime builds (read back from the session itself)."""
    built: list[ort.InferenceSession] = []
    real_session = ort.InferenceSession

    def recording_session(*args: object, **kwargs: object) -> ort.InferenceSession:
        built.append(real_session(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(ort, "InferenceSession", recording_session)
    options = SessionOptionsConfig(
        graph_optimization_level="ENABLE_BASIC",
        intra_op_num_threads=1,
        inter_op_num_threads=2,
        allow_spinning=False,
        optimized_model_path=tmp_path / "opt.onnx",
        log_severity_level=2,
    )
    with OnnxBackend.from_checkpoint(tiny_checkpoint, [CpuProvider()], options) as backend:
        backend.run(batch())

    (session,) = built
    applied = session.get_session_options()
    assert applied.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert (applied.intra_op_num_threads, applied.inter_op_num_threads) == (1, 2)
    assert applied.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert applied.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert applied.log_severity_level == 2
    assert applied.optimized_model_filepath == str(tmp_path / "opt.onnx")
    # ONNX Runtime wrote the optimized graph there: a model that loads and has the checkpoint's inputs.
    optimized = ort.InferenceSession(str(tmp_path / "opt.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in optimized.get_inputs()] == [i.name for i in session.get_inputs()]


def test_caller_owned_session(tiny_checkpoint: ResolvedCheckpoint) -> None:
    session = ort.InferenceSession(str(tiny_checkpoint.weights_path), providers=["CPUExecutionProvider"])
    backend = OnnxBackend(tiny_checkpoint.metadata, session)
    assert backend.run(batch())["quantile_preds"].shape == (2, 9, 8)


def test_closed_backend_refuses(tiny_checkpoint: ResolvedCheckpoint) -> None:
    backend = OnnxBackend.from_checkpoint(tiny_checkpoint)
    backend.close()
    with pytest.raises(BackendClosedError):
        backend.run(batch())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b.pop("group_ids"), r"missing \['group_ids'\]"),
        (lambda b: b.update(extra=np.zeros(2)), r"unexpected \['extra'\]"),
        (
            lambda b: b.update(context=b["context"].astype(np.float64)),
            "'context' has dtype float64, expected float32",
        ),
        (lambda b: b.update(group_ids=b["group_ids"].astype(np.int32)), "'group_ids' has dtype int32"),
        (lambda b: b.update(context=b["context"][None]), r"'context' has rank 3 .* expected rank 2"),
        (lambda b: b.update(context=b["context"][:, :15]), r"'context' has size 15 on axis 1 .* expected 16"),
        (
            lambda b: b.update(attention_mask=b["attention_mask"][:1]),
            r"Axis 'rows' is 2 in input 'context' but 1",
        ),
    ],
)
def test_bad_inputs_are_named(tiny_checkpoint: ResolvedCheckpoint, mutate: object, message: str) -> None:
    backend = OnnxBackend.from_checkpoint(tiny_checkpoint)
    inputs = batch()
    mutate(inputs)  # type: ignore[operator]
    with pytest.raises(InputValidationError, match=message):
        backend.run(inputs)


def test_values_are_not_the_backends_business(tiny_checkpoint: ResolvedCheckpoint) -> None:
    """NaN/inf pass the backend: which values may be NaN is the family adapter's rule (test_adapters.py)."""
    inputs = batch()
    inputs["context"][1, 3] = np.nan
    inputs["future_covariates"][0, 0] = np.inf
    out = OnnxBackend.from_checkpoint(tiny_checkpoint).run(inputs)["quantile_preds"]
    assert np.isnan(out[1]).all()  # the tiny graph's mean over a NaN is NaN: the value reached the graph


def test_unsigned_integer_inputs_load_and_run(tmp_path: Path) -> None:
    backend = OnnxBackend.from_checkpoint(write_unsigned_inputs(tmp_path))
    assert [spec.dtype for spec in backend.input_specs] == [np.uint16, np.uint32, np.uint64]
    inputs = {
        "a": np.array([1, 65535], dtype=np.uint16),
        "b": np.array([2, 4_000_000_000], dtype=np.uint32),
        "c": np.array([3, 2**60], dtype=np.uint64),
    }
    np.testing.assert_array_equal(backend.run(inputs)["total"], [6.0, 65535.0 + 4e9 + 2.0**60])
    with pytest.raises(InputValidationError, match="'b' has dtype int64, expected uint32"):
        backend.run(inputs | {"b": inputs["b"].astype(np.int64)})


def test_additive_attention_mask_with_minus_infinity_runs(tmp_path: Path) -> None:
    backend = OnnxBackend.from_checkpoint(write_additive_mask(tmp_path))
    scores = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    mask = np.array([[0.0, -np.inf, 0.0, -np.inf]], dtype=np.float32)
    weights = backend.run({"scores": scores, "attention_mask": mask})["weights"]
    expected = np.exp([1.0, 3.0]) / np.exp([1.0, 3.0]).sum()
    np.testing.assert_allclose(weights[0], [expected[0], 0.0, expected[1], 0.0], rtol=1e-6)


def test_corrupt_weights_name_the_file(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "broken.onnx", b"this is not protobuf", tiny_chronos2_metadata())
    resolved = LocalCheckpoint(path=tmp_path / "broken.onnx").resolve()
    with pytest.raises(CheckpointCorruptError, match=r"cannot load checkpoint weights .*broken\.onnx"):
        OnnxBackend.from_checkpoint(resolved)


def test_graph_disagreeing_with_metadata(tmp_path: Path) -> None:
    metadata = tiny_chronos2_metadata(output_name="forecast", input_names=["context", "mask"])
    write_checkpoint(tmp_path / "m.onnx", tiny_chronos2_model().SerializeToString(), metadata)
    with pytest.raises(CheckpointGraphMismatchError) as info:
        OnnxBackend.from_checkpoint(LocalCheckpoint(path=tmp_path / "m.onnx").resolve())
    assert "input_names ['context', 'mask']" in str(info.value)
    assert "'forecast' is not a graph output" in str(info.value)


def test_fixed_rows_dimension_is_checked(tmp_path: Path) -> None:
    model = tiny_chronos2_model(rows=4)
    write_checkpoint(tmp_path / "static.onnx", model.SerializeToString(), tiny_chronos2_metadata(static_shapes=True))
    backend = OnnxBackend.from_checkpoint(LocalCheckpoint(path=tmp_path / "static.onnx").resolve())
    assert backend.run(batch(rows=4))["quantile_preds"].shape == (4, 9, 8)
    with pytest.raises(InputValidationError, match="size 2 on axis 0"):
        backend.run(batch(rows=2))


def test_explicit_cuda_chain_is_strict_on_a_cpu_host(tiny_checkpoint: ResolvedCheckpoint) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this host has CUDA; the strict-fallback check needs a CPU-only onnxruntime")
    with pytest.raises(ProviderUnavailableError):
        OnnxBackend.from_checkpoint(tiny_checkpoint, [CudaProvider(), CpuProvider()])


def test_gpu_chain_refused_in_a_process_without_gpu(tiny_checkpoint: ResolvedCheckpoint) -> None:
    no_gpu = detect_host(gpu_assigned=False)
    with pytest.raises(ProviderNotAllowedError):
        OnnxBackend.from_checkpoint(tiny_checkpoint, [CudaProvider()], host=no_gpu)


def test_policy_chain_is_graceful(tiny_checkpoint: ResolvedCheckpoint) -> None:
    fake_gpu_host = HostCapabilities(
        platform="linux", available_providers=frozenset({"CUDAExecutionProvider", "CPUExecutionProvider"})
    )
    backend = OnnxBackend.from_checkpoint(tiny_checkpoint, host=fake_gpu_host)  # CUDA missing: warn, run on CPU
    assert backend.providers[-1] == "CPUExecutionProvider"
    assert backend.run(batch())["quantile_preds"].shape == (2, 9, 8)


def test_metadata_file_stays_valid_json(tmp_path: Path) -> None:
    resolved = write_tiny_chronos2(tmp_path)
    document = json.loads((tmp_path / "tiny.metadata.json").read_text())
    assert document["sha256"] == resolved.metadata.sha256
