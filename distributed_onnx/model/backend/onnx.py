"""ONNX Runtime backend: the one module of the package that imports ``onnxruntime``.

Builds one :class:`onnxruntime.InferenceSession` from a resolved checkpoint with a typed provider chain, checks
the graph against the metadata, validates every batch before ORT sees it, and converts ORT's exceptions into
the project's own (with the tensor names and shapes) at this boundary, once.

On CUDA the backend takes the fastest correct path for where the inputs are: plain ``session.run`` from numpy;
IOBinding from numpy only moves the same copies (it measured slower), so it is not used; with CUDA graphs
(``CudaProvider.cuda_graph``, the default) every batch is copied into device buffers bound once per batch
bucket and the bucket's graph is replayed (pinned host buffers, asynchronous copies, graph replay, output
back), see ``graph_runner.py``. Without graphs, device tensors (torch) are bound where they lie, and
:meth:`OnnxBackend.run_on_device` leaves the outputs on the GPU either way. Each path's throughput:
``benchmarks/results/gpu.md`` (``make bench-gpu``).
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from distributed_onnx.errors import (
    BackendClosedError,
    CheckpointCorruptError,
    CheckpointGraphMismatchError,
    InferenceError,
    MissingExtraError,
)
from distributed_onnx.model.backend import optimized_cache
from distributed_onnx.model.backend.policy import (
    DefaultProviderPolicy,
    HostCapabilities,
    ProviderPolicy,
    check_allowed,
    check_realized,
)
from distributed_onnx.model.backend.providers import (
    DEFAULT_BATCH_BUCKETS,
    CpuProvider,
    CudaProvider,
    ExecutionProvider,
    SessionOptionsConfig,
)
from distributed_onnx.model.backend.session_info import GPU_PROVIDERS, captures, check_graph, device_id
from distributed_onnx.model.backend.validation import TensorSpec, validate_inputs
from distributed_onnx.model.checkpoint import CheckpointMetadata, ResolvedCheckpoint

if TYPE_CHECKING:  # the CUDA path is imported where a GPU session needs it, never on the CPU path (_graph_chain)
    from distributed_onnx.model.backend.cuda.graph_runner import GraphRunner
    from distributed_onnx.model.backend.cuda.transfers import TransferKind

try:
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError.for_package("onnxruntime", "cpu") from exc

# onnxruntime-gpu loads the CUDA/cuDNN libraries from the nvidia-* wheels only if asked; without this the CUDA
# provider silently falls back to CPU on machines without a system CUDA. A no-op on the CPU build.
if hasattr(ort, "preload_dlls"):
    try:
        ort.preload_dlls()
    except Exception:  # pragma: no cover - depends on the GPU libraries present
        logging.getLogger(__name__).debug("onnxruntime.preload_dlls() failed", exc_info=True)

logger = logging.getLogger(__name__)

_ORT_TYPES: dict[str, np.dtype[Any]] = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in {
        "float": np.float32,
        "float16": np.float16,
        "double": np.float64,
        "int8": np.int8,
        "int16": np.int16,
        "int32": np.int32,
        "int64": np.int64,
        "uint8": np.uint8,
        "uint16": np.uint16,
        "uint32": np.uint32,
        "uint64": np.uint64,
        "bool": np.bool_,
    }.items()
}


def available_providers() -> list[str]:
    """Execution providers this ONNX Runtime build offers on this host."""
    return list(ort.get_available_providers())


def detect_host(*, gpu_assigned: bool = True) -> HostCapabilities:
    """This process's platform and ONNX Runtime's available providers: the one impure call of provider selection.

    Here rather than on :class:`HostCapabilities`, whose policy module must load without ONNX Runtime.
    ``gpu_assigned``: whether this process was given a GPU (a Ray actor without ``num_gpus`` was not).
    """
    return HostCapabilities(
        platform=platform.system().lower(),
        available_providers=frozenset(available_providers()),
        gpu_assigned=gpu_assigned,
    )


def runtime_version() -> str:
    """The installed ONNX Runtime version."""
    return str(ort.__version__)


class OnnxBackend:
    """An :class:`~distributed_onnx.model.backend.protocol.InferenceBackend` over one ONNX Runtime session.

    On the bundled reference checkpoint (a Chronos-2 contract), with its family's adapter making the tensors:

    >>> import numpy as np
    >>> from distributed_onnx import LocalCheckpoint, OnnxBackend
    >>> from distributed_onnx.model.adapters.chronos2 import Chronos2Adapter
    >>> from distributed_onnx.resources import REFERENCE_CHECKPOINT
    >>> checkpoint = LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve()
    >>> adapter = Chronos2Adapter(checkpoint.metadata)
    >>> days = np.sin(np.arange(512) * 2 * np.pi / 48) + 30.0  # two windows of half-hourly history
    >>> inputs, rows = adapter.build_inputs(np.stack([days, days + 1.0]), None)
    >>> with OnnxBackend.from_checkpoint(checkpoint) as backend:  # no GPU here: the policy picks the CPU
    ...     backend.providers
    ...     outputs = backend.run(inputs)
    ['CPUExecutionProvider']
    >>> forecast = adapter.decode(outputs, rows)  # [windows, quantiles, steps]
    >>> forecast.shape
    (2, 9, 96)
    >>> bool((forecast[:, 0] <= forecast[:, 8]).all())  # the 0.1 quantile below the 0.9 one
    True
    >>> backend.run(inputs)
    Traceback (most recent call last):
    ...
    distributed_onnx.errors.BackendClosedError: This OnnxBackend was closed; build a new one to run the model again.
    """

    def __init__(self, metadata: CheckpointMetadata, session: Any) -> None:
        """Wrap a session the caller built and owns; prefer :meth:`from_checkpoint`.

        Inputs are checked for what ORT would reject (names, dtypes, ranks, fixed dims), not for their values:
        which values may be NaN is the model family's rule (:mod:`distributed_onnx.model.adapters`).
        """
        self._metadata = metadata
        self._session: Any | None = session
        self._input_specs = [_spec(node) for node in session.get_inputs()]
        self._output_specs = [_spec(node) for node in session.get_outputs()]
        self._output_names = [spec.name for spec in self._output_specs]
        self._providers = list(session.get_providers())
        self._device_id = device_id(session)
        # A session built with enable_cuda_graph must only run through its buckets (a plain run would capture).
        self._graphs = self._graph_runner(DEFAULT_BATCH_BUCKETS, True, "auto") if captures(session) else None

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: ResolvedCheckpoint,
        providers: Sequence[ExecutionProvider] | None = None,
        session_options: SessionOptionsConfig | None = None,
        policy: ProviderPolicy | None = None,
        *,
        transfers: TransferKind = "auto",
        host: HostCapabilities | None = None,
    ) -> OnnxBackend:
        """Load ``checkpoint`` into a new session.

        ``providers`` given: that chain, strictly (an accelerator not realized raises). ``providers=None``:
        ``policy`` (default :class:`DefaultProviderPolicy`) picks a chain for ``host`` (default: detected),
        gracefully. Either way a GPU provider is refused when ``host.gpu_assigned`` is False, and CUDA graphs
        are checked now: strict raises, graceful rebuilds without them and warns (``graph_capture.py``).
        ``transfers``: how host data reaches CUDA-graph buffers (``transfers.py``; ``auto`` unless comparing).

        Raises:
            ProviderNotAllowedError, ProviderUnavailableError, GraphCaptureError, CheckpointCorruptError,
            CheckpointGraphMismatchError.
        """
        host = host or detect_host()
        strict = providers is not None
        chain = (
            list(providers)
            if providers is not None
            else (policy or DefaultProviderPolicy()).select(checkpoint.metadata, host)
        )
        check_allowed(chain, host)
        chain, graphs = _graph_chain(chain)
        config = session_options or SessionOptionsConfig()
        session = _load(checkpoint, chain, config, strict=strict)
        on_cuda = session.get_providers()[:1] == ["CUDAExecutionProvider"]
        if graphs is not None and on_cuda:
            from distributed_onnx.model.backend.cuda.graph_capture import capture_problems, settle, without_graphs

            problems = capture_problems(*_specs(session))
            if not settle(problems, strict=strict, checkpoint=checkpoint.weights_path.name):
                chain, graphs = _graph_chain(without_graphs(chain))
                session = _load(checkpoint, chain, config, strict=strict)
        backend = cls(checkpoint.metadata, session)
        if graphs is not None and on_cuda:  # requested and realized: never run such a session without its buckets
            backend._graphs = backend._graph_runner(graphs.batch_buckets, strict, transfers)
        return backend

    @property
    def metadata(self) -> CheckpointMetadata:
        return self._metadata

    @property
    def providers(self) -> list[str]:
        """The providers ONNX Runtime realized, preferred first."""
        return list(self._providers)

    @property
    def input_specs(self) -> list[TensorSpec]:
        return list(self._input_specs)

    @property
    def output_specs(self) -> list[TensorSpec]:
        return list(self._output_specs)

    @property
    def uses_io_binding(self) -> bool:
        """True when the session runs on a GPU, where device tensors are bound and CUDA graphs replayed."""
        return bool(self._providers) and self._providers[0] in GPU_PROVIDERS

    @property
    def uses_cuda_graphs(self) -> bool:
        """True when batches run as replays of per-bucket CUDA graphs."""
        return self._graphs is not None

    @property
    def graph_transfers(self) -> str | None:
        """How host data reaches the CUDA-graph buffers: ``torch`` or ``ort`` (None without graphs)."""
        return None if self._graphs is None else self._graphs.transfers

    def empty_host_array(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised host array to pack one input into.

        On a CUDA-graph session with torch it lies in pinned memory, which :meth:`run` copies straight to the
        device instead of staging it first; elsewhere it is a plain ``np.empty``. Dropping it frees it.
        """
        if self._graphs is None:
            return np.empty(shape, dtype=dtype)
        return self._graphs.empty_host_array(shape, np.dtype(dtype))

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate ``inputs`` and run the model; outputs come back as new host numpy arrays.

        Nothing keeps a reference to ``inputs`` after the call, and no later call overwrites what it returned.
        """
        session = self._require_session()
        validate_inputs(inputs, self._input_specs)
        if self.uses_io_binding:
            return self._run_on_gpu(session, inputs)
        return self._run_plain(session, inputs)

    def run_on_device(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run on the GPU and return the outputs as new CUDA torch tensors, never copied to the host."""
        session = self._require_session()
        if not self.uses_io_binding:
            msg = f"run_on_device needs a GPU session; this one realized {self._providers}. Use run()."
            raise InferenceError(msg)
        if self._graphs is not None:
            validate_inputs(inputs, self._input_specs)
            return self._graphs.run_on_device(inputs)
        try:
            import torch
        except ImportError as exc:
            raise MissingExtraError.for_package("torch", "export") from exc
        validate_inputs(inputs, self._input_specs)
        binding = self._bind(session, inputs)
        values = binding.get_outputs()
        return {
            name: torch.utils.dlpack.from_dlpack(getattr(value, "_ortvalue", value))
            for name, value in zip(self._output_names, values, strict=True)
        }

    def close(self) -> None:
        """Drop the session and the device buffers (ORT frees native memory when the last reference goes)."""
        if self._graphs is not None:
            self._graphs.close()
            self._graphs = None
        self._session = None

    def __enter__(self) -> OnnxBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _require_session(self) -> Any:
        if self._session is None:
            raise BackendClosedError("This OnnxBackend was closed; build a new one to run the model again.")
        return self._session

    def _run_on_gpu(self, session: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """CUDA graphs when on; without them numpy takes a plain run and device tensors are bound where they lie.

        Binding host memory only moves ORT's own copies of ``session.run`` (``benchmarks/results/gpu.md``).
        """
        if self._graphs is not None:
            return self._graphs.run(inputs)
        if all(isinstance(value, np.ndarray) for value in inputs.values()):
            return self._run_plain(session, inputs)
        binding = self._bind(session, inputs)
        return dict(zip(self._output_names, binding.copy_outputs_to_cpu(), strict=True))

    def _run_plain(self, session: Any, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        try:
            results = session.run(self._output_names, dict(inputs))
        except Exception as exc:
            raise self._inference_error(inputs, exc) from exc
        return dict(zip(self._output_names, results, strict=True))

    def _bind(self, session: Any, inputs: Mapping[str, Any]) -> Any:
        from distributed_onnx.model.backend.cuda.graph_runner import run_bound_in_place

        try:
            return run_bound_in_place(session, inputs, self._input_specs, self._output_names, self._device_id)
        except Exception as exc:
            raise self._inference_error(inputs, exc) from exc

    def _graph_runner(self, buckets: Sequence[int], strict: bool, transfers: TransferKind) -> GraphRunner:
        from distributed_onnx.model.backend.cuda.buckets import BucketPlan, effective_buckets, fixed_batch
        from distributed_onnx.model.backend.cuda.graph_capture import capture_problems, settle
        from distributed_onnx.model.backend.cuda.graph_runner import GraphRunner
        from distributed_onnx.model.backend.cuda.transfers import TransferOptions

        specs = self._input_specs, self._output_specs
        settle(capture_problems(*specs), strict=True, checkpoint="this session")  # from_checkpoint fell back already
        plan = BucketPlan(effective_buckets(buckets, fixed_batch(self._input_specs)), strict=strict)
        # Host copies into the staging buffers use the session's CPU share (its intra-op pool idles on CUDA).
        threads = self._require_session().get_session_options().intra_op_num_threads or min(4, os.cpu_count() or 1)
        options = TransferOptions(kind=transfers, device_id=self._device_id, copy_threads=threads)
        return GraphRunner(self._session, ort, *specs, plan, transfer=options)

    def _inference_error(self, inputs: Mapping[str, Any], exc: Exception) -> InferenceError:
        shapes = {name: tuple(getattr(value, "shape", ())) for name, value in inputs.items()}
        return InferenceError(
            f"ONNX Runtime failed to run {self._metadata.model_family!r} on inputs {shapes}: {exc}",
            shapes={name: list(shape) for name, shape in shapes.items()},
        )


def _load(
    checkpoint: ResolvedCheckpoint, chain: list[ExecutionProvider], config: SessionOptionsConfig, *, strict: bool
) -> Any:
    """Build the session and check what it realized; ORT refusing graph capture follows the fallback rule."""
    # ORT 1.31 logs "No registered plugin EP device found for 'CUDAExecutionProvider'" for every CUDA session
    # through its default logger (harmless: CUDA is realized); the default logger follows the session's level.
    ort.set_default_logger_severity(config.log_severity_level)
    try:
        session = _cached_session(checkpoint, chain, config) or ort.InferenceSession(
            str(checkpoint.weights_path),
            sess_options=build_session_options(config),
            providers=[provider.to_ort() for provider in chain],
        )
    except Exception as exc:
        if _graph_chain(chain)[1] is None:
            raise _corrupt(checkpoint, exc) from exc
        from distributed_onnx.model.backend.cuda.graph_capture import capture_refusal, settle, without_graphs

        refusal = capture_refusal(str(exc))
        if refusal is None:
            raise _corrupt(checkpoint, exc) from exc
        settle([refusal], strict=strict, checkpoint=checkpoint.weights_path.name)  # raises when strict
        return _load(checkpoint, without_graphs(chain), config, strict=strict)
    session.disable_fallback()  # else ORT retries a failed run on the CPU provider, announced on stdout only
    realized = list(session.get_providers())
    logger.info("Session for %s built; realized providers %s", checkpoint.weights_path.name, realized)
    check_realized(chain, realized, strict=strict)
    check_graph(checkpoint, session)
    return session


def _corrupt(checkpoint: ResolvedCheckpoint, exc: Exception) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"ONNX Runtime cannot load checkpoint weights {checkpoint.weights_path}: {exc}",
        path=str(checkpoint.weights_path),
    )


def _graph_chain(chain: list[ExecutionProvider]) -> tuple[list[ExecutionProvider], CudaProvider | None]:
    """The chain and its CUDA-graph provider (``graph_capture.graph_chain``); a chain without a GPU provider has
    none, and then the CUDA path (``model/backend/cuda/``, never measured on a GPU: docs/gpu.md) is not imported."""
    if not any(provider.needs_gpu for provider in chain):
        return chain, None
    from distributed_onnx.model.backend.cuda.graph_capture import graph_chain

    return graph_chain(chain)


def _cached_session(
    checkpoint: ResolvedCheckpoint, chain: list[ExecutionProvider], config: SessionOptionsConfig
) -> Any:
    """A CPU session through the optimized-graph cache (``optimized_cache.py``), or None where it does not apply.

    A cached graph loads with optimization disabled; a missing one is optimized now, saved while this session is
    built (weights as external data: a published graph's protobuf exceeds 2 GiB without) and published. A cache
    folder that cannot be written or a cached graph that does not load costs only the cache: the plain session.
    """
    if (
        not config.cache_optimized_graph
        or config.optimized_model_path is not None
        or config.graph_optimization_level == "DISABLE_ALL"
        or any(not isinstance(provider, CpuProvider) for provider in chain)
    ):
        return None
    providers = [provider.to_ort() for provider in chain]
    level = optimized_cache.cached_level(config.graph_optimization_level)
    folder = optimized_cache.cache_folder(checkpoint, level, runtime_version())
    graph = folder / optimized_cache.GRAPH_NAME
    if (folder / optimized_cache.NOT_CACHEABLE_NAME).is_file():
        return None
    if graph.is_file():
        try:
            session = ort.InferenceSession(str(graph), sess_options=_unoptimized(config), providers=providers)
        except Exception:
            logger.warning("Cached optimized graph %s does not load; optimizing the checkpoint", graph, exc_info=True)
            return None
        logger.info("Session for %s loaded its optimized graph from %s", checkpoint.weights_path.name, graph)
        return session
    try:
        staging = optimized_cache.staging_folder(folder)
    except OSError as exc:
        logger.warning("Cannot cache the optimized graph of %s in %s (%s)", checkpoint.weights_path.name, folder, exc)
        return None
    options = build_session_options(config.model_copy(update={"graph_optimization_level": level}))
    options.optimized_model_filepath = str(staging / optimized_cache.GRAPH_NAME)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", optimized_cache.WEIGHTS_NAME
    )
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        session = ort.InferenceSession(str(checkpoint.weights_path), sess_options=options, providers=providers)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise  # _load names the checkpoint
    staged = staging / optimized_cache.GRAPH_NAME
    if not staged.is_file():  # ORT writes it while building the session
        shutil.rmtree(staging, ignore_errors=True)
        return session
    try:  # what ORT saves it cannot always load again: checked once here, not at every later start
        ort.InferenceSession(str(staged), sess_options=_unoptimized(config), providers=providers)
    except Exception as exc:
        for path in staging.iterdir():
            path.unlink()
        (staging / optimized_cache.NOT_CACHEABLE_NAME).write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
        optimized_cache.publish(staging, folder)
        logger.info(
            "Session for %s optimized (%s); its saved graph does not load, not cached",
            checkpoint.weights_path.name,
            level,
        )
        return session
    optimized_cache.publish(staging, folder)
    logger.info("Session for %s optimized (%s) and cached in %s", checkpoint.weights_path.name, level, folder)
    return session


def _unoptimized(config: SessionOptionsConfig) -> Any:
    """The options a cached (already optimized) graph loads with."""
    return build_session_options(config.model_copy(update={"graph_optimization_level": "DISABLE_ALL"}))


def build_session_options(config: SessionOptionsConfig) -> Any:
    """Translate the typed config into ``onnxruntime.SessionOptions``."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_{config.graph_optimization_level}")
    options.log_severity_level = config.log_severity_level
    if config.intra_op_num_threads is not None:
        options.intra_op_num_threads = config.intra_op_num_threads
    if config.inter_op_num_threads is not None:
        options.inter_op_num_threads = config.inter_op_num_threads
    if config.allow_spinning is not None:
        flag = "1" if config.allow_spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", flag)
        options.add_session_config_entry("session.inter_op.allow_spinning", flag)
    if config.optimized_model_path is not None:
        options.optimized_model_filepath = str(config.optimized_model_path)
    return options


def _specs(session: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    return [_spec(node) for node in session.get_inputs()], [_spec(node) for node in session.get_outputs()]


def _spec(node: Any) -> TensorSpec:
    dtype = _ORT_TYPES.get(node.type)
    if dtype is None:
        msg = f"Tensor {node.name!r} has type {node.type}, which this package does not map to numpy"
        raise CheckpointGraphMismatchError(msg, tensor=node.name)
    shape = tuple(dim if isinstance(dim, int | str) else None for dim in node.shape)
    return TensorSpec(name=node.name, dtype=dtype, shape=shape)
