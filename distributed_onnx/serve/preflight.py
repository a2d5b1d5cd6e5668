"""What ``serve`` checks before Ray starts: what would otherwise fail inside it, seconds later and in Ray's words.

A typo or a wrong Ray costs one line and exit code 2 here instead of seconds of start-up and pages of Ray's logs:
the checkpoints resolve (and their families' plugins load), the model repository holds what it should, the ports
are free (:mod:`.operations.ports`), the installed Ray still has the private parts the embedded Serve relies on,
and a forecast log can be written. The start and stop of the deployment are :mod:`.runner`'s.
"""

from __future__ import annotations

import os

from distributed_onnx.live.log.health import check_writable
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import LocalCheckpoint
from distributed_onnx.runtime import ray_private
from distributed_onnx.serve.operations.ports import check_port_free
from distributed_onnx.serve.repository import check_repository
from distributed_onnx.serve.settings import ServeSettings

__all__ = ["preflight"]


def preflight(settings: ServeSettings) -> None:
    """Fail fast, before Ray starts, on what would otherwise fail inside it (embedded Ray only).

    On a cluster (``address``) the checkpoint path and the ports are the cluster nodes' business, not this
    machine's, so they are not checked here; a forecast log at a URL is checked either way (it is the same store
    from every node): a log that cannot be written stops the command (:func:`~.health.check_writable`).
    """
    embedded = not (settings.address or os.environ.get("RAY_ADDRESS"))
    if settings.forecast_log is not None and (embedded or settings.forecast_log.is_url):
        check_writable(settings.forecast_log)  # StorageError naming the log: no ready line for a log that drops all
    if not embedded:
        return
    for checkpoint in settings.checkpoint:
        # CheckpointError naming the missing or corrupt file; PluginError naming a family's plugin that does not
        # load (it would otherwise surface as the replica's ActorDiedError)
        adapter_for(LocalCheckpoint(path=checkpoint).resolve().metadata)
    if settings.model_repository is not None:
        check_repository(settings.model_repository)
    check_port_free(settings.host, settings.port, "port")
    check_port_free(settings.host, settings.grpc_port, "grpc_port")
    # UnsupportedRayError naming the first private part of Ray (Serve) that is gone
    ray_private.check_names((*ray_private.EMBEDDED_RAY_NAMES, *ray_private.SERVE_NAMES))
