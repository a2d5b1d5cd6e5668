"""Start the deployment in the foreground and stop it cleanly on Ctrl-C or SIGTERM.

Without ``address`` the runner starts an embedded Ray bound to 127.0.0.1 (as the backtest does) and shuts
Serve and Ray down on exit; with ``address`` it deploys to that cluster and deletes only its application.

What can be checked before Ray starts is checked first (:func:`~.preflight.preflight`: the checkpoint resolves,
the ports are free, the installed Ray still has the private parts the embedded Serve relies on), so a typo or a
wrong Ray costs one line and exit code 2 instead of seconds of start-up and pages of Ray's logs; a port taken
after it is named by :mod:`.operations.ports` too, the one home of serve's port conflicts. Once an embedded
deployment is ready, the sockets of this process tree are read: any beyond loopback that the user did not ask
for stops the command (:func:`distributed_onnx.serve.operations.loopback.check_listening`). While it serves,
the main loop polls a :class:`~distributed_onnx.runtime.ray_watch.RayWatch`: a Ray that went away (GCS or raylet
killed) is one ``error:`` line and exit 3, what is left of the embedded Ray stopped
(:func:`~distributed_onnx.runtime.ray_watch.abandon_lost_ray`), before Ray's
own core would abort the process a minute later.
"""

from __future__ import annotations

import http.client
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import ray
from ray import serve

from distributed_onnx import interrupts
from distributed_onnx.errors import ConfigError, RayLostError, Suggestion, WorkerStartError
from distributed_onnx.runtime import ray_private
from distributed_onnx.runtime.local_ray import connect, disconnect
from distributed_onnx.runtime.pool_room import ActorShape, Asked, check_fits, room_words
from distributed_onnx.runtime.ray_watch import RayWatch, abandon_lost_ray, watch_connected_ray
from distributed_onnx.serve.app import APP_NAME, DEPLOYMENT_NAME, build_app
from distributed_onnx.serve.operations.ingress import IngressHost, IngressPlan, free_port, free_range, plan_ingress
from distributed_onnx.serve.operations.loopback import allowed_ports, check_listening
from distributed_onnx.serve.operations.ports import not_the_proxy, proxy_could_not_bind, taken_while_starting
from distributed_onnx.serve.preflight import preflight
from distributed_onnx.serve.served_text import served_models
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.grpc_api import message_limit_environment
from distributed_onnx.serve.wire.grpc_messages import SERVICER_FUNCTION

logger = logging.getLogger(__name__)


def choose_ingress(settings: ServeSettings) -> IngressPlan:
    """The ingress for these settings on this machine (see :mod:`distributed_onnx.serve.operations.ingress`)."""
    embedded = not (settings.address or os.environ.get("RAY_ADDRESS") or ray.is_initialized())
    # Sized for the most replicas that may run at once: an autoscaled deployment starting with one still needs
    # HAProxy in front of the ones it adds.
    wants_haproxy = settings.ingress == "haproxy" or (settings.ingress == "auto" and settings.most_replicas > 1)
    return plan_ingress(
        settings.ingress,
        replicas=settings.most_replicas,
        routes_by_model=settings.model_repository is not None,
        host=settings.host,
        port=settings.port,
        grpc_port=settings.grpc_port,
        facts=IngressHost(
            embedded=embedded,
            haproxy_binary=ray_private.haproxy_binary() if embedded and wants_haproxy else None,
            free_port=free_port,
            free_range=free_range,
        ),
    )


def deploy(settings: ServeSettings, plan: IngressPlan) -> None:
    """Start Serve (if not running) with ``plan``'s ports and deploy the application at ``/`` (Ray connected).

    HTTP and the KServe v2 gRPC service are both served; with direct ingress or HAProxy the proxy's own ports
    are free loopback ports nobody calls, the user's ones being the replica's or HAProxy's.
    """
    from ray.serve.config import gRPCOptions

    grpc_options = gRPCOptions(
        port=plan.proxy_grpc_port,
        grpc_servicer_functions=[SERVICER_FUNCTION],
        request_timeout_s=settings.request_timeout_s,
    )
    http_options = settings.http_options() | {"port": plan.proxy_http_port}
    try:
        serve.start(http_options=http_options, grpc_options=grpc_options)
        # Not serve.run: it waits for the application without a deadline (replicas Ray has no room for: forever).
        # wait_ready waits instead, within --ready-timeout-s, and names Serve's own error if it gives up on them.
        target = serve.RunTarget(target=build_app(settings), name=APP_NAME, route_prefix="/")
        serve.run_many([target], wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    except Exception as exc:  # Ray's task error of a proxy that could not bind: one line naming the port
        unbound = proxy_could_not_bind(settings.host, (settings.port, settings.grpc_port), exc)
        if unbound is None:
            raise
        raise unbound from None


def replicas_asked(settings: ServeSettings) -> Asked:
    """The replicas Serve starts with (the fixed count, or autoscaling's fewest) and what each asks Ray for."""
    shape = ActorShape(settings.cpus_per_replica, settings.gpus_per_replica)
    return Asked(
        settings.lowest_replicas if settings.autoscaling else settings.replicas,
        shape,
        "Serve replicas",
        "replicas",
        "cpus_per_replica",
        "gpus_per_replica",
    )


def stop(started_ray: bool, deployed: bool = True) -> None:
    """Undo :func:`serve_forever`'s start: the whole embedded instance, or only our application on a cluster.

    The application is deleted first (its replicas drain their in-flight requests), then an embedded Ray is
    shut down with everything in it. ``serve.shutdown()`` is not used: its controller task kills its own actor
    and Ray then prints "Task ServeController.graceful_shutdown failed ... infinite retries" on every clean
    exit (measured), which reads like a failure.
    """
    try:
        if deployed:  # a start stopped before its deploy has no Serve instance to delete from
            serve.delete(APP_NAME)
    finally:
        disconnect(started_ray)


def lost_ray_error(reason: str, started_ray: bool) -> RayLostError:
    """The one line for a Ray lost under ``serve``: what went, what was stopped, what to do."""
    if started_ray:
        stopped = "serve stopped its deployment and the rest of the embedded Ray"
        look = "Ray's logs (/tmp/ray/session_latest/logs by default: gcs_server.out, raylet.out) or dmesg"
    else:
        stopped = f"serve stopped; the application {APP_NAME!r} may still be deployed on the cluster"
        look = "the cluster's state (ray status) and its head node's logs"
    return RayLostError(
        f"Ray went away under serve: {reason}; {stopped}. See {look} for why (memory, a kill), then start serve again.",
        reason=reason,
    )


def wait_ready(settings: ServeSettings) -> None:
    """Poll ``/v2/health/ready`` until it answers 200, within ``settings.ready_timeout_s``; a deployment Serve gave
    up on, or one not ready in time, is one error line (the second naming what the replicas asked, what the
    cluster had free and what Serve said of them)."""
    host = "127.0.0.1" if settings.host in {"0.0.0.0", "::"} else settings.host
    url = f"http://{host}:{settings.port}/v2/health/ready"
    timeout_s = settings.ready_timeout_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check_not_failed(settings)
        if answers_ready(host, settings.port):
            return
        time.sleep(0.2)
    asked = replicas_asked(settings)
    said = (deployment_message() or "nothing").rstrip(".")
    raise WorkerStartError(
        f"the deployment of {asked.words()} was not ready within {timeout_s:g} s ({url}); the cluster has "
        f"{room_words()}; Serve says: {said}. Rerun when the cluster is free.",
        ready=0,
        requested=asked.count,
        suggestions=(asked.lower(), Suggestion("Or raise {} for a large model.", (("ready_timeout_s", None),))),
    )


def answers_ready(host: str, port: int) -> bool:
    """Whether Serve's proxy at ``host:port`` answers ``/v2/health/ready`` with 200 now; False while nothing listens
    or the proxy is not up yet.

    Something that answers but not in HTTP/1.1 is another process on the port (the preflight found it free, but
    Ray's own processes take ports from the kernel's ephemeral range while Ray starts, and Serve's proxy then
    cannot bind it): one error line naming the port, not an internal error from the HTTP client.
    """
    # The standard library's client: httpx is only a test dependency, and no proxy applies on loopback.
    connection = http.client.HTTPConnection(host, port, timeout=2.0)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False
    except http.client.HTTPException as exc:
        raise not_the_proxy(host, port, exc) from None
    finally:
        connection.close()


def _serve_ports(settings: ServeSettings, plan: IngressPlan) -> tuple[int, int, int, int]:
    """The ports serve listens on by the user's word: theirs, and the proxies' behind an ingress."""
    return (settings.port, settings.grpc_port, plan.proxy_http_port, plan.proxy_grpc_port)


def check_not_failed(settings: ServeSettings) -> None:
    """Raise the replicas' start-up error (its last line: the exception) once Serve marks the deploy failed; a port
    taken meanwhile is named as such (Serve's own words name neither the port nor the flag)."""
    application = serve.status().applications.get(APP_NAME)
    # The status is a str enum, whose str() is "ApplicationStatus.DEPLOY_FAILED" on Python 3.11: its value.
    if application is None or getattr(application.status, "value", application.status) != "DEPLOY_FAILED":
        return
    said = deployment_message()
    taken = taken_while_starting(settings.host, settings.port, settings.grpc_port, said)
    if taken is not None:
        raise taken
    raise ConfigError(f"the deployment failed to start: {said or 'no reason given by Serve'}")


def deployment_message() -> str:
    """The last line of what Serve says of the deployment (or else of the application): a start-up error, or
    why replicas are not scheduled (the resources each needs and those available)."""
    application = serve.status().applications.get(APP_NAME)
    if application is None:
        return ""
    deployment = application.deployments.get(DEPLOYMENT_NAME)
    message = (deployment.message if deployment is not None else "") or application.message
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class StartInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM while ``serve``'s Ray starts (before the deploy): Ray is shut down, the command ends
    with exit 130 and this one line (a KeyboardInterrupt, so the CLI's interrupted exit applies)."""


def _connect_interruptibly(address: str | None, joining: threading.Event) -> bool:
    """:func:`connect`, with ``joining`` set while it joins a running Ray (``address`` or ``RAY_ADDRESS``): a signal
    then ends the join at once (the handler raises :class:`StartInterrupted` inside ``ray.init``) rather than after
    Ray's own retries.

    An embedded Ray's processes lead process groups of their own (:func:`~.ray_private.own_process_group`): a
    SIGTERM to serve's group (``timeout``, ``kill -TERM -PGID``) killed them with it, and the orderly stop then
    waited a minute on the dead GCS and exited 1 without a line. Now it reaches serve alone, which stops them.

    An embedded Ray's start is not cut: raised while ``ray.init`` built the head, the interruption left the raylet's
    two agents running for about a minute after the exit (Ray's shutdown never learnt of the half-started head, and
    its reaper stopped the rest). The signal is taken once Ray is up instead, and Ray shut down whole.
    """
    with ray_private.keep_signal_handlers(), ray_private.own_process_group():
        if address or os.environ.get("RAY_ADDRESS"):
            joining.set()
        try:
            return connect(address)
        finally:
            joining.clear()


def _take_signals(
    handler: Callable[[int, FrameType | None], None], received: list[str] | None = None
) -> dict[signal.Signals, Any]:
    """SIGINT and SIGTERM to ``handler``; the handlers they had. With ``received``, the signal (its name) that came
    before and whose ``KeyboardInterrupt`` Python swallowed (in a finalizer during the imports:
    :mod:`distributed_onnx.interrupts`) is taken from the record into it: ``serve`` stops on it at its next
    checkpoint, before Ray starts, as on a signal to ``handler``."""
    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    if received is not None and (early := interrupts.arrived()) is not None:
        received.append(early)
        interrupts.forget()
    return previous


def serve_forever(settings: ServeSettings) -> int:
    """Run until SIGINT/SIGTERM, then shut down cleanly; returns the exit code (0).

    A signal while an embedded Ray starts is held until Ray is up (its start is not cut: see
    :func:`~distributed_onnx.runtime.ray_private.keep_signal_handlers` and :func:`_connect_interruptibly`); then Ray
    is shut down and :class:`StartInterrupted` raised (exit 130, one line); one while joining a cluster ends the
    join at once. A signal once the deploy began lets the deploy finish (a start cut short leaves Serve's actors
    half made), then stops without the ``ready:`` line: exit 130, one line. A supervisor that stopped serve must
    not read "ready" (it did, with exit 0, until an outside attack found it).
    """
    stop_requested = threading.Event()
    received: list[str] = []

    joining = threading.Event()  # inside ray.init's join: a signal ends it there, not after Ray's own retries

    def request_stop(signum: int, frame: FrameType | None) -> None:
        logger.info("Received %s; shutting down", signal.Signals(signum).name)
        received.append(signal.Signals(signum).name)
        stop_requested.set()
        if joining.is_set():  # inside ray.init's join: end it there (one raise; the flag is cleared on the way out)
            stop_if_asked()

    def stop_if_asked(said: str = "nothing was served") -> None:
        if received:  # a signal to request_stop, or one before it whose KeyboardInterrupt was swallowed
            raise StartInterrupted(f"interrupted by {received[0]} while starting; {said}")

    previous = _take_signals(request_stop, received)
    started_ray = False
    deployed = False
    lost = False
    watch: RayWatch | None = None
    preflight(settings)
    plan = choose_ingress(settings)
    # Serve's processes read the ingress switches (and the gRPC message limit) from their environment when they
    # start: set them first.
    os.environ.update(plan.environment | message_limit_environment(settings.max_body_bytes))
    logger.info("Ingress: %s (%s)", plan.mode, plan.reason)
    try:
        stop_if_asked()  # before Ray starts
        started_ray = _connect_interruptibly(settings.address, joining)
        # ray.init installs its own SIGTERM handlers (a Python one that exits, kept out above, and a C-level one
        # that aborts the driver with exit -6 - measured): take the signals back before deploying.
        _take_signals(request_stop)
        stop_if_asked()  # a signal during Ray's start: nothing deployed yet, stop here
        check_fits(replicas_asked(settings))  # replicas no node (or the whole cluster) can hold: exit 2, not a wait
        deployed = True
        deploy(settings, plan)  # a signal from here on: the deploy completes, then stops before the ready line
        wait_ready(settings)
        stop_if_asked("stopped before the ready line")
        if started_ray:  # every socket of the embedded instance on loopback, but those the user asked for
            check_listening(os.getpid(), allowed_ports(settings.host, _serve_ports(settings, plan), plan.environment))
        watch = watch_connected_ray(started_ray)  # before the ready line: its processes read while they all run
        logger.info(
            "Serving %s on http://%s:%d (docs at /docs); Ctrl-C to stop",
            served_models(settings),
            settings.host,
            settings.port,
        )
        base = f"http://{settings.host}:{settings.port}"
        print(
            f"ready: {base}/v1/forecast (docs: {base}/docs), gRPC {settings.host}:{settings.grpc_port} (KServe v2); "
            f"{served_models(settings)}; ingress: {plan.mode}, {settings.replica_words()}; Ctrl-C or SIGTERM stops",
            flush=True,
        )
        while not stop_requested.wait(0.5):
            reason = watch.lost()
            if reason is not None:
                lost = True
                raise lost_ray_error(reason, started_ray)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if lost:
            abandon_lost_ray(started_ray, watch)  # serve.delete and ray.shutdown would wait on the dead GCS
        elif deployed or started_ray:
            stop(started_ray, deployed)
    return 0
