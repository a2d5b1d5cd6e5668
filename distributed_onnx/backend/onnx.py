"""ONNX Runtime backend: the one module of the package that imports ``onnxruntime``.

Builds one :class:`onnxruntime.InferenceSession` from a resolved checkpoint with a typed provider chain, checks
the graph against the metadata, validates every batch before ORT sees it, and converts ORT's exceptions into
the project's own (with the tensor names and shapes) at this boundary, once.

On CUDA the backend runs through IOBinding: numpy inputs are copied to the device once, CUDA tensors (torch,
via ``data_ptr``) are bound where they are, and :meth:`OnnxBackend.run_on_device` leaves the outputs on the
GPU, so a caller that stays on the device never round-trips through host memory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from distributed_onnx.backend.policy import (
    DefaultProviderPolicy,
    HostCapabilities,
    ProviderPolicy,
    check_allowed,
    check_realized,
)
from distributed_onnx.backend.providers import ExecutionProvider, SessionOptionsConfig
from distributed_onnx.backend.validation import TensorSpec, validate_inputs
from distributed_onnx.checkpoint import CheckpointMetadata, ResolvedCheckpoint
from distributed_onnx.errors import (
    BackendClosedError,
    CheckpointCorruptError,
    CheckpointGraphMismatchError,
    InferenceError,
    MissingExtraError,
)

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

_GPU_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})

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


def runtime_version() -> str:
    """The installed ONNX Runtime version."""
    return str(ort.__version__)


class OnnxBackend:
    """An :class:`~distributed_onnx.backend.protocol.InferenceBackend` over one ONNX Runtime session."""

    def __init__(self, metadata: CheckpointMetadata, session: Any) -> None:
        """Wrap a session the caller built and owns; prefer :meth:`from_checkpoint`.

        Inputs are checked for what ORT would reject (names, dtypes, ranks, fixed dims), not for their values:
        which values may be NaN is the model family's rule (:mod:`distributed_onnx.adapters`).
        """
        self._metadata = metadata
        self._session: Any | None = session
        self._input_specs = [_spec(node) for node in session.get_inputs()]
        self._output_specs = [_spec(node) for node in session.get_outputs()]
        self._output_names = [spec.name for spec in self._output_specs]
        self._providers = list(session.get_providers())
        self._device_id = _device_id(session)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: ResolvedCheckpoint,
        providers: Sequence[ExecutionProvider] | None = None,
        session_options: SessionOptionsConfig | None = None,
        policy: ProviderPolicy | None = None,
        *,
        host: HostCapabilities | None = None,
    ) -> OnnxBackend:
        """Load ``checkpoint`` into a new session.

        ``providers`` given: that chain, strictly (an accelerator not realized raises). ``providers=None``:
        ``policy`` (default :class:`DefaultProviderPolicy`) picks a chain for ``host`` (default: detected),
        gracefully. Either way a GPU provider is refused when ``host.gpu_assigned`` is False.

        Raises:
            ProviderNotAllowedError, ProviderUnavailableError, CheckpointCorruptError,
            CheckpointGraphMismatchError.
        """
        host = host or HostCapabilities.detect()
        strict = providers is not None
        chain = (
            list(providers)
            if providers is not None
            else (policy or DefaultProviderPolicy()).select(checkpoint.metadata, host)
        )
        check_allowed(chain, host)
        options = build_session_options(session_options or SessionOptionsConfig())
        try:
            session = ort.InferenceSession(
                str(checkpoint.weights_path),
                sess_options=options,
                providers=[provider.to_ort() for provider in chain],
            )
        except Exception as exc:
            raise CheckpointCorruptError(
                f"ONNX Runtime cannot load checkpoint weights {checkpoint.weights_path}: {exc}",
                path=str(checkpoint.weights_path),
            ) from exc
        realized = list(session.get_providers())
        logger.info("Session for %s built; realized providers %s", checkpoint.weights_path.name, realized)
        check_realized(chain, realized, strict=strict)
        _check_graph(checkpoint, session)
        return cls(checkpoint.metadata, session)

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
        """True when the session runs on a GPU, where IOBinding avoids host round trips."""
        return bool(self._providers) and self._providers[0] in _GPU_PROVIDERS

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate ``inputs`` and run the model; outputs come back as host numpy arrays."""
        session = self._require_session()
        validate_inputs(inputs, self._input_specs)
        if self.uses_io_binding:
            binding = self._bind(session, inputs)
            return dict(zip(self._output_names, binding.copy_outputs_to_cpu(), strict=True))
        try:
            results = session.run(self._output_names, dict(inputs))
        except Exception as exc:
            raise self._inference_error(inputs, exc) from exc
        return dict(zip(self._output_names, results, strict=True))

    def run_on_device(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run through IOBinding and return the outputs as CUDA torch tensors, never copied to the host."""
        session = self._require_session()
        if not self.uses_io_binding:
            msg = f"run_on_device needs a GPU session; this one realized {self._providers}. Use run()."
            raise InferenceError(msg)
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
        """Drop the session (ORT frees native memory when the last reference goes)."""
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

    def _bind(self, session: Any, inputs: Mapping[str, Any]) -> Any:
        binding = session.io_binding()
        for spec in self._input_specs:
            value = inputs[spec.name]
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(spec.name, np.ascontiguousarray(value))
            else:  # a device tensor (torch): bind its memory where it lies.
                tensor = value.contiguous()
                binding.bind_input(
                    name=spec.name,
                    device_type=tensor.device.type,
                    device_id=tensor.device.index or 0,
                    element_type=spec.dtype.type,
                    shape=tuple(tensor.shape),
                    buffer_ptr=tensor.data_ptr(),
                )
        for name in self._output_names:
            binding.bind_output(name, "cuda", self._device_id)
        try:
            session.run_with_iobinding(binding)
        except Exception as exc:
            raise self._inference_error(inputs, exc) from exc
        return binding

    def _inference_error(self, inputs: Mapping[str, Any], exc: Exception) -> InferenceError:
        shapes = {name: tuple(getattr(value, "shape", ())) for name, value in inputs.items()}
        return InferenceError(
            f"ONNX Runtime failed to run {self._metadata.model_family!r} on inputs {shapes}: {exc}",
            shapes={name: list(shape) for name, shape in shapes.items()},
        )


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


def _spec(node: Any) -> TensorSpec:
    dtype = _ORT_TYPES.get(node.type)
    if dtype is None:
        msg = f"Tensor {node.name!r} has type {node.type}, which this package does not map to numpy"
        raise CheckpointGraphMismatchError(msg, tensor=node.name)
    shape = tuple(dim if isinstance(dim, int | str) else None for dim in node.shape)
    return TensorSpec(name=node.name, dtype=dtype, shape=shape)


def _check_graph(checkpoint: ResolvedCheckpoint, session: Any) -> None:
    metadata = checkpoint.metadata
    graph_inputs = [node.name for node in session.get_inputs()]
    graph_outputs = [node.name for node in session.get_outputs()]
    problems = []
    if sorted(graph_inputs) != sorted(metadata.input_names):
        problems.append(f"graph inputs {graph_inputs} != metadata input_names {metadata.input_names}")
    if metadata.output_name not in graph_outputs:
        problems.append(f"metadata output_name {metadata.output_name!r} is not a graph output {graph_outputs}")
    if problems:
        raise CheckpointGraphMismatchError(
            f"Checkpoint {checkpoint.weights_path} disagrees with its metadata: {'; '.join(problems)}",
            path=str(checkpoint.weights_path),
        )


def _device_id(session: Any) -> int:
    for name, options in zip(session.get_providers(), session.get_provider_options().values(), strict=False):
        if name in _GPU_PROVIDERS:
            return int(options.get("device_id", 0))
    return 0
