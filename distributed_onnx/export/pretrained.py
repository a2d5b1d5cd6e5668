"""Loading ``--from-pretrained``: what fails while an exporter reads the folder is the folder's fault (exit 2).

Upstream's loaders raise whatever their parsers raise on a folder that is not theirs; every exporter loads its
folder inside :func:`pretrained_folder`, so each of those failures reads as one message naming the folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from distributed_onnx.errors import ConfigError, DistributedOnnxError
from distributed_onnx.export.progress import phase
from distributed_onnx.export.request import ExportRequest


@contextlib.contextmanager
def pretrained_folder(request: ExportRequest, family: str) -> Iterator[None]:
    """Loading ``--from-pretrained`` and reading its config: what fails here is the folder's (exit 2, naming it).

    Upstream's loaders raise whatever their parsers raise on a folder that is not theirs: ``OSError`` on a
    ``config.json`` that is not JSON (which read as "I/O error ... rerun"), ``SafetensorError`` on corrupt
    weights, ``AttributeError`` on another family's folder, pydantic's error on a config with context 0.
    """
    phase(f"loading the {family} model from {request.folder}")
    try:
        yield
    except DistributedOnnxError:
        raise
    except MemoryError:
        raise
    except Exception as exc:
        from pydantic import ValidationError

        from distributed_onnx.errors import describe_validation

        seen = describe_validation(exc.errors()) if isinstance(exc, ValidationError) else str(exc).strip()
        seen = " ".join(seen.splitlines()[0].split())[:300] if seen else ""
        raise ConfigError(
            f"--from-pretrained {request.folder} cannot be exported as {family} ({type(exc).__name__}: "
            f"{seen}); give the folder of a {family} model as its package saves it.",
            key="from_pretrained",
        ) from exc
