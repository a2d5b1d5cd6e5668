"""What a running service says it serves: the ready line's models and ``/docs``' description.

The ready line named the default model only, and ``/docs`` no model at all: someone who started a primary, a
shadow and a log could not see from either that all three were on. Both read these functions.
"""

from __future__ import annotations

from distributed_onnx.serve.settings import ServeSettings

__all__ = ["DOCS_SUMMARY", "docs_description", "served_models"]

DOCS_SUMMARY = "Quantile forecasts from an ONNX checkpoint: /v1/forecast and the Open Inference Protocol (v2)."


def served_models(settings: ServeSettings) -> str:
    """``a (default), b, c (shadow, 10% of requests); forecast log: DIR`` (or ``forecast log: off``)."""
    names = []
    for name in settings.model_names:
        if name in settings.shadow:
            share = "" if settings.shadow_fraction == 1.0 else f", {settings.shadow_fraction:.0%} of requests"
            names.append(f"{name} (shadow{share})")
        else:
            names.append(f"{name} (default)" if name == settings.model_name else name)
    log = "off" if settings.forecast_log is None else str(settings.forecast_log)
    return f"models: {', '.join(names)}; forecast log: {log}"


def docs_description(settings: ServeSettings) -> str:
    """The OpenAPI description: what the service does, then its models, shadows and log (Markdown)."""
    answering = [name for name in settings.model_names if name not in settings.shadow]
    lines = [
        DOCS_SUMMARY,
        "",
        f"**Models answering requests** (name them in a request's `model`; without it `{settings.model_name}` "
        f"answers): {', '.join(f'`{name}`' for name in answering)}.",
        "",
        "**Shadows** (forecast the answered requests, logged only, never returned): "
        + (
            ", ".join(f"`{name}`" for name in settings.shadow)
            + ("" if settings.shadow_fraction == 1.0 else f" ({settings.shadow_fraction:.0%} of requests)")
            if settings.shadow
            else "none"
        )
        + ".",
        "",
        "**Forecast log**: "
        + (
            "off"
            if settings.forecast_log is None
            else f"`{settings.forecast_log}` (score it with `distributed-onnx score`)"
        )
        + ".",
    ]
    return "\n".join(lines)
