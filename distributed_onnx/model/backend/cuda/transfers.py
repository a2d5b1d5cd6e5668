"""How a batch reaches the device buffers of a CUDA-graph bucket and how its outputs come back.

The whole speed difference of the GPU data path is here, between ORT alone (``OrtValue.update_inplace`` from
numpy into the bound device OrtValues, outputs by ``.numpy()``) and torch ``copy_(non_blocking=True)`` from
pinned host buffers into the bound device tensors, the faster one, graph replay in both cases (each path
beside a plain ``session.run``: ``benchmarks/results/gpu.md``, written by ``make bench-gpu``). So:

- :class:`TorchTransfers` (torch with CUDA importable): device buffers are torch tensors bound by pointer.
  Host arrays the caller allocated pinned (:meth:`host_buffer`, which the backend offers as
  ``empty_host_array``) are copied straight to the device; other numpy arrays are first copied into a pinned
  staging buffer, split over ``copy_threads`` threads for large arrays (numpy releases the GIL while copying;
  that host copy is what separates the numpy path from the pinned one). Each input's transfer is queued
  asynchronously and overlaps the next input's host copy. Outputs come back by one copy into fresh pinned
  memory, which the caller then owns.
- :class:`OrtTransfers` (ORT alone, also the CPU stand-in the tests use): device OrtValues updated in place
  from host arrays padded in a staging buffer; outputs by ``.numpy()``. ORT's Python API refuses
  ``cuda_pinned`` OrtValues ("Unsupported device type"), so this path cannot pin.

Either way nothing keeps a reference to the caller's arrays once the call returns (every copy has completed)
and every returned array is new memory, so the caller may refill its inputs and keep its outputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from distributed_onnx.errors import InputValidationError, MissingExtraError
from distributed_onnx.model.backend.cuda.buckets import fill_padding, padding_label

TransferKind = Literal["auto", "torch", "ort"]


@dataclass(frozen=True)
class TransferOptions:
    """Where the bound buffers live and how host data reaches them (see :func:`make_transfers`)."""

    kind: TransferKind = "auto"
    #: ``"cuda"``, or ``"cpu"``: the same bookkeeping on host memory, for tests without a GPU.
    device_type: str = "cuda"
    device_id: int = 0
    #: Threads that split large host copies into the pinned staging buffers.
    copy_threads: int = 1


#: Host copies at least this large are split over the copy threads; smaller ones are not worth a hand-off.
PARALLEL_COPY_BYTES = 1 << 20


def make_transfers(
    kind: TransferKind, ort_api: Any, device_type: str, device_id: int, copy_threads: int = 1
) -> TorchTransfers | OrtTransfers:
    """``auto``: torch when it is importable and, for a CUDA device, has CUDA; else ORT alone."""
    if kind == "ort":
        return OrtTransfers(ort_api, device_type, device_id)
    try:
        import torch
    except ImportError as exc:
        if kind == "torch":
            raise MissingExtraError.for_package("torch", "export") from exc
        return OrtTransfers(ort_api, device_type, device_id)
    if kind == "auto" and device_type == "cuda" and not torch.cuda.is_available():
        return OrtTransfers(ort_api, device_type, device_id)
    return TorchTransfers(device_type, device_id, copy_threads)


class TorchTransfers:
    """Pinned host buffers and asynchronous copies into torch device buffers (see the module docstring)."""

    name = "torch"

    def __init__(self, device_type: str, device_id: int, copy_threads: int = 1) -> None:
        import torch

        self._torch = torch
        self._device = torch.device(device_type, device_id) if device_type == "cuda" else torch.device("cpu")
        self._cuda = device_type == "cuda"
        self.device_id = device_id
        self._threads = max(1, copy_threads)
        self._pool: ThreadPoolExecutor | None = None

    def device_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self._torch.empty(shape, dtype=self._torch_dtype(dtype), device=self._device)

    def host_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A host array in pinned memory (on CUDA); torch's caching host allocator recycles it once dropped."""
        tensor = self._torch.empty(shape, dtype=self._torch_dtype(dtype), pin_memory=self._cuda)
        return tensor.numpy()

    def bind(self, binding: Any, name: str, buffer: Any, *, output: bool) -> None:
        bind = binding.bind_output if output else binding.bind_input
        bind(
            name,
            device_type=self._device.type,
            device_id=self._device.index or 0,
            element_type=_numpy_dtype(buffer).type,
            shape=tuple(buffer.shape),
            buffer_ptr=buffer.data_ptr(),
        )

    def write(self, inputs: Mapping[str, Any], device: Mapping[str, Any], staging: dict[str, Any], rows: int) -> None:
        """Copy each input's ``rows`` rows to the front of its device buffer and pad the rest; wait for it."""
        for name, target in device.items():
            value = inputs[name]
            target[:rows].copy_(self._source(name, value, target, staging, rows), non_blocking=self._cuda)
            if rows < target.shape[0]:
                self._pad(target, value, rows)
        self._synchronize()

    def read(self, device: Mapping[str, Any], rows: int) -> dict[str, np.ndarray]:
        """The first ``rows`` rows of each output, copied once into new (pinned) host memory."""
        hosts = {}
        for name, source in device.items():
            host = self._torch.empty((rows, *source.shape[1:]), dtype=source.dtype, pin_memory=self._cuda)
            host.copy_(source[:rows], non_blocking=self._cuda)
            hosts[name] = host
        self._synchronize()
        return {name: host.numpy() for name, host in hosts.items()}

    def read_on_device(self, device: Mapping[str, Any], rows: int) -> dict[str, Any]:
        """The first ``rows`` rows of each output as new device tensors (the bucket's buffers are reused)."""
        return {name: source[:rows].clone() for name, source in device.items()}

    def _source(self, name: str, value: Any, target: Any, staging: dict[str, Any], rows: int) -> Any:
        torch = self._torch
        if isinstance(value, torch.Tensor):
            return value
        if not isinstance(value, np.ndarray):  # another DLPack producer (cupy, jax, ...)
            return torch.from_dlpack(value)
        pinned = self._pinned(value)
        if pinned is not None:
            return pinned
        if name not in staging:
            staging[name] = self._torch.empty(tuple(target.shape), dtype=target.dtype, pin_memory=self._cuda)
        stage = staging[name][:rows]
        self._copy(stage.numpy(), value)
        return stage

    def _copy(self, target: np.ndarray, source: np.ndarray) -> None:
        """``np.copyto``, split by rows over the copy threads when the array is large."""
        if self._threads == 1 or source.nbytes < PARALLEL_COPY_BYTES or source.shape[0] < self._threads:
            np.copyto(target, source)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="distributed-onnx-staging")
        bounds = np.linspace(0, source.shape[0], self._threads + 1).astype(int)
        parts = itertools.pairwise(bounds.tolist())
        for copy in [self._pool.submit(np.copyto, target[a:b], source[a:b]) for a, b in parts]:
            copy.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def _pinned(self, array: np.ndarray) -> Any | None:
        """``array`` as a tensor when it lies in pinned memory torch allocated (``host_buffer``), else None."""
        if not (self._cuda and array.flags.c_contiguous and array.flags.writeable):
            return None
        owner: Any = array
        while isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        if isinstance(owner, self._torch.Tensor) and owner.is_pinned():
            return self._torch.from_numpy(array)
        return None

    def _pad(self, target: Any, value: Any, rows: int) -> None:
        if target.dtype.is_floating_point or target.dtype == self._torch.bool:
            target[rows:].zero_()
            return
        real = value if isinstance(value, np.ndarray) else target[:rows].cpu().numpy()
        target[rows:].fill_(padding_label(np.asarray(real)))

    def _synchronize(self) -> None:
        if self._cuda:
            self._torch.cuda.current_stream(self._device).synchronize()

    def _torch_dtype(self, dtype: np.dtype[Any]) -> Any:
        return self._torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class OrtTransfers:
    """ORT alone: device OrtValues updated in place from padded host arrays (see the module docstring)."""

    name = "ort"

    def __init__(self, ort_api: Any, device_type: str, device_id: int) -> None:
        self._ort = ort_api
        self._device_type = device_type
        self.device_id = device_id

    def device_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self._ort.OrtValue.ortvalue_from_shape_and_type(
            list(shape), dtype.type, self._device_type, self.device_id
        )

    def host_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def bind(self, binding: Any, name: str, buffer: Any, *, output: bool) -> None:
        (binding.bind_ortvalue_output if output else binding.bind_ortvalue_input)(name, buffer)

    def write(self, inputs: Mapping[str, Any], device: Mapping[str, Any], staging: dict[str, Any], rows: int) -> None:
        for name, target in device.items():
            array = _host_array(name, inputs[name])
            shape = tuple(target.shape())
            if rows == shape[0]:
                target.update_inplace(array)  # copies a non-contiguous array first
                continue
            if name not in staging:
                staging[name] = np.empty(shape, dtype=array.dtype)
            stage = staging[name]
            stage[:rows] = array
            fill_padding(stage, rows)
            target.update_inplace(stage)

    def read(self, device: Mapping[str, Any], rows: int) -> dict[str, np.ndarray]:
        # A CUDA OrtValue's .numpy() is a new host copy; a CPU one's shares the bucket's buffer, so copy that.
        copy = self._device_type == "cpu"
        return {name: np.array(value.numpy()[:rows], copy=copy) for name, value in device.items()}

    def read_on_device(self, device: Mapping[str, Any], rows: int) -> dict[str, Any]:
        raise MissingExtraError.for_package("torch", "export")

    def close(self) -> None:
        """Nothing to release beyond the buffers the buckets hold."""


def _host_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)  # a CPU torch tensor
    except (TypeError, RuntimeError) as exc:
        msg = (
            f"Input {name!r} is a {type(value).__name__} on a device; without torch's CUDA support only host arrays run"
        )
        raise InputValidationError(msg, tensor=name) from exc


def _numpy_dtype(tensor: Any) -> np.dtype[Any]:
    return np.dtype(str(tensor.dtype).removeprefix("torch."))
