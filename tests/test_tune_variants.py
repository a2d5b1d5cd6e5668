"""Issue 52 (5): precision as a choice the runner makes. ``tune`` weighs the variants beside a checkpoint (the
report's accuracy verdict on the data's windows, then a timing of those that pass), chooses one saying why, and
``backtest --tuned`` runs the choice in its parent's place, saying so; a variant never replaces its parent
otherwise.

The checkpoints are real graphs run by real ONNX Runtime sessions: a parent that spends its time on work that does
not reach its forecast, a "variant" without that work whose forecasts move a little (a stand-in for an int8
quantization that kept its accuracy and is faster: whether a real int8 graph is faster depends on the CPU, and its
timing on a busy machine is no test), one clearly worse, and one naming another identity of the parent. The real
int8 graphs of the families go through ``tune`` in tests/test_nan_families.py.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs import scaled_model, tiny_context_quantiles_model
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'cpu' or 'gpu' extra)")

from distributed_onnx import cli
from distributed_onnx.model.backend.cpu_features import FLAGS, cpu_features
from distributed_onnx.model.checkpoint import (
    CheckpointMetadata,
    LocalCheckpoint,
    ParentCheckpoint,
    Quantization,
    ResolvedCheckpoint,
    write_checkpoint,
)
from distributed_onnx.model.identity import identity_of
from distributed_onnx.resources import REFERENCE_DATASET
from distributed_onnx.tune_variants import MIN_SPEEDUP

CONTEXT, HORIZON = 16, 8
#: The slow parent's MatMuls of 1024 x 1024 whose result reaches nothing.
LAYERS = 8


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, value.shape, value)
    )


def _with_output_added(model: onnx.ModelProto, nodes: list[onnx.NodeProto], added: str) -> onnx.ModelProto:
    """``model`` with ``added`` ([rows, 1, 1]) added to its output, computed by ``nodes`` from ``context``."""
    graph = model.graph
    output = graph.output[0].name
    graph.node[-1].output[0] = "before_added"
    graph.node.extend([*nodes, helper.make_node("Add", ["before_added", added], [output])])
    onnx.checker.check_model(model)
    return model


def slow_model() -> onnx.ModelProto:
    """The plain graph plus :data:`LAYERS` 1024-wide MatMuls of the context whose result is multiplied by 0: the same
    forecasts, at many times the cost."""
    rng = np.random.default_rng(0)
    nodes = [_constant("w0", rng.uniform(0, 1e-3, (CONTEXT, 1024)).astype(np.float32))]
    nodes.append(helper.make_node("MatMul", ["context", "w0"], ["h0"]))
    for layer in range(1, LAYERS + 1):
        nodes.append(_constant(f"w{layer}", rng.uniform(0, 1e-3, (1024, 1024)).astype(np.float32)))
        nodes.append(helper.make_node("MatMul", [f"h{layer - 1}", f"w{layer}"], [f"h{layer}"]))
    nodes += [
        helper.make_node("ReduceSum", [f"h{LAYERS}"], ["sum"], keepdims=1),  # [1, 1]: every row's work summed
        _constant("zero", np.zeros((1, 1, 1), dtype=np.float32)),
        helper.make_node("Mul", ["sum", "zero"], ["nothing"]),
    ]
    return _with_output_added(tiny_context_quantiles_model(CONTEXT, HORIZON), nodes, "nothing")


def nudged_model() -> onnx.ModelProto:
    """The plain graph plus ``50 sin(last / 3)``: forecasts a little off, by an amount that changes sign from one
    window to the next (on the bundled data, whose values are in the tens of thousands). Its verdict against the
    plain graph is "no difference shown" at every gate size from 8 to 64 origins (checked once, for each), so
    the test does not depend on how many windows the budget bought on a busy machine."""
    nodes = [
        helper.make_node("Constant", [], ["start"], value=helper.make_tensor("start", TensorProto.INT64, [1], [-1])),
        helper.make_node("Constant", [], ["stop"], value=helper.make_tensor("stop", TensorProto.INT64, [1], [CONTEXT])),
        helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("axis", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", ["context", "start", "stop", "axis"], ["final"]),
        _constant("third", np.full((1, 1), 1 / 3, dtype=np.float32)),
        helper.make_node("Mul", ["final", "third"], ["angle"]),
        helper.make_node("Sin", ["angle"], ["wave"]),
        _constant("fifty", np.full((1, 1), 50.0, dtype=np.float32)),
        helper.make_node("Mul", ["wave", "fifty"], ["nudge2"]),
        helper.make_node("Unsqueeze", ["nudge2", "axis"], ["nudge"]),
    ]
    return _with_output_added(tiny_context_quantiles_model(CONTEXT, HORIZON), nodes, "nudge")


def _metadata() -> CheckpointMetadata:
    return CheckpointMetadata(
        model_family="context_quantiles",
        input_names=["context"],
        output_name="quantiles",
        native_quantiles=[0.1, 0.5, 0.9],
        context_length=CONTEXT,
        output_patch_size=HORIZON,
        horizon_patches=1,
        resolution_minutes=30,
    )


def _variant(parent: ResolvedCheckpoint, name: str, model: onnx.ModelProto, **parent_fields: object) -> Path:
    """``model`` written as ``parent``'s int8 variant, as export --quantize writes its metadata."""
    identity = identity_of(parent).record() | parent_fields
    metadata = _metadata().model_copy(
        update={
            "precision": "int8",
            "parent": ParentCheckpoint(name=parent.name, sha256=identity_of(parent).sha256, identity=identity),
            "quantization": Quantization(mode="dynamic", weight_type="int8"),
        }
    )
    return write_checkpoint(
        parent.weights_path.with_name(f"{name}.onnx"), model.SerializeToString(), metadata
    ).weights_path


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    """``plain`` and, beside it, ``plain-int8`` (faster, about as accurate), ``plain-coarse`` (clearly worse) and
    ``plain-stale`` (naming another identity of ``plain``: left out)."""
    folder = tmp_path_factory.mktemp("variants")
    parent = write_checkpoint(folder / "plain.onnx", slow_model().SerializeToString(), _metadata())
    _variant(parent, "plain-int8", nudged_model())
    _variant(parent, "plain-coarse", scaled_model(tiny_context_quantiles_model(CONTEXT, HORIZON), 1.2))
    stale = identity_of(parent).record()
    _variant(parent, "plain-stale", nudged_model(), fields={**stale["fields"], "context_length": 32})
    return parent


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.integration
@pytest.mark.usefixtures("ray_session")
def test_tune_chooses_a_variant_saying_why_and_backtest_tuned_runs_it_saying_so(
    family: ResolvedCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuned = tmp_path / "tune.json"
    argv = ["tune", str(family.weights_path), "--budget-s", "3", "--cpus", "2", "--output", str(tuned)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    document = json.loads(tuned.read_text())
    choice = document["choice"]
    assert (choice["parent"], choice["chosen"], choice["replaces_parent"]) == ("plain", "plain-int8", True)
    chosen = LocalCheckpoint(path=family.weights_path.with_name("plain-int8.onnx")).resolve()
    assert choice["identity"] == identity_of(chosen).record()
    reason = choice["reason"]
    assert reason.startswith("int8 chosen: plain-int8 ran ") and "the windows per second of plain (fp32)" in reason
    assert "accuracy not distinguishable from fp32 (Diebold-Mariano p " in reason, reason
    assert choice["speedup"] >= MIN_SPEEDUP
    assert f"choice: {reason}" in capsys.readouterr().out

    weighed = {record["name"]: record for record in document["variants"]["weighed"]}
    assert set(weighed) == {"plain-int8", "plain-coarse"}
    coarse = weighed["plain-coarse"]
    assert coarse["accuracy_holds"] is False and coarse["windows_per_s"] is None  # failed the gate: never timed
    assert coarse["verdict"]["differs"] is True and coarse["verdict"]["dm_statistic"] > 0  # worse
    assert (  # worse beyond the gate's margin, which the file records
        "differs in accuracy from plain (fp32): worse, Diebold-Mariano p " in coarse["why"]
        and coarse["why"].endswith("beyond the 1.00% accepted")
        and coarse["verdict"]["relative_change"] > document["variants"]["accuracy_margin"] == 0.01
    ), coarse["why"]
    assert weighed["plain-int8"]["accuracy_holds"] is True and weighed["plain-int8"]["verdict"]["differs"] is False
    [stale] = document["variants"]["left_out"]
    assert stale.startswith("plain-stale: names another identity of plain") and "context_length" in stale, stale
    gate = document["variants"]["gate"]
    assert gate["windows"] == weighed["plain-int8"]["verdict"]["n"] >= 8 and gate["stride"] == HORIZON
    timed = [trial["checkpoint"] for trial in document["trials"] if trial["stage"] == "variant"]
    assert timed == ["plain", "plain-int8"]  # the parent beside the one that passed, at the tuned settings
    cpu = document["machine"]["cpu"]
    assert set(cpu["flags"]) == set(FLAGS) and cpu["int8_dot_product"] in (
        "amx_int8",
        "avx512_vnni",
        "avx_vnni",
        "none",
    )

    output = tmp_path / "run"
    argv = ["backtest", "--tuned", str(tuned), "--checkpoint", str(family.weights_path)]
    argv += ["--data", str(REFERENCE_DATASET), "--output", str(output), "--n-windows", "3", "--stride", "48"]
    assert cli.main([*argv, "--no-progress"]) == 0
    said = f"distributed-onnx backtest --tuned {tuned}: ran plain-int8 in place of its parent plain, tune's choice: "
    said += reason
    assert said in capsys.readouterr().err
    summary = json.loads((output / "summary.json").read_text())
    assert list(summary["models"]) == ["plain-int8"]  # the choice ran, not its parent
    assert summary["tuned"]["replaced"] == {"plain": "plain-int8"} and summary["tuned"]["said"] == said
    assert said in summary["notes"]
    assert html.escape(said) in (output / "report.html").read_text()

    # The variant tune weighed, gone from beside its parent: refused, naming it, before anything runs.
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in family.weights_path.parent.glob("plain-int8*"):
        shutil.move(path, moved / path.name)
    try:
        line = _refused([*argv[:-2], "--output", str(tmp_path / "gone")], capsys)
    finally:
        for path in moved.iterdir():
            shutil.move(path, family.weights_path.parent / path.name)
    assert "chose plain-int8 in place of plain, but" in line and "plain-int8.onnx" in line and "tune again" in line
    assert not (tmp_path / "gone").exists()


@pytest.mark.integration
def test_tune_without_variants_writes_no_choice(family: ResolvedCheckpoint, tmp_path: Path) -> None:
    tuned = tmp_path / "tune.json"
    argv = ["tune", str(family.weights_path), "--budget-s", "1", "--cpus", "1", "--no-variants", "--output", str(tuned)]
    assert cli.main(argv) == 0
    document = json.loads(tuned.read_text())
    assert "choice" not in document and "variants" not in document
    assert {trial["stage"] for trial in document["trials"]} == {"level", "batch", "layout"}


def test_the_cpus_flags_are_read_from_cpuinfo() -> None:
    text = "processor : 0\nmodel name : Xeon\nflags : fpu avx2 avx512f amx_tile amx_int8 avx512_vnni\n\nprocessor : 1\n"
    found = cpu_features(text)
    assert found["model"] == "Xeon" and found["int8_dot_product"] == "amx_int8"
    assert found["flags"]["amx_int8"] and found["flags"]["avx512_vnni"] and not found["flags"]["avx512_bf16"]
    assert cpu_features("model name : Old\nflags : fpu avx2\n")["int8_dot_product"] == "none"
    assert cpu_features(None, "arm64") == {"model": "arm64", "flags": None, "int8_dot_product": None}


def broken_by_int8_model() -> onnx.ModelProto:
    """``context @ W``, the quantiles the last 24 of W's 25 columns; W's first column (dropped) is 1e4, the others
    1e-2: one int8 scale for the whole weight rounds every weight the forecast reads to 0 (a real quantization
    breaking a graph, as a weight of outlying magnitude does)."""
    weights = np.full((CONTEXT, 1 + 3 * HORIZON), 1e-2, dtype=np.float32)
    weights[:, 0] = 1e4
    nodes = [
        helper.make_node("MatMul", ["context", "weights"], ["product"]),
        helper.make_node("Constant", [], ["first"], value=helper.make_tensor("first", TensorProto.INT64, [1], [1])),
        helper.make_node("Constant", [], ["last"], value=helper.make_tensor("last", TensorProto.INT64, [1], [99])),
        helper.make_node("Constant", [], ["axis"], value=helper.make_tensor("axis", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", ["product", "first", "last", "axis"], ["kept"]),
        helper.make_node(
            "Constant", [], ["shape"], value=helper.make_tensor("shape", TensorProto.INT64, [3], [0, 3, HORIZON])
        ),
        helper.make_node("Reshape", ["kept", "shape"], ["quantiles"]),
    ]
    graph = helper.make_graph(
        nodes,
        "broken_by_int8",
        [helper.make_tensor_value_info("context", TensorProto.FLOAT, ["rows", CONTEXT])],
        [helper.make_tensor_value_info("quantiles", TensorProto.FLOAT, ["rows", 3, HORIZON])],
        initializer=[onnx.numpy_helper.from_array(weights, "weights")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.integration
def test_a_variant_its_quantization_broke_is_removed_and_its_parent_kept(tmp_path: Path) -> None:
    """``export --quantize int8``'s last step on a graph int8 breaks: beyond the variant tolerance the variant is
    removed, its report kept saying so, and the error (exit 2) names the parent kept and what to do."""
    from distributed_onnx.errors import ParityError
    from distributed_onnx.export.request import ExportRequest
    from distributed_onnx.export.variants import VARIANT_TOLERANCE, write_int8_variant

    request = ExportRequest(  # before the parent is written: export refuses to replace an existing checkpoint
        family="chronos_bolt",
        random_weights=True,
        output=tmp_path / "broken.onnx",
        quantize="int8",
        resolution_minutes=30,
    )
    write_checkpoint(tmp_path / "broken.onnx", broken_by_int8_model().SerializeToString(), _metadata())
    with pytest.raises(ParityError, match=r"beyond the tolerance 0\.1: the quantization broke the graph") as caught:
        write_int8_variant(request)
    assert caught.value.exit_code == 2 and "the parent broken.onnx is kept" in str(caught.value)
    assert "Try the other --quantize-mode, or export without --quantize" in str(caught.value)
    report = json.loads((tmp_path / "broken-int8.parity.json").read_text())
    assert report["passed"] is False and report["max_rel_diff"] > VARIANT_TOLERANCE
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "broken-int8.parity.json",
        "broken.metadata.json",
        "broken.onnx",
    ]


def test_a_tuned_choice_edited_to_another_file_or_name_is_refused_naming_the_key(
    family: ResolvedCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tester's defects 3 and 4: ``choice.file`` edited to ``../m/x.onnx`` or ``/etc/passwd`` crashed (exit 4,
    "internal error: ValueError: Invalid name"); ``choice.chosen`` naming another checkpoint than ``choice.file``
    made stderr, summary.json and the report say one checkpoint ran while the file's ran. Both: exit 2, naming the
    key and what it holds, before anything runs."""
    from distributed_onnx.tune import FORMAT

    variant = LocalCheckpoint(path=family.weights_path.with_name("plain-int8.onnx")).resolve()
    choice = {
        "parent": "plain",
        "chosen": "plain-int8",
        "file": "plain-int8.onnx",
        "precision": "int8",
        "identity": identity_of(variant).record(),
        "replaces_parent": True,
        "reason": "int8 chosen",
    }
    settings = {"actors": 1, "cpus_per_actor": 1.0, "rows_per_batch": 4, "graph_optimization": "all"}
    document = {"format": FORMAT, "settings": settings, "checkpoint": str(family.weights_path)}
    document["checkpoint_identity"] = identity_of(family).record()
    argv = ["backtest", "--checkpoint", str(family.weights_path), "--output", str(tmp_path / "run"), "--tuned"]
    for edit, says in (
        ({"file": "../m/plain-int8.onnx"}, "choice.file '../m/plain-int8.onnx' [from "),
        ({"file": "/etc/passwd"}, "choice.file '/etc/passwd' [from "),
        ({"chosen": "other-int8"}, "choice.chosen 'other-int8' [from "),
    ):
        tuned = tmp_path / "tuned.json"
        tuned.write_text(json.dumps(document | {"choice": choice | edit}))
        line = _refused([*argv, str(tuned)], capsys)
        assert says in line and "distributed-onnx tune" in line, line
        assert "plain-int8.onnx" in line or "passwd" in line, line
    # Outside test: a choice that is not the record tune writes ("choice": 5, or a mapping without "file") was read
    # as "no choice" and the parent ran, exit 0. Only null means no choice; anything else is refused naming it.
    for whole, says in ((5, "holds int (5)"), ({"chosen": "plain-int8"}, "without ['parent', 'file', 'identity']")):
        tuned = tmp_path / "tuned.json"
        tuned.write_text(json.dumps(document | {"choice": whole}))
        line = _refused([*argv, str(tuned)], capsys)
        assert "choice [from " in line and says in line and "distributed-onnx tune" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_tune_says_on_the_console_when_every_variant_was_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tester's defect 5: with every variant left out (their parent's identity changed), the console said only
    "wrote ...": now that no variant was chosen, and each one left out with why, one line each."""
    parent = write_checkpoint(tmp_path / "plain.onnx", nudged_model().SerializeToString(), _metadata())
    stale = identity_of(parent).record()
    _variant(parent, "plain-int8", nudged_model(), fields={**stale["fields"], "context_length": 32})
    tuned = tmp_path / "tune.json"
    argv = ["tune", str(parent.weights_path), "--budget-s", "1", "--cpus", "1", "--windows", "8", "--output"]
    assert cli.main([*argv, str(tuned)]) == 0
    out = capsys.readouterr().out
    assert "choice: plain kept, no variant chosen: every variant beside it was left out (1)" in out, out
    [left] = [line for line in out.splitlines() if line.startswith("left out: ")]
    assert left.startswith("left out: plain-int8: names another identity of plain") and "context_length" in left
    assert json.loads(tuned.read_text())["variants"]["left_out"] == [left.removeprefix("left out: ")]
