"""The reference checkpoint: torch/ORT parity of the export path, and the committed file's contract.

Real ONNX Runtime sessions on real ONNX files; no mocks. The parity test needs torch (the ``export`` extra)
and skips without it; the committed-checkpoint tests need only onnxruntime and numpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.reference.data import (
    SEASONALITY,
    Series,
    holdout_origins,
    load_taylor,
    mase,
    model_inputs,
    seasonal_naive,
)
from distributed_onnx.resources import REFERENCE_CHECKPOINT

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

pytestmark = pytest.mark.integration

CHECKPOINT = REFERENCE_CHECKPOINT
CONTEXT_LENGTH, HORIZON, QUANTILES = 512, 96, 9


def _session(path: Path) -> InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _run(session: InferenceSession, inputs: dict[str, np.ndarray]) -> np.ndarray:
    output: np.ndarray = session.run(["quantile_preds"], inputs)[0]
    return output


def _take(inputs: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {name: np.ascontiguousarray(value[rows]) for name, value in inputs.items()}


def _random_inputs(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """Load-like rows in a few groups, with gaps, one all-missing row and covariate rows."""
    level = rng.uniform(100.0, 30_000.0, size=(rows, 1))
    phase = np.arange(CONTEXT_LENGTH) * 2 * np.pi / 48
    context = level * (1 + 0.2 * np.sin(phase) + 0.05 * rng.standard_normal((rows, CONTEXT_LENGTH)))
    mask = (rng.random((rows, CONTEXT_LENGTH)) > 0.1).astype(np.float32)
    mask[0, : rng.integers(1, CONTEXT_LENGTH)] = 0.0
    if rows > 2:
        mask[2] = 0.0
    covariate_rows = np.arange(rows) % 3 == 1
    future = np.where(covariate_rows[:, None], rng.standard_normal((rows, HORIZON)), 0.0)
    return {
        "context": (context * mask).astype(np.float32),
        "attention_mask": mask,
        "group_ids": rng.integers(0, max(rows // 3, 1), size=rows).astype(np.int64),
        "future_covariates": future.astype(np.float32),
        "future_covariates_mask": np.repeat(covariate_rows[:, None], HORIZON, axis=1).astype(np.float32),
    }


def test_torch_and_onnxruntime_agree_on_a_freshly_exported_model(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="needs torch (the 'export' extra)")
    from distributed_onnx.reference.export import export_onnx
    from distributed_onnx.reference.training import TrainingConfig, predict, train

    torch.set_num_threads(2)
    model, _ = train(load_taylor(), training=TrainingConfig(steps=15, groups_per_batch=16))
    path = tmp_path / "fresh.onnx"
    path.write_bytes(export_onnx(model))
    session = _session(path)

    rng = np.random.default_rng(7)
    for rows in (1, 17):
        inputs = _random_inputs(rng, rows)
        expected = predict(model, inputs)
        actual = _run(session, inputs)
        assert actual.shape == (rows, QUANTILES, HORIZON)
        scale = np.abs(inputs["context"]).max(axis=1, keepdims=True)[:, :, None] + 1.0
        np.testing.assert_allclose(actual / scale, expected / scale, atol=1e-4, err_msg=f"rows={rows}")


@pytest.fixture(scope="module")
def committed() -> ResolvedCheckpoint:
    return LocalCheckpoint(path=CHECKPOINT).resolve()  # verifies the recorded sha256


@pytest.fixture(scope="module")
def session(committed: ResolvedCheckpoint) -> InferenceSession:
    return _session(committed.weights_path)


@pytest.fixture(scope="module")
def taylor() -> Series:
    return load_taylor()


def test_committed_checkpoint_io_matches_its_metadata(committed: ResolvedCheckpoint, session: InferenceSession) -> None:
    meta = committed.metadata
    assert meta.sha256 is not None
    assert meta.model_family == "chronos2"
    assert (meta.context_length, meta.horizon_length, meta.resolution_minutes) == (
        CONTEXT_LENGTH,
        HORIZON,
        30,
    )
    assert [node.name for node in session.get_inputs()] == meta.input_names
    shapes = {node.name: (node.type, node.shape) for node in session.get_inputs()}
    assert shapes == {
        "context": ("tensor(float)", ["rows", CONTEXT_LENGTH]),
        "attention_mask": ("tensor(float)", ["rows", CONTEXT_LENGTH]),
        "group_ids": ("tensor(int64)", ["rows"]),
        "future_covariates": ("tensor(float)", ["rows", HORIZON]),
        "future_covariates_mask": ("tensor(float)", ["rows", HORIZON]),
    }
    [output] = session.get_outputs()
    assert (output.name, output.type) == (meta.output_name, "tensor(float)")
    assert output.shape == ["rows", len(meta.native_quantiles), meta.horizon_length]


def _three_groups(taylor: Series) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Three windows as groups 70, 5, 123 (two with a weekend-flag covariate row), rows interleaved."""
    origins = holdout_origins(taylor.y.size, HORIZON, step=SEASONALITY)[[0, 7, 13]]
    inputs, _ = model_inputs(taylor, origins, CONTEXT_LENGTH, HORIZON, with_covariate=True)
    inputs["group_ids"] = np.array([70, 5, 123, 70, 5, 123], dtype=np.int64)
    inputs["attention_mask"][1, 200:300] = 0.0  # a gap in group 5's target
    inputs["context"][1, 200:300] = 0.0
    order = np.array([0, 4, 1, 3, 2])  # group 123 without its covariate row; rows interleaved
    batch = _take(inputs, order)
    groups = [np.flatnonzero(batch["group_ids"] == group) for group in (70, 5, 123)]
    return batch, groups


def test_groups_do_not_influence_each_other(session: InferenceSession, taylor: Series) -> None:
    batch, groups = _three_groups(taylor)
    batched = _run(session, batch)
    for rows in groups:
        alone = _run(session, _take(batch, rows))
        np.testing.assert_allclose(batched[rows], alone, rtol=1e-5, atol=1e-2)


def test_a_covariate_row_changes_its_own_groups_forecast(session: InferenceSession, taylor: Series) -> None:
    batch, groups = _three_groups(taylor)
    target, covariate = groups[0]  # group 70: target row first, then its weekend-flag row
    with_covariate = _run(session, _take(batch, np.array([target, covariate])))[0]
    without = _run(session, _take(batch, np.array([target])))[0]
    assert np.abs(with_covariate - without).mean() > 1.0  # MW: the covariate path is not dead weight


def test_quantiles_are_monotone_and_finite_even_without_observations(session: InferenceSession, taylor: Series) -> None:
    batch, _ = _three_groups(taylor)
    batch["context"][0] = 0.0
    batch["attention_mask"][0] = 0.0  # nothing observed at all
    batch["context"][1, :10] = np.nan  # NaN under a zero mask must not leak either
    batch["attention_mask"][1, :10] = 0.0
    output = _run(session, batch)
    assert np.isfinite(output).all()
    # The trained head is monotone by construction (the median plus or minus cumulative softplus steps:
    # reference/model.py); this checks that the exported graph kept that construction on degenerate inputs,
    # where a lost head (or a NaN leaking past the mask, which isfinite above also catches) would show.
    assert (np.diff(output, axis=1) >= 0).all()
    # ... and did not collapse to one value: the outer quantiles stay apart in every row and step.
    assert (output[:, -1] - output[:, 0] > 0).all()


def test_median_beats_seasonal_naive_on_held_out_days(session: InferenceSession, taylor: Series) -> None:
    origins = holdout_origins(taylor.y.size, HORIZON, step=SEASONALITY)
    inputs, target_rows = model_inputs(taylor, origins, CONTEXT_LENGTH, HORIZON, with_covariate=False)
    median = _run(session, inputs)[target_rows, QUANTILES // 2]
    model_mase = mase(taylor.y, origins, median)
    naive_mase = mase(taylor.y, origins, seasonal_naive(taylor.y, origins, HORIZON))
    assert model_mase / naive_mase < 1.0, f"model MASE {model_mase:.3f} vs seasonal naive {naive_mase:.3f}"
