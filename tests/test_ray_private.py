"""Ray's private parts (``runtime/ray_private.py``) and the loopback socket check: unit tests, no Ray started.

The name check runs on hand-made module objects (a Ray that moved a name), then on the installed Ray, where
every name the package and its tests rely on must exist (a Ray upgrade that moves one fails here first).
"""

from __future__ import annotations

import os
import pickle
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from distributed_onnx.errors import DistributedOnnxError, LoopbackError, UnsupportedRayError
from distributed_onnx.runtime import ray_private
from distributed_onnx.runtime.listening import decode_address, exposed_sockets, listening_addresses
from distributed_onnx.runtime.ray_private import PrivateName, check_names, missing_names
from distributed_onnx.serve.operations.loopback import allowed_ports, check_listening

GRPC = PrivateName("fake_ray.serve._private.replica", "add_port_to_grpc_server")
SWITCH = PrivateName("fake_ray._private.ray_constants", "ENABLE_RAY_CLUSTERS_ENV_VAR", "RAY_X")


def fake_ray(*, with_grpc: bool = True, switch: str = "RAY_X") -> dict[str, ModuleType]:
    replica = ModuleType("fake_ray.serve._private.replica")
    if with_grpc:
        replica.add_port_to_grpc_server = lambda server, address: 0  # type: ignore[attr-defined]
    constants = ModuleType("fake_ray._private.ray_constants")
    constants.ENABLE_RAY_CLUSTERS_ENV_VAR = switch  # type: ignore[attr-defined]
    return {module.__name__: module for module in (replica, constants)}


def importer(modules: dict[str, ModuleType]):  # type: ignore[no-untyped-def]
    def import_module(name: str) -> ModuleType:
        if name not in modules:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return modules[name]

    return import_module


def test_a_missing_function_is_one_line_naming_it_and_the_tested_ray() -> None:
    with pytest.raises(UnsupportedRayError) as info:
        check_names([GRPC, SWITCH], import_module=importer(fake_ray(with_grpc=False)), ray_version="2.61.0")
    message = str(info.value)
    assert "\n" not in message
    assert "Ray 2.61.0 has no fake_ray.serve._private.replica.add_port_to_grpc_server" in message
    assert f"tested with Ray {ray_private.TESTED_RAY}.x" in message
    assert info.value.missing == ["fake_ray.serve._private.replica.add_port_to_grpc_server"]  # type: ignore[attr-defined]
    assert isinstance(info.value, DistributedOnnxError)
    assert pickle.loads(pickle.dumps(info.value)).missing == info.value.missing  # type: ignore[attr-defined]


def test_a_missing_module_and_a_changed_value_are_both_reported() -> None:
    modules = fake_ray(switch="RAY_RENAMED")
    del modules["fake_ray.serve._private.replica"]
    found = missing_names([GRPC, SWITCH], importer(modules))
    assert found == [
        "fake_ray.serve._private.replica.add_port_to_grpc_server",
        "fake_ray._private.ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == 'RAY_X' (found 'RAY_RENAMED')",
    ]
    with pytest.raises(UnsupportedRayError, match=r"add_port_to_grpc_server \(and 1 more\)"):
        check_names([GRPC, SWITCH], import_module=importer(modules), ray_version="3.0.0")


def test_a_dotted_name_is_a_class_attribute_and_a_missing_method_is_reported() -> None:
    module = ModuleType("fake_ray._private.node")

    class Node:
        def start_monitor(self) -> None: ...

    module.Node = Node  # type: ignore[attr-defined]
    names = [PrivateName(module.__name__, "Node.start_monitor"), PrivateName(module.__name__, "Node.start_api_server")]
    assert missing_names(names, importer({module.__name__: module})) == ["fake_ray._private.node.Node.start_api_server"]


def test_the_single_node_head_skips_two_processes_and_the_dashboard_check_for_its_block_only() -> None:
    from ray._private import utils
    from ray._private.node import Node

    processes = (ray_private.HEAD_API_SERVER, ray_private.HEAD_MONITOR)
    before = {name.attribute: name.get() for name in ray_private.SINGLE_NODE_SKIPS}
    with ray_private.single_node_head():
        for name in ray_private.SINGLE_NODE_SKIPS:
            assert name.get() is not before[name.attribute]
        for name in processes:
            assert name.get()(object()) is None  # a no-op, whatever Ray passes
        assert isinstance(utils.get_dashboard_dependency_error(), ImportError)  # the agent starts minimal
    assert {name.attribute: name.get() for name in ray_private.SINGLE_NODE_SKIPS} == before
    assert Node.start_monitor is before["Node.start_monitor"]
    assert utils.get_dashboard_dependency_error is before["get_dashboard_dependency_error"]


def test_stand_in_agents_replace_the_raylets_start_for_the_block_only_and_only_for_the_raylet() -> None:
    from ray._private import services

    original = services.start_ray_process
    started: list[tuple[list[str], str]] = []
    services.start_ray_process = lambda command, process_type, *args, **kwargs: started.append((command, process_type))
    recording = services.start_ray_process
    raylet = ["raylet", "--dashboard_agent_command=py a.py --node-id=n --session-dir=/s",
              "--runtime_env_agent_command=py m.py --node-id=n --session-dir=/s"]  # fmt: skip
    try:
        with ray_private.single_node_head():  # asked without stand-ins: the raylet's start is Ray's
            assert services.start_ray_process is recording
        with ray_private.single_node_head(stand_in_agents=True):
            services.start_ray_process(raylet, "raylet")
            services.start_ray_process(["gcs_server", "--dashboard_agent_command=x"], "gcs_server")
        assert services.start_ray_process is recording
    finally:
        services.start_ray_process = original
    (raylet_command, _), (gcs_command, _) = started
    assert all(str(ray_private.STAND_IN_SCRIPT) in each for each in raylet_command[1:])
    assert "--ports=runtime_env_agent_port" in raylet_command[2]
    assert gcs_command == ["gcs_server", "--dashboard_agent_command=x"]  # another process: untouched


def test_a_raylet_command_line_without_both_agents_keeps_rays_agents(caplog: pytest.LogCaptureFixture) -> None:
    command = ["raylet", "--dashboard_agent_command=py a.py --node-id=n --session-dir=/s"]  # no runtime-env agent
    assert ray_private.with_stand_in_agents(command) == command
    assert "does not name its two agents" in caplog.text


def test_the_stand_in_writes_each_port_file_whole_as_not_in_use(tmp_path: Path) -> None:
    from distributed_onnx.runtime import agent_stand_in

    session = str(tmp_path)
    for name in ("metrics_agent_port", "runtime_env_agent_port"):
        agent_stand_in.persist_port(session, "ab12", name, agent_stand_in.NOT_IN_USE)
    assert sorted(os.listdir(session)) == ["metrics_agent_port_ab12", "runtime_env_agent_port_ab12"]
    assert open(os.path.join(session, "runtime_env_agent_port_ab12")).read() == "-1"


def test_a_stand_in_whose_raylet_went_before_it_started_exits_at_once_instead_of_outliving_the_command(
    tmp_path: Path,
) -> None:
    """Outside attack: the loser of two backtests started together on one ``--output`` (refused: in use) exited
    while its early Ray was starting; its raylet went with it before the stand-ins had looked at their parent, so
    each took the init process for its raylet and waited for it: two orphans alive a quarter of an hour later.
    Here the stand-in starts, as the raylet would start it, under a parent already gone (a shell that exited)."""
    import psutil

    session = str(tmp_path / "session_orphan")
    os.mkdir(session)
    stand_in = [sys.executable, "-S", str(ray_private.STAND_IN_SCRIPT), "--node-id=ab12", f"--session-dir={session}"]
    command = shlex.join([*stand_in, "--ports=runtime_env_agent_port"])
    subprocess.run(["sh", "-c", f"(sleep 0.3; exec {command}) >/dev/null 2>&1 &"], check=True, timeout=10)

    def left() -> list[psutil.Process]:  # the subshell while it sleeps, then the stand-in (the same process)
        named = (process for process in psutil.process_iter(["cmdline"]) if process.info["cmdline"])
        return [process for process in named if f"--session-dir={session}" in " ".join(process.info["cmdline"])]

    assert left(), "the subshell that starts the stand-in is not running"
    deadline = time.monotonic() + 5.0  # its sleep, its start, and an exit at once; on main it never exits
    while (remaining := left()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in remaining:
        process.kill()
    assert not remaining, f"stand-in left running without its raylet: {[p.info['cmdline'] for p in remaining]}"
    assert os.listdir(session) == []  # nothing written for a raylet that is gone


def test_the_installed_ray_has_every_private_name_the_package_and_tests_use() -> None:
    assert missing_names(ray_private.ALL_NAMES) == []
    assert len(ray_private.SERVE_SWITCHES) == len(set(ray_private.SERVE_SWITCHES)) >= 12


def test_the_address_wrapper_rebinds_and_does_not_stack() -> None:
    module = ModuleType("fake_ray_bind")
    seen: list[str] = []
    module.bind = lambda server, address: seen.append(address)  # type: ignore[attr-defined]
    sys.modules["fake_ray_bind"] = module
    try:
        name = PrivateName("fake_ray_bind", "bind")
        host_of = lambda address, host: address.replace("[::]", host)  # noqa: E731
        assert ray_private.wrap_address_argument(name, "127.0.0.1", host_of)
        assert ray_private.wrap_address_argument(name, "127.0.0.1", host_of)  # same host: already wrapped
        module.bind(None, "[::]:0")  # type: ignore[attr-defined]
        assert seen == ["127.0.0.1:0"]
        assert not ray_private.wrap_address_argument(PrivateName("fake_ray_bind", "gone"), "127.0.0.1", host_of)
    finally:
        del sys.modules["fake_ray_bind"]


# ------------------------------------------------------------------------------------------ sockets


def test_proc_addresses_decode() -> None:
    assert decode_address("0100007F:1F90") == "127.0.0.1:8080"
    assert decode_address("00000000000000000000000000000000:0050") == ":::80"
    mapped = decode_address("0000000000000000FFFF00000100007F:0050")  # ::ffff:127.0.0.1, port 80
    assert mapped == "::ffff:7f00:1:80" and not exposed_sockets([mapped])


def test_exposed_sockets_are_those_beyond_loopback_not_allowed() -> None:
    addresses = ["127.0.0.1:6379", "::1:7000", "::ffff:7f00:1:80", "0.0.0.0:8404", ":::9101", "192.0.2.2:8000"]
    assert exposed_sockets(addresses) == ["0.0.0.0:8404", ":::9101", "192.0.2.2:8000"]
    assert exposed_sockets(addresses, allowed_ports={8404, 9101}) == ["192.0.2.2:8000"]


def test_allowed_ports_follow_the_host_and_the_haproxy_template() -> None:
    haproxy = {
        ray_private.HA_PROXY: "1",
        ray_private.HAPROXY_STATS_PORT: "8404",
        ray_private.HAPROXY_METRICS_PORT: "9101",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "20000",
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "20002",
    }
    assert allowed_ports("127.0.0.1", (8000, 8001), {}) == set()
    assert allowed_ports("127.0.0.1", (8000, 8001), haproxy) == {8404, 9101}
    assert allowed_ports("0.0.0.0", (8000, 8001), haproxy) == {8000, 8001, 8404, 9101, 20000, 20001}


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_this_process_listening_on_loopback_passes_the_check() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        found = listening_addresses(os.getpid())
        assert found is not None and address in found
        assert address in check_listening(os.getpid(), allowed=())


def test_a_socket_beyond_loopback_stops_serve_with_one_line_naming_it() -> None:
    def read(pid: int) -> list[str]:
        return ["127.0.0.1:6379", "0.0.0.0:8404", ":::37001"]

    assert check_listening(1, allowed={8404, 37001}, read=read) == read(1)
    with pytest.raises(LoopbackError, match=r"^the embedded Ray should listen on loopback only, but :::37001") as info:
        check_listening(1, allowed={8404}, read=read)
    assert "\n" not in str(info.value)
    assert info.value.exposed == [":::37001"]  # type: ignore[attr-defined]


def test_no_other_module_of_the_package_imports_a_private_part_of_ray() -> None:
    """The one-module rule, checked on the source: import-linter sees external packages only by their top name."""
    import ast
    from pathlib import Path

    package = Path(ray_private.__file__).resolve().parent.parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "ray_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            offenders += [
                f"{path.relative_to(package)}: {name}" for name in names if name.startswith("ray") and "._" in name
            ]
    assert offenders == []


def test_serve_refuses_a_ray_without_a_private_name_in_one_line_before_ray_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from distributed_onnx.runtime.ray_private import SERVE_NAMES
    from distributed_onnx.serve.operations.ingress import free_port
    from distributed_onnx.serve.preflight import preflight
    from distributed_onnx.serve.settings import ServeSettings

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    gone = PrivateName("ray.serve._private.replica", "add_port_to_grpc_server_renamed")
    monkeypatch.setattr(ray_private, "SERVE_NAMES", (*SERVE_NAMES, gone))
    settings = ServeSettings(port=free_port(), grpc_port=free_port())  # the bundled checkpoint
    with pytest.raises(UnsupportedRayError) as info:
        preflight(settings)  # what `distributed-onnx serve` runs first: the CLI prints it as one error line
    assert str(info.value) == (
        f"Ray {ray.__version__} has no ray.serve._private.replica.add_port_to_grpc_server_renamed, which "
        f"distributed_onnx relies on; it is tested with Ray {ray_private.TESTED_RAY}.x: pip install "
        f"'ray[serve]~={ray_private.TESTED_RAY}.0'"
    )
    preflight(settings.model_copy(update={"address": "127.0.0.1:6379"}))  # a cluster's Ray is not checked here
