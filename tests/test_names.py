"""Names are not paths (issue 40): the one check of a name that becomes a file or folder, and the join under a root.

Pure logic plus real files in a temporary folder: every non-name is refused, ordinary names pass, a name cannot
lead out of its root (a symbolic link inside the root included), and the places that build paths from names use
it: the serve repository's local folder and download cache, the backtest's ``forecasts/model=NAME``, serve's
checkpoint names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from distributed_onnx import names
from distributed_onnx.evaluation.outputs import model_dir
from distributed_onnx.location import Location
from distributed_onnx.serve.repository import CheckpointRepository
from distributed_onnx.serve.settings import ServeSettings

# One rule for every command (issue 51): a leading '.' or '-', a non-ASCII letter and a baseline's name are refused
# too, as the backtest refused them, so that no command writes or takes a checkpoint another refuses.
REFUSED = ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "nul\x00", "tab\there", "del\x7f", "C:", "c:evil", "%2e%2e"]
REFUSED += ["...x", "-m", "模型", "a b", "seasonal_naive", "x" * (names.MAX_NAME_BYTES + 1)]
ACCEPTED = ["region00", "tiny_plain", "taylor.chronos2", "a..b", "m-", "9x", "x" * names.MAX_NAME_BYTES]


@pytest.mark.parametrize("name", REFUSED)
def test_a_non_name_is_refused(name: str) -> None:
    assert names.name_problem(name) is not None
    with pytest.raises(names.UnsafeNameError):
        names.check(name)


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_name_is_accepted(name: str) -> None:
    assert names.check(name) == name


def test_over_long_and_non_string_names_are_refused() -> None:
    assert "bytes long" in (names.name_problem("é" * names.MAX_NAME_BYTES) or "")
    assert names.name_problem(7) is not None
    assert names.name_problem("\ud800") is not None  # a lone surrogate: no file name on any system


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_whatever_the_name_join_under_stays_under_its_root(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    root = tmp_path_factory.getbasetemp() / "root"
    root.mkdir(exist_ok=True)
    try:
        joined = names.join_under(root, name)
    except names.UnsafeNameError:
        return
    assert joined.parent == root and joined.resolve().parent == root.resolve()


def test_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    with pytest.raises(names.UnsafeNameError, match="resolves outside"):
        names.join_under(root, "escape")


def test_the_repository_never_lists_fetches_or_releases_a_non_name(tmp_path: Path) -> None:
    models, cache = tmp_path / "models", tmp_path / "cache"
    models.mkdir()
    cache.mkdir()
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("kept")
    for stem in ("good", "..", ""):
        (models / f"{stem}.onnx").write_bytes(b"x")
    repository = CheckpointRepository(models, cache)
    assert repository.names() == ["good"]
    assert ".." not in repository and "" not in repository
    with pytest.raises(names.UnsafeNameError):
        repository.fetch("..")
    repository.release("..")  # nothing: the cache's parent stays
    assert sentinel.read_text() == "kept" and cache.is_dir()


def test_backtest_and_serve_refuse_a_model_name_that_is_no_file_name(tmp_path: Path) -> None:
    with pytest.raises(names.UnsafeNameError):
        model_dir(Location(tmp_path), "..")
    assert model_dir(Location(tmp_path), "tiny") == tmp_path / "forecasts" / "model=tiny"
    with pytest.raises(ValidationError, match="is refused"):
        ServeSettings(checkpoint=[tmp_path / "p%2e%2e.onnx"])
