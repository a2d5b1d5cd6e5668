"""The optimized-graph cache's key and publishing (model/backend/optimized_cache.py): plain files, no ORT session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from graphs import write_tiny_chronos2, write_tiny_chronos2_external

from distributed_onnx.model.backend import optimized_cache


def test_key_changes_with_the_graph_its_weights_the_runtime_and_the_level(tmp_path: Path) -> None:
    checkpoint = write_tiny_chronos2(tmp_path)
    other_graph = write_tiny_chronos2(tmp_path / "b", horizon_patches=1)
    folder = optimized_cache.cache_folder(checkpoint, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache")
    assert folder.parent == tmp_path / "cache" / "optimized-graphs" and folder.name.startswith("tiny-")
    assert folder == optimized_cache.cache_folder(checkpoint, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache")
    others = {
        optimized_cache.cache_folder(checkpoint, "ENABLE_BASIC", "1.32.0", tmp_path / "cache"),
        optimized_cache.cache_folder(checkpoint, "ENABLE_EXTENDED", "1.33.0", tmp_path / "cache"),
        optimized_cache.cache_folder(other_graph, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache"),
    }
    # A file beside the graph that the graph does not load changes nothing it computes: the same key.
    checkpoint.weights_path.with_name("tiny.onnx.data").write_bytes(b"not this graph's weights")
    assert folder == optimized_cache.cache_folder(checkpoint, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache")
    # The weights a graph keeps as external data (their bytes are not in the graph's sha256): rewritten, another
    # key; only touched, the same bytes, the same key.
    external = write_tiny_chronos2_external(tmp_path / "external")
    external_folder = optimized_cache.cache_folder(external, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache")
    others.add(external_folder)
    data = tmp_path / "external" / "tiny.onnx.data"
    os.utime(data, ns=(1, 1))
    assert optimized_cache.cache_folder(external, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache") == external_folder
    write_tiny_chronos2_external(tmp_path / "external", shift=1.0)  # the same graph bytes, other weights
    others.add(optimized_cache.cache_folder(external, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache"))
    assert folder not in others and len({path.name for path in others}) == 5


def test_weights_edited_in_place_with_their_old_time_restored_are_another_key(tmp_path: Path) -> None:
    """Attack E: the same size, the same modification time (``touch -r``), other bytes: keyed by size and time,
    the old optimized graph was loaded and every forecast came from the old weights."""
    external = write_tiny_chronos2_external(tmp_path / "external")
    data = tmp_path / "external" / "tiny.onnx.data"
    os.utime(data, ns=(10**18, 10**18))  # long ago: the digest is kept, as after any earlier command
    before = optimized_cache.cache_folder(external, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache")
    edited = bytearray(data.read_bytes())
    edited[-8:] = bytes(8)  # the last weights zeroed in place: the size stays
    data.write_bytes(bytes(edited))
    os.utime(data, ns=(10**18, 10**18))
    assert optimized_cache.cache_folder(external, "ENABLE_EXTENDED", "1.32.0", tmp_path / "cache") != before


@pytest.mark.parametrize(
    ("requested", "cached"),
    [("ENABLE_ALL", "ENABLE_EXTENDED"), ("ENABLE_EXTENDED", "ENABLE_EXTENDED"), ("ENABLE_BASIC", "ENABLE_BASIC")],
)
def test_cached_level_is_portable(requested: str, cached: str) -> None:
    assert optimized_cache.cached_level(requested) == cached


def test_a_racing_publisher_keeps_the_first_copy(tmp_path: Path) -> None:
    folder = tmp_path / "optimized-graphs" / "tiny-key"
    first, second = optimized_cache.staging_folder(folder), optimized_cache.staging_folder(folder)
    (first / "model.onnx").write_bytes(b"first")
    (second / "model.onnx").write_bytes(b"second")

    optimized_cache.publish(first, folder)
    optimized_cache.publish(second, folder)

    assert (folder / "model.onnx").read_bytes() == b"first"
    assert [path.name for path in folder.parent.iterdir()] == ["tiny-key"]  # no staging folder left
