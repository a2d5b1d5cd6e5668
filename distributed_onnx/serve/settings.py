"""Serve settings: one typed model for the deployment (replicas, batching, limits) and where it listens.

The same model is filled from ``distributed-onnx serve`` (flags > ``DISTRIBUTED_ONNX_*`` > ``--config`` YAML >
defaults, see :mod:`distributed_onnx.settings_sources`; every field is a flag) and from the ``args`` of a Serve
config file (``jobs/serve.yaml``, via :func:`distributed_onnx.serve.app.app_builder`, which reads only those);
unknown keys and invalid values are errors naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from distributed_onnx import names as path_names
from distributed_onnx.bounds import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_CPUS,
    MAX_GPUS,
    MAX_ROWS_PER_BATCH,
    MAX_SECONDS,
    MAX_WORKERS,
    MIN_RESOURCE_SHARE,
    resource_share,
)
from distributed_onnx.location import Location
from distributed_onnx.model.backend.providers import ProviderChain
from distributed_onnx.model.checkpoint import checkpoint_paths, local_checkpoints
from distributed_onnx.model.worker import WorkerConfig
from distributed_onnx.resources import REFERENCE_CHECKPOINT
from distributed_onnx.runtime.addresses import check_address_or_none
from distributed_onnx.serve.autoscaling import ReplicaSettings
from distributed_onnx.serve.operations.ingress import IngressMode
from distributed_onnx.settings_sources import CommandSettings, CrossKeyError, comma_list
from distributed_onnx.writable import unwritable_problem

LOOPBACK = "127.0.0.1"
#: Requests Serve lets through beyond a replica's admission limit (at least), so the replica itself answers them:
#: a rejection takes microseconds, so few are ever inside at once.
ADMISSION_MARGIN = 64


class ServeSettings(CommandSettings, ReplicaSettings):
    """Everything one online deployment depends on (the replica count: :mod:`distributed_onnx.serve.autoscaling`)."""

    label: ClassVar[str] = "serve settings"

    checkpoint: list[Path] = Field(
        default_factory=lambda: [REFERENCE_CHECKPOINT],
        json_schema_extra={"repeatable": True},
        description="The .onnx checkpoint to serve; repeat the flag (or give a YAML list) to serve several in one "
        "application, each named by its file stem; the first that is not a shadow answers /v1/forecast requests "
        "that name no model (default: the bundled reference one).",
    )
    model_repository: Location | None = Field(
        default=None,
        examples=["s3://bucket/checkpoints"],
        description="Folder or URL (s3://...) of a checkpoint repository: every <name>.onnx there with its "
        "<name>.metadata.json is a model, loaded in a replica on its first request and evicted least recently "
        "used beyond --repository-budget; send the serve_multiplexed_model_id header (the model's name) so "
        "requests go to a replica that holds it. Without --checkpoint no model is held in every replica and "
        "requests must name their model; with it, those checkpoints stay in every replica as well.",
    )
    repository_budget: int = Field(
        default=8,
        gt=0,
        le=MAX_WORKERS,
        description="Repository models one replica holds at once (--model-repository); the least recently used "
        "is evicted to load another.",
    )
    shadow: list[str] = Field(
        default_factory=list,
        examples=["challenger"],
        description="Names (file stems) of checkpoints that are shadows: each forecasts every /v1/forecast request "
        "another model answers, after the answer is sent, and is only logged (--forecast-log), never returned.",
    )
    shadow_fraction: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Share of the answered requests the shadows also forecast, drawn per request id (a replayed "
        "request is drawn the same way): on CPUs a shadow as costly as its primary halves the replica's req/s at "
        "saturation, 0.1 costs a tenth of that. score compares models on the windows both forecast.",
    )
    forecast_log: Location | None = Field(
        default=None,
        description="Folder or URL (s3://...) of the forecast log: every forecast answered and every shadow "
        "forecast, in the backtest's forecast schema, partitioned by day and model; scored by "
        "`distributed-onnx score` (default: no log).",
    )
    forecast_log_max_queued: int = Field(
        default=100_000,
        gt=0,
        le=MAX_COUNT,
        description="Forecasts (one per series) a replica holds for the log before it drops new ones (counted in "
        "/metrics and in the log's _log_state/): a slow or failing sink never delays a request.",
    )
    forecast_log_flush_s: float = Field(
        default=1.0,
        gt=0,
        le=MAX_SECONDS,
        description="How long the log gathers forecasts before it writes a file of them.",
    )
    host: str = Field(
        default=LOOPBACK, min_length=1, description="Address the HTTP proxy listens on (loopback by default)."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port (the one address clients call).")
    grpc_port: int = Field(
        default=8001,
        ge=1,
        le=65535,
        validate_default=True,  # --port 8001 alone is the default gRPC port: refused as a setting (_distinct_ports)
        description="gRPC port of the KServe v2 GRPCInferenceService (as Triton's).",
    )
    ingress: IngressMode = Field(
        default="auto",
        description="How traffic reaches the replicas: auto (direct for one replica, haproxy for several), direct, "
        "haproxy, or proxy (Serve's Python proxy). Applies to the embedded Ray.",
    )
    address: str | None = Field(
        default=None, min_length=1, description="Ray address (default: an embedded local Ray on 127.0.0.1)."
    )
    cpus_per_replica: float = Field(
        default=1.0, ge=MIN_RESOURCE_SHARE, le=MAX_CPUS, description="CPUs per replica; sets ORT's threads."
    )
    gpus_per_replica: float = Field(
        default=0.0, ge=0, le=MAX_GPUS, description="GPUs per replica; fractions share a GPU."
    )
    providers: ProviderChain = Field(
        default=None,
        examples=["cuda,cpu"],
        description="Explicit provider chain, strict (default: the provider policy's, graceful).",
    )
    max_batch_size: int = Field(
        default=16,
        gt=0,
        le=MAX_ROWS_PER_BATCH,
        description="Forecast requests merged into one model call (1 turns batching off).",
    )
    batch_wait_ms: float = Field(
        default=1.0,
        ge=0,
        le=MAX_SECONDS * 1000,
        description="How long a batch waits to fill; one lone client pays at most this.",
    )
    rows_per_batch: int = Field(
        default=1024,
        gt=0,
        le=MAX_ROWS_PER_BATCH,
        description="Windows per model call: merged or large requests are split into such chunks.",
    )
    max_ongoing_requests: int | None = Field(
        default=None,
        gt=0,
        le=MAX_COUNT,
        description="Requests a replica holds at once (default: max(64, 2 x max_batch_size)).",
    )
    max_queued_requests: int = Field(
        default=128,
        gt=0,
        le=MAX_COUNT,
        description="Requests waiting in a replica (beyond max_ongoing_requests) before new ones get 503 + "
        "Retry-After (HTTP) or UNAVAILABLE (gRPC).",
    )
    retry_after_s: float = Field(default=1.0, ge=0, le=MAX_SECONDS, description="Retry-After of an overload 503.")
    request_timeout_s: float = Field(
        default=30.0, gt=0, le=MAX_SECONDS, description="End-to-end HTTP timeout (408 after)."
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        le=MAX_BYTES,
        description="Larger request bodies get 413; gRPC messages above it are refused by gRPC itself "
        "(RESOURCE_EXHAUSTED) before they are parsed.",
    )
    max_request_memory_bytes: int = Field(
        default=1024 * 1024 * 1024,
        gt=0,
        le=MAX_BYTES,
        description="Memory a replica lets its requests in flight hold: each body is charged 40x its size (the "
        "measured worst case of parsing it) before it is read, each forecast its response; requests beyond get "
        "503 + Retry-After. The replica's RSS stays under its idle RSS plus this.",
    )
    health_check_period_s: float = Field(
        default=10.0, gt=0, le=MAX_SECONDS, description="Seconds between replica health checks."
    )
    health_check_timeout_s: float = Field(
        default=30.0, gt=0, le=MAX_SECONDS, description="A health check slower than this fails."
    )
    warm_up_rows: int = Field(
        default=8, ge=0, le=MAX_ROWS_PER_BATCH, description="Rows of the warm-up run at replica start (0 skips)."
    )
    # As the backtest's ready_timeout_s: a published model read onto a cold node takes minutes; a start that
    # cannot finish (replicas Ray has no room for) must still end, in one line.
    ready_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=MAX_SECONDS,
        description="How long serve waits for its replicas to be placed, load their checkpoints and answer readiness "
        "before it stops, naming what they asked and what the cluster had free. Replicas larger than the whole "
        "cluster are refused at once.",
    )
    max_consecutive_model_failures: int = Field(
        default=3,
        gt=0,
        le=MAX_COUNT,
        description="Model calls failing in a row (on valid input) before the replica reports not ready and "
        "Serve replaces it; one success resets the count.",
    )

    @model_validator(mode="after")
    def _warm_when_autoscaled(self) -> ServeSettings:
        if self.autoscaling and self.warm_up_rows == 0:
            raise ValueError(
                "autoscaling starts replicas under load, which must run their first batch before they take traffic: "
                "warm_up_rows must be at least 1"
            )
        return self

    @field_validator("address")
    @classmethod
    def _named_address(cls, value: str | None) -> str | None:
        if value == "auto":
            raise ValueError(
                "serve keeps its Serve instance (controller, proxies) in the Ray it runs on, so it joins a running Ray "
                "only by its address (--address HOST:PORT), not by auto; leave it out for an embedded Ray"
            )
        return check_address_or_none(value)  # the one parse (runtime/addresses.py)

    @field_validator("forecast_log")
    @classmethod
    def _log_writable_there(cls, value: Location | None) -> Location | None:
        """Refused as every other output is, by the one rule (:func:`~distributed_onnx.writable.unwritable_problem`):
        ``s3:/K:S@b/log`` was a local folder ``s3:`` (the credentials in a path on disk, nothing logged to the
        store), ``-`` a folder ``./-``, and ``ftp://...`` was tried only once Ray had started (exit 3, in the
        store's words)."""
        problem = None if value is None else unwritable_problem(value, "folder")
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("grpc_port")
    @classmethod
    def _distinct_ports(cls, value: int, info: ValidationInfo) -> int:
        """A key's error, so that it reads as serve's other setting errors do (``Invalid serve settings: --grpc-port:
        ... [from command line]``), naming the flags; ``port`` is validated before it (declared first)."""
        if value == info.data.get("port"):
            raise CrossKeyError(
                f"is {value}, the same port as --port (HTTP); HTTP and gRPC need a port each: give --grpc-port "
                "another one",
                involves=("port",),
            )
        return value

    #: Local files only: a URL is refused in one line (model/checkpoint.py), never folded into a path.
    _gpu_share = field_validator("gpus_per_replica")(resource_share)  # none, or one of Ray's units at least
    _local = field_validator("checkpoint", mode="before")(local_checkpoints)
    #: Folders and metadata files as the checkpoints they mean (model/checkpoint.py).
    _folders = field_validator("checkpoint")(checkpoint_paths)
    _comma_list = field_validator("shadow", mode="before")(comma_list)

    # forecast_log and model_repository are Locations: an empty text is refused, as every path setting refuses it
    # (for none, leave the setting out).

    @model_validator(mode="before")
    @classmethod
    def _repository_alone(cls, data: Any) -> Any:
        """A repository without --checkpoint holds no model in every replica (not the bundled reference one)."""
        if isinstance(data, dict) and data.get("model_repository") and data.get("checkpoint") is None:
            return {**data, "checkpoint": []}
        return data

    @model_validator(mode="after")
    def _models(self) -> ServeSettings:
        if not self.checkpoint:
            if self.model_repository is None:
                raise ValueError("give at least one checkpoint (or a model_repository)")
            if self.shadow:
                raise ValueError(
                    f"shadow {self.shadow} names no checkpoint: shadows are --checkpoint models (held by every "
                    "replica), not repository ones"
                )
            return self
        names = [path.stem for path in self.checkpoint]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"checkpoints are named by their file stems, and {repeated} names several; rename one")
        unknown = [name for name in self.shadow if name not in names]
        if unknown:
            raise ValueError(f"shadow {unknown} names no checkpoint; the checkpoints are {names}")
        if all(name in self.shadow for name in names):
            raise ValueError(f"every checkpoint ({names}) is a shadow; at least one must answer requests")
        return self

    @property
    def model_names(self) -> list[str]:
        """Every model's name, in the order given: the checkpoints' file stems."""
        return [path.stem for path in self.checkpoint]

    @model_validator(mode="after")
    def _names_are_file_names(self) -> ServeSettings:
        """A model's name becomes a folder of the forecast log and a URL segment: the names rule
        (:mod:`distributed_onnx.names`), the same as every other command's."""
        for name in self.model_names:
            problem = path_names.name_problem(name)
            if problem is not None:
                raise ValueError(f"checkpoint name {path_names.quoted(name)} (its file stem) is refused: {problem}")
        return self

    @model_validator(mode="after")
    def _one_body_fits(self) -> ServeSettings:
        from distributed_onnx.serve.operations.admission import PARSE_BYTES_PER_BODY_BYTE

        needed = self.max_body_bytes * PARSE_BYTES_PER_BODY_BYTE
        if self.max_request_memory_bytes < needed:
            raise ValueError(
                f"max_request_memory_bytes is {self.max_request_memory_bytes}, below what one body of max_body_bytes "
                f"({self.max_body_bytes}) takes to parse ({PARSE_BYTES_PER_BODY_BYTE}x = {needed}); raise it or "
                "lower max_body_bytes"
            )
        return self

    @property
    def model_name(self) -> str | None:
        """The default model: the first checkpoint that is not a shadow (what ``/v1/forecast`` uses without
        ``model``); None with a model repository and no checkpoint (requests name their model)."""
        return next((name for name in self.model_names if name not in self.shadow), None)

    @property
    def ongoing_requests(self) -> int:
        """Requests a replica accepts at once (Serve's ``max_ongoing_requests``, default 5, caps the batch size).

        Room for one batch filling while one runs, and more: requests beyond it wait in Serve's router, which
        retries with backoff, which costs far more in p50 and req/s than a replica-side queue does. Waiting
        inside the replica (its batch queue, or the one model thread) is cheap, so the default is generous;
        ``max_queued_requests`` still bounds the total.
        """
        return self.max_ongoing_requests or max(64, 2 * self.max_batch_size)

    @property
    def admission_limit(self) -> int:
        """Requests a replica holds (running or waiting inside it) before it answers 503 / UNAVAILABLE itself.

        The replica's own check, so an overload answer is JSON with Retry-After on HTTP and UNAVAILABLE on gRPC
        on every ingress; Serve's own limits sit above it (``deployment_options``) and only catch the excess.
        """
        return self.ongoing_requests + self.max_queued_requests

    def worker_config(self, checkpoint: Path | None = None) -> WorkerConfig:
        """The worker of ``checkpoint`` (default: the default model's)."""
        chosen = checkpoint or next(path for path in self.checkpoint if path.stem == self.model_name)
        return WorkerConfig(checkpoint=chosen, providers=self.providers, warm_up_rows=self.warm_up_rows)

    def deployment_options(self) -> dict[str, Any]:
        """Options of the Serve deployment (``Deployment.options(**...)``)."""
        from ray.serve.config import BackpressureConfig

        return {
            **self.replica_options(),
            # Room above the replica's own admission limit, so that requests reach its check and get its answer:
            # Serve also counts requests in its router while it picks a replica, and with a queue of 1 a burst
            # of 30 got Serve's text 503s (measured).
            "max_ongoing_requests": self.admission_limit + max(ADMISSION_MARGIN, self.admission_limit),
            "max_queued_requests": self.admission_limit + ADMISSION_MARGIN,
            "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=self.retry_after_s),
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            # How often a stopping replica checks for in-flight requests; Serve's 2 s default made every exit
            # wait 2 s more than the requests needed (measured).
            "graceful_shutdown_wait_loop_s": 0.1,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica, "num_gpus": self.gpus_per_replica},
        }

    def http_options(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "request_timeout_s": self.request_timeout_s}
