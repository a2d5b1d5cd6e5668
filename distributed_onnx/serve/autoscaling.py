"""How many replicas serve: a fixed count (``replicas``) or Ray Serve's autoscaling between two bounds.

The fields below are part of :class:`distributed_onnx.serve.settings.ServeSettings` (so each is a flag of
``distributed-onnx serve`` and a key of ``jobs/serve.yaml``'s ``args``); kept here because the rule that ties them
together is their own. Autoscaling is on when ``max_replicas`` is given: Serve's controller then keeps between
``min_replicas`` and ``max_replicas`` replicas, aiming at ``target_ongoing_requests`` requests in each (its
``autoscaling_config``, https://docs.ray.io/en/latest/serve/autoscaling-guide.html). ``replicas`` and the
autoscaling fields are exclusive: a fixed count given together with bounds is refused, naming both, rather than one
of them silently winning.

A replica that starts under load takes traffic only once it is ready: Serve routes to a replica after its
constructor returned and its first health check passed, and the constructor builds the session and runs the
warm-up forecast (``warm_up_rows``, the first batch), so autoscaling refuses ``warm_up_rows: 0``. The ingress is
sized for ``max_replicas`` (:attr:`ReplicaSettings.most_replicas`): several replicas at once go behind HAProxy even
while only one runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from distributed_onnx.bounds import MAX_COUNT, MAX_REPLICAS, MAX_SECONDS

#: The fields that configure autoscaling (``min_replicas`` and ``max_replicas`` turn it on; the others tune it).
AUTOSCALING_FIELDS = (
    "min_replicas",
    "max_replicas",
    "target_ongoing_requests",
    "upscale_delay_s",
    "downscale_delay_s",
    "metrics_interval_s",
    "look_back_period_s",
)


class ReplicaSettings(BaseModel):
    """The replica count: fixed, or autoscaled between bounds (mixed into ``ServeSettings``)."""

    replicas: int = Field(
        default=1,
        gt=0,
        le=MAX_REPLICAS,
        description="A fixed number of replicas, each owning one ONNX Runtime session per model (exclusive with "
        "min_replicas/max_replicas, which autoscale).",
    )
    min_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="Autoscaling: the fewest replicas kept (default 1; zero is refused: a request finding none "
        "would wait for a replica to load its checkpoint).",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="Autoscaling: the most replicas Serve starts under load; giving it turns autoscaling on.",
    )
    target_ongoing_requests: float = Field(
        default=2.0,
        gt=0,
        le=MAX_COUNT,
        description="Autoscaling: requests in flight per replica Serve aims at (more on average: it adds replicas).",
    )
    upscale_delay_s: float = Field(
        default=30.0,
        ge=0,
        le=MAX_SECONDS,
        description="Autoscaling: how long the load must call for more replicas before one starts.",
    )
    downscale_delay_s: float = Field(
        default=600.0,
        ge=0,
        le=MAX_SECONDS,
        description="Autoscaling: how long the load must call for fewer replicas before one stops.",
    )
    metrics_interval_s: float = Field(
        default=10.0,
        gt=0,
        le=MAX_SECONDS,
        description="Autoscaling: how often each replica reports its requests in flight.",
    )
    look_back_period_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SECONDS,
        description="Autoscaling: the window over which requests in flight are averaged.",
    )

    @model_validator(mode="after")
    def _fixed_or_autoscaled(self) -> ReplicaSettings:
        given = self.model_fields_set
        tuning = sorted(name for name in AUTOSCALING_FIELDS if name in given)
        if "replicas" in given and tuning:
            raise ValueError(
                f"replicas (a fixed count, {self.replicas}) and {', '.join(tuning)} (autoscaling) exclude each "
                "other; give either replicas or max_replicas"
            )
        if tuning and self.max_replicas is None:
            raise ValueError(f"{', '.join(tuning)} set autoscaling, which needs max_replicas (the most replicas)")
        if self.max_replicas is not None and self.max_replicas < self.lowest_replicas:
            raise ValueError(f"min_replicas ({self.lowest_replicas}) is above max_replicas ({self.max_replicas})")
        return self

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    @property
    def lowest_replicas(self) -> int:
        return self.min_replicas or 1

    @property
    def most_replicas(self) -> int:
        """The most replicas that may run at once (what the ingress is sized for)."""
        return self.max_replicas if self.max_replicas is not None else self.replicas

    def replica_options(self) -> dict[str, Any]:
        """``num_replicas`` or ``autoscaling_config`` of ``Deployment.options``."""
        if self.max_replicas is None:
            return {"num_replicas": self.replicas}
        return {
            "autoscaling_config": {
                "min_replicas": self.lowest_replicas,
                "initial_replicas": self.lowest_replicas,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
                "metrics_interval_s": self.metrics_interval_s,
                "look_back_period_s": self.look_back_period_s,
            }
        }

    def replica_words(self) -> str:
        """``2 replicas`` or ``1-4 replicas (autoscaling)``, for the ready line."""
        if self.max_replicas is None:
            return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        return f"{self.lowest_replicas}-{self.max_replicas} replicas (autoscaling)"
