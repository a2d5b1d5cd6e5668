"""The package's version, from the installed metadata (pyproject.toml is its one source).

A foundation module of its own, so that any layer can name the version without importing the package root
(which imports the API, the top layer).
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("distributed-onnx")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
