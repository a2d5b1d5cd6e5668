"""Start the deployment in the foreground and stop it cleanly on Ctrl-C or SIGTERM.

Without ``address`` the runner starts an embedded Ray bound to 127.0.0.1 (as the backtest does) and shuts
Serve and Ray down on exit; with ``address`` it deploys to that cluster and deletes only its application.
"""

from __future__ import annotations

import http.client
import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

import ray
from ray import serve

from distributed_onnx.errors import ConfigError
from distributed_onnx.local_ray import connect
from distributed_onnx.serve.app import APP_NAME, build_app
from distributed_onnx.serve.settings import ServeSettings

logger = logging.getLogger(__name__)


def start(settings: ServeSettings) -> bool:
    """Connect to (or start) Ray, start Serve's proxy and deploy; returns True if this call started Ray."""
    started_ray = connect(settings.address)
    deploy(settings)
    return started_ray


def deploy(settings: ServeSettings) -> None:
    """Start Serve's HTTP proxy (if not running) and deploy the application at ``/`` (Ray must be connected)."""
    serve.start(http_options=settings.http_options())
    serve.run(build_app(settings), name=APP_NAME, route_prefix="/", blocking=False)


def stop(started_ray: bool) -> None:
    """Undo :func:`start`: the whole embedded instance, or only our application on a shared cluster."""
    try:
        if started_ray:
            serve.shutdown()  # type: ignore[no-untyped-call]
        else:
            serve.delete(APP_NAME)
    finally:
        if started_ray:
            ray.shutdown()


def wait_ready(settings: ServeSettings, timeout_s: float = 120.0) -> None:
    """Poll ``/v2/health/ready`` until it answers 200."""
    host = "127.0.0.1" if settings.host in {"0.0.0.0", "::"} else settings.host
    url = f"http://{host}:{settings.port}/v2/health/ready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # The standard library's client: httpx is only a test dependency, and no proxy applies on loopback.
        connection = http.client.HTTPConnection(host, settings.port, timeout=2.0)
        try:
            connection.request("GET", "/v2/health/ready")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.2)
    raise ConfigError(f"the deployment did not become ready within {timeout_s} s ({url})")


def serve_forever(settings: ServeSettings) -> int:
    """Run until SIGINT/SIGTERM, then shut down cleanly; returns the exit code (0)."""
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logger.info("Received %s; shutting down", signal.Signals(signum).name)
        stop_requested.set()

    previous: dict[signal.Signals, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, request_stop)
    started_ray = False
    try:
        started_ray = connect(settings.address)
        # ray.init installs its own SIGTERM handlers (a Python one that exits, and a C-level one that aborts
        # the driver with exit -6 - measured): take the signals back before deploying, which takes seconds.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, request_stop)
        deploy(settings)
        wait_ready(settings)
        logger.info(
            "Serving %s on http://%s:%d (docs at /docs); Ctrl-C to stop",
            settings.model_name,
            settings.host,
            settings.port,
        )
        print(f"ready: http://{settings.host}:{settings.port}/v1/forecast  (docs: /docs)", flush=True)
        while not stop_requested.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop(started_ray)
    return 0
