"""Wire schemas of the online deployment: ``/v1/forecast`` and the Open Inference Protocol (KServe v2) JSON.

Every request model forbids unknown fields, so a typo is a 4xx naming the field rather than a silently
ignored option, and is strict: a value of another JSON type is a 422 rather than converted (``"y": ["1"]``,
``"y": [true]`` and ``"horizon": "4"`` were taken as numbers). Floats in a forecast history may be ``null``
(missing) but never NaN or infinite; an integer is a number; a timestamp is an ISO 8601 string. A window
appears once per request: one series id twice with one start and history length would be logged as two windows at
the same origin (one series at two origins is two windows); the same origin from other starts and lengths needs the
model's resolution, and is refused where the request is planned for its model
(:func:`~distributed_onnx.serve.wire.forecasting.check_one_window_per_origin`). v2 tensor
``data`` is kept as received (flat row-major, or nested as the protocol also allows) and checked against
``shape`` and ``datatype`` by :mod:`distributed_onnx.serve.wire.protocol`, which names the tensor at fault.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from distributed_onnx.bounds import MAX_SERIES_ID_BYTES, id_bytes
from distributed_onnx.model.quantiles import QuantileLevels

#: Datatypes of the Open Inference Protocol. BYTES and BF16 parse, so that refusing them (in
#: :mod:`distributed_onnx.serve.wire.protocol`) names the tensor; every other one maps to numpy.
Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _bounded_id(series_id: str) -> str:
    """A series id within :data:`~distributed_onnx.bounds.MAX_SERIES_ID_BYTES` (UTF-8 bytes, as every reader counts)."""
    if id_bytes(series_id) > MAX_SERIES_ID_BYTES:
        msg = f"is {id_bytes(series_id):,} bytes in UTF-8; a series id is at most {MAX_SERIES_ID_BYTES:,} bytes"
        raise ValueError(msg)
    return series_id


def _timestamp_text(value: Any) -> Any:
    """A timestamp as a request gives it: ISO 8601 text (or a datetime, from Python), never a number."""
    if value is None or isinstance(value, str | datetime):
        return value
    raise ValueError(f"expected an ISO 8601 timestamp string, got {type(value).__name__}")


#: A timestamp: ISO 8601 text parsed (strict mode would take only a datetime object from Python, refusing the
#: text every JSON client and the Python API's dicts send), any other type refused rather than read as epoch seconds.
Timestamp = Annotated[datetime, BeforeValidator(_timestamp_text), Field(strict=False)]

#: A series id as the routes take it: not empty, at most :data:`~distributed_onnx.bounds.MAX_SERIES_ID_BYTES`.
SeriesId = Annotated[str, Field(min_length=1), AfterValidator(_bounded_id)]


class _Strict(BaseModel):
    """A request's model: unknown fields refused, and no value converted from another JSON type (strict)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --------------------------------------------------------------------------------------------- /v1/forecast


class SeriesHistory(_Strict):
    """One series' history, oldest first, on the checkpoint's grid."""

    series_id: SeriesId = Field(
        description=f"Echoed back in the forecast; at most {MAX_SERIES_ID_BYTES:,} bytes in UTF-8 (as a backtest's)."
    )
    y: list[FiniteFloat | None] = Field(
        min_length=1,
        description="History, oldest first; null = missing. Longer than the context: the last context_length "
        "values are used, as a backtest window would use them.",
    )
    start: Timestamp | None = Field(
        default=None, description="Timestamp of y[0] (UTC if naive); when given, forecasts carry timestamps."
    )


class ForecastRequest(_Strict):
    """Quantile forecasts for many series at once (the efficient way to use a replica on CPU)."""

    series: list[SeriesHistory] = Field(min_length=1, description="The series to forecast.")
    horizon: int | None = Field(default=None, gt=0, description="Steps to forecast; default: the checkpoint's.")
    quantiles: QuantileLevels = Field(
        default=None, description="Levels in (0, 1), ascending; default: the checkpoint's native ones."
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        description="The model to answer (a checkpoint's file stem, as in /v2/models/{name}); default: the "
        "first checkpoint served that is not a shadow.",
    )

    @field_validator("series")
    @classmethod
    def _one_history_per_window(cls, series: list[SeriesHistory]) -> list[SeriesHistory]:
        """Each window once: the forecast log keys a window by series and origin (``start`` plus the history's
        length), so two histories of one series ending at one origin would be two windows of that key, their
        forecasts indistinguishable to ``score``. One series at two origins (histories of other lengths) is two
        windows, as a backtest's."""
        seen: dict[tuple[str, Any, int], int] = {}
        for position, history in enumerate(series):
            key = (history.series_id, history.start, len(history.y))
            if key in seen:
                raise ValueError(
                    f"series_id {history.series_id!r} is given twice with the same start and history length "
                    f"(series {seen[key]} and {position}): one window sent twice; send each window once per request"
                )
            seen[key] = position
        return series


#: The example body of ``/v1/forecast`` on ``/docs`` (Swagger UI's "Try it out" starts from it): the bundled series
#: ``taylor_ew`` (``distributed_onnx/resources/taylor.parquet``) on 20 August 2000, its own values with one missing,
#: the README's serve example (tests/test_serve_docs.py checks both), so ``score`` finds actuals for the forecast.
FORECAST_EXAMPLE: dict[str, Any] = {
    "series": [{"series_id": "taylor_ew", "y": [22869, None, 21806, 21483], "start": "2000-08-20T00:00:00Z"}],
    "horizon": 4,
    "quantiles": [0.1, 0.5, 0.9],
}


class SeriesForecast(BaseModel):
    series_id: str
    quantiles: dict[str, list[float]] = Field(description="Level (e.g. '0.1') -> horizon values.")
    timestamps: list[datetime] | None = Field(default=None, description="Present when the request gave start.")


class ClampedQuantile(BaseModel):
    requested: float = Field(description="A requested level outside the model's native range.")
    served_by: float = Field(description="The native level whose values it gets.")


class ForecastResponse(BaseModel):
    model: str = Field(description="The checkpoint's file stem.")
    forecasts: list[SeriesForecast]
    quantile_clamping: list[ClampedQuantile] | None = Field(
        default=None,
        description="Present when requested levels lie outside the model's native range: each is served by the "
        "nearest native level, so an interval built on it is narrower than its name says (as a backtest's "
        "summary.json records it).",
    )


# --------------------------------------------------------------------------- Open Inference Protocol (v2)


class InferInputTensor(_Strict):
    name: str = Field(min_length=1)
    shape: list[Annotated[int, Field(ge=0)]]
    datatype: Datatype
    parameters: dict[str, Any] | None = Field(
        default=None, description="binary_data_size: the tensor's bytes follow the JSON header (binary extension)."
    )
    data: list[Any] | None = Field(
        default=None,
        description="Row-major tensor data (flat, or nested to the tensor's rank); absent for binary data.",
    )


class RequestedOutput(_Strict):
    name: str = Field(min_length=1)
    parameters: dict[str, Any] | None = None


class InferRequest(_Strict):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[InferInputTensor] = Field(min_length=1)
    outputs: list[RequestedOutput] | None = None


class InferOutputTensor(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = Field(default=None, description="Absent when parameters.binary_data_size is set.")


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[InferOutputTensor]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1 marks a dynamic axis.")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(default_factory=list)
    platform: str = "onnxruntime_onnx"
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ErrorResponse(BaseModel):
    error: str = Field(description="What was wrong, naming the field or tensor.")


class RepositoryIndexRequest(BaseModel):
    """``POST /v2/repository/index`` (Triton's model repository extension); an empty body lists every model."""

    model_config = ConfigDict(extra="forbid")

    ready: bool = Field(default=False, description="Only the models READY in the replica that answers.")
