"""TimesFM 2.5's ``decode`` as the exported graph computes it: upstream's values, only the work a call reads.

``TimesFM_2p5_200M_torch_module.decode(horizon, inputs, masks)`` runs the model on the context's patches (the
prefill), then, per further output patch of the horizon, on that patch's median fed back as input patches (the
autoregressive steps, each reading the layers' keys and values so far). :func:`decode` is its lines, with three
changes of cost that leave every value upstream's:

- **Heads on the token read.** ``decode`` projects every token through both output heads (the point head, one
  output patch per token; the quantile head, ``os`` steps per token) and then reads one token's: the prefill's
  last, each step's last. The graph projects only that token (a head acts on each token alone: the same
  products on the same values; what that saves: ``benchmarks/results/roofline.md``).
- **The output patches the call asks.** Each autoregressive step runs inside a ``torch.cond`` (an ONNX ``If``)
  taken when the call's ``num_output_patches`` asks for its patch, nested in the step before it: a call of one
  patch runs the prefill alone, whatever the graph's most. Each step only appends to what the steps before it
  computed (upstream's decode is causal), so a call of ``n`` patches gives the first ``n`` patches of the graph's
  most, which is upstream's forecast for that horizon (``tests/test_family_timesfm.py``).
- **The keys and values grow by concatenation.** Upstream writes them into a cache sized for its whole horizon and
  masks the slots not yet written (zero attention weight); here each step attends to exactly the slots written
  (the attention is patched to concatenate: ``timesfm._exportable``), so a step's attention is the same, and a
  branch not taken holds no cache to copy.

Patches not asked are zeros in :func:`decode`'s output, cut by the caller to the patches asked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from distributed_onnx.export.torch_extra import require_torch


@dataclasses.dataclass
class LayerCache:
    """One layer's keys and values written so far (None before the prefill), the masked patches among them and
    how many are written: what the patched attention reads and updates (``timesfm._exportable``)."""

    key: Any = None
    value: Any = None
    num_masked: Any = None
    written: int = 0


def decode(model: Any, inputs: Any, masks: Any, wanted: Any, most: int) -> tuple[Any, Any]:
    """``(outputs [rows, most x o, q], quantile spreads [rows, os, q])`` for normalized ``inputs`` and their
    ``masks`` ``[rows, context]``: upstream's ``decode`` at a horizon of ``most`` output patches, the patches from
    ``wanted`` (a 0-d int64 tensor, 1 to ``most``) on zeros and never computed."""
    from timesfm.torch.util import revin

    torch = require_torch()
    rows = inputs.shape[0]
    patched_inputs = inputs.reshape(rows, -1, model.p)
    patched_masks = masks.reshape(rows, -1, model.p)
    zero = torch.zeros(rows, dtype=inputs.dtype)
    (n, mu, sigma), context_mu, context_sigma = _running_stats(zero, zero, zero, patched_inputs, patched_masks)
    normed = revin(patched_inputs, context_mu, context_sigma, reverse=False)
    normed = torch.where(patched_masks, 0.0, normed)
    caches = [LayerCache() for _ in range(model.x)]
    last = _last_token(model, normed, patched_masks, caches)
    mu_last, sigma_last = context_mu[:, -1:], context_sigma[:, -1:]
    first = revin(model.output_projection_point(last), mu_last, sigma_last, reverse=True)
    first = first.reshape(rows, model.o, model.q)
    spreads = revin(model.output_projection_quantiles(last), mu_last, sigma_last, reverse=True)
    spreads = spreads.reshape(rows, model.os, model.q)
    if most == 1:
        return first, spreads
    state = (first[..., model.aridx], n, mu, sigma, caches[0].num_masked)
    rest = _steps_from(model, 1, most, wanted, state, caches)
    return torch.cat([first, rest], dim=1), spreads


def _steps_from(model: Any, step: int, most: int, wanted: Any, state: tuple[Any, ...], caches: list[Any]) -> Any:
    """``[rows, (most - step) x o, q]``: autoregressive steps ``step`` to ``most - 1``, each taken when ``wanted``
    asks for its patch (zeros otherwise). ``state``: the last patch's median, the running stats, the masked count."""
    torch = require_torch()
    written = caches[0].written
    keys = [cache.key for cache in caches]
    values = [cache.value for cache in caches]
    layers = len(caches)

    def taken(median: Any, n: Any, mu: Any, sigma: Any, num_masked: Any, *kv: Any) -> Any:
        from timesfm.torch.util import revin

        rows = median.shape[0]
        patched = median.reshape(rows, model.m, model.p)
        mask = torch.zeros_like(patched, dtype=torch.bool)
        (n, mu, sigma), step_mu, step_sigma = _running_stats(n, mu, sigma, patched, mask)
        normed = revin(patched, step_mu, step_sigma, reverse=False)
        step_caches = [
            LayerCache(key=kv[index], value=kv[layers + index], num_masked=num_masked, written=written)
            for index in range(layers)
        ]
        last = _last_token(model, normed, mask, step_caches)
        out = revin(model.output_projection_point(last), step_mu[:, -1:], step_sigma[:, -1:], reverse=True)
        out = out.reshape(rows, model.o, model.q)
        if step + 1 == most:
            return out
        following = (out[..., model.aridx], n, mu, sigma, num_masked)
        return torch.cat([out, _steps_from(model, step + 1, most, wanted, following, step_caches)], dim=1)

    def skipped(median: Any, *rest: Any) -> Any:
        return median.new_zeros(median.shape[0], (most - step) * model.o, model.q)

    return torch.cond(wanted > step, taken, skipped, (*state, *keys, *values))


def _running_stats(n: Any, mu: Any, sigma: Any, patches: Any, masks: Any) -> tuple[tuple[Any, Any, Any], Any, Any]:
    """``util.update_running_stats`` over ``patches`` ``[rows, count, p]`` in order, as ``decode`` runs it: the
    last ``(n, mu, sigma)`` and each patch's ``mu`` and ``sigma`` ``[rows, count]``."""
    from timesfm.torch.util import update_running_stats

    torch = require_torch()
    mus, sigmas = [], []
    for index in range(patches.shape[1]):
        (n, mu, sigma), _ = update_running_stats(n, mu, sigma, patches[:, index], masks[:, index])
        mus.append(mu)
        sigmas.append(sigma)
    return (n, mu, sigma), torch.stack(mus, dim=1), torch.stack(sigmas, dim=1)


def _last_token(model: Any, normed: Any, masks: Any, caches: list[LayerCache]) -> Any:
    """The module's ``forward`` up to its heads (tokenizer, the stacked layers writing ``caches``), returning only
    the last token's embedding ``[rows, model_dims]``: the one token whose heads ``decode`` reads."""
    torch = require_torch()
    embeddings = model.tokenizer(torch.cat([normed, masks.to(normed.dtype)], dim=-1))
    for layer, cache in zip(model.stacked_xf, caches, strict=True):
        embeddings, _ = layer(embeddings, masks[..., -1], cache)
    return embeddings[:, -1]
