"""The embedded local Ray stays on 127.0.0.1: every socket its process tree listens on is loopback.

Runs the embedded start-up (``local_ray.connect``) in a fresh interpreter, without the test suite's
environment switch, exactly as ``distributed-onnx backtest`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from listening import is_loopback, listening_addresses

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, sys.argv[1])
    import ray
    from distributed_onnx.local_ray import connect
    connect(None, num_cpus=1)

    @ray.remote
    def where():
        return ray.util.get_node_ip_address()

    print(json.dumps({"node": ray.get(where.remote()), "pid": os.getpid()}), flush=True)
    sys.stdin.readline()  # hold Ray up until the test has looked at the sockets
    ray.shutdown()
    """
)


def test_embedded_ray_listens_on_loopback_only() -> None:
    env = {key: value for key, value in os.environ.items() if key != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    tests_dir = os.path.dirname(__file__)
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, tests_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=os.path.dirname(tests_dir),
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        line = process.stdout.readline()
        started = json.loads(line)
        assert started["node"] == "127.0.0.1"
        addresses = listening_addresses(process.pid)
        assert addresses, "found no listening sockets: the /proc reading is broken"
        exposed = [address for address in addresses if not is_loopback(address)]
        assert not exposed, f"embedded Ray listens beyond loopback: {exposed} (all: {addresses})"
        process.stdin.write("\n")
        process.stdin.flush()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
