"""Training the reference forecaster on the bundled Taylor series (CPU, seconds to a couple of minutes).

Each training example is one group: the load series' target row and, half of the time, a covariate row
carrying the weekend flag (past values in ``context``, known-future values in ``future_covariates``).
Examples are drawn from the series before the held-out tail only. Contexts are randomly shortened (left
padding with mask 0) and punched with missing values, so the model learns to rely on the mask. Rows are
shuffled and group ids are random, so nothing depends on row order or id values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from distributed_onnx.reference.data import HOLDOUT_POINTS, Series, weekend_flag
from distributed_onnx.reference.model import (
    ReferenceConfig,
    ReferenceForecaster,
    masked_loc_scale,
    pinball_loss,
)


@dataclass(frozen=True)
class TrainingConfig:
    """Optimization settings."""

    # ~2 minutes on 2 idle CPU threads: enough for the transformer to beat seasonal naive by a wide margin.
    steps: int = 1500
    groups_per_batch: int = 32
    learning_rate: float = 2e-3
    weight_decay: float = 1e-4
    covariate_probability: float = 0.5
    short_context_probability: float = 0.15
    missing_probability: float = 0.3
    seed: int = 0


def seed_everything(seed: int) -> np.random.Generator:
    """Seed torch and return a numpy generator (the only sources of randomness used here)."""
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def sample_batch(
    series: Series,
    config: ReferenceConfig,
    training: TrainingConfig,
    rng: np.random.Generator,
    train_end: int,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """One shuffled batch of groups; returns the named inputs, target row indices and their actuals [B, H]."""
    length, horizon = config.context_length, config.horizon
    flag = weekend_flag(series.timestamps_us)
    origins = rng.integers(length, train_end - horizon + 1, size=training.groups_per_batch)
    group_ids = rng.choice(1 << 40, size=training.groups_per_batch, replace=False)
    rows: list[tuple[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray]] = []
    targets = []
    for origin, group in zip(origins, group_ids, strict=True):
        context = series.y[origin - length : origin].astype(np.float32)
        mask = np.ones(length, dtype=np.float32)
        if rng.random() < training.short_context_probability:
            mask[: rng.integers(0, length - 48)] = 0.0
        if rng.random() < training.missing_probability:
            start = rng.integers(0, length)
            mask[start : start + rng.integers(1, 97)] = 0.0
            mask[rng.random(length) < 0.05] = 0.0
        no_future = np.zeros(horizon, dtype=np.float32)
        rows.append((context * mask, mask, int(group), no_future, no_future))
        targets.append(series.y[origin : origin + horizon])
        if rng.random() < training.covariate_probability:
            past, future = flag[origin - length : origin], flag[origin : origin + horizon]
            rows.append((past, np.ones(length, np.float32), int(group), future, np.ones(horizon, np.float32)))
    order = rng.permutation(len(rows))
    shuffled = [rows[i] for i in order]
    position = {int(row): new for new, row in enumerate(order)}
    target_rows = np.array([position[i] for i, row in enumerate(rows) if not row[4].any()])
    inputs = {
        "context": torch.from_numpy(np.stack([r[0] for r in shuffled])),
        "attention_mask": torch.from_numpy(np.stack([r[1] for r in shuffled])),
        "group_ids": torch.tensor([r[2] for r in shuffled], dtype=torch.int64),
        "future_covariates": torch.from_numpy(np.stack([r[3] for r in shuffled])),
        "future_covariates_mask": torch.from_numpy(np.stack([r[4] for r in shuffled])),
    }
    return inputs, torch.from_numpy(target_rows), torch.from_numpy(np.stack(targets).astype(np.float32))


def train(
    series: Series,
    config: ReferenceConfig | None = None,
    training: TrainingConfig | None = None,
    holdout: int = HOLDOUT_POINTS,
    log_every: int = 0,
) -> tuple[ReferenceForecaster, float]:
    """Train on all but the last ``holdout`` points with the pinball loss; returns (model, seconds)."""
    config = config or ReferenceConfig()
    training = training or TrainingConfig()
    rng = seed_everything(training.seed)
    model = ReferenceForecaster(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=training.learning_rate, total_steps=max(training.steps, 1), pct_start=0.1
    )
    quantiles = torch.tensor(config.quantiles)
    train_end = series.y.size - holdout
    started = time.perf_counter()
    model.train()
    for step in range(training.steps):
        inputs, target_rows, actuals = sample_batch(series, config, training, rng, train_end)
        predictions = model(**inputs)[target_rows]
        mask = inputs["attention_mask"][target_rows]
        _, scale = masked_loc_scale(inputs["context"][target_rows] * mask, mask)
        # Loss in each row's normalized units, so every window weighs the same whatever its level.
        loss = pinball_loss(predictions / scale.unsqueeze(-1), actuals / scale, quantiles)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if log_every and (step % log_every == 0 or step == training.steps - 1):
            print(f"step {step:5d}  pinball {loss.item():.4f}  ({time.perf_counter() - started:.1f} s)")
    model.eval()
    return model, time.perf_counter() - started


def predict(model: ReferenceForecaster, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Run the torch model on named numpy inputs; returns ``quantile_preds`` as numpy."""
    with torch.no_grad():
        output: np.ndarray = model(**{name: torch.from_numpy(value) for name, value in inputs.items()}).numpy()
    return output
