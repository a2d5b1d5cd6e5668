"""Several models in one replica's core, without Serve: which model answers, readiness, and a shadow's forecast.

Integration tier for ONNX Runtime (two tiny graphs), no Ray: :class:`ReplicaCore` is what each replica runs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from graphs import write_tiny_chronos2, write_tiny_context_quantiles

from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.serve.core import ReplicaCore
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.http import HttpError
from distributed_onnx.serve.wire.schemas import ForecastRequest

pytestmark = pytest.mark.integration


@pytest.fixture
def replica(tmp_path: Path) -> ReplicaCore:
    champion = write_tiny_chronos2(tmp_path, name="champion").weights_path
    challenger = write_tiny_context_quantiles(tmp_path).weights_path
    settings = ServeSettings(checkpoint=[champion, challenger], shadow=["tiny_plain"])
    core = ReplicaCore(settings, LiveMetrics(replica="test"))
    for checkpoint in settings.checkpoint:
        worker = InferenceWorker.from_config(WorkerConfig(checkpoint=checkpoint, warm_up_rows=0))
        core.add_model(worker, shadow=checkpoint.stem in settings.shadow, checkpoint_sha256="0" * 64)
    return core


BODY = {"series": [{"series_id": "a", "y": [1.0, 2.0, 3.0, 4.0]}], "horizon": 4, "quantiles": [0.1, 0.5, 0.9]}


def _answer(replica: ReplicaCore, body: dict[str, object]) -> tuple[str, dict[str, object]]:
    async def run() -> tuple[str, dict[str, object]]:
        with replica.admission.enter() as ticket:
            answer = await replica.forecast(json.dumps(body).encode(), ticket)
        return answer.model.name, json.loads(answer.body)

    return asyncio.run(run())


def test_the_model_field_picks_the_model_and_the_default_is_the_first_non_shadow(replica: ReplicaCore) -> None:
    assert replica.default_model.name == "champion"
    assert [model.name for model in replica.shadows] == ["tiny_plain"]
    name, document = _answer(replica, BODY)
    assert name == document["model"] == "champion"
    name, document = _answer(replica, {**BODY, "model": "tiny_plain"})
    assert name == document["model"] == "tiny_plain"
    quantiles = document["forecasts"][0]["quantiles"]  # type: ignore[index]
    assert quantiles["0.5"] == [4.0] * 4  # tiny_plain: the last value, +-1
    with pytest.raises(HttpError, match="Unknown model 'nope'; this server serves 'champion', 'tiny_plain'"):
        _answer(replica, {**BODY, "model": "nope"})


def test_a_shadow_forecasts_the_same_request_on_its_own_grid(replica: ReplicaCore) -> None:
    request = ForecastRequest.model_validate(BODY)
    forecasts, levels = asyncio.run(replica.models["tiny_plain"].shadow_forecast(request))
    assert levels == (0.1, 0.5, 0.9)
    np.testing.assert_allclose(forecasts[0, :, 1], 4.0)


def test_a_failing_shadow_does_not_make_the_replica_unready(replica: ReplicaCore) -> None:
    shadow = replica.models["tiny_plain"]
    for _ in range(5):
        shadow.health.failed(RuntimeError("broken challenger"))
    assert not shadow.health.ready
    assert replica.ready and replica.not_ready_reason == ""
    replica.models["champion"].health.failed(RuntimeError("x"))
    for _ in range(5):
        replica.models["champion"].health.failed(RuntimeError("broken champion"))
    assert not replica.ready and "champion: " in replica.not_ready_reason


def test_a_shadows_plan_runs_off_the_event_loop(replica: ReplicaCore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29, defect 10: a large request's shadow plan ran on the replica's event loop (hundreds of ms)."""
    import threading

    from distributed_onnx.serve import core

    planned_in: list[threading.Thread] = []
    original = core.plan_job

    def plan_job(*args: Any) -> Any:
        planned_in.append(threading.current_thread())
        return original(*args)

    monkeypatch.setattr(core, "plan_job", plan_job)

    async def shadow() -> threading.Thread:
        await replica.models["tiny_plain"].shadow_forecast(ForecastRequest.model_validate(BODY))
        return threading.current_thread()

    loop_thread = asyncio.run(shadow())
    assert planned_in and planned_in[0] is not loop_thread
