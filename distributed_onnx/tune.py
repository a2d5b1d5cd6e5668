"""``distributed-onnx tune``: measure, on this machine, the backtest settings that run a checkpoint fastest.

The defaults are chosen without measuring (:mod:`.evaluation.planning._part_count`); a machine's cores, caches and
ONNX Runtime build decide what is fastest for a graph. ``tune`` measures, with real ORT sessions of the
checkpoint on real windows of the data (the bundled data by default), in short timed runs within a budget:

1. the graph optimization level (basic, extended, all), one actor with every core;
2. the rows per batch (a few sizes up to the windows it holds, and only those whose one call takes at most half
   a trial on one thread: a one-window call is timed first), at the best level;
3. actors x intra-op threads over this machine's cores (1 x N, 2 x N/2, ... N x 1), each actor its own session
   called from its own thread (ORT releases the GIL in a run, as each actor's process would be on its own).

4. with variants beside the checkpoint (``NAME-int8.onnx`` naming it as parent, ``export --quantize``; off with
   ``--no-variants``): each one's accuracy against the checkpoint on the data's windows, the verdict the report
   gives (:mod:`.tune_gate`); those that pass, timed beside it at the settings of 1-3; the choice, with its reason
   (:mod:`.tune_variants`). The settings stay the checkpoint's: a chosen variant runs with them.

It writes the best of each to a JSON file whose ``settings`` a backtest reads with ``--tuned FILE``, above the
defaults and below everything a user writes: flags > environment > ``--config`` > ``--tuned`` > defaults
(:mod:`.settings_sources`), and whose ``choice`` says which checkpoint such a backtest runs. Its ``trials`` keep
every measurement (windows per second) beside it, and ``machine`` the CPU they were taken on, with the flags that
decide int8's speed (:mod:`.model.backend.cpu_features`). The figures are this machine's, under whatever load it
had: tune on the machine that runs the backtest, and quiet.

What a backtest takes from the file is what tune measured, nothing else (:mod:`.tuned_file`, which reads it):
only the keys of :data:`~.tuned_file.TUNED_KEYS` are accepted under ``settings`` (a file edited to carry
``checkpoint``, ``data`` or ``horizon`` is refused naming the key: those say what a run computes, and come from
what a user writes). The file records the identity of the checkpoint it was measured on
(:mod:`distributed_onnx.model.identity`), and a run none of whose checkpoints has that identity is refused naming
both: the speed of one graph says little about another's.

This module is the command's request and its flow: what is tried in which order and what is written. What is
measured and how the budget is shared are :mod:`.tune_plan`'s (pure), the timed trials :mod:`.tune_trials`'.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import CliPositionalArg

from distributed_onnx import storage
from distributed_onnx.bounds import MAX_CPUS, MAX_SECONDS, MAX_TUNE_WINDOWS
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.output_checks import check_output_reachable
from distributed_onnx.evaluation.scoring.variants import DEFAULT_MARGIN, accuracy_holds
from distributed_onnx.evaluation.up_front import check_output_file
from distributed_onnx.location import Location
from distributed_onnx.model.backend.cpu_features import detect_cpu
from distributed_onnx.model.backend.providers import SessionOptionsConfig
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint, checkpoint_paths, local_checkpoint
from distributed_onnx.model.identity import identity_of
from distributed_onnx.own_inputs import Read, Written, check_own_inputs, checkpoint_files
from distributed_onnx.resources import REFERENCE_DATASET
from distributed_onnx.settings_flags import flag_name
from distributed_onnx.settings_sources import CommandSettings
from distributed_onnx.tune_plan import GATE_SHARE, LEVELS, affordable_batches
from distributed_onnx.tune_trials import Measure, data_contexts, one_window_s
from distributed_onnx.tune_variants import choose, variants_beside
from distributed_onnx.tuned_file import FORMAT, FORMAT_WITHOUT_IDENTITY, TUNED_KEYS, TunedFile, load_tuned, read_tuned

__all__ = ["LEVELS", "TUNED_KEYS", "TunedFile", "TuneRequest", "choice_lines", "load_tuned", "read_tuned", "run_tune"]


class TuneRequest(CommandSettings):
    """Measure graph optimization level, rows per batch and actors x threads with real ONNX Runtime sessions on
    windows of the data, and write the best to a file that backtest --tuned reads."""

    label: ClassVar[str] = "tune settings"

    checkpoint: CliPositionalArg[Path] = Field(
        examples=["CHECKPOINT.onnx"],
        description="The checkpoint to tune for: its .onnx file, its .metadata.json, or a folder holding just it.",
    )
    data: Location = Field(
        default=Location(REFERENCE_DATASET),
        description="Input table whose windows are run, a path or a URL (default: the bundled data).",
    )
    output: Location = Field(
        default=Location("tune.json"), examples=["FILE.json"], description="The file to write (default: tune.json)."
    )
    budget_s: float = Field(
        default=45.0,
        gt=0,
        le=MAX_SECONDS,
        examples=["S"],
        description="Seconds of timed runs in all (sessions' builds apart).",
    )
    windows: int = Field(
        default=256,
        gt=0,
        le=MAX_TUNE_WINDOWS,
        examples=["N"],
        description="Windows of the data the runs forecast (default: 256).",
    )
    cpus: int | None = Field(
        default=None,
        gt=0,
        le=MAX_CPUS,
        examples=["N"],
        description="Cores to spread over actors (default: this machine's).",
    )
    variants: bool = Field(
        default=True,
        description="Also weigh the checkpoint's variants beside it (NAME-*.onnx naming it as parent, e.g. export "
        "--quantize int8's): each tested for accuracy against it on the data's windows, those that pass timed, and "
        "one chosen for backtest --tuned to run in its place when faster, saying why.",
    )

    accuracy_margin: float = Field(
        default=DEFAULT_MARGIN,
        ge=0.0,
        le=1.0,
        examples=["FRACTION"],
        description="How much worse a variant's pooled accuracy (the report's test metric, relative change) may be "
        "and still replace the checkpoint when the Diebold-Mariano test tells them apart (0.01: 1%; 0: only a "
        "variant the test cannot tell apart, or better).",
    )

    @field_validator("checkpoint")
    @classmethod
    def _one_checkpoint(cls, value: Path) -> Path:
        """One checkpoint, resolved as backtest --checkpoint resolves it (a folder holding exactly one)."""
        found = checkpoint_paths([value])
        if len(found) != 1:
            names = ", ".join(path.name for path in found)
            raise ValueError(f"tune measures one checkpoint; the folder {value} holds {len(found)} ({names}): name one")
        return found[0]

    @field_validator("cpus")
    @classmethod
    def _on_this_machine(cls, value: int | None) -> int | None:
        # Every layout of N cores builds up to N sessions here: 1000 "cores" on 2 built hundreds of sessions and
        # wrote nothing within minutes of a 45 s budget. tune measures this machine: more cores than it has mean
        # nothing.
        here = os.cpu_count() or 1
        if value is not None and value > here:
            raise ValueError(
                f"is {value}, but this machine has {here} cores; tune measures this machine: give at most {here}"
            )
        return value

    @field_validator("checkpoint", mode="before")
    @classmethod
    def _local(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty; give the checkpoint's path")
        return local_checkpoint(value, "tune's checkpoint") if isinstance(value, str | Path | Location) else value

    @model_validator(mode="after")
    def _writes_no_input(self) -> TuneRequest:
        """``--output`` is never one of tune's inputs (:mod:`distributed_onnx.own_inputs`: the checkpoint's files,
        its variants', ``--data``), nor an existing file tune did not write: tune replaces only its own file."""
        check_output_reachable(self.output, what="file")  # ftp://, -, s3:/x: before any look at the place
        inputs = [checkpoint_files(self.checkpoint, flag_name(type(self), "checkpoint")), Read("data", self.data)]
        check_own_inputs([Written("output", self.output)], inputs)
        if not storage.is_file(self.output):
            return self
        try:
            found = json.loads(storage.read_bytes(self.output)).get("format")
        except (ValueError, AttributeError):  # not JSON, not UTF-8, not an object
            found = None
        if found not in (FORMAT, FORMAT_WITHOUT_IDENTITY):
            raise ConfigError(
                f"--output {self.output} exists and is not a file distributed-onnx tune wrote (no format "
                f"{FORMAT!r}): tune replaces only its own file. Give another --output, or remove that file.",
                key="output",
            )
        return self


def run_tune(request: TuneRequest) -> dict[str, Any]:
    """Measure (module docstring), write ``request.output`` and return its document. An output that cannot be
    written is refused before anything is measured."""
    check_output_file(request.output, example="tune.json")
    started = time.perf_counter()
    checkpoint = LocalCheckpoint(path=request.checkpoint).resolve()
    variants, left_out = variants_beside(checkpoint) if request.variants else ([], [])
    contexts = data_contexts(request.data, checkpoint, request.windows)
    cpus = request.cpus or os.cpu_count() or 1
    layouts = [(actors, cpus // actors) for actors in range(1, cpus + 1) if cpus % actors == 0]
    window_s = one_window_s(checkpoint, contexts)
    gate_s = request.budget_s * GATE_SHARE if variants else 0.0
    timed_s = request.budget_s - gate_s
    others = len(layouts) + (1 + len(variants) if variants else 0)  # layouts, then the variants' timings
    batches = affordable_batches(len(contexts), window_s, timed_s, others)
    measure = Measure(checkpoint, contexts, timed_s / (len(LEVELS) + len(batches) + others))
    middle = batches[len(batches) // 2]
    trials = [measure(level, middle, 1, cpus) for level in LEVELS]
    level = max((t for t in trials if t["stage"] == "level"), key=_speed)["graph_optimization"]
    trials += [measure(level, size, 1, cpus, stage="batch") for size in batches]
    rows = max((t for t in trials if t["stage"] == "batch"), key=_speed)["rows_per_batch"]
    trials += [measure(level, rows, actors, threads, stage="layout") for actors, threads in layouts]
    best = max((t for t in trials if t["stage"] == "layout"), key=_speed)
    settings = {
        "actors": best["actors"],
        "cpus_per_actor": float(best["threads"]),
        "rows_per_batch": best["rows_per_batch"],
        "graph_optimization": best["graph_optimization"],
    }
    weighed: dict[str, Any] = {}
    if variants:
        affordable = max(1, min(request.windows, int(gate_s / (window_s * (1 + len(variants))))))
        found, timed = _weigh(checkpoint, variants, request, affordable, measure, best)
        choice = found.pop("choice")
        weighed = {"variants": found | {"left_out": left_out}, "choice": choice}
        trials += timed
    elif left_out:
        weighed = {"variants": {"gate": None, "weighed": [], "left_out": left_out}}
    document = {
        "format": FORMAT,
        "checkpoint": str(checkpoint.weights_path),
        "checkpoint_sha256": checkpoint.metadata.sha256,
        "checkpoint_identity": identity_of(checkpoint).record(),
        "data": str(request.data),  # redacted: a URL's secrets stay in the URL
        "machine": {"cpus": cpus, "platform": platform.platform(), "load_average": _load(), "cpu": detect_cpu()},
        "settings": {key: settings[key] for key in TUNED_KEYS},
        "windows_per_s": best["windows_per_s"],
        "one_window_s": round(window_s, 4),
        **weighed,
        "trials": trials,
        "seconds": round(time.perf_counter() - started, 3),
    }
    storage.write_bytes(request.output, (json.dumps(document, indent=2) + "\n").encode())
    return document


def choice_lines(document: dict[str, Any]) -> list[str]:
    """What the console says of the variants: the choice and its reason; or, when variants were looked for and
    none weighed, that none was chosen; and each variant left out with why, one line each (the file holds the
    same under ``variants.left_out``: a console saying only "wrote" hid that every variant was left out)."""
    variants = document.get("variants") or {}
    left_out = list(variants.get("left_out") or [])
    lines = []
    if document.get("choice"):
        lines.append(f"choice: {document['choice']['reason']}")
    elif variants:
        name = Path(str(document.get("checkpoint", "?"))).stem
        lines.append(f"choice: {name} kept, no variant chosen: every variant beside it was left out ({len(left_out)})")
    lines += [f"left out: {reason}" for reason in left_out]
    return lines


def _weigh(
    checkpoint: ResolvedCheckpoint,
    variants: list[ResolvedCheckpoint],
    request: TuneRequest,
    affordable: int,
    measure: Measure,
    best: dict[str, Any],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The variants' part of the file (:mod:`.tune_variants`): the gate on about ``affordable`` windows each, the
    choice and its reason; and the trials timing those that pass beside the checkpoint (one each at ``best``'s
    settings, in turn)."""
    from distributed_onnx.tune_gate import run_gate  # the backtest's code: only when there is a variant to gate

    level, rows, actors, threads = best["graph_optimization"], best["rows_per_batch"], best["actors"], best["threads"]
    options = SessionOptionsConfig(
        graph_optimization_level=LEVELS[level], intra_op_num_threads=actors * threads, allow_spinning=False
    )
    gate = run_gate(checkpoint, variants, request.data, affordable, options, rows)
    margin = request.accuracy_margin
    holds = {v["variant"] for v in gate.verdicts if v.get("parent") == checkpoint.name and accuracy_holds(v, margin)}
    passed = [variant for variant in variants if variant.name in holds]
    trials, speed = [], {}
    for each in [checkpoint, *passed] if passed else []:
        trial = measure.of(each)(level, rows, actors, threads, stage="variant") | {"checkpoint": each.name}
        trials.append(trial)
        speed[each.name] = float(trial["windows_per_s"])
    records, choice = choose(checkpoint, variants, gate.verdicts, speed, margin)
    return {"gate": gate.record(), "accuracy_margin": margin, "weighed": records, "choice": choice}, trials


def _speed(trial: dict[str, Any]) -> float:
    return float(trial["windows_per_s"])


def _load() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None
