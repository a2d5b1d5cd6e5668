"""A checkpoint repository on an object store, tried as an attacker and as a flaky network would (issue 40).

Integration tier: moto's S3 server in a thread of this process on 127.0.0.1, ``distributed-onnx serve
--model-repository s3://...`` in a subprocess whose ``TMPDIR`` is a sandbox holding a sentinel file (the
replica's download cache is made there). The bucket holds two good checkpoints, one whose weights ONNX Runtime
cannot read, and objects whose stems are no file names: ``...onnx`` (stem ``..``), ``.onnx`` (empty) and
``%2e%2e.onnx`` (``..`` once a URL decodes it).

- names are not paths (defect 1): the listing leaves those out, ``/v2/models/%2e%2e/ready`` and its kin are JSON
  404s, and the sentinel beside the cache survives;
- a checkpoint that fails to load is logged under its model's name, kind ``load`` with its error's class, over
  v2 HTTP and gRPC (defect 5);
- the store stops answering (defect 12): ``/v2/models`` and ``/v2/repository/index`` are 503 with Retry-After, a
  listed model not held is a 503 with Retry-After, an unknown name stays a 404, the held model still answers;
- a clean shutdown leaves no downloaded checkpoint in the temporary folder (defect 17).
"""

from __future__ import annotations

import http.client
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from graphs import tiny_chronos2_metadata, write_tiny_chronos2

pytest.importorskip("ray.serve")
pytest.importorskip("onnxruntime")
moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the 'dev' extra)")

from test_serve_ingress import Server  # noqa: E402

pytestmark = pytest.mark.integration

BUCKET = "repository"
CACHE_PREFIX = "distributed-onnx-repository-"


@pytest.fixture
def sandbox() -> Iterator[Path]:
    """A short temporary folder of its own (Ray's sockets live under TMPDIR too: their paths must stay short)."""
    folder = Path(tempfile.mkdtemp(prefix="do-sb-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _upload(filesystem: pafs.FileSystem, name: str, payload: bytes) -> None:
    with filesystem.open_output_stream(f"{BUCKET}/models/{name}") as stream:
        stream.write(payload)


def _get(port: int, path: str) -> tuple[int, dict[str, str], Any]:
    """GET ``path`` sent as written (http.client does not normalize ``%2e%2e`` or ``..`` away, as httpx may)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read() or b"null")
    finally:
        connection.close()


def _post(port: int, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def _failures(log: Path, status: int, count: int) -> list[dict[str, Any]]:
    """The failures table's rows once ``count`` of them have ``status`` (the log is written every 0.2 s)."""
    from distributed_onnx.live.log.failures import read_failures
    from distributed_onnx.location import Location

    deadline = time.monotonic() + 60
    while True:
        table, _ = read_failures(Location(log))
        rows: list[dict[str, Any]] = table.to_pylist()
        if sum(row["status"] == status for row in rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


SERIES = [{"series_id": "a", "y": [1.0, 2.0, 3.0]}]


def _fill(filesystem: pafs.FileSystem, work: Path) -> None:
    """Two good checkpoints, one ONNX Runtime cannot read, and three objects whose stems are no file names."""
    filesystem.create_dir(BUCKET)
    good = write_tiny_chronos2(work, "region00")
    weights, metadata = good.weights_path.read_bytes(), (work / "region00.metadata.json").read_bytes()
    for stem in ("region00", "region01"):
        _upload(filesystem, f"{stem}.onnx", weights)
        _upload(filesystem, f"{stem}.metadata.json", metadata)
    document = tiny_chronos2_metadata().model_dump(mode="json", exclude_none=True)
    _upload(filesystem, "bad.onnx", b"these are not ONNX bytes")
    _upload(filesystem, "bad.metadata.json", json.dumps(document).encode())
    for stem in ("..", "", "%2e%2e"):  # '...onnx', '.onnx', '%2e%2e.onnx'
        _upload(filesystem, f"{stem}.onnx", b"not a checkpoint")
        _upload(filesystem, f"{stem}.metadata.json", b"{not json")


def _names_are_not_paths(port: int, sandbox: Path, sentinel: Path) -> None:
    status, _, listed = _get(port, "/v2/models")
    assert (status, listed) == (200, {"models": ["bad", "region00", "region01"]})
    for path in (
        "/v2/models/%2e%2e/ready",
        "/v2/models/%2E%2E/ready",
        "/v2/models/%2e%2e",
        "/v2/models/%252e%252e/ready",
        "/v2/models/%2e/ready",
        "/v2/models/.../ready",
    ):
        status, _, answer = _get(port, path)
        assert 400 <= status < 500 and "error" in answer, (path, status, answer)
    for body, headers in (
        ({"series": SERIES, "model": ".."}, {}),
        ({"series": SERIES, "model": "%2e%2e"}, {}),
        ({"series": SERIES}, {"serve_multiplexed_model_id": ".."}),
    ):
        status, answer = _post(port, "/v1/forecast", body, headers)
        assert status == 404 and "error" in answer, (body, headers, status, answer)
    status, answer = _post(port, "/v1/forecast", {"series": SERIES, "model": "region00"})
    assert status == 200, answer  # region00 is held from here on
    assert sentinel.read_text() == "the replica's temporary folder"
    caches = [found for found in sandbox.iterdir() if found.name.startswith(CACHE_PREFIX)]
    assert [sorted(child.name for child in cache.iterdir()) for cache in caches] == [["region00"]]


def _load_failures_are_the_models(server: Server, log: Path) -> None:
    """A checkpoint that fails to load: a 503 / UNAVAILABLE, logged under its name as kind 'load'."""
    grpc = pytest.importorskip("grpc")
    from distributed_onnx.serve.wire.grpc_messages import ModelInferRequest, ModelInferResponse

    status, answer = _post(server.port, "/v2/models/bad/infer", {"inputs": []})
    assert status == 503 and "CheckpointCorruptError" in answer["error"], answer
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    infer = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=ModelInferRequest.SerializeToString,
        response_deserializer=ModelInferResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as refused:
        infer(ModelInferRequest(model_name="bad", id="g"), timeout=60)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
    channel.close()
    rows = _failures(log, 503, 2)
    loads = sorted((row["protocol"], row["model"], row["kind"], row["reason"]) for row in rows if row["status"] == 503)
    assert loads == [
        ("grpc", "bad", "load", "CheckpointCorruptError"),
        ("http", "bad", "load", "CheckpointCorruptError"),
    ], rows
    assert {row["model"] for row in rows if row["status"] == 404} == {None}  # '..' is no model's name


GONE_PATHS = ("/v2/models", "/v2/models/region01/ready", "/v2/models/nowhere/ready")


def _the_store_is_gone(port: int) -> None:
    time.sleep(1.2)  # past the relisting interval
    # Asked at once, as several clients would: each answer waits out the store client's own retries (seconds).
    with ThreadPoolExecutor(max_workers=4) as clients:
        models, listed, nowhere = (clients.submit(_get, port, path) for path in GONE_PATHS)
        index = clients.submit(_post, port, "/v2/repository/index", {})
        for path, asked in zip(GONE_PATHS[:2], (models, listed), strict=True):
            status, headers, answer = asked.result()
            assert status == 503 and "retry-after" in headers, (path, status, answer)
            assert "does not answer" in answer["error"], (path, answer)
        status, answer = index.result()
        assert status == 503 and "does not answer" in answer["error"], answer
        status, _, answer = nowhere.result()
        assert status == 404 and "nowhere" in answer["error"], answer
    assert _get(port, "/v2/models/region00/ready")[0] == 200  # the held model still answers
    assert _post(port, "/v1/forecast", {"series": SERIES, "model": "region00"})[0] == 200
    assert _get(port, "/v2/health/ready")[0] == 200


@pytest.mark.timeout(600)
def test_an_s3_repository_keeps_names_in_their_folder_logs_load_failures_and_survives_its_store_going_away(
    sandbox: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "TMPDIR": str(sandbox),
    }.items():
        monkeypatch.setenv(name, value)
    sentinel = sandbox / "sentinel.txt"
    sentinel.write_text("the replica's temporary folder")
    store = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    store.start()
    stopped = False
    try:
        _, store_port = store.get_host_and_port()
        options = f"endpoint_override=127.0.0.1:{store_port}&scheme=http&region=us-east-1"
        _fill(pafs.FileSystem.from_uri(f"s3://{BUCKET}?{options}&allow_bucket_creation=true")[0], tmp_path)
        log = tmp_path / "log"
        server = Server(
            *("--model-repository", f"s3://{BUCKET}/models?{options}"),
            *("--forecast-log", str(log), "--forecast-log-flush-s", "0.2"),
            *("--cpus-per-replica", "1", "--warm-up-rows", "0"),
        )
        try:
            _names_are_not_paths(server.port, sandbox, sentinel)
            _load_failures_are_the_models(server, log)
            store.stop()
            stopped = True
            _the_store_is_gone(server.port)
        finally:
            output = server.stop()
        assert server.process.returncode == 0, output
        assert "Internal error" not in output, output
        # A clean shutdown takes the downloaded checkpoints with it; the sentinel beside them stays.
        assert sentinel.exists()
        assert list(sandbox.rglob("*.onnx")) == []
        assert not [found for found in sandbox.iterdir() if found.name.startswith(CACHE_PREFIX)]
    finally:
        if not stopped:
            store.stop()
