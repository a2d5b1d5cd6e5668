"""A checkpoint's identity covers the weights its graph keeps as ONNX external data.

The identity hashed the ``.onnx`` file only, while every family export keeps its weights in ``NAME.onnx.data``
beside it: editing that file between two runs on one folder resumed and mixed the forecasts of two models. The
external files are found by scanning the graph's protobuf (onnx is not a dependency of the main install):
checked here against onnx's own reading of graphs that keep tensors everywhere a graph can (initializers,
a Constant's attribute, a subgraph, sparse tensors, several files, a subfolder), and its table of fields against
onnx's descriptors. Their digests are kept per version of the file, so a large weights file is hashed once.
Unit tier (no ORT, no Ray); the command's refusal is in test_checkpoint_identity.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs import write_tiny_chronos2_external
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from distributed_onnx import storage
from distributed_onnx.errors import CheckpointNotFoundError
from distributed_onnx.location import Location
from distributed_onnx.model import external_data, file_digests
from distributed_onnx.model.checkpoint import LocalCheckpoint
from distributed_onnx.model.external_data import external_data_locations
from distributed_onnx.model.file_digests import file_sha256
from distributed_onnx.model.identity import identity_of


def _tensor_holders() -> dict[str, dict[int, str]]:
    """From onnx's descriptors: each message that can hold a TensorProto, and the fields through which it can."""
    from onnx import onnx_ml_pb2

    def fields(name: str) -> dict[int, str]:
        descriptor = getattr(onnx_ml_pb2, name).DESCRIPTOR
        return {f.number: f.message_type.name for f in descriptor.fields if f.message_type is not None}

    reaches = {"TensorProto"}
    names = [name for name in dir(onnx_ml_pb2) if name.endswith("Proto") and hasattr(onnx_ml_pb2, name)]
    changed = True
    while changed:  # a fixpoint: a message reaches a tensor if one of its fields' types does
        changed = False
        for name in names:
            if name not in reaches and any(child in reaches for child in fields(name).values()):
                reaches.add(name)
                changed = True
    return {
        name: {number: child for number, child in fields(name).items() if child in reaches}
        for name in reaches - {"TensorProto"}
    }


def test_the_scans_fields_are_every_way_an_onnx_message_can_hold_a_tensor() -> None:
    """If onnx adds a message or a field that can carry a tensor, this fails until the scan follows it."""
    assert _tensor_holders() == external_data._HOLDS


def _model_with_tensors_everywhere() -> onnx.ModelProto:
    """Tensors as an initializer, a Constant's attribute, an initializer of an If's branch and a sparse
    initializer, and one small tensor kept inside the file."""
    f = TensorProto.FLOAT
    weight = numpy_helper.from_array(np.arange(64, dtype=np.float32), "weight")
    small = numpy_helper.from_array(np.array([1.0], dtype=np.float32), "small")
    branch_weight = numpy_helper.from_array(np.full(64, 2.0, dtype=np.float32), "branch_weight")
    branch = helper.make_graph(
        [helper.make_node("Add", ["x", "branch_weight"], ["b_out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("b_out", f, [64])],
        initializer=[branch_weight],
    )
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.arange(32, dtype=np.float32), "sparse"),
        numpy_helper.from_array(np.arange(32, dtype=np.int64), "sparse_indices"),
        [64],
    )
    nodes = [
        helper.make_node(
            "Constant", [], ["constant"], value=numpy_helper.from_array(np.ones(64, np.float32), "constant")
        ),
        helper.make_node("Add", ["x", "weight"], ["a"]),
        helper.make_node("Add", ["a", "constant"], ["b"]),
        helper.make_node("Add", ["b", "sparse"], ["c"]),
        helper.make_node("Mul", ["c", "small"], ["d"]),
        helper.make_node("ReduceSum", ["d"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["y"], then_branch=branch, else_branch=branch),
    ]
    graph = helper.make_graph(
        nodes,
        "everywhere",
        [helper.make_tensor_value_info("x", f, [64])],
        [helper.make_tensor_value_info("y", f, [64])],
        initializer=[weight, small, numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
        sparse_initializer=[sparse],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _locations_by_onnx(path: Path) -> list[str]:
    """What onnx itself says the graph keeps outside (every tensor it finds, subgraphs and attributes included)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    tensors = list(_get_all_tensors(model))
    tensors += [t for s in model.graph.sparse_initializer for t in (s.values, s.indices)]
    return sorted(
        {entry.value for t in tensors if uses_external_data(t) for entry in t.external_data if entry.key == "location"}
    )


@pytest.mark.parametrize("one_file", [True, False])
def test_the_scan_finds_what_onnx_finds_without_loading_the_weights(tmp_path: Path, one_file: bool) -> None:
    """One file beside the graph, or one per tensor in a subfolder (onnx names those after the tensors)."""
    from onnx.external_data_helper import _get_all_tensors, set_external_data

    model = _model_with_tensors_everywhere()
    location = "m.onnx.data" if one_file else None
    convert_model_to_external_data(
        model, all_tensors_to_one_file=one_file, location=location, size_threshold=64, convert_attribute=True
    )
    folder = "" if one_file else "weights/"
    (tmp_path / "weights").mkdir()
    for tensor in _get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = folder + entry.value
    for sparse in model.graph.sparse_initializer:  # onnx's helpers leave sparse tensors inside: by hand
        for tensor in (sparse.values, sparse.indices):
            name = f"{folder}{tensor.name or 'sparse'}.bin" if not one_file else "sparse.bin"
            path = tmp_path / name
            offset = path.stat().st_size if path.exists() else 0
            with path.open("ab") as handle:
                handle.write(tensor.raw_data or numpy_helper.to_array(tensor).tobytes())
            set_external_data(tensor, name, offset, path.stat().st_size - offset)
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
    onnx.save_model(model, tmp_path / "m.onnx")
    found = external_data_locations(tmp_path / "m.onnx")
    assert found == _locations_by_onnx(tmp_path / "m.onnx")
    if one_file:
        assert found == ["m.onnx.data", "sparse.bin"]
    else:  # weight, the Constant's, the branch's initializer, the sparse tensor's values and indices
        assert len(found) == 5 and all(each.startswith("weights/") for each in found), found
    assert not [each for each in found if "small" in each or "zero" in each]  # below the threshold: inside


def test_a_graph_without_external_data_and_a_file_that_is_no_graph_name_none(tmp_path: Path) -> None:
    """The bundled checkpoint keeps its weights inside; a file that is not ONNX is left to ONNX Runtime, which says
    what is wrong with it when it loads it."""
    from distributed_onnx.resources import REFERENCE_CHECKPOINT

    assert external_data_locations(Path(REFERENCE_CHECKPOINT)) == []
    for content in (b"", b"not an onnx graph", b"\x3a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"):
        (tmp_path / "x.onnx").write_bytes(content)
        assert external_data_locations(tmp_path / "x.onnx") == []


def test_the_identity_holds_each_weights_file_and_a_missing_one_is_named(tmp_path: Path) -> None:
    before = identity_of(write_tiny_chronos2_external(tmp_path))
    after = identity_of(write_tiny_chronos2_external(tmp_path, shift=1.0))  # the same .onnx bytes
    assert before.sha256 == after.sha256 and before.fields == after.fields
    assert set(before.external) == {"tiny.onnx.data"} and before.digest != after.digest
    [difference] = before.differences(after)
    assert difference.field == "external data tiny.onnx.data"
    assert difference.recorded == storage.sha256(Location(tmp_path / "tiny.onnx.data")) or difference.current == (
        storage.sha256(Location(tmp_path / "tiny.onnx.data"))
    )
    record = after.record()
    assert record["external"] == dict(after.external)
    from distributed_onnx.model.identity import CheckpointIdentity

    assert CheckpointIdentity.from_record(record) == after
    # A record written before external files counted holds none: such a checkpoint differs from it.
    older = CheckpointIdentity.from_record({key: value for key, value in record.items() if key != "external"})
    assert older is not None
    assert [d.field for d in older.differences(after)] == ["external data tiny.onnx.data"]
    assert older.differences(after)[0].recorded == "(not recorded)"

    (tmp_path / "tiny.onnx.data").unlink()
    with pytest.raises(CheckpointNotFoundError, match=r"tiny\.onnx\.data not found: the graph .*tiny\.onnx keeps"):
        identity_of(LocalCheckpoint(path=tmp_path / "tiny.onnx").resolve())


def test_a_weights_digest_is_computed_once_per_version_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept by path, inode, size and times: asked again (in this process or another), it is read; any write
    (the same size, the modification time set back) or a file moved into its place is hashed again; a file
    written within the last two seconds is not kept (a second write in the same clock tick would look alike)."""
    calls: list[Path] = []
    real = storage.sha256

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(storage, "sha256", counting)
    cache = tmp_path / "cache"
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"a" * 1000)
    old = weights.stat().st_mtime_ns - 10**10
    os.utime(weights, ns=(old, old))

    first = file_sha256(weights, cache)
    assert first == real(Location(weights)) and len(calls) == 1
    file_digests._KNOWN.clear()  # another process: reads the kept digest
    assert file_sha256(weights, cache) == first and len(calls) == 1
    assert [path.suffix for path in (cache / "digests").iterdir()] == [".sha256"]

    weights.write_bytes(b"b" * 1000)  # the same size, the modification time set back
    os.utime(weights, ns=(old, old))
    assert file_sha256(weights, cache) == real(Location(weights)) != first and len(calls) == 2

    replacement = tmp_path / "new.bin"
    replacement.write_bytes(b"c" * 1000)
    os.utime(replacement, ns=(old, old))
    replacement.replace(weights)  # another inode in its place
    assert file_sha256(weights, cache) == real(Location(weights)) and len(calls) == 3

    weights.write_bytes(b"d" * 1000)  # just written: hashed, not kept
    kept = len(list((cache / "digests").iterdir()))
    assert file_sha256(weights, cache) == real(Location(weights)) and len(calls) == 4
    assert file_sha256(weights, cache) == real(Location(weights)) and len(calls) == 5
    assert len(list((cache / "digests").iterdir())) == kept


def test_a_cache_folder_that_cannot_be_written_costs_only_the_hashing(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x" * 10)
    old = weights.stat().st_mtime_ns - 10**10
    os.utime(weights, ns=(old, old))
    blocked = tmp_path / "a-file"
    blocked.write_text("in the way of the cache folder")
    assert file_sha256(weights, blocked) == storage.sha256(Location(weights))


@pytest.mark.integration
def test_weights_edited_in_place_with_their_old_time_restored_forecast_from_the_new_weights(
    tmp_path: Path, ray_session: None
) -> None:
    """Attack E, defect 1: the weights file rewritten in place (same size, its modification time set back with
    ``touch -r``) and a backtest into a new folder: the actors loaded the optimized graph cached from the old
    weights (keyed by size and time) and every forecast was the old one, exit 0. Now they are the new weights'."""
    from backtest_data import read_forecasts, settings_for, write_dataset

    from distributed_onnx import cli

    checkpoint = write_tiny_chronos2_external(tmp_path / "models")
    data_file = tmp_path / "models" / "tiny.onnx.data"
    data = write_dataset(tmp_path / "load.parquet", covariate=False)
    settings = settings_for(checkpoint.weights_path, data, tmp_path / "a", actors=1, n_windows=2)
    words = ["backtest", "--checkpoint", str(checkpoint.weights_path), "--data", str(data), "--actors", "1"]
    words += ["--n-windows", "2", "--stride", str(settings.stride), "--cpus-per-actor", "1", "--no-progress"]
    assert cli.main([*words, "--output", str(tmp_path / "a")]) == 0
    stat = data_file.stat()
    write_tiny_chronos2_external(tmp_path / "models", shift=1.0)  # the same graph bytes and size, other weights
    assert data_file.stat().st_size == stat.st_size
    os.utime(data_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -r
    assert cli.main([*words, "--output", str(tmp_path / "b")]) == 0
    before, after = read_forecasts(tmp_path / "a"), read_forecasts(tmp_path / "b")
    assert before.column("window_id").equals(after.column("window_id"))
    moved = after.column("q0.5").to_numpy() - before.column("q0.5").to_numpy()
    np.testing.assert_allclose(moved, 1.0, atol=1e-4)  # each quantile offset moved by the shift
