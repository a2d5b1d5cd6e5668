"""Live evaluation end to end: serve two checkpoints (one a shadow) with the forecast log on, send requests whose
histories end at a backtest's origins, score the log against the actuals: the backtests' forecasts and metrics.
Then the log's folder is replaced by a file mid-run: every request is still answered, the drops are counted on
/metrics, and logging resumes when the folder is back.

Integration tier: ``distributed-onnx serve`` in a subprocess (embedded Ray on 127.0.0.1, one replica holding both
tiny checkpoints), real HTTP; the backtests run in-process (what each actor runs, :mod:`backtest_data`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from backtest_data import (
    QUANTILES,
    STEP_US,
    dense_series,
    read_forecasts,
    run_parts_in_process,
    settings_for,
    write_dataset,
)
from graphs import write_tiny_chronos2, write_tiny_context_quantiles
from prometheus_client.parser import text_string_to_metric_families
from test_live_score import _assert_same_metrics, backtest_metrics
from test_serve_ingress import Server

from distributed_onnx.evaluation.scoring.pairs import BASELINES
from distributed_onnx.live.log.layout import CONTEXT_KEY, log_files
from distributed_onnx.live.score import score_log
from distributed_onnx.live.score.settings import ScoreSettings
from distributed_onnx.location import Location
from distributed_onnx.storage import sha256 as storage_sha256

pytestmark = pytest.mark.integration

CHAMPION, CHALLENGER = "champion", "tiny_plain"
HORIZON = 8


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = write_dataset(root / "load.parquet", covariate=False)
        self.checkpoints = {
            CHAMPION: write_tiny_chronos2(root / "models", name=CHAMPION).weights_path,
            CHALLENGER: write_tiny_context_quantiles(root / "models").weights_path,
        }
        self.log = root / "log"
        self.forecasts: dict[str, pa.Table] = {}
        self.metrics: dict[str, pa.Table] = {}
        for name, checkpoint in self.checkpoints.items():
            settings = settings_for(checkpoint, self.data, root / f"backtest-{name}", n_windows=6, stride=2)
            plan = run_parts_in_process(settings)
            self.forecasts[name] = read_forecasts(settings.output)
            self.metrics[name] = backtest_metrics(plan)

    def windows(self) -> list[tuple[str, int, list[float | None]]]:
        """Each backtest window: its series, its origin (us) and its series' history up to that origin."""
        series = dense_series()
        table = self.forecasts[CHAMPION]
        found = []
        firsts = zip(table["series_id"].to_pylist()[::HORIZON], table["origin"].to_pylist()[::HORIZON], strict=True)
        for series_id, origin in firsts:
            data = series[series_id]
            origin_us = int(origin.timestamp() * 1_000_000)
            position = (origin_us - int(data["start_us"])) // STEP_US
            history = [None if not present or np.isnan(y) else float(y) for y, present in
                       zip(data["y"][:position], data["present"][:position], strict=True)]  # fmt: skip
            found.append((series_id, origin_us, history))
        return found

    def requests(self) -> list[dict[str, Any]]:
        """One request per backtest window: its series' history up to the window's origin, and its start."""
        bodies = []
        for series_id, origin_us, history in self.windows():
            start = _iso(origin_us - len(history) * STEP_US)
            bodies.append(
                {
                    "series": [{"series_id": series_id, "y": history, "start": start}],
                    "horizon": HORIZON,
                    "quantiles": QUANTILES,
                }
            )
        return bodies


def _iso(moment_us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment_us / 1e6))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    return Setup(tmp_path_factory.mktemp("live"))


@pytest.fixture(scope="module")
def server(setup: Setup) -> Iterator[Server]:
    running = Server(
        *("--checkpoint", str(setup.checkpoints[CHAMPION]), "--checkpoint", str(setup.checkpoints[CHALLENGER])),
        *("--shadow", CHALLENGER, "--forecast-log", str(setup.log), "--forecast-log-flush-s", "0.2"),
        *("--cpus-per-replica", "1", "--warm-up-rows", "0"),
    )
    try:
        yield running
    finally:
        output = running.stop()
        assert running.process.returncode == 0, output


def _metrics(url: str) -> dict[tuple[str, str, str], float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        (sample.name, sample.labels.get("model", ""), sample.labels.get("reason", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _requests_timed(url: str, model: str) -> dict[str, float]:
    """Requests timed on /metrics by endpoint, for ``model``."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        sample.labels["endpoint"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "distributed_onnx_request_duration_seconds_count" and sample.labels["model"] == model
    }


def _wait_for(condition: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def _logged_rows(log: Path) -> int:
    return sum(pq.read_metadata(path).num_rows for path in log_files(Location(log)))


def _assert_backtest_forecasts(setup: Setup, name: str, logged: pa.Table) -> None:
    """The log's placed rows of ``name`` are its backtest's forecasts: same windows, leads, timestamps, values."""
    keys = ["series_id", "origin", "lead"]
    served = logged.sort_by([(key, "ascending") for key in keys])
    backtest = setup.forecasts[name].sort_by([(key, "ascending") for key in keys])
    for key in (*keys, "timestamp", "cutoff"):
        assert served[key].equals(backtest[key]), (name, key)
    for level in QUANTILES:
        column = f"q{format(level, 'g')}"
        np.testing.assert_allclose(served[column].to_numpy(), backtest[column].to_numpy(), rtol=1e-6, atol=1e-6)


def _champion_tensors(setup: Setup, histories: list[list[float | None]]) -> dict[str, np.ndarray]:
    """The champion's input tensors for these histories, laid out as its backtest lays out a window."""
    from distributed_onnx.model.adapters import adapter_for
    from distributed_onnx.model.checkpoint import LocalCheckpoint

    metadata = LocalCheckpoint(path=setup.checkpoints[CHAMPION]).resolve().metadata
    length = metadata.context_length
    grid = np.full((len(histories), length), np.nan, dtype=np.float32)
    for row, history in enumerate(histories):
        kept = np.array([np.nan if y is None else y for y in history[-length:]], dtype=np.float32)
        grid[row, length - len(kept) :] = kept
    inputs, _ = adapter_for(metadata).build_inputs(grid, None)
    return inputs


def _v2_body(inputs: dict[str, np.ndarray], **fields: Any) -> dict[str, Any]:
    encoded = [
        {"name": name, "datatype": "FP32" if value.dtype == np.float32 else "INT64",
         "shape": list(value.shape), "data": value.reshape(-1).tolist()}
        for name, value in inputs.items()
    ]  # fmt: skip
    return {"inputs": encoded, **fields}


def test_scoring_what_was_served_gives_the_backtests_forecasts_and_metrics(setup: Setup, server: Server) -> None:
    bodies = setup.requests()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for body in bodies:
            response = client.post("/v1/forecast", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["model"] == CHAMPION
        no_start = client.post("/v1/forecast", json={"series": [{"series_id": "a", "y": [1.0, 2.0]}], "horizon": 4})
        assert no_start.status_code == 200
        assert client.get(f"/v2/models/{CHALLENGER}/ready").status_code == 200
        named = client.post("/v1/forecast", json={**bodies[0], "model": CHALLENGER})
        assert named.json()["model"] == CHALLENGER  # a shadow may still be asked directly
        unknown = client.post("/v1/forecast", json={**bodies[0], "model": "nope"})
        assert unknown.status_code == 404 and CHAMPION in unknown.json()["error"]
    windows = len(bodies)
    # champion: the windows + the request without start; the challenger: its shadow forecasts of both + one answer
    expected_rows = (windows * HORIZON + 4) * 2 + HORIZON
    _wait_for(lambda: _logged_rows(setup.log) == expected_rows)
    counters = _metrics(server.url)
    assert counters[("distributed_onnx_forecasts_served_total", CHAMPION, "")] == windows + 1
    assert counters[("distributed_onnx_forecasts_shadow_total", CHALLENGER, "")] == windows + 1
    assert counters[("distributed_onnx_forecasts_logged_total", CHAMPION, "")] == windows + 1
    assert counters[("distributed_onnx_request_duration_seconds_count", CHAMPION, "")] == windows + 1

    files = log_files(Location(setup.log))
    # Each file records its checkpoint's context length: what score's seasonal-quantile baseline looks back over.
    assert {pq.read_schema(str(path)).metadata[CONTEXT_KEY] for path in files} == {b"16"}
    log = pa.concat_tables([pq.read_table(str(path)) for path in files], promote_options="default")
    for name in (CHAMPION, CHALLENGER):
        role = "shadow" if name == CHALLENGER else "served"
        mine = log.filter((pc.field("model") == name) & (pc.field("role") == role) & pc.field("origin").is_valid())
        _assert_backtest_forecasts(setup, name, mine)

    scored = score_log(ScoreSettings(forecasts=setup.log, actuals=setup.data, output=setup.root / "score"))
    assert scored.summary["windows"][CHAMPION] == {"scored": windows, "no_start": 1}
    assert scored.summary["windows"][CHALLENGER]["scored"] == windows + 1  # its shadow forecasts + the direct one
    # The champion and its shadow are scored together on their common pairs, like two checkpoints of one run:
    # each equals its own backtest (the models are finite everywhere, so the pairs are the backtests' pairs).
    both = scored.metrics.filter(pc.field("scored_with") == ",".join(sorted((CHAMPION, CHALLENGER))))
    assert set(both["model"].to_pylist()) == {CHAMPION, CHALLENGER, *BASELINES}
    for name in (CHAMPION, CHALLENGER):
        mine = pc.field("model") == name
        _assert_same_metrics(both.filter(mine), setup.metrics[name].filter(mine))
    baselines = pc.field("model").isin(list(BASELINES))
    _assert_same_metrics(both.filter(baselines), setup.metrics[CHAMPION].filter(baselines))


def test_an_unwritable_log_drops_counted_and_logging_resumes(setup: Setup, server: Server) -> None:
    body = setup.requests()[0]
    shutil.move(setup.log, setup.root / "log-before")
    setup.log.write_text("the log's folder is a file now")
    before = _metrics(server.url)
    dropped_key = ("distributed_onnx_forecasts_dropped_total", CHAMPION, "write_failed")
    shadow_dropped_key = ("distributed_onnx_forecasts_dropped_total", CHALLENGER, "write_failed")

    def dropped_both() -> bool:  # the shadow's forecasts come after the answers: wait for them too
        now = _metrics(server.url)
        return all(now.get(key, 0) >= before.get(key, 0) + 5 for key in (dropped_key, shadow_dropped_key))

    with httpx.Client(base_url=server.url, timeout=60) as client:
        for _ in range(5):
            assert client.post("/v1/forecast", json=body).status_code == 200
        _wait_for(dropped_both)
        setup.log.unlink()
        for _ in range(3):
            assert client.post("/v1/forecast", json=body).status_code == 200
    _wait_for(lambda: _logged_rows(setup.log) == 3 * HORIZON * 2)
    after = _metrics(server.url)
    logged = ("distributed_onnx_forecasts_logged_total", CHAMPION, "")
    assert after[logged] == before[logged] + 3
    assert after[dropped_key] == before.get(dropped_key, 0) + 5
    assert after[shadow_dropped_key] == before.get(shadow_dropped_key, 0) + 5
    assert after[("distributed_onnx_forecast_log_pending", CHAMPION, "")] == 0


def _send_windows_over_v2(
    setup: Setup, server: Server, windows: list[tuple[str, int, list[float | None]]]
) -> list[str]:
    """Each window to the champion over v2 (even ones over HTTP, odd ones over gRPC), placed by its parameters;
    then a request without parameters (id ``bare``) and malformed ones. Returns the placed requests' ids."""
    grpc = pytest.importorskip("tritonclient.grpc")
    from test_serve_ingress import triton_inputs
    from tritonclient.utils import InferenceServerException

    from distributed_onnx.model.checkpoint import LocalCheckpoint

    context_length = LocalCheckpoint(path=setup.checkpoints[CHAMPION]).resolve().metadata.context_length
    tensors = partial(_champion_tensors, setup)
    ids = []
    triton = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for index, (series_id, origin_us, history) in enumerate(windows):
            inputs = tensors([history])
            parameters = {"start": _iso(origin_us - context_length * STEP_US), "series_ids": series_id}
            if index % 2:
                ids.append(f"grpc-{index}")
                triton.infer(CHAMPION, triton_inputs(grpc, inputs), request_id=ids[-1], parameters=parameters)
            else:
                ids.append(f"http-{index}")
                body = _v2_body(inputs, id=ids[-1], parameters=parameters)
                response = client.post(f"/v2/models/{CHAMPION}/infer", json=body)
                assert response.status_code == 200, response.text
        bare = client.post(f"/v2/models/{CHAMPION}/infer", json=_v2_body(tensors([[1.0, 2.0], [3.0]]), id="bare"))
        assert bare.status_code == 200, bare.text
        bad = _v2_body(tensors([[1.0]]), parameters={"start": "yesterday"})
        refused = client.post(f"/v2/models/{CHAMPION}/infer", json=bad)
        assert refused.status_code == 422 and "parameters.start" in refused.json()["error"], refused.text
        assert client.post("/v2/models/nope/infer", json=bad).status_code == 404
    with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*parameters.series_ids: 2 ids"):
        triton.infer(CHAMPION, triton_inputs(grpc, tensors([[1.0]])), parameters={"series_ids": "a,b"})
    triton.close()
    return ids


def test_v2_infer_over_http_and_grpc_is_logged_and_shadowed_like_v1(setup: Setup, server: Server) -> None:
    """Each backtest window sent as the champion's own tensors (KServe v2, half over HTTP, half over gRPC) with
    ``start`` and ``series_ids`` parameters: the log holds the backtests' forecasts, served and shadow; a request
    without parameters is logged unplaceable; a malformed parameter is refused before the model runs."""
    before = _metrics(server.url)
    windows = setup.windows()
    ids = _send_windows_over_v2(setup, server, windows)

    mine = pc.field("request_id").isin([*ids, "bare"])
    expected_rows = (len(windows) + 2) * HORIZON * 2  # served and shadow, the windows and the two bare ones

    def logged() -> pa.Table:
        tables = [pq.read_table(path) for path in log_files(Location(setup.log))]
        return pa.concat_tables(tables, promote_options="default").filter(mine) if tables else pa.table({})

    _wait_for(lambda: logged().num_rows == expected_rows)
    log = logged()
    for name, role in ((CHAMPION, "served"), (CHALLENGER, "shadow")):
        rows = log.filter((pc.field("model") == name) & (pc.field("role") == role))
        _assert_backtest_forecasts(setup, name, rows.filter(pc.field("origin").is_valid()))
        unplaced = rows.filter(pc.field("request_id") == "bare")
        assert unplaced["series_id"].to_pylist() == ["0"] * HORIZON + ["1"] * HORIZON
        assert unplaced["origin"].null_count == 2 * HORIZON
    assert set(log.filter(pc.field("role") == "served")["checkpoint_sha256"].to_pylist()) == {
        storage_sha256(Location(setup.checkpoints[CHAMPION]))
    }
    after = _metrics(server.url)

    def grew(name: str, model: str) -> float:
        return after[(name, model, "")] - before.get((name, model, ""), 0)

    assert not [key for key in after if key[1] == "nope"]  # a label per unknown name would grow without bound
    assert grew("distributed_onnx_forecasts_served_total", CHAMPION) == len(windows) + 2
    assert grew("distributed_onnx_forecasts_shadow_total", CHALLENGER) == len(windows) + 2
    latency = _requests_timed(server.url, CHAMPION)
    assert latency["grpc_infer"] == len(windows) // 2 + 1  # the refused request is timed too
    assert latency["infer"] == len(windows) - len(windows) // 2 + 2


def test_levels_served_clamped_are_recorded_by_the_log_and_by_score(setup: Setup, server: Server) -> None:
    """One window asked at 0.05/0.5/0.95 (outside the champion's native 0.1..0.9: served clamped, as the response
    says) and at 0.1/0.5/0.9. The log's q0.05 held the 0.1 values with no record, and ``score``'s summary said
    nothing: now each log file records its clamped levels, and ``score`` reads every file's own columns (two files
    of other levels in one log) and reports the clamping in summary.json as a backtest does."""
    import json

    from distributed_onnx import cli
    from distributed_onnx.live.log.layout import CLAMPING_KEY

    series_id, origin_us, history = setup.windows()[0]
    start = _iso(origin_us - len(history) * STEP_US)
    body = {"series": [{"series_id": series_id, "y": history, "start": start}], "horizon": HORIZON}
    clamped = [{"requested": 0.05, "served_by": 0.1}, {"requested": 0.95, "served_by": 0.9}]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for request_id, levels in (("clamped", [0.05, 0.5, 0.95]), ("native", [0.1, 0.5, 0.9])):
            answer = client.post(
                "/v1/forecast", json={**body, "quantiles": levels}, headers={"X-Request-ID": request_id}
            )
            assert answer.status_code == 200, answer.text
            assert answer.json().get("quantile_clamping") == (clamped if request_id == "clamped" else None)
    mine = pc.field("request_id").isin(["clamped", "native"])

    def files() -> dict[tuple[str, str], Path]:
        found: dict[tuple[str, str], Path] = {}
        for path in log_files(Location(setup.log)):
            rows = pq.read_table(path.local_path).filter(mine)
            pairs = zip(rows["model"].to_pylist(), rows["request_id"].to_pylist(), strict=True)
            found |= {pair: Path(path.local_path) for pair in pairs}
        return found

    _wait_for(lambda: len(files()) == 4)  # served and shadow, of each request
    for (model, request_id), path in files().items():
        record = json.loads(pq.read_schema(path).metadata[CLAMPING_KEY])
        assert record == (clamped if request_id == "clamped" else []), (model, request_id)
        columns = pq.read_schema(path).names
        assert ("q0.05" in columns) == (request_id == "clamped"), columns

    output = setup.root / "score-clamped"
    argv = ["score", "--forecasts", str(setup.log), "--actuals", str(setup.data), "--output", str(output)]
    assert cli.main(argv) == 0
    summary = json.loads((output / "summary.json").read_text())
    assert summary["quantile_clamping"] == {CHAMPION: clamped, CHALLENGER: clamped}
    metrics = pq.read_table(output / "metrics.parquet")
    assert {"0.05,0.5,0.95", "0.1,0.5,0.9"} <= set(metrics["quantile_levels"].to_pylist())
