"""Runs a CUDA-graph session: device buffers bound once per batch bucket, graph replay, one copy back.

ONNX Runtime replays a captured graph on the addresses that were bound when it was captured (it does not even
look at the binding again), so each bucket owns its device buffers, its IOBinding and its ``gpu_graph_id``
for the session's lifetime, and a batch only writes into them: the rows to the front, padding behind (see
``buckets.py``), then a replay, then the real rows' outputs copied back (``transfers.py``). The first batch of
a bucket captures its graph (ORT runs it normally once, then captures).

Also here, for sessions without graphs: :func:`run_bound_in_place`, which binds device tensors (torch) where
they lie. Nothing here imports onnxruntime: ``backend/onnx.py`` hands over the session and the ORT module.
ORT's graph replay is not thread-safe and the buckets' buffers are shared, so calls are serialised (one ``run``
at a time is the backend's contract anyway; the lock only makes a second caller wait). Another thread may fill
the next batch meanwhile, with one caveat: ORT captures in CUDA's global capture mode, in which
any other thread's CUDA call (a pinned allocation, a synchronize) breaks the capture. So a bucket's first batch
holds a lock that :meth:`GraphRunner.empty_host_array` waits for; other CUDA work in other threads must avoid it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distributed_onnx.errors import InferenceError
from distributed_onnx.model.backend.cuda.buckets import BucketPlan, batch_rows, bucket_shape
from distributed_onnx.model.backend.cuda.graph_capture import oversize_error
from distributed_onnx.model.backend.cuda.transfers import TransferOptions, make_transfers
from distributed_onnx.model.backend.validation import TensorSpec

logger = logging.getLogger(__name__)

_GRAPH_ID = "gpu_graph_id"  # ORT's run-config key; "-1" runs without capture or replay.


@dataclass
class _Bucket:
    rows: int
    binding: Any
    run_options: Any
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    staging: dict[str, Any] = field(default_factory=dict)
    captured: bool = False


class GraphRunner:
    """The data path of one CUDA-graph session (a ``"cpu"`` device runs the same bookkeeping on CPU, for tests)."""

    def __init__(
        self,
        session: Any,
        ort_api: Any,
        input_specs: Sequence[TensorSpec],
        output_specs: Sequence[TensorSpec],
        plan: BucketPlan,
        *,
        transfer: TransferOptions | None = None,
    ) -> None:
        self._session = session
        self._ort = ort_api
        self._inputs = list(input_specs)
        self._outputs = list(output_specs)
        self._output_names = [spec.name for spec in self._outputs]
        self._plan = plan
        options = transfer if transfer is not None else TransferOptions()
        self._transfers = make_transfers(
            options.kind, ort_api, options.device_type, options.device_id, options.copy_threads
        )
        self._buckets: dict[int, _Bucket] = {}
        self._without_graph = self._run_options("-1")
        self._warned_oversize = False
        self._capturing = threading.Lock()
        self._running = threading.Lock()

    @property
    def plan(self) -> BucketPlan:
        return self._plan

    @property
    def transfers(self) -> str:
        """``torch`` (pinned buffers, asynchronous copies) or ``ort`` (``update_inplace``)."""
        return self._transfers.name

    @property
    def captured_buckets(self) -> list[int]:
        """Buckets whose graph has been captured (by their first batch), smallest first."""
        return sorted(rows for rows, bucket in self._buckets.items() if bucket.captured)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One validated batch -> host outputs of its real rows (new arrays the caller owns)."""
        rows = batch_rows(inputs, self._inputs)
        with self._running:
            bucket = self._bucket(rows)
            if bucket is None:
                return self._run_without_graph(inputs, rows)
            self._transfers.write(inputs, bucket.inputs, bucket.staging, rows)
            self._replay(bucket, rows)
            return self._transfers.read(bucket.outputs, rows)

    def run_on_device(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Like :meth:`run`, but the outputs stay on the device as new torch tensors."""
        rows = batch_rows(inputs, self._inputs)
        with self._running:
            bucket = self._bucket(rows)
            if bucket is None:
                import torch

                device = torch.device("cuda", self._transfers.device_id)
                return {k: torch.from_numpy(v).to(device) for k, v in self._run_without_graph(inputs, rows).items()}
            self._transfers.write(inputs, bucket.inputs, bucket.staging, rows)
            self._replay(bucket, rows)
            return self._transfers.read_on_device(bucket.outputs, rows)

    def empty_host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A host array that :meth:`run` copies to the device without staging (pinned, with torch on CUDA).

        Safe from another thread while :meth:`run` executes: it waits while a bucket captures its graph.
        """
        with self._capturing:
            return self._transfers.host_buffer(shape, np.dtype(dtype))

    def close(self) -> None:
        """Drop the buffers and bindings (their graphs go with the session)."""
        self._buckets.clear()
        self._transfers.close()
        self._session = None

    def _bucket(self, rows: int) -> _Bucket | None:
        size = self._plan.select(rows)
        if size is None:
            if rows > 0 and self._plan.strict:
                raise oversize_error(rows, self._plan.largest)
            if rows > 0 and not self._warned_oversize:
                self._warned_oversize = True
                logger.warning(
                    "A batch of %d rows is above the largest CUDA-graph bucket (%d): batches that large run "
                    "without graph replay (slower). Add a bucket (CudaProvider.batch_buckets) or send smaller "
                    "batches.",
                    rows,
                    self._plan.largest,
                )
            return None
        bucket = self._buckets.get(size)
        if bucket is None:
            bucket = self._buckets[size] = self._build(size)
        return bucket

    def _build(self, rows: int) -> _Bucket:
        transfers = self._transfers
        binding = self._session.io_binding()
        inputs = {spec.name: transfers.device_buffer(bucket_shape(spec, rows), spec.dtype) for spec in self._inputs}
        outputs = {spec.name: transfers.device_buffer(bucket_shape(spec, rows), spec.dtype) for spec in self._outputs}
        for name, buffer in inputs.items():
            transfers.bind(binding, name, buffer, output=False)
        for name, buffer in outputs.items():
            transfers.bind(binding, name, buffer, output=True)
        logger.debug("CUDA-graph bucket of %d rows bound (graph id %d)", rows, self._plan.graph_id(rows))
        return _Bucket(rows, binding, self._run_options(str(self._plan.graph_id(rows))), inputs, outputs)

    def _replay(self, bucket: _Bucket, rows: int) -> None:
        try:
            if bucket.captured:
                self._session.run_with_iobinding(bucket.binding, bucket.run_options)
            else:
                with self._capturing:  # ORT runs the graph once, captures it, then replays it
                    self._session.run_with_iobinding(bucket.binding, bucket.run_options)
                bucket.captured = True
            bucket.binding.synchronize_outputs()
        except Exception as exc:
            raise InferenceError(
                f"ONNX Runtime failed to run a batch of {rows} rows in its CUDA-graph bucket of {bucket.rows} "
                f"rows: {exc}. If the graph cannot be captured, run without CUDA graphs "
                "(CudaProvider(cuda_graph=False)).",
                shapes={"rows": [rows], "bucket": [bucket.rows]},
            ) from exc

    def _run_without_graph(self, inputs: Mapping[str, Any], rows: int) -> dict[str, np.ndarray]:
        if rows == 0:
            return {spec.name: np.empty(bucket_shape(spec, 0), dtype=spec.dtype) for spec in self._outputs}
        feed = {name: _to_numpy(value) for name, value in inputs.items()}
        try:
            results = self._session.run(self._output_names, feed, self._without_graph)
        except Exception as exc:
            raise InferenceError(f"ONNX Runtime failed to run a batch of {rows} rows: {exc}") from exc
        return dict(zip(self._output_names, results, strict=True))

    def _run_options(self, graph_id: str) -> Any:
        options = self._ort.RunOptions()
        options.add_run_config_entry(_GRAPH_ID, graph_id)
        return options


def run_bound_in_place(
    session: Any, inputs: Mapping[str, Any], specs: Sequence[TensorSpec], output_names: Sequence[str], device_id: int
) -> Any:
    """Run a session without graphs on inputs bound where they lie (numpy on the host, torch on its device).

    Returns the IOBinding, whose outputs are on the CUDA device (``copy_outputs_to_cpu`` or ``get_outputs``).
    Raises whatever ORT raises; the backend converts it.
    """
    binding = session.io_binding()
    for spec in specs:
        value = inputs[spec.name]
        if isinstance(value, np.ndarray):
            binding.bind_cpu_input(spec.name, np.ascontiguousarray(value))
        else:
            tensor = value.contiguous()
            binding.bind_input(
                name=spec.name,
                device_type=tensor.device.type,
                device_id=tensor.device.index or 0,
                element_type=spec.dtype.type,
                shape=tuple(tensor.shape),
                buffer_ptr=tensor.data_ptr(),
            )
    for name in output_names:
        binding.bind_output(name, "cuda", device_id)
    session.run_with_iobinding(binding)
    return binding


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    cpu = getattr(value, "cpu", None)
    return np.asarray(cpu() if callable(cpu) else value)
