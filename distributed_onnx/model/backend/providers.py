"""Typed ONNX Runtime execution providers and session options.

Each provider is a small tagged pydantic config that compiles itself to ONNX Runtime's ``(name, options)``
pair with :meth:`to_ort`, so a chain is a list of validated objects rather than parallel lists of strings and
option dicts. The ``kind`` tag lets a chain round-trip through YAML/JSON settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from distributed_onnx.settings_sources import comma_list

#: ONNX Runtime's provider form: ``(provider_name, provider_options)``.
OrtProvider = tuple[str, dict[str, str]]

CPU_PROVIDER_NAME = "CPUExecutionProvider"


class _ProviderConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    #: Whether this provider runs on an NVIDIA GPU (and so needs one assigned to the process).
    needs_gpu: ClassVar[bool] = False


class CpuProvider(_ProviderConfig):
    """ONNX Runtime's default CPU provider; threads are set through :class:`SessionOptionsConfig`."""

    kind: Literal["cpu"] = Field(default="cpu", description="Discriminator tag.")
    use_arena: bool = Field(default=True, description="Use ORT's memory arena for CPU allocations.")

    def to_ort(self) -> OrtProvider:
        return (CPU_PROVIDER_NAME, {"arena_extend_strategy": "kNextPowerOfTwo"} if self.use_arena else {})


#: Default batch-size buckets of a CUDA-graph session (rows): powers of two, so a batch pads to at most twice its
#: size. Only the buckets a run actually meets are captured (on their first batch), each holding its own buffers.
DEFAULT_BATCH_BUCKETS: tuple[int, ...] = tuple(2**power for power in range(4, 15))  # 16 .. 16384


class CudaProvider(_ProviderConfig):
    """The CUDA provider. ``device_id`` is the index among the devices *visible to this process*.

    Under Ray that is the local index after Ray set ``CUDA_VISIBLE_DEVICES`` (usually 0), not the
    physical GPU id that ``ray.get_gpu_ids()`` reports.

    With ``cuda_graph`` (the default) the backend captures one CUDA graph per batch bucket and replays it: each
    batch is copied into device buffers bound once per bucket (padded to the bucket, the padding cut off the
    outputs); what that gains over a plain ``session.run``: ``benchmarks/results/gpu.md`` (``make bench-gpu``).
    A checkpoint that cannot be captured
    (nodes off the CUDA provider, control flow, dynamic axes besides the batch) is refused at load with an
    explicit chain and falls back, with a warning, to running without graphs with a policy-chosen one.
    """

    kind: Literal["cuda"] = Field(default="cuda", description="Discriminator tag.")
    needs_gpu: ClassVar[bool] = True
    device_id: int = Field(default=0, ge=0, description="Local CUDA device index.")
    gpu_mem_limit_bytes: int | None = Field(
        default=None, gt=0, description="Cap on the CUDA arena; None lets ORT grow it as needed."
    )
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field(
        default="HEURISTIC",
        description="How cuDNN picks convolution kernels; EXHAUSTIVE benchmarks every shape it meets.",
    )
    use_tf32: bool = Field(
        default=True,
        description="TF32 matrix multiplies on Ampere and newer (ORT's default, kept). On: GPU forecasts differ "
        "from CPU ones (by how much: benchmarks/results/gpu.md); off: fp32 math, closer to CPU, slower.",
    )
    cuda_graph: bool = Field(
        default=True,
        description="Capture a CUDA graph per batch bucket and replay it (ORT's enable_cuda_graph); checked at "
        "load: an explicit chain raises if the checkpoint cannot be captured, a policy chain falls back.",
    )
    batch_buckets: tuple[int, ...] = Field(
        default=DEFAULT_BATCH_BUCKETS,
        min_length=1,
        description="Batch sizes (rows) a CUDA graph is captured for; a batch runs in the smallest bucket that "
        "holds it. Larger batches are refused (explicit chain) or run without a graph, with a warning (policy).",
    )

    @field_validator("batch_buckets")
    @classmethod
    def _sorted_positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(rows <= 0 for rows in value):
            raise ValueError(f"batch_buckets must be positive row counts, got {list(value)}")
        return tuple(sorted(set(value)))

    def to_ort(self) -> OrtProvider:
        options = {
            "device_id": str(self.device_id),
            "cudnn_conv_algo_search": self.cudnn_conv_algo_search,
            "use_tf32": "1" if self.use_tf32 else "0",
        }
        if self.gpu_mem_limit_bytes is not None:
            options["gpu_mem_limit"] = str(self.gpu_mem_limit_bytes)
        if self.cuda_graph:
            options["enable_cuda_graph"] = "1"
        return ("CUDAExecutionProvider", options)


class TensorRTProvider(_ProviderConfig):
    """The TensorRT provider: builds an engine ahead of time, so keep an engine cache between runs.

    Put a :class:`CudaProvider` after it in the chain: nodes TensorRT cannot take run on CUDA.
    """

    kind: Literal["tensorrt"] = Field(default="tensorrt", description="Discriminator tag.")
    needs_gpu: ClassVar[bool] = True
    device_id: int = Field(default=0, ge=0, description="Local CUDA device index.")
    fp16: bool = Field(default=True, description="Build FP16 engines.")
    engine_cache_dir: Path | None = Field(
        default=None,
        description="Where built engines persist; the first run pays the build, later ones load.",
    )
    timing_cache_dir: Path | None = Field(
        default=None, description="Where layer timings persist; speeds up building engines for new shapes."
    )
    max_workspace_size_bytes: int | None = Field(default=None, gt=0, description="TensorRT builder workspace.")
    builder_optimization_level: int = Field(
        default=3, ge=0, le=5, description="Higher builds longer for (sometimes) faster engines."
    )

    def to_ort(self) -> OrtProvider:
        options = {
            "device_id": str(self.device_id),
            "trt_fp16_enable": "True" if self.fp16 else "False",
            "trt_builder_optimization_level": str(self.builder_optimization_level),
        }
        if self.engine_cache_dir is not None:
            options["trt_engine_cache_enable"] = "True"
            options["trt_engine_cache_path"] = str(self.engine_cache_dir)
        if self.timing_cache_dir is not None:
            options["trt_timing_cache_enable"] = "True"
            options["trt_timing_cache_path"] = str(self.timing_cache_dir)
        if self.max_workspace_size_bytes is not None:
            options["trt_max_workspace_size"] = str(self.max_workspace_size_bytes)
        return ("TensorrtExecutionProvider", options)


class CoreMLProvider(_ProviderConfig):
    """The CoreML provider (Apple GPU / Neural Engine). Needs ``MLProgram`` for modern op coverage."""

    kind: Literal["coreml"] = Field(default="coreml", description="Discriminator tag.")
    model_format: Literal["MLProgram", "NeuralNetwork"] = Field(
        default="MLProgram",
        description="NeuralNetwork fragments the graph and falls back to CPU for many ops.",
    )
    compute_units: Literal["CPUOnly", "CPUAndGPU", "CPUAndNeuralEngine", "ALL"] = Field(
        default="CPUAndGPU",
        description="Allowing the Neural Engine can make CoreML's ahead-of-time compile take minutes.",
    )
    cache_dir: Path | None = Field(default=None, description="CoreML compiled-model cache directory.")

    def to_ort(self) -> OrtProvider:
        options: dict[str, str] = {"ModelFormat": self.model_format, "MLComputeUnits": self.compute_units}
        if self.cache_dir is not None:
            options["ModelCacheDirectory"] = str(self.cache_dir)
        return ("CoreMLExecutionProvider", options)


#: One execution provider, discriminated by ``kind``.
ExecutionProvider = Annotated[
    CpuProvider | CudaProvider | TensorRTProvider | CoreMLProvider, Field(discriminator="kind")
]

_BY_KIND: dict[str, type[_ProviderConfig]] = {
    "cpu": CpuProvider,
    "cuda": CudaProvider,
    "tensorrt": TensorRTProvider,
    "coreml": CoreMLProvider,
}


def parse_provider_chain(value: Any) -> Any:
    """``"cuda,cpu"`` or ``["cuda", {...}]`` -> provider configs; anything else is left to pydantic.

    Read by the one parser of comma lists (:func:`~distributed_onnx.settings_sources.comma_list`): an empty entry
    (``cpu,,``) is refused, as is a provider given twice (``cpu,cpu``, or ``cpu,CPU``), which ONNX Runtime only
    warns of, from each worker."""
    value = comma_list(value)
    if isinstance(value, list):
        chain = [provider_from_kind(item) if isinstance(item, str) else item for item in value]
        kinds = [_kind_of(item) for item in chain]
        twice = sorted({kind for kind in kinds if kind is not None and kinds.count(kind) > 1})
        if twice:
            raise ValueError(f"{twice} given more than once: give each provider once")
        return chain
    return value


def _kind_of(item: Any) -> str | None:
    """A provider's tag (``"cpu"``) from its config or its mapping; None for anything pydantic is left to refuse."""
    if isinstance(item, _ProviderConfig):
        return str(getattr(item, "kind", "")) or None
    kind = item.get("kind") if isinstance(item, dict) else None
    return kind.strip().lower() if isinstance(kind, str) else None


def provider_from_kind(kind: str) -> ExecutionProvider:
    """The default config of a provider named by its tag (``"cuda"``), for command-line flags."""
    try:
        provider = _BY_KIND[kind.strip().lower()]()
    except KeyError:
        msg = f"Unknown execution provider {kind!r}; expected one of {sorted(_BY_KIND)}"
        raise ValueError(msg) from None
    return provider  # type: ignore[return-value]


#: An optional provider chain in settings: accepts configs, tags (``["cuda", "cpu"]``) or ``"cuda,cpu"``.
ProviderChain = Annotated[list[ExecutionProvider] | None, BeforeValidator(parse_provider_chain)]


class SessionOptionsConfig(BaseModel):
    """The ONNX Runtime ``SessionOptions`` this project sets, as typed config.

    ORT ignores ``OMP_NUM_THREADS``: under Ray, set ``intra_op_num_threads`` from the actor's CPU share and
    turn spinning off, or several actors on one node oversubscribe its cores.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    graph_optimization_level: Literal["DISABLE_ALL", "ENABLE_BASIC", "ENABLE_EXTENDED", "ENABLE_ALL"] = Field(
        default="ENABLE_ALL", description="Graph optimizations applied when the session is built."
    )
    intra_op_num_threads: int | None = Field(
        default=None, ge=0, description="Threads inside one operator; None = ORT's default (all cores)."
    )
    inter_op_num_threads: int | None = Field(
        default=None, ge=0, description="Threads across operators (parallel execution mode only)."
    )
    allow_spinning: bool | None = Field(
        default=None,
        description="Whether idle intra-op threads busy-wait; off avoids burning a shared core between calls.",
    )
    optimized_model_path: Path | None = Field(
        default=None, description="Write the optimized graph here (to inspect it or skip optimization later)."
    )
    log_severity_level: int = Field(default=3, ge=0, le=4, description="0 verbose ... 3 error, 4 fatal.")
    cache_optimized_graph: bool = Field(
        default=True,
        description="CPU sessions: save the optimized graph once (a user cache keyed by the graph's content, ONNX "
        "Runtime's version and the level, at most ENABLE_EXTENDED) and load it unoptimized in every later session "
        "(model/backend/optimized_cache.py). Ignored with optimized_model_path or on GPU providers.",
    )
