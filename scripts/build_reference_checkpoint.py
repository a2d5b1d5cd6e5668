"""Train the reference patch transformer on the bundled Taylor series and write it as a Chronos-2-contract checkpoint.

    python scripts/build_reference_checkpoint.py            # ~2-4 minutes on 2 CPU cores

Trains on all but the last 21 days (1,008 half-hours), exports to ONNX (opset 17, dynamic ``rows`` axis,
weights embedded), checks the graph in ONNX Runtime against torch for rows = 1, 3 and 64, scores the ORT
model's median against the seasonal-naive baseline (m = 48) on the held-out windows, and writes
``distributed_onnx/resources/reference/taylor_chronos2_patchtst.onnx`` plus its ``.metadata.json``.
Needs the ``export`` extra (torch, onnx) and onnxruntime.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from distributed_onnx.model.checkpoint import CheckpointMetadata, write_checkpoint
from distributed_onnx.reference.data import (
    HOLDOUT_POINTS,
    SEASONALITY,
    Series,
    holdout_origins,
    load_taylor,
    mase,
    model_inputs,
    seasonal_naive,
    taylor_path,
)
from distributed_onnx.reference.export import OPSET_VERSION, export_onnx
from distributed_onnx.reference.model import (
    INPUT_NAMES,
    NATIVE_QUANTILES,
    OUTPUT_NAME,
    ReferenceConfig,
    ReferenceForecaster,
    count_parameters,
)
from distributed_onnx.reference.training import TrainingConfig, predict, train
from distributed_onnx.resources import REFERENCE_CHECKPOINT

DEFAULT_OUTPUT = REFERENCE_CHECKPOINT
PARITY_RTOL = 1e-5  # relative: one float32 ulp at 30,000 MW is ~0.004 MW


def verify_in_onnxruntime(model: ReferenceForecaster, model_bytes: bytes, series: Series) -> ort.InferenceSession:
    """The graph loads in ORT and matches torch for rows = 1, 3 and 64 (mixed groups, covariates, gaps)."""
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    if names != list(INPUT_NAMES):
        raise RuntimeError(f"ORT session inputs are {names}, expected {list(INPUT_NAMES)}")
    cfg = model.config
    for rows in (1, 3, 64):
        origins = holdout_origins(series.y.size, cfg.horizon, step=1)[:rows]
        inputs, _ = model_inputs(series, origins, cfg.context_length, cfg.horizon, with_covariate=rows > 1)
        inputs = {name: value[:rows] for name, value in inputs.items()}
        inputs["attention_mask"][0, :100] = 0.0
        inputs["context"][0, :100] = 0.0
        actual = session.run([OUTPUT_NAME], inputs)[0]
        expected = predict(model, inputs)
        if actual.shape != (rows, len(cfg.quantiles), cfg.horizon):
            raise RuntimeError(f"ORT output shape {actual.shape} for rows={rows}")
        gap = float(np.max(np.abs(actual - expected) / np.maximum(np.abs(expected), 1.0)))
        print(f"ORT vs torch, rows={rows:2d}: max relative difference {gap:.1e}")
        if gap > PARITY_RTOL:
            raise RuntimeError(f"ORT and torch differ by {gap:.1e} (relative) for rows={rows}; max {PARITY_RTOL}")
    return session


def evaluate(session: ort.InferenceSession, series: Series, cfg: ReferenceConfig) -> dict[str, float]:
    """Held-out MASE (m = 48) of the ORT median and of seasonal naive, by origin spacing and covariate use."""
    scores: dict[str, float] = {}
    median = len(cfg.quantiles) // 2
    for step in (SEASONALITY, 1):
        origins = holdout_origins(series.y.size, cfg.horizon, step)
        scores[f"naive_step{step}"] = mase(series.y, origins, seasonal_naive(series.y, origins, cfg.horizon))
        for with_covariate in (False, True):
            inputs, target_rows = model_inputs(series, origins, cfg.context_length, cfg.horizon, with_covariate)
            quantiles = session.run([OUTPUT_NAME], inputs)[0][target_rows]
            if not np.all(np.diff(quantiles, axis=1) >= 0):
                raise RuntimeError("quantiles cross on held-out windows")
            key = f"model{'_cov' if with_covariate else ''}_step{step}"
            scores[key] = mase(series.y, origins, quantiles[:, median])
            print(
                f"held-out origins every {step:2d} step(s) ({origins.size} windows), "
                f"{'with' if with_covariate else 'no  '} weekend covariate: MASE model {scores[key]:.3f} "
                f"vs seasonal naive {scores[f'naive_step{step}']:.3f} "
                f"(ratio {scores[key] / scores[f'naive_step{step}']:.3f})"
            )
    return scores


def describe(parameters: int, cfg: ReferenceConfig, scores: dict[str, float]) -> str:
    """The metadata ``description``: what the file is and how good it is, for whoever finds it alone."""
    ratio = scores["model_step48"] / scores["naive_step48"]
    return (
        f"Reference patch transformer ({parameters:,} parameters: {cfg.num_patches} patch tokens of "
        f"{cfg.input_patch_size}, {cfg.num_layers} pre-norm encoder layers, d_model {cfg.d_model}, "
        f"{cfg.num_heads} heads, ff {cfg.ff_dim}) speaking the Chronos-2 tensor contract, sized to cost about "
        f"as much per window as a ~1M-parameter foundation model; trained by "
        f"scripts/build_reference_checkpoint.py on the bundled Taylor (2003) England & Wales half-hourly "
        f"demand "
        f"(pmdarima, MIT) minus its last 21 days. Held-out MASE (m=48, horizon 96, origins every 48 steps, "
        f"{HOLDOUT_POINTS} points): model median {scores['model_step48']:.3f} vs seasonal naive "
        f"{scores['naive_step48']:.3f} (ratio {ratio:.3f}); with the weekend-flag covariate row "
        f"{scores['model_cov_step48']:.3f}. Not a real foundation model: for tests and demos."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=taylor_path(), help="long-format Parquet (one series)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="checkpoint .onnx path")
    parser.add_argument("--steps", type=int, default=TrainingConfig.steps, help="training steps")
    parser.add_argument("--seed", type=int, default=TrainingConfig.seed, help="random seed")
    args = parser.parse_args(argv)

    torch.set_num_threads(2)
    series = load_taylor(args.data)
    config = ReferenceConfig()
    model, seconds = train(series, config, TrainingConfig(steps=args.steps, seed=args.seed), log_every=250)
    parameters = count_parameters(model)
    print(f"trained {parameters:,} parameters in {seconds:.1f} s")

    model_bytes = export_onnx(model)
    print(
        f"exported ONNX opset {OPSET_VERSION} with the TorchScript exporter (dynamo=False): {len(model_bytes):,} bytes"
    )
    session = verify_in_onnxruntime(model, model_bytes, series)
    scores = evaluate(session, series, config)
    if scores["model_step48"] >= scores["naive_step48"]:
        raise SystemExit("the model does not beat seasonal naive on the held-out windows; not writing it")

    metadata = CheckpointMetadata(
        model_family="chronos2",
        input_names=list(INPUT_NAMES),
        output_name=OUTPUT_NAME,
        native_quantiles=list(NATIVE_QUANTILES),
        context_length=config.context_length,
        output_patch_size=config.output_patch_size,
        horizon_patches=config.horizon_patches,
        # Its head emits the whole horizon at once, trained on all of it: a shorter horizon is its first steps.
        short_horizon="first_steps",
        resolution_minutes=30,
        precision="fp32",
        static_shapes=False,
        description=describe(parameters, config, scores),
        # Trained on every point but the last HOLDOUT_POINTS: windows starting at or before this are in-sample.
        training_data_end=datetime.fromtimestamp(
            int(series.timestamps_us[series.y.size - HOLDOUT_POINTS - 1]) / 1e6, tz=UTC
        ),
    )
    resolved = write_checkpoint(args.output, model_bytes, metadata)
    print(f"wrote {resolved.weights_path} (sha256 {resolved.metadata.sha256})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
