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
    return f"models: {', '.join(names) or 'none in every replica'}{_repository(settings)}; forecast log: {log}"


def _repository(settings: ServeSettings) -> str:
    if settings.model_repository is None:
        return ""
    location = str(settings.model_repository)
    return f"; model repository: {location} (up to {settings.repository_budget} per replica, loaded on first use)"


def docs_description(settings: ServeSettings) -> str:
    """The OpenAPI description: what the service does, then its models, shadows and log (Markdown)."""
    answering = [name for name in settings.model_names if name not in settings.shadow]
    default = f"`{settings.model_name}`" if settings.model_name else "none"
    lines = [
        DOCS_SUMMARY,
        "",
        f"**Models answering requests** (name them in a request's `model`; without it {default} answers): "
        f"{', '.join(f'`{name}`' for name in answering) or 'none held by every replica'}.",
        "",
        *(
            [
                f"**Model repository**{_repository(settings).split(':', 1)[1]}: list it with `GET /v2/models` "
                "or `POST /v2/repository/index`; send the `serve_multiplexed_model_id` header (the model's name) "
                "to reach a replica that holds it.",
                "",
            ]
            if settings.model_repository is not None
            else []
        ),
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
