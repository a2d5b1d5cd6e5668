"""A checkpoint repository: many checkpoints behind one deployment, each loaded in a replica on first use.

A team with one fine-tuned checkpoint per region or customer (tens to hundreds) cannot hold every session in
every replica, so with ``--model-repository URL`` (a folder or an object-store prefix of checkpoints, each an
``.onnx`` file with its ``<stem>.metadata.json``) a replica loads a checkpoint when a request first names it and
keeps at most ``--repository-budget`` of them, evicting the least recently used.

The cache is Ray Serve's model multiplexing (``serve.multiplexed``): its LRU is the budget, and its router sends
a request carrying the ``serve_multiplexed_model_id`` header to a replica that already holds that model (Serve's
proxy and deployment handles read the header; HAProxy and direct ingress do not route by it, so with several
replicas the ingress is Serve's proxy). Measured against a per-replica LRU without that routing
(``benchmarks/repository_bench.py``, ``benchmarks/results/repository.md``): with a working set larger than one
replica's budget but within the fleet's, routing by model keeps each model on the replicas that hold it, where
the unrouted LRU keeps reloading. A request without the header is still answered (the body's ``model`` or the
v2 path names the model): its replica loads the model if it lacks it.

This module holds what is not Serve's: the listing of the repository (:class:`CheckpointRepository`, local
folders and URLs through :mod:`distributed_onnx.storage`; a URL's checkpoint is downloaded into a replica-local
folder while loaded), the checks that keep a broken checkpoint from costing a healthy one its place
(:class:`ModelRepository`: the metadata and sha256 are checked before Serve's LRU evicts anything, and a
checkpoint that failed to load is refused with its reason until its files change), Triton's repository index,
and the counters on ``/metrics``. Unknown names are 404s naming the repository, a broken checkpoint a 503 naming
its error: never a failed replica.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from distributed_onnx import names as path_names
from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.model.checkpoint import LocalCheckpoint, default_metadata_path
from distributed_onnx.serve.wire.http import HttpError, ModelUnavailableError

logger = logging.getLogger(__name__)

#: The weights' suffix; the metadata is ``<stem>.metadata.json`` beside them (the checkpoint layout).
WEIGHTS_SUFFIX = ".onnx"
#: An unknown name relists the repository at most this often (a client asking for names that do not exist must
#: not turn into a listing per request on an object store); a listing that failed is not tried again sooner
#: either: requests meanwhile get its error at once, instead of each waiting out the store client's own retries
#: (seconds on S3) one after another behind the listing lock.
RELIST_INTERVAL_S = 1.0
#: Names shown in a 404 (a repository of hundreds would make the message a page).
NAMES_IN_ERRORS = 10

State = Literal["READY", "UNAVAILABLE"]


class CheckpointRepository:
    """The checkpoints under one location: their names (file stems) and a local copy of each to load."""

    def __init__(self, location: LocationLike, cache_dir: Path | None = None) -> None:
        self.location = Location.parse(location)
        self._local = self.location.local_path
        self._cache_dir = cache_dir
        self._names: list[str] = []
        self._listed_at = float("-inf")
        self._failed: tuple[float, OSError] | None = None  # the last listing's failure: when, and its error
        self._lock = threading.Lock()

    def names(self, *, refresh: bool = False) -> list[str]:
        """The checkpoints' names, sorted; listed again when ``refresh`` and the last listing is not recent."""
        with self._lock:
            if (refresh and time.monotonic() - self._listed_at >= RELIST_INTERVAL_S) or self._listed_at < 0:
                if self._failed is not None and time.monotonic() - self._failed[0] < RELIST_INTERVAL_S:
                    raise self._failed[1].with_traceback(None)
                try:
                    found = storage.list_files(self.location, "", WEIGHTS_SUFFIX)
                except OSError as exc:
                    self._failed = (time.monotonic(), exc)
                    raise
                self._failed = None
                stems = [self._stem(path) for path in found]
                # An object ``...onnx`` is the stem ``..``: a name the names rule refuses is no model.
                self._names = sorted(stem for stem in stems if path_names.is_safe(stem))
                if len(self._names) < len(stems):
                    logger.warning(
                        "model repository: %d checkpoint file(s) skipped, the names rule refuses their names (%s)",
                        len(stems) - len(self._names),
                        path_names.RULE,
                    )
                self._listed_at = time.monotonic()
            return list(self._names)

    def listed(self, name: str) -> bool:
        """Whether the last listing had ``name`` (no I/O: what a failed request's log row may name)."""
        with self._lock:
            return name in self._names

    @property
    def ever_listed(self) -> bool:
        return self._listed_at > float("-inf")

    def __contains__(self, name: str) -> bool:
        if not path_names.is_safe(name):
            return False  # never listed, so never looked up, fetched or released
        return name in self.names() or name in self.names(refresh=True)

    def signature(self, name: str) -> tuple[int | None, int | None]:
        """The sizes of the weights and metadata: what a remembered load failure is valid for."""
        path_names.check(name, what="model name")
        weights = self.location / (name + WEIGHTS_SUFFIX)
        metadata = self.location / (name + ".metadata.json")
        return storage.file_size(weights), storage.file_size(metadata)

    def fetch(self, name: str) -> Path:
        """A local path of ``name``'s weights, its metadata beside it (a URL's files downloaded first)."""
        path_names.check(name, what="model name")
        if self._local is not None:
            return path_names.join_under(self._local, f"{name}{WEIGHTS_SUFFIX}", what="model name")
        folder = path_names.join_under(self._cache_folder(), name, what="model name")
        folder.mkdir(parents=True, exist_ok=True)
        weights = folder / f"{name}{WEIGHTS_SUFFIX}"
        for local in (weights, default_metadata_path(weights)):
            local.write_bytes(storage.read_bytes(self.location / local.name))
        return weights

    def release(self, name: str) -> None:
        """Delete the local copy of a URL's checkpoint (its model was evicted); nothing for a local folder."""
        if self._local is None and self._cache_dir is not None and path_names.is_safe(name):
            shutil.rmtree(path_names.join_under(self._cache_dir, name, what="model name"), ignore_errors=True)

    def close(self) -> None:
        """Delete the whole download cache (the replica shuts down); nothing for a local folder."""
        if self._local is None and self._cache_dir is not None:
            shutil.rmtree(self._cache_dir, ignore_errors=True)

    def _cache_folder(self) -> Path:
        if self._cache_dir is None:
            self._cache_dir = Path(tempfile.mkdtemp(prefix="distributed-onnx-repository-"))
        return self._cache_dir

    @staticmethod
    def _stem(path: Location) -> str:
        return path.name[: -len(WEIGHTS_SUFFIX)]


def check_repository(location: LocationLike) -> None:
    """Refuse a local repository folder that does not exist (before Ray starts; a URL is the cluster's business)."""
    path = Location.parse(location).local_path
    if path is not None and not path.is_dir():
        raise ConfigError(f"model repository {path} is not a folder", key="model_repository")


class RepositoryMetrics:
    """The repository's counters on the replica's ``/metrics`` page (its own registry, see :mod:`.live_metrics`).

    - ``distributed_onnx_repository_loads_total`` (``model``): checkpoints loaded into this replica;
    - ``distributed_onnx_repository_evictions_total`` (``model``): models evicted (least recently used) to stay
      within ``--repository-budget``;
    - ``distributed_onnx_repository_load_failures_total`` (``model``): loads that failed (the reason is in the
      503 and in ``/v2/repository/index``);
    - ``distributed_onnx_repository_models_loaded``: models this replica holds now.
    """

    def __init__(self, registry: CollectorRegistry, replica: str) -> None:
        self._replica = replica

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, ["model", "replica"], registry=registry)

        self._loads = counter("distributed_onnx_repository_loads", "Repository checkpoints loaded.")
        self._evictions = counter(
            "distributed_onnx_repository_evictions",
            "Repository models evicted, least recently used, to stay within the replica's budget.",
        )
        self._failures = counter(
            "distributed_onnx_repository_load_failures", "Repository checkpoints that failed to load."
        )
        self._loaded = Gauge(
            "distributed_onnx_repository_models_loaded",
            "Repository models this replica holds.",
            ["replica"],
            registry=registry,
        )

    def loaded(self, model: str, held: int) -> None:
        self._loads.labels(model, self._replica).inc()
        self._loaded.labels(self._replica).set(held)

    def evicted(self, model: str, held: int) -> None:
        self._evictions.labels(model, self._replica).inc()
        self._loaded.labels(self._replica).set(held)

    def failed(self, model: str) -> None:
        self._failures.labels(model, self._replica).inc()


class LoadedModel:
    """What Serve's LRU holds for one checkpoint: the model (a ``ModelCore``) and what its eviction undoes.

    Serve calls ``__del__`` when it evicts the model; in-flight requests keep their own reference to the model,
    so they finish (its session and thread go once the last of them lets go). Python calls ``__del__`` again
    when the object is collected: only the first call counts.
    """

    def __init__(self, name: str, model: Any, on_evict: Callable[[LoadedModel], None]) -> None:
        self.name = name
        self.model = model
        self._on_evict: Callable[[LoadedModel], None] | None = on_evict

    def __del__(self) -> None:
        on_evict, self._on_evict = self._on_evict, None
        if on_evict is not None:
            on_evict(self)


@dataclass(frozen=True)
class LoadFailure:
    reason: str
    signature: tuple[int | None, int | None]
    cause: str  # the error's class: the failures table's reason


class ModelRepository:
    """A replica's side of the repository: which models it holds, their loads, failures and the index.

    ``build(name, weights)`` builds a model from a checkpoint's local weights (in a thread: it builds an ONNX
    Runtime session); the deployment wraps :meth:`load` in ``serve.multiplexed`` and hands it in as ``cached``.
    """

    def __init__(
        self,
        repository: CheckpointRepository,
        build: Callable[[str, Path], Any],
        metrics: RepositoryMetrics | None = None,
        retry_after_s: float = 1.0,
    ) -> None:
        self.repository = repository
        self._retry_after = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
        self._build = build
        self._metrics = metrics
        self._cached: Callable[[str], Awaitable[LoadedModel]] | None = None
        self._held: dict[str, LoadedModel] = {}
        self._fetched: dict[str, Path] = {}  # checked before the LRU's load, which takes them from here
        self._failures: dict[str, LoadFailure] = {}

    def set_cache(self, cached: Callable[[str], Awaitable[LoadedModel]]) -> None:
        """The LRU in front of :meth:`load` (``serve.multiplexed(max_num_models_per_replica=budget)(load)``)."""
        self._cached = cached

    def has(self, name: str) -> bool:
        return name in self._held or name in self.repository

    def holds(self, name: str) -> bool:
        return name in self._held

    def knows(self, name: str) -> bool:
        """Held or in the last listing (no I/O): a failed request's log row names the model then."""
        return name in self._held or self.repository.listed(name)

    def names(self) -> list[str]:
        """The repository's names, listed again; 503 with Retry-After when the repository does not answer."""
        try:
            return self.repository.names(refresh=True)
        except OSError as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: OSError, name: str | None = None) -> ModelUnavailableError:
        what = f"Model {name!r} is unavailable: the" if name is not None else "The"
        return ModelUnavailableError(
            f"{what} model repository {self.repository.location} does not answer ({type(exc).__name__}); retry later.",
            "repository_unavailable",
            self._retry_after,
        )

    def _contains(self, name: str) -> bool:
        """Whether the repository has ``name``; when it does not answer, the last listing decides a name it lacks
        (an unknown name stays a 404) and one it has is a 503 (its files cannot be read now)."""
        try:
            return name in self.repository
        except OSError as exc:
            if self.repository.ever_listed and not self.repository.listed(name):
                return False
            raise self._unavailable(exc, name) from None

    async def model(self, name: str) -> Any:
        """The model called ``name``: held, or loaded now; 404 when the repository has no such checkpoint,
        503 naming the reason when its checkpoint does not load."""
        held = self._held.get(name)
        if held is not None and self._cached is not None:
            return (await self._cached(name)).model  # marks it most recently used
        if not await asyncio.to_thread(self._contains, name):
            raise HttpError(404, self._unknown(name))
        failure = self._failures.get(name)
        try:  # the repository not answering is no fault of the checkpoint: not remembered, retried later
            signature = await asyncio.to_thread(self.repository.signature, name)
            remembered = failure if failure is not None and failure.signature == signature else None
            weights = None if remembered else await asyncio.to_thread(self.repository.fetch, name)
        except OSError as exc:
            await asyncio.to_thread(self.repository.release, name)
            raise self._unavailable(exc, name) from None
        if remembered is not None or weights is None:
            assert remembered is not None
            raise ModelUnavailableError(f"Model {name!r} is unavailable: {remembered.reason}", remembered.cause)
        try:
            # Checked before Serve's LRU makes room: a checkpoint whose files are missing, invalid or corrupt
            # must not cost a healthy model its place.
            await asyncio.to_thread(LocalCheckpoint(path=weights).resolve)
            self._fetched[name] = weights
            loaded = await (self._cached or self.load)(name)
        except HttpError:
            raise
        except Exception as exc:  # a broken checkpoint: its answer names why, the replica carries on
            reason = f"{type(exc).__name__}: {exc}"
            self._failures[name] = LoadFailure(reason, signature, type(exc).__name__)
            self.repository.release(name)
            if self._metrics is not None:
                self._metrics.failed(name)
            logger.warning("repository model %s failed to load: %s", name, reason)
            raise ModelUnavailableError(f"Model {name!r} is unavailable: {reason}", type(exc).__name__) from None
        self._failures.pop(name, None)
        return loaded.model

    async def load(self, name: str) -> LoadedModel:
        """Build ``name``'s model off the event loop (what Serve's LRU calls on a miss)."""
        weights = self._fetched.pop(name, None)
        if weights is None:
            weights = await asyncio.to_thread(self.repository.fetch, name)
        model = await asyncio.to_thread(self._build, name, weights)
        loaded = LoadedModel(name, model, self._evicted)
        self._held[name] = loaded
        if self._metrics is not None:
            self._metrics.loaded(name, len(self._held))
        return loaded

    def _evicted(self, loaded: LoadedModel) -> None:
        if self._held.get(loaded.name) is loaded:
            del self._held[loaded.name]
        release = getattr(loaded.model, "release", None)
        if callable(release):
            release()  # what refers back to the model goes, so its session is freed when its last request ends
        self.repository.release(loaded.name)
        if self._metrics is not None:
            self._metrics.evicted(loaded.name, len(self._held))

    def _unknown(self, name: str) -> str:
        names = self.repository.names()
        shown = ", ".join(repr(known) for known in names[:NAMES_IN_ERRORS])
        more = f" and {len(names) - NAMES_IN_ERRORS} more" if len(names) > NAMES_IN_ERRORS else ""
        return (
            f"Unknown model {name!r}: the model repository {self.repository.location} has no "
            f"checkpoint {name + WEIGHTS_SUFFIX!r} ({len(names)} checkpoints: {shown}{more})."
        )

    def index(self, fixed: list[str], *, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model with its state in *this* replica and the reason if not READY.

        ``fixed`` (the ``--checkpoint`` models, held by every replica) are READY; a repository model is READY
        when this replica holds it, UNAVAILABLE otherwise: ``unloaded`` (it loads on its first request), or the
        error its last load failed with.
        """
        entries = [{"name": name, "version": "1", "state": "READY", "reason": ""} for name in fixed]
        for name in self.names():
            if name in fixed:
                continue
            state: State = "READY" if name in self._held else "UNAVAILABLE"
            failure = self._failures.get(name)
            reason = "" if state == "READY" else failure.reason if failure else "unloaded: loads on its first request"
            entries.append({"name": name, "version": "1", "state": state, "reason": reason})
        return [entry for entry in entries if entry["state"] == "READY"] if ready_only else entries
