"""A checkpoint repository behind one deployment, over real HTTP on 127.0.0.1 (real Ray, Serve, ONNX Runtime).

Forty tiny checkpoints that differ per checkpoint (each adds 1000 x its number to every quantile, so an answer
from the wrong model is off by thousands), a replica budget of 8: every model answers its own forecast (equal
to a backtest of that checkpoint on the same windows for a sample, and to that checkpoint's worker run in this
process for all forty), least recently used models are evicted and counted on ``/metrics``, the repository is
listed (``/v2/models``) and indexed as Triton does (``/v2/repository/index``), an unknown name is a JSON 404 and
a broken checkpoint a JSON 503 naming its error, the replica staying ready.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")

from backtest_data import QUANTILES, write_dataset
from conftest import free_port, start_test_ray
from graphs import QUANTILE_OFFSETS, tiny_chronos2_metadata, tiny_chronos2_model
from onnx import numpy_helper

from distributed_onnx.model.checkpoint import write_checkpoint
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig

pytestmark = pytest.mark.integration

MODELS = [f"region{k:02d}" for k in range(40)]
BUDGET = 8
#: Backtested as well (a backtest per checkpoint costs seconds each on 2 cores): first, last and two between.
BACKTESTED = ["region00", "region13", "region26", "region39"]
APP = "repository"


def write_region(directory: Path, k: int) -> Path:
    """The tiny Chronos-2 graph with every quantile moved by ``1000 * k``: a checkpoint of its own."""
    model = tiny_chronos2_model()
    (offsets,) = [node for node in model.graph.node if node.output[0] == "offsets"]
    moved = (QUANTILE_OFFSETS + np.float32(1000.0 * k)).reshape(1, -1, 1)
    offsets.attribute[0].t.CopyFrom(numpy_helper.from_array(moved, name="offsets"))
    path = directory / f"region{k:02d}.onnx"
    return write_checkpoint(path, model.SerializeToString(), tiny_chronos2_metadata()).weights_path


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("repository")
    for k in range(len(MODELS)):
        write_region(folder, k)
    # Two broken checkpoints: metadata that is not JSON (caught before anything is evicted), and weights ONNX
    # Runtime cannot read (metadata valid, no sha256 to catch it earlier).
    (folder / "bad_metadata.onnx").write_bytes((folder / "region00.onnx").read_bytes())
    (folder / "bad_metadata.metadata.json").write_text("{not json")
    (folder / "bad_graph.onnx").write_bytes(b"these are not ONNX bytes")
    document = tiny_chronos2_metadata().model_dump(mode="json", exclude_none=True)
    (folder / "bad_graph.metadata.json").write_text(json.dumps(document))
    return folder


@pytest.fixture(scope="module")
def client(repository: Path) -> Iterator[httpx.Client]:
    from ray import serve

    from distributed_onnx.serve.app import build_app
    from distributed_onnx.serve.settings import ServeSettings

    start_test_ray()
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": 60})
    settings = ServeSettings(
        model_repository=str(repository), repository_budget=BUDGET, port=port, cpus_per_replica=0.5
    )
    serve.run(build_app(settings), name=APP, route_prefix="/", blocking=False)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for _ in range(600):
                try:
                    if client.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            yield client
    finally:
        serve.shutdown()


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The backtest's data and its windows: per window the series, its origin (µs) and its history."""
    from distributed_onnx.evaluation.data.windows import plan_series
    from distributed_onnx.evaluation.planning import prepare
    from distributed_onnx.evaluation.settings import BacktestSettings

    work = tmp_path_factory.mktemp("windows")
    data = write_dataset(work / "data.parquet", covariate=False)
    checkpoint = write_region(work, 0)
    plan = prepare(
        BacktestSettings(checkpoint=checkpoint, data=data, output=work / "run", n_windows=3, stride=3, progress=False)
    )
    found = []
    for series in plan.table.series:
        for origin in plan_series(series, plan.spec).origins:
            found.append(
                {
                    "series_id": series.series_id,
                    "origin_us": int(series.timestamp_us(int(origin))),
                    "y": [None if np.isnan(v) else float(v) for v in series.values[: int(origin)]],
                }
            )
    assert len(found) >= 5
    return data, found


def metric(client: httpx.Client, name: str) -> float:
    """The sum of a counter's samples on the replica's /metrics page (one replica here)."""
    text = client.get("/metrics").text
    return sum(float(value) for value in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, flags=re.MULTILINE))


def forecast(client: httpx.Client, model: str, histories: list[dict[str, Any]], header: bool) -> np.ndarray:
    """[windows, horizon, quantiles] from /v1/forecast, the model named by the header or by the body."""
    body: dict[str, Any] = {"series": histories, "horizon": 8, "quantiles": QUANTILES}
    headers = {"serve_multiplexed_model_id": model} if header else {}
    if not header:
        body["model"] = model
    response = client.post("/v1/forecast", json=body, headers=headers)
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["model"] == model
    return np.array(
        [[f["quantiles"][format(q, "g")] for q in QUANTILES] for f in document["forecasts"]], dtype=np.float32
    ).transpose(0, 2, 1)


def histories_of(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"series_id": f"w{i}", "y": window["y"]} for i, window in enumerate(windows)]


def test_every_checkpoint_answers_its_own_forecast_and_the_lru_evicts_beyond_the_budget(
    client: httpx.Client, repository: Path, windows: tuple[Path, list[dict[str, Any]]]
) -> None:
    _, planned = windows
    histories = histories_of(planned)
    answers = {}
    counts = []
    for rounds in range(2):  # forty models in turn, twice: with 8 held, every request of the second pass misses
        counts.append([metric(client, f"distributed_onnx_repository_{n}_total") for n in ("loads", "evictions")])
        for index, model in enumerate(MODELS):
            answers[model] = forecast(client, model, histories, header=(index + rounds) % 2 == 0)
    loads, evictions = (
        metric(client, "distributed_onnx_repository_loads_total"),
        metric(client, "distributed_onnx_repository_evictions_total"),
    )
    assert loads - counts[0][0] >= len(MODELS) + len(MODELS) - BUDGET  # the first pass: at least 32 misses
    assert (loads - counts[1][0], evictions - counts[1][1]) == (len(MODELS), len(MODELS))
    assert metric(client, "distributed_onnx_repository_models_loaded") == BUDGET
    # A hit: the model just answered is held, so asking again loads nothing.
    before = metric(client, "distributed_onnx_repository_loads_total")
    forecast(client, MODELS[-1], histories, header=True)
    assert metric(client, "distributed_onnx_repository_loads_total") == before

    context = np.full((len(histories), 16), np.nan, dtype=np.float32)  # the last 16 values, missing on the left
    for row, history in enumerate(histories):
        tail = [np.nan if v is None else v for v in history["y"][-16:]]
        context[row, 16 - len(tail) :] = tail
    for k, model in enumerate(MODELS):
        config = WorkerConfig(checkpoint=repository / f"{model}.onnx", warm_up_rows=0)
        expected = InferenceWorker.from_config(config).forecast(context, 8, QUANTILES)
        np.testing.assert_array_equal(answers[model], expected, err_msg=model)
        # each its own model: every quantile 1000 x k above region00's (a wrong routing is off by thousands)
        np.testing.assert_allclose(answers[model] - answers[MODELS[0]], 1000.0 * k, rtol=0, atol=0.05)


def test_a_sample_of_checkpoints_answers_its_backtest_forecast(
    client: httpx.Client, repository: Path, windows: tuple[Path, list[dict[str, Any]]]
) -> None:
    import distributed_onnx

    data, planned = windows
    result = distributed_onnx.backtest(
        str(data),
        checkpoint=[repository / f"{model}.onnx" for model in BACKTESTED],
        n_windows=3,
        stride=3,
        quantiles=QUANTILES,
        actors=1,
        cpus_per_actor=1.0,
        progress=False,
    ).forecasts.to_pylist()
    for model in BACKTESTED:
        served = forecast(client, model, histories_of(planned), header=True)
        for index, window in enumerate(planned):
            rows = sorted(
                (
                    row
                    for row in result
                    if row["model"] == model
                    and row["series_id"] == window["series_id"]
                    and int(row["origin"].timestamp() * 1_000_000) == window["origin_us"]
                ),
                key=lambda row: row["lead"],
            )
            assert len(rows) == 8, (model, window["series_id"], window["origin_us"])
            backtested = np.array([[row[f"q{q:g}"] for q in QUANTILES] for row in rows], dtype=np.float32)
            np.testing.assert_array_equal(served[index], backtested, err_msg=f"{model} {window['series_id']}")


def test_the_repository_is_listed_and_indexed(client: httpx.Client) -> None:
    forecast(client, "region05", [{"series_id": "a", "y": [1.0, 2.0, 3.0]}], header=True)  # held now
    listed = client.get("/v2/models").json()["models"]
    assert listed == sorted([*MODELS, "bad_graph", "bad_metadata"])
    index = client.post("/v2/repository/index").json()
    assert [entry["name"] for entry in index] == listed
    states = {entry["name"]: entry for entry in index}
    assert states["region05"] == {"name": "region05", "version": "1", "state": "READY", "reason": ""}
    assert sum(entry["state"] == "READY" for entry in index) == BUDGET
    unloaded = next(entry for entry in index if entry["state"] != "READY" and entry["name"].startswith("region"))
    assert unloaded["state"] == "UNAVAILABLE" and unloaded["reason"].startswith("unloaded")
    ready = client.post("/v2/repository/index", json={"ready": True}).json()
    assert len(ready) == BUDGET and all(entry["state"] == "READY" for entry in ready)
    assert client.post("/v2/repository/index", json={"ready": "x", "other": 1}).status_code == 422
    metadata = client.get("/v2/models/region17")  # loads it: metadata of a repository model
    assert metadata.status_code == 200 and metadata.json()["name"] == "region17"


def test_an_unknown_model_is_a_json_404_naming_the_repository(client: httpx.Client) -> None:
    body = {"series": [{"series_id": "a", "y": [1.0, 2.0]}], "model": "nowhere"}
    for response in (
        client.post("/v1/forecast", json=body),
        client.post("/v1/forecast", json={"series": body["series"]}, headers={"serve_multiplexed_model_id": "nope"}),
        client.get("/v2/models/nowhere"),
        client.post("/v2/models/../etc/infer", json={"inputs": []}),
    ):
        assert response.status_code == 404, response.text
        assert "error" in response.json()
    assert "model repository" in client.post("/v1/forecast", json=body).json()["error"]
    nameless = client.post("/v1/forecast", json={"series": body["series"]})
    assert nameless.status_code == 422 and "Name the model" in nameless.json()["error"]


def test_a_broken_checkpoint_is_a_503_with_its_reason_and_the_replica_stays_ready(client: httpx.Client) -> None:
    series = [{"series_id": "a", "y": [1.0, 2.0, 3.0]}]
    for name, reason in (("bad_metadata", "CheckpointMetadataError"), ("bad_graph", "CheckpointCorruptError")):
        for _ in range(2):  # the second time from the remembered failure
            response = client.post("/v1/forecast", json={"series": series, "model": name})
            assert response.status_code == 503, response.text
            assert reason in response.json()["error"] and name in response.json()["error"]
        entry = next(e for e in client.post("/v2/repository/index").json() if e["name"] == name)
        assert entry["state"] == "UNAVAILABLE" and reason in entry["reason"]
    assert metric(client, "distributed_onnx_repository_load_failures_total") >= 2
    assert client.get("/v2/health/ready").status_code == 200
    forecast(client, "region03", series, header=False)
