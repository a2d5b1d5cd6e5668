"""The package's cache folder on this machine: what is kept between runs to save work, never anything a run needs.

``$DISTRIBUTED_ONNX_CACHE``, else ``$XDG_CACHE_HOME/distributed_onnx``, else ``~/.cache/distributed_onnx``: a user
cache, not a checkpoint's folder, which may be read-only or shared. Each user of it has a subfolder of its own
(``optimized-graphs/``: :mod:`.backend.optimized_cache`; ``digests/``: :mod:`.file_digests`). Nothing is evicted;
deleting the folder is always safe (what was kept is computed again).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$DISTRIBUTED_ONNX_CACHE``, else ``$XDG_CACHE_HOME/distributed_onnx``, else ``~/.cache/distributed_onnx``."""
    explicit = os.environ.get("DISTRIBUTED_ONNX_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "distributed_onnx"
