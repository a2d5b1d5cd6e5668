"""The checkpoint repository's pure parts: settings, the ingress it picks, listing, failures, the index.

No Ray and no ONNX Runtime: the model a repository builds is a fake here (the real path, with Serve's LRU and
real sessions, is ``tests/test_serve_repository.py``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from distributed_onnx.serve.operations.ingress import IngressHost, plan_ingress
from distributed_onnx.serve.repository import CheckpointRepository, ModelRepository
from distributed_onnx.serve.settings import ServeSettings
from distributed_onnx.serve.wire.http import HttpError

METADATA = (
    '{"model_family": "chronos2", "input_names": ["context"], "output_name": "q", "native_quantiles": [0.5], '
    '"context_length": 4, "output_patch_size": 1, "horizon_patches": 1, "resolution_minutes": 60}'
)


def checkpoint(folder: Path, name: str, metadata: str = METADATA) -> None:
    (folder / f"{name}.onnx").write_bytes(b"weights of " + name.encode())
    (folder / f"{name}.metadata.json").write_text(metadata)


def test_a_repository_alone_holds_no_model_in_every_replica(tmp_path: Path) -> None:
    settings = ServeSettings(model_repository=str(tmp_path), repository_budget=3)
    assert settings.checkpoint == [] and settings.model_name is None
    assert settings.model_repository == tmp_path
    both = ServeSettings(model_repository="s3://bucket/models", checkpoint=tmp_path / "champion.onnx")
    assert both.model_names == ["champion"] and both.model_repository is not None
    assert both.model_repository.reveal() == "s3://bucket/models"


def test_repository_settings_refuse_what_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="shadows are --checkpoint models"):
        ServeSettings(model_repository=str(tmp_path), shadow=["a"])
    with pytest.raises(ValidationError, match="repository_budget"):
        ServeSettings(model_repository=str(tmp_path), repository_budget=0)
    with pytest.raises(ValidationError, match="give at least one checkpoint \\(or a model_repository\\)"):
        ServeSettings(checkpoint=[])


def routed(requested: str = "auto", replicas: int = 1) -> Any:
    ports = iter(range(50000, 50100))
    host = IngressHost(True, "/usr/bin/haproxy", lambda: next(ports), lambda count, above: max(30000, above + 1))
    return plan_ingress(
        requested,  # type: ignore[arg-type]
        replicas=replicas,
        host="127.0.0.1",
        port=8000,
        grpc_port=8001,
        facts=host,
        routes_by_model=True,
    )


def test_several_replicas_with_a_repository_go_through_the_proxy_that_routes_by_model() -> None:
    assert routed(replicas=2).mode == "proxy"
    assert "the proxy routes by model" in routed(replicas=2).reason
    assert routed(replicas=1).mode == "direct"
    assert routed("haproxy", replicas=2).mode == "haproxy"  # asked for: kept


def test_a_missing_repository_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "distributed_onnx", "serve", "--model-repository", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "nowhere" in lines[0] and "not a folder" in lines[0]


class Built:
    def __init__(self, name: str, weights: Path) -> None:
        self.name, self.weights = name, weights


def repository(folder: Path, fail: set[str] | None = None) -> ModelRepository:
    def build(name: str, weights: Path) -> Built:
        if name in (fail or set()):
            raise RuntimeError(f"cannot build {name}")
        return Built(name, weights)

    return ModelRepository(CheckpointRepository(folder), build)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_listing_loading_unknown_names_and_the_index(tmp_path: Path) -> None:
    for name in ("b", "a", "c"):
        checkpoint(tmp_path, name)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    models = repository(tmp_path)
    assert models.repository.names() == ["a", "b", "c"]
    loaded = run(models.model("b"))
    assert (loaded.name, loaded.weights) == ("b", tmp_path / "b.onnx")
    with pytest.raises(HttpError) as unknown:
        run(models.model("zz"))
    assert unknown.value.status_code == 404
    assert "has no checkpoint 'zz.onnx' (3 checkpoints: 'a', 'b', 'c')" in str(unknown.value)
    index = models.index(["champion"])
    assert [(e["name"], e["state"]) for e in index] == [
        ("champion", "READY"),
        ("a", "UNAVAILABLE"),
        ("b", "READY"),
        ("c", "UNAVAILABLE"),
    ]
    assert index[1]["reason"].startswith("unloaded")
    assert [e["name"] for e in models.index([], ready_only=True)] == ["b"]


def test_a_checkpoint_added_later_is_found_on_its_first_request(tmp_path: Path) -> None:
    checkpoint(tmp_path, "a")
    models = repository(tmp_path)
    assert models.repository.names() == ["a"]
    checkpoint(tmp_path, "late")
    models.repository._listed_at -= 10  # the last listing is old enough to list again
    assert run(models.model("late")).name == "late"


def test_a_broken_checkpoint_is_a_503_remembered_until_its_files_change(tmp_path: Path) -> None:
    checkpoint(tmp_path, "bad", metadata="{not json")
    checkpoint(tmp_path, "wont_build")
    models = repository(tmp_path, fail={"wont_build"})
    for name, reason in (("bad", "CheckpointMetadataError"), ("wont_build", "RuntimeError: cannot build")):
        with pytest.raises(HttpError) as refused:
            run(models.model(name))
        assert refused.value.status_code == 503 and reason in str(refused.value)
    states = {entry["name"]: entry for entry in models.index([])}
    assert states["bad"]["state"] == "UNAVAILABLE" and "not valid JSON" in states["bad"]["reason"]
    # Fixed: its files changed, so it is tried again (and loads).
    (tmp_path / "bad.metadata.json").write_text(METADATA)
    assert run(models.model("bad")).name == "bad"
    assert models.index([], ready_only=True)[0]["name"] == "bad"


def test_an_evicted_model_is_counted_once_and_leaves_the_index(tmp_path: Path) -> None:
    checkpoint(tmp_path, "a")
    models = repository(tmp_path)
    loaded = run(models.load("a"))
    assert models.holds("a")
    loaded.__del__()  # what Serve's LRU calls on eviction
    loaded.__del__()  # and Python again when it collects the object: nothing more
    assert not models.holds("a")
    assert models.index([])[0]["state"] == "UNAVAILABLE"


def test_a_store_that_stops_answering_is_a_503_with_retry_after_and_an_unknown_name_stays_a_404(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40, defect 12 (the logic; tests/test_serve_repository_store.py stops a real S3 server)."""
    from distributed_onnx import storage
    from distributed_onnx.serve.wire.failure_kinds import classify
    from distributed_onnx.serve.wire.http import ModelUnavailableError

    checkpoint(tmp_path, "a")
    repository = CheckpointRepository(tmp_path)
    models = ModelRepository(repository, lambda name, weights: object(), retry_after_s=2.5)
    assert repository.names() == ["a"]

    def down(*args: Any, **kwargs: Any) -> Any:
        raise OSError("When listing objects under key 'models': connection refused")

    monkeypatch.setattr(storage, "list_files", down)
    monkeypatch.setattr(storage, "file_size", down)
    repository._listed_at -= 60  # the last listing is old: the next lookup relists
    for call in (models.names, lambda: models.index([])):
        with pytest.raises(ModelUnavailableError) as refused:
            call()
        assert refused.value.status_code == 503 and refused.value.headers == {"Retry-After": "3"}
        assert classify(refused.value) == ("load", "repository_unavailable", 503)
    with pytest.raises(HttpError) as unknown:
        asyncio.run(models.model("nowhere"))
    assert unknown.value.status_code == 404
    with pytest.raises(ModelUnavailableError, match=r"'a' is unavailable: the model repository .* does not answer"):
        asyncio.run(models.model("a"))


def test_a_store_that_does_not_answer_is_asked_once_per_relisting_interval_not_once_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each listing of a store that does not answer waits out the store client's retries (6 s on S3, measured),
    one request after another behind the listing lock: requests within the interval get the failure at once."""
    from distributed_onnx import storage
    from distributed_onnx.serve import repository as repository_module
    from distributed_onnx.serve.wire.http import ModelUnavailableError

    checkpoint(tmp_path, "a")
    repository = CheckpointRepository(tmp_path)
    models = ModelRepository(repository, lambda name, weights: object())
    assert repository.names() == ["a"]
    asked: list[str] = []

    def down(*args: Any, **kwargs: Any) -> Any:
        asked.append("list")
        raise OSError("When listing objects under key 'models': connection refused")

    monkeypatch.setattr(storage, "list_files", down)
    monkeypatch.setattr(repository_module, "RELIST_INTERVAL_S", 60.0)  # however slow this machine: within it
    repository._listed_at -= 120  # the last listing is old: the next lookup relists
    for call in (models.names, lambda: models.index([]), models.names):
        with pytest.raises(ModelUnavailableError, match="does not answer"):
            call()
    with pytest.raises(HttpError) as unknown:
        asyncio.run(models.model("nowhere"))
    assert unknown.value.status_code == 404
    assert asked == ["list"]
    monkeypatch.setattr(repository_module, "RELIST_INTERVAL_S", 0.0)  # the interval over: the store is asked again
    with pytest.raises(ModelUnavailableError, match="does not answer"):
        models.names()
    assert asked == ["list", "list"]
