"""Where a checkpoint's ONNX Runtime-optimized graph is kept, so that only the first session pays for optimizing.

Building a session of a large graph is mostly ORT's graph optimization, paid by every actor (a Chronos-2-sized
graph: ``benchmarks/results/docstring_figures.md``). The first CPU session of a checkpoint saves the graph it
optimized (``SessionOptions.optimized_model_filepath``, weights as external data beside it); every later one, in
any process on this machine, loads that file with optimization disabled.

What is saved must stay valid wherever the key matches: only CPU-provider sessions are cached, at most at
``ENABLE_EXTENDED`` (``ENABLE_ALL`` adds layout rewrites chosen for this CPU; ORT warns such a file is not
portable), and the key changes with whatever changes the optimized graph: the graph file's sha256, each of its
external data files' name and sha256 (their bytes are not in the graph's sha256; the files are those the graph
names, :mod:`~distributed_onnx.model.external_data`), the ONNX Runtime version and the level. The weights' digests
are the ones the checkpoint's identity uses (:mod:`~distributed_onnx.model.file_digests`: kept per version of the
file, so asking costs a ``stat`` once a command has hashed them). Keyed by size and modification time instead, a
weights file edited in place with its old time restored (``touch -r``) loaded the old optimized graph: every
backtest and serve forecast from the old weights, silently, while the run recorded the new weights' digest. A
cached graph is published by renaming a finished folder into place, so two actors racing never see half a file:
the loser's folder is dropped and both read the winner's.

The cache lives in the package's cache folder (:mod:`~distributed_onnx.model.user_cache`:
``$DISTRIBUTED_ONNX_CACHE``, default ``$XDG_CACHE_HOME/distributed_onnx``, else ``~/.cache/distributed_onnx``),
under ``optimized-graphs/``. Nothing is evicted; deleting the folder is always safe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

from distributed_onnx import storage
from distributed_onnx.location import Location
from distributed_onnx.model.checkpoint import ResolvedCheckpoint
from distributed_onnx.model.external_data import external_data_locations
from distributed_onnx.model.file_digests import file_sha256
from distributed_onnx.model.user_cache import cache_root

#: The levels, weakest first; the cached graph is optimized at most at :data:`PORTABLE_LEVEL`.
LEVELS = ("DISABLE_ALL", "ENABLE_BASIC", "ENABLE_EXTENDED", "ENABLE_ALL")
PORTABLE_LEVEL = "ENABLE_EXTENDED"
#: The graph's file name inside its cache folder, and its weights' (relative, as the graph records them).
GRAPH_NAME = "model.onnx"
WEIGHTS_NAME = "model.onnx.data"
#: Published in place of a graph ORT saved but cannot load again (it writes subgraphs of ``If`` nodes, TimesFM's
#: decode steps, outside single static assignment): the checkpoint is then optimized per session, uncached.
NOT_CACHEABLE_NAME = "not-cacheable"


def cached_level(requested: str) -> str:
    """The level the cached graph is optimized at: the requested one, capped at :data:`PORTABLE_LEVEL`."""
    return min(requested, PORTABLE_LEVEL, key=LEVELS.index)


def cache_folder(checkpoint: ResolvedCheckpoint, level: str, runtime_version: str, root: Path | None = None) -> Path:
    """The folder holding ``checkpoint``'s graph optimized at ``level`` by ONNX Runtime ``runtime_version``."""
    weights = checkpoint.weights_path
    graph_sha = checkpoint.metadata.sha256 or storage.sha256(Location(weights))  # verified on resolve when recorded
    data_stamp = (
        ",".join(f"{location}:{_digest(weights.parent / location)}" for location in external_data_locations(weights))
        or "-"
    )
    key = hashlib.sha256(f"{graph_sha}|{data_stamp}|{runtime_version}|{level}".encode()).hexdigest()[:24]
    return (root or cache_root()) / "optimized-graphs" / f"{checkpoint.name}-{key}"


def _digest(path: Path) -> str:
    """A weights file's sha256 (``-`` when it cannot be read: loading the graph then says so)."""
    try:
        return file_sha256(path)
    except OSError:
        return "-"


def staging_folder(folder: Path) -> Path:
    """A fresh folder beside ``folder`` to write into before :func:`publish` renames it into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    return staging


def publish(staging: Path, folder: Path) -> None:
    """Rename the finished ``staging`` folder to ``folder``; when another process published first, keep its copy."""
    try:
        staging.rename(folder)
    except OSError:  # the folder exists: a racing session published the same graph (same key, same content)
        shutil.rmtree(staging, ignore_errors=True)
