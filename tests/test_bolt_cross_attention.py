"""Chronos-Bolt's export re-associates the decoder's one-query cross-attention: fewer multiply-adds, same forecasts.

The tiny random-weight Bolt (tests/families.py) is exported twice with the package's exporter: as the export does
it, and with the re-association switched off (upstream's ``T5Attention.forward``). The graphs' MatMul/Gemm
multiply-adds for one row, from ONNX shape inference, must differ by exactly what the re-association saves; and
the exported graph's forecasts on gappy windows (NaN inside, a fully missing patch, a short history) must equal
upstream's ``ChronosBoltPipeline.predict``.

Integration tier: real ONNX Runtime sessions; no Ray.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
pytest.importorskip("chronos")

from families import BOLT_CONTEXT, BOLT_STEPS, gappy_series  # noqa: E402

from distributed_onnx.export import chronos_bolt  # noqa: E402
from distributed_onnx.export.graph import context_module, export_context_graph  # noqa: E402

pytestmark = pytest.mark.integration


def graph_multiply_adds(path: Path, batch: int = 1) -> int:
    """The MatMul and Gemm multiply-adds of the graph at ``path`` for ``batch`` rows (every symbolic dim is the
    batch axis, the export's only dynamic one), from the shapes ONNX shape inference gives."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))
    shapes: dict[str, list[int]] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_value if d.HasField("dim_value") else batch for d in dims]
    for initializer in model.graph.initializer:
        shapes[initializer.name] = list(initializer.dims)
    total = 0
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        a, b = shapes[node.input[0]], shapes[node.input[1]]
        if node.op_type == "Gemm":  # 2-D, either side possibly transposed
            trans = {attr.name: attr.i for attr in node.attribute}
            m, k = (a[1], a[0]) if trans.get("transA") else (a[0], a[1])
            n = b[0] if trans.get("transB") else b[1]
            total += m * k * n
            continue
        a = [1, *a] if len(a) == 1 else a
        b = [*b, 1] if len(b) == 1 else b
        rows = int(np.prod(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])), dtype=np.int64))
        total += rows * a[-2] * a[-1] * b[-1]
    return total


@contextlib.contextmanager
def _upstream_cross_attention(model: Any) -> Iterator[None]:
    yield


def _export(pipeline: Any, output: Path) -> Path:
    model = pipeline.model
    one_call = context_module(model, lambda model, context: model(context=context).quantile_preds)
    sample = np.random.default_rng(0).normal(size=(2, BOLT_CONTEXT)).astype(np.float32)
    with chronos_bolt._exportable(model):
        export_context_graph(one_call, sample, output, chronos_bolt.OUTPUT_NAME)
    return output


@pytest.fixture(scope="module")
def pipeline(tiny_bolt_pretrained: Path) -> Any:
    """The session's tiny Bolt (tests/families.py), loaded by upstream's pipeline (its folder only read)."""
    from chronos import ChronosBoltPipeline

    return ChronosBoltPipeline.from_pretrained(str(tiny_bolt_pretrained), local_files_only=True)


def test_cross_attention_skips_projecting_the_encoder_tokens_and_forecasts_stay_upstreams(
    pipeline: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime as ort
    from transformers.models.t5.modeling_t5 import T5Attention

    upstream_forward, cache = T5Attention.forward, pipeline.model.decoder.config.use_cache
    after = _export(pipeline, tmp_path / "after.onnx")
    assert (T5Attention.forward, pipeline.model.decoder.config.use_cache) == (upstream_forward, cache)  # undone
    with monkeypatch.context() as switched_off:
        switched_off.setattr(chronos_bolt, "_one_query_cross_attention", _upstream_cross_attention)
        before = _export(pipeline, tmp_path / "before.onnx")

    config, chronos_config = pipeline.model.config, pipeline.model.chronos_config
    d_model, heads, d_kv = config.d_model, config.num_heads, config.d_kv
    tokens = BOLT_CONTEXT // chronos_config.input_patch_size + int(chronos_config.use_reg_token)  # + its token
    inner = heads * d_kv
    # Per decoder layer, one row: K and V over every encoder token, then q.K and weights.V ...
    upstream = 2 * tokens * d_model * inner + 2 * tokens * inner
    # ... against q through each head's key weights, scores and the weighted sum over E, then the value weights.
    reassociated = 2 * inner * d_model + 2 * heads * d_model * tokens
    saved = config.num_decoder_layers * (upstream - reassociated)
    assert saved > 0
    assert graph_multiply_adds(before) - graph_multiply_adds(after) == saved

    # Gappy windows: scattered NaN, a fully missing patch, a run of NaN, a short history (left-padded here with
    # NaN as the worker does; upstream is given the short tensor).
    series = gappy_series()
    contexts = [series["a"][-BOLT_CONTEXT:], series["b"][:BOLT_CONTEXT].copy(), series["c"][:40]]
    contexts[1][16:24] = np.nan  # one whole patch of 8 missing: the encoder's attention mask
    padded = np.full((len(contexts), BOLT_CONTEXT), np.nan, dtype=np.float32)
    for row, context in enumerate(contexts):
        padded[row, BOLT_CONTEXT - context.size :] = context
    assert np.isnan(padded).any(axis=1).all()
    session = ort.InferenceSession(str(after), providers=["CPUExecutionProvider"])
    ours = session.run(None, {"context": padded})[0]  # [rows, quantiles, steps]
    with torch.no_grad():
        theirs = pipeline.predict([torch.tensor(c, dtype=torch.float32) for c in contexts], BOLT_STEPS).numpy()
    assert ours.shape == theirs.shape
    scale = float(np.abs(theirs).max())
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * scale)
