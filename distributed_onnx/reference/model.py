"""A small patch transformer that speaks the Chronos-2 tensor contract, as OpenSTEF feeds it.

It exists so distributed benchmarks have a stand-in with roughly the per-window cost of a small foundation
model (~1 M parameters; its throughput: benchmarks/results/backtest.md), not one so cheap that Ray and IO
dominate.

Inputs (``rows`` is dynamic; C = context_length and H = horizon are static):

- ``context`` [rows, C] float32, ``attention_mask`` [rows, C] float32 (1 observed, 0 missing),
- ``group_ids`` [rows] int64: a series' target row and its covariate rows share one id,
- ``future_covariates`` [rows, H] float32 and ``future_covariates_mask`` [rows, H] float32: known-future
  values on covariate rows (mask 1); zeros with mask 0 on target rows.

Output ``quantile_preds`` [rows, Q, H] float32, ascending quantiles (0.1 .. 0.9 by default).

How it works, per row:

1. Instance normalization: ``loc``/``scale`` are the masked mean and mean absolute deviation over the row's
   observed context *and* observed future covariates (a target row has none of the latter, so its statistics
   are its context's). A row with nothing observed, or a constant row, gets ``loc`` 0 / ``scale`` 1, so it
   never divides by zero; normalized values are clipped to +-``clip``. Missing values are replaced by zero
   with ``where`` (not multiplied), so even a NaN under a zero mask cannot leak.
2. Covariates: each row's normalized future covariates (and their mask) are embedded by a small MLP; a row
   with no observed future covariate contributes nothing. Each row then takes the mean embedding of the
   *other* rows of its own group, through a [rows, rows] same-group matrix built from ``group_ids`` (with
   the diagonal removed). Rows of different groups are multiplied by exact zeros, so they cannot influence
   each other: the output for a row is the same alone or batched with other groups.
3. Encoder: the normalized context is cut into patches; each patch's values plus its observed fraction are
   embedded linearly, a learned position embedding is added, and pre-norm transformer layers mix the tokens
   of the row (attention never spans rows). Attention is written with plain ``Linear``/``matmul``/softmax so
   the TorchScript ONNX export is a predictable graph (no ``nn.MultiheadAttention`` fast paths).
4. Head: each token is projected to a few features, flattened, concatenated with the pooled covariate
   embedding and a "group has covariates" flag, and passed through an MLP. A linear context -> horizon skip
   (in normalized space) carries the seasonal shape. Quantiles are the median plus cumulative softplus
   offsets above and below, so they never cross; the result is mapped back with ``loc + scale * q``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 (torch convention)

INPUT_NAMES = ("context", "attention_mask", "group_ids", "future_covariates", "future_covariates_mask")
OUTPUT_NAME = "quantile_preds"
NATIVE_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class ReferenceConfig:
    """Shapes and sizes of the reference model."""

    context_length: int = 512
    output_patch_size: int = 48
    horizon_patches: int = 2
    input_patch_size: int = 16
    d_model: int = 128
    num_heads: int = 4
    num_layers: int = 3
    ff_dim: int = 512
    token_head_dim: int = 16
    hidden_dim: int = 256
    covariate_dim: int = 32
    quantiles: tuple[float, ...] = NATIVE_QUANTILES
    clip: float = 30.0
    dropout: float = 0.0

    @property
    def horizon(self) -> int:
        """Forecast steps emitted: ``output_patch_size * horizon_patches``."""
        return self.output_patch_size * self.horizon_patches

    @property
    def num_patches(self) -> int:
        """Input patches (tokens) the context is cut into."""
        return self.context_length // self.input_patch_size


def masked_loc_scale(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row masked mean and mean absolute deviation, [rows, 1] each; (0, 1) where they are undefined."""
    count = mask.sum(dim=-1, keepdim=True)
    safe_count = torch.clamp(count, min=1.0)
    loc = (values * mask).sum(dim=-1, keepdim=True) / safe_count
    scale = ((values - loc).abs() * mask).sum(dim=-1, keepdim=True) / safe_count
    tiny = 1e-6 * (loc.abs() + 1.0)
    scale = torch.where(scale > tiny, scale, torch.ones_like(scale))
    return loc, scale


class EncoderLayer(nn.Module):
    """Pre-norm self-attention + feed-forward block over one row's tokens, [rows, tokens, d_model]."""

    def __init__(self, d_model: int, num_heads: int, ff_dim: int, dropout: float) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.attention_norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attention_out = nn.Linear(d_model, d_model)
        self.ff_norm = nn.LayerNorm(d_model)
        self.ff_in = nn.Linear(d_model, ff_dim)
        self.ff_out = nn.Linear(ff_dim, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, d_model = x.shape[1], x.shape[2]
        qkv = self.qkv(self.attention_norm(x)).reshape(-1, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [rows, heads, tokens, head_dim]
        weights = torch.softmax((q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1), dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(-1, tokens, d_model)
        x = x + self.dropout(self.attention_out(attended))
        return x + self.dropout(self.ff_out(F.gelu(self.ff_in(self.ff_norm(x)))))


class ReferenceForecaster(nn.Module):
    """Patch transformer with masked instance normalization and same-group covariate pooling (module doc)."""

    def __init__(self, config: ReferenceConfig | None = None) -> None:
        super().__init__()
        self.config = config or ReferenceConfig()
        cfg = self.config
        if cfg.context_length % cfg.input_patch_size:
            msg = f"context_length {cfg.context_length} is not a multiple of {cfg.input_patch_size}"
            raise ValueError(msg)
        self.patch_embed = nn.Linear(cfg.input_patch_size + 1, cfg.d_model)
        self.position = nn.Parameter(torch.randn(1, cfg.num_patches, cfg.d_model) * 0.02)
        self.layers = nn.ModuleList(
            EncoderLayer(cfg.d_model, cfg.num_heads, cfg.ff_dim, cfg.dropout) for _ in range(cfg.num_layers)
        )
        self.final_norm = nn.LayerNorm(cfg.d_model)
        self.token_head = nn.Linear(cfg.d_model, cfg.token_head_dim)
        self.covariate_encoder = nn.Sequential(
            nn.Linear(2 * cfg.horizon, cfg.covariate_dim * 2),
            nn.GELU(),
            nn.Linear(cfg.covariate_dim * 2, cfg.covariate_dim),
        )
        num_quantiles = len(cfg.quantiles)
        self.head = nn.Sequential(
            nn.Linear(cfg.num_patches * cfg.token_head_dim + cfg.covariate_dim + 1, cfg.hidden_dim),
            nn.GELU(),
            nn.Linear(cfg.hidden_dim, num_quantiles * cfg.horizon),
        )
        self.skip = nn.Linear(cfg.context_length, cfg.horizon)
        self.median_index = num_quantiles // 2

    def forward(
        self,
        context: torch.Tensor,
        attention_mask: torch.Tensor,
        group_ids: torch.Tensor,
        future_covariates: torch.Tensor,
        future_covariates_mask: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.config
        observed = attention_mask > 0.5
        known = future_covariates_mask > 0.5
        context_mask = observed.to(context.dtype)
        future_mask = known.to(context.dtype)
        context = torch.where(observed, context, torch.zeros_like(context))
        future = torch.where(known, future_covariates, torch.zeros_like(future_covariates))

        loc, scale = masked_loc_scale(
            torch.cat([context, future], dim=-1), torch.cat([context_mask, future_mask], dim=-1)
        )
        x = torch.clamp((context - loc) / scale, -cfg.clip, cfg.clip) * context_mask
        f = torch.clamp((future - loc) / scale, -cfg.clip, cfg.clip) * future_mask

        pooled, group_has_covariates = self._pool_group_covariates(f, future_mask, group_ids)

        patches = x.reshape(-1, cfg.num_patches, cfg.input_patch_size)
        observed_fraction = context_mask.reshape(-1, cfg.num_patches, cfg.input_patch_size).mean(-1, keepdim=True)
        tokens = self.patch_embed(torch.cat([patches, observed_fraction], dim=-1)) + self.position
        for layer in self.layers:
            tokens = layer(tokens)
        features = self.token_head(self.final_norm(tokens)).reshape(-1, cfg.num_patches * cfg.token_head_dim)
        raw = self.head(torch.cat([features, pooled, group_has_covariates], dim=-1))

        raw = raw.reshape(-1, len(cfg.quantiles), cfg.horizon)
        median = raw[:, self.median_index] + self.skip(x)
        upper = median.unsqueeze(1) + torch.cumsum(F.softplus(raw[:, self.median_index + 1 :]), dim=1)
        lower = median.unsqueeze(1) - torch.cumsum(F.softplus(raw[:, : self.median_index].flip(1)), dim=1)
        normalized = torch.cat([lower.flip(1), median.unsqueeze(1), upper], dim=1)
        return loc.unsqueeze(-1) + scale.unsqueeze(-1) * normalized

    def _pool_group_covariates(
        self, future: torch.Tensor, future_mask: torch.Tensor, group_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean covariate embedding of the *other* rows in each row's group, and whether there are any."""
        has_covariates = (future_mask.sum(dim=-1, keepdim=True) > 0).to(future.dtype)  # [rows, 1]
        embedding = self.covariate_encoder(torch.cat([future, future_mask], dim=-1)) * has_covariates
        index = torch.arange(group_ids.shape[0], device=group_ids.device)
        same_group = group_ids.unsqueeze(1) == group_ids.unsqueeze(0)
        not_self = index.unsqueeze(1) != index.unsqueeze(0)
        others = (same_group & not_self).to(future.dtype)  # [rows, rows], 0 across groups
        count = others @ has_covariates  # [rows, 1]
        pooled = (others @ embedding) / torch.clamp(count, min=1.0)
        return pooled, (count > 0).to(future.dtype)


def pinball_loss(predictions: torch.Tensor, target: torch.Tensor, quantiles: torch.Tensor) -> torch.Tensor:
    """Mean quantile (pinball) loss; ``predictions`` [rows, Q, H], ``target`` [rows, H], ``quantiles`` [Q]."""
    error = target.unsqueeze(1) - predictions
    q = quantiles.view(1, -1, 1)
    return torch.maximum(q * error, (q - 1.0) * error).mean()


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
