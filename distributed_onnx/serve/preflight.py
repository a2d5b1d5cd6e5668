"""What ``serve`` checks before Ray starts: what would otherwise fail inside it, seconds later and in Ray's words.

A typo or a wrong Ray costs one line and exit code 2 here instead of seconds of start-up and pages of Ray's logs:
the checkpoints resolve (and their families' plugins load), the model repository holds what it should, the ports
are free (:mod:`.operations.ports`), the installed Ray still has the private parts the embedded Serve relies on,
and a forecast log can be written (a local one's path is a folder or can be made one: :func:`check_log_folder`).
The start and stop of the deployment are :mod:`.runner`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from distributed_onnx.errors import ConfigError
from distributed_onnx.live.log.health import check_writable
from distributed_onnx.local_paths import SHOWN_NAME, name_too_long, not_a_file
from distributed_onnx.location import Location
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.checkpoint import LocalCheckpoint
from distributed_onnx.redact import shortened
from distributed_onnx.runtime import ray_private
from distributed_onnx.serve.operations.ports import check_port_free
from distributed_onnx.serve.repository import check_repository
from distributed_onnx.serve.settings import ServeSettings

__all__ = ["check_log_folder", "preflight"]


def preflight(settings: ServeSettings) -> None:
    """Fail fast, before Ray starts, on what would otherwise fail inside it (embedded Ray only).

    On a cluster (``address``) the checkpoint path and the ports are the cluster nodes' business, not this
    machine's, so they are not checked here; a forecast log at a URL is checked either way (it is the same store
    from every node): a log that cannot be written stops the command (:func:`~.health.check_writable`).
    """
    embedded = not (settings.address or os.environ.get("RAY_ADDRESS"))
    if settings.forecast_log is not None and embedded:
        check_log_folder(settings.forecast_log)  # bad input (exit 2), before the probe's write says it as exit 3
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


def check_log_folder(log: Location) -> None:
    """Refuse (exit 2) a local forecast log that no write could make a folder of, in the shared words
    (:mod:`~distributed_onnx.local_paths`): a name longer than its file system takes, or a file, a device
    (``/dev/null``), a symbolic link in a loop or to nothing at the path or at a folder above it. Each was the
    probe's ``Cannot write the forecast log`` (exit 3, "check credentials"), which no rerun could get past."""
    local = log.local_path
    if local is None:
        return
    problem = name_too_long(local)
    if problem is not None:
        shown = shortened(str(log), SHOWN_NAME)  # its too-long name is said once, shortened, in the problem
        raise ConfigError(f"--forecast-log {shown}: {problem}; give a shorter one.", key="forecast_log")
    for place in (local, *local.parents):
        if place.is_dir():  # a folder, or a link to one: the log is made below it
            return
        if os.path.lexists(place):
            _refuse_what_is_at(log, local, place)


def _refuse_what_is_at(log: Location, local: Path, place: Path) -> None:
    """:func:`check_log_folder`'s refusal of ``place`` (the log's path or a folder above it), which exists and is
    not a folder, saying what it is."""
    there = not_a_file(place) or "is a file"
    if there.endswith("which does not exist"):
        fix = "make that folder or remove the link"
    elif place.is_symlink():
        fix = "remove the link"
    else:
        fix = "the forecast log is a folder (new, or one serve wrote): give another --forecast-log"
    named = f"--forecast-log {log}" if place == local else f"--forecast-log {log}: {place}"
    raise ConfigError(f"{named} {there}; {fix}.", key="forecast_log")
