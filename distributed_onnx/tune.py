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

What a backtest takes from the file is what tune measured, nothing else: only the keys of :data:`TUNED_KEYS` are
accepted under ``settings`` (a file edited to carry ``checkpoint``, ``data`` or ``horizon`` is refused naming
the key: those say what a run computes, and come from what a user writes). The file records the identity of the
checkpoint it was measured on (:mod:`distributed_onnx.model.identity`), and a run none of whose checkpoints has
that identity is refused naming both: the speed of one graph says little about another's.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator
from pydantic_settings import CliPositionalArg

from distributed_onnx import storage
from distributed_onnx.bounds import MAX_CPUS, MAX_SECONDS, MAX_TUNE_WINDOWS
from distributed_onnx.errors import ConfigError
from distributed_onnx.evaluation.scoring.variants import DEFAULT_MARGIN, accuracy_holds
from distributed_onnx.evaluation.up_front import check_output_file
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.model.backend.cpu_features import detect_cpu
from distributed_onnx.model.backend.providers import CpuProvider, SessionOptionsConfig
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint, checkpoint_paths, local_checkpoint
from distributed_onnx.model.identity import CheckpointIdentity, describe_differences, identity_of
from distributed_onnx.model.worker import InferenceWorker, WorkerConfig
from distributed_onnx.own_inputs import Read, Written, check_own_inputs, checkpoint_files
from distributed_onnx.redact import redact_text
from distributed_onnx.resources import REFERENCE_DATASET
from distributed_onnx.settings_sources import CommandSettings, flag_name
from distributed_onnx.tune_variants import Choice, choose, variants_beside

__all__ = ["LEVELS", "TUNED_KEYS", "TunedFile", "TuneRequest", "choice_lines", "load_tuned", "read_tuned", "run_tune"]

#: The graph optimization levels measured, as the backtest's ``graph_optimization`` names them.
LEVELS: dict[str, Literal["ENABLE_BASIC", "ENABLE_EXTENDED", "ENABLE_ALL"]] = {
    "basic": "ENABLE_BASIC",
    "extended": "ENABLE_EXTENDED",
    "all": "ENABLE_ALL",
}
#: The batch sizes tried (those above the windows held are left out).
BATCHES = (1, 4, 16, 64, 256)
#: The file's format, for a reader to refuse another (2: the checkpoint's identity is recorded).
FORMAT = "distributed-onnx tune 2"
#: Format 1 recorded the graph's sha256 only: refused with a word on why (tune again).
_FORMAT_WITHOUT_IDENTITY = "distributed-onnx tune 1"
#: The settings tune measures and writes: the only keys ``--tuned`` accepts.
TUNED_KEYS = ("actors", "cpus_per_actor", "rows_per_batch", "graph_optimization")
#: The share of the budget the variants' accuracy gate takes when there are variants (:mod:`.tune_gate`).
GATE_SHARE = 1 / 3


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
        inputs = [checkpoint_files(self.checkpoint, flag_name(type(self), "checkpoint")), Read("data", self.data)]
        check_own_inputs([Written("output", self.output)], inputs)
        if not storage.is_file(self.output):
            return self
        try:
            found = json.loads(storage.read_bytes(self.output)).get("format")
        except (ValueError, AttributeError):  # not JSON, not UTF-8, not an object
            found = None
        if found not in (FORMAT, _FORMAT_WITHOUT_IDENTITY):
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
    contexts = _windows(request.data, checkpoint, request.windows)
    cpus = request.cpus or os.cpu_count() or 1
    layouts = [(actors, cpus // actors) for actors in range(1, cpus + 1) if cpus % actors == 0]
    window_s = _one_window_s(checkpoint, contexts)
    gate_s = request.budget_s * GATE_SHARE if variants else 0.0
    timed_s = request.budget_s - gate_s
    others = len(layouts) + (1 + len(variants) if variants else 0)  # layouts, then the variants' timings
    batches = affordable_batches(len(contexts), window_s, timed_s, others)
    measure = _Measure(checkpoint, contexts, timed_s / (len(LEVELS) + len(batches) + others))
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
    measure: _Measure,
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


def affordable_batches(windows: int, window_s: float, budget_s: float, layouts: int) -> list[int]:
    """The batch sizes of :data:`BATCHES` a trial can time: at most ``windows``, and one call of the size takes at
    most half of a trial's share of the budget (a trial runs a warm-up call and at least one timed call, so a
    longer call overruns the budget: a 256-row call of a Chronos-2-sized graph on one core takes minutes).
    ``window_s`` is one window's call on one thread, the slowest layout; ``layouts`` the trials besides the levels
    and the batches (the layouts, and the variants' timings). 1 when nothing larger fits."""
    trial_s = budget_s / (len(LEVELS) + len(BATCHES) + layouts)
    return [size for size in BATCHES if size <= windows and size * window_s <= trial_s / 2] or [1]


@dataclass(frozen=True)
class TunedFile:
    """A file ``tune`` wrote, read and checked: its ``settings`` (only :data:`TUNED_KEYS`) and the identity of the
    checkpoint they were measured on."""

    path: Location
    settings: dict[str, Any]
    checkpoint: str
    identity: CheckpointIdentity | None
    #: Which checkpoint a run of the tuned one runs: it, or a variant tune chose (:mod:`.tune_variants`).
    choice: Choice | None = None

    @property
    def source(self) -> tuple[str, dict[str, Any]]:
        """``(file, settings)`` for :meth:`~.settings_sources.CommandSettings.from_sources`."""
        return str(self.path), self.settings

    def checkpoints_to_run(self, checkpoints: Sequence[Path], settings: Any) -> tuple[list[Path], dict[str, Any]]:
        """The run's checkpoints once checked (:meth:`check_checkpoints`), with the file's choice applied (a variant
        in its parent's place: :meth:`.tune_variants.Choice.apply`), and the record of the file for
        ``summary.json``, whatever it changed: its ``settings`` the run took (``settings``: the run's, after every
        source), those a user's flag, environment or ``--config`` ``overridden``, and its choice (None: it holds
        none). ``said`` (shown on stderr and in the report's notes) names the file and what it changed, so the file
        a run used is never silent (a file without a choice once left no trace anywhere)."""
        resolved = [LocalCheckpoint(path=path).resolve() for path in checkpoints]
        self._check(resolved)
        used, overridden = self._taken(settings)
        taken = {"settings": used, "overridden": overridden}
        if self.choice is None or self.identity is None:
            said = f"distributed-onnx backtest --tuned {self.path}: {_settings_said(used, overridden)}; it holds no "
            said += "choice of checkpoint (no variant was chosen): the checkpoints ran as given"
            record: dict[str, Any] = {"file": str(self.path), "choice": None, "replaced": {}, "said": said}
            return list(checkpoints), record | taken
        run = [(path, identity_of(checkpoint)) for path, checkpoint in zip(checkpoints, resolved, strict=True)]
        paths, record = self.choice.apply(run, self.identity)
        return paths, record | taken | {"settings_said": _settings_said(used, overridden)}

    def _taken(self, settings: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The file's settings the run holds (taken from it), and those it holds otherwise: ``{key: {"tuned": the
        file's, "used": the run's}}`` (a flag, the environment or ``--config`` is above the file)."""
        used = {key: tuned for key, tuned in self.settings.items() if getattr(settings, key) == tuned}
        overridden = {
            key: {"tuned": tuned, "used": getattr(settings, key)}
            for key, tuned in self.settings.items()
            if key not in used
        }
        return used, overridden

    def check_checkpoints(self, checkpoints: Sequence[Path]) -> None:
        """Refuse a run none of whose ``checkpoints`` has the identity the file was tuned on (or that of the variant
        it chose), naming both."""
        self._check([LocalCheckpoint(path=path).resolve() for path in checkpoints])

    def _check(self, resolved: Sequence[ResolvedCheckpoint]) -> None:
        identities = {each.name: identity_of(each) for each in resolved}
        tuned_name = Path(self.checkpoint).stem
        if self.identity is None:
            raise ConfigError(
                f"{self.path} records no checkpoint identity, so nothing says it was tuned for "
                f"{', '.join(identities)}: run distributed-onnx tune again, or distributed-onnx backtest without "
                "--tuned",
                path=str(self.path),
            )
        accepted = [self.identity, *([self.choice.identity] if self.choice and self.choice.identity else [])]
        if any(not known.differences(each) for known in accepted for each in identities.values()):
            return
        name = tuned_name if tuned_name in identities else next(iter(identities))
        found = identities[name]
        differences = describe_differences(self.identity.differences(found), "tuned", f"this run's {name}")
        raise ConfigError(
            f"{self.path} was tuned for checkpoint {tuned_name} (identity {self.identity.digest}), not for this "
            f"run's {name} (identity {found.digest}): {differences}. The speed measured on one checkpoint says "
            f"little about another: tune this one (distributed-onnx tune {resolved[0].weights_path}), or run "
            "distributed-onnx backtest without --tuned",
            key="tuned",
            path=str(self.path),
        )


def _settings_said(used: Mapping[str, Any], overridden: Mapping[str, Mapping[str, Any]]) -> str:
    """What a tuned file's settings changed, in words: those taken, those given otherwise above the file."""
    said = f"ran with its {', '.join(f'{key}={value}' for key, value in used.items())}" if used else "took none of it"
    if overridden:
        above = ", ".join(f"{key}={each['used']} (its {each['tuned']})" for key, each in overridden.items())
        said += f"; a flag, the environment or --config gave {above}"
    return said


def tuned_lines(record: Mapping[str, Any]) -> list[str]:
    """The lines ``backtest --tuned`` says on stderr: what the file's settings changed, and its choice."""
    return [line for line in (record.get("settings_said"), record["said"]) if line]


def load_tuned(given: LocationLike) -> TunedFile:
    """Read a file ``tune`` wrote (a path or a URL, as its ``--output``; named redacted): its format, only the keys
    tune writes under ``settings``, the checkpoint's identity (compared with the run's by
    :meth:`TunedFile.check_checkpoints`)."""
    path = Location.parse(given)
    try:
        document = json.loads(storage.read_bytes(path))
    except FileNotFoundError as exc:
        msg = f"Tuned settings file not found: {path}; write it with distributed-onnx tune"
        raise ConfigError(msg, path=str(path)) from exc
    except (OSError, ValueError) as exc:
        msg = f"Tuned settings file {path} is not JSON ({path.scrub(str(exc))}); write it with distributed-onnx tune"
        raise ConfigError(msg, path=str(path)) from exc
    settings = document.get("settings") if isinstance(document, dict) else None
    if isinstance(settings, dict) and document.get("format") == _FORMAT_WITHOUT_IDENTITY:
        raise ConfigError(
            f"{path} was written by an older distributed-onnx tune ({_FORMAT_WITHOUT_IDENTITY!r}), which did not "
            f"record the identity of the checkpoint it measured: run distributed-onnx tune again",
            path=str(path),
        )
    if not isinstance(settings, dict) or document.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not a tuned settings file (expected format {FORMAT!r} with a 'settings' mapping); "
            "write it with distributed-onnx tune",
            path=str(path),
        )
    foreign = [key for key in settings if key not in TUNED_KEYS]
    if foreign:
        raise ConfigError(
            f"Invalid tuned settings: settings.{foreign[0]} [from {path}] is not a key distributed-onnx tune "
            f"writes; a tuned file holds only {', '.join(TUNED_KEYS)}. Give {foreign[0]} as a flag or in --config, "
            "and remove it from the file",
            key=foreign[0],
            path=str(path),
        )
    recorded = document.get("checkpoint_identity")
    identity = CheckpointIdentity.from_record(recorded)
    if identity is None and recorded is not None:  # there, but not the record tune writes: not "records none"
        shown = redact_text(" ".join(json.dumps(recorded, default=str).split()))[:80]
        raise ConfigError(
            f"{path} records checkpoint_identity as a {type(recorded).__name__} ({shown}), not the identity record "
            "tune writes (a mapping with the graph's sha256 and the metadata fields): the file was edited or "
            "damaged; run distributed-onnx tune again, or distributed-onnx backtest without --tuned",
            key="tuned",
            path=str(path),
        )
    choice = Choice.from_record(document.get("choice"), str(path))
    return TunedFile(path, dict(settings), str(document.get("checkpoint") or "?"), identity, choice)


def read_tuned(path: LocationLike) -> tuple[str, dict[str, Any]]:
    """``(file, settings)`` of a file ``tune`` wrote, for :meth:`~.settings_sources.CommandSettings.from_sources`
    (:func:`load_tuned`, less the checkpoint's identity)."""
    return load_tuned(path).source


def _speed(trial: dict[str, Any]) -> float:
    return float(trial["windows_per_s"])


def _load() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def _windows(data: Location, checkpoint: ResolvedCheckpoint, count: int) -> np.ndarray:
    """``count`` contexts ``[W, context_length]`` of the data's series: each series' latest window first, then
    stepping back one horizon at a time, round robin over the series (NaN where a series is short); repeated
    when the data holds fewer (the speed of a call does not depend on which windows it holds)."""
    from distributed_onnx.evaluation.data.table import load_series

    metadata = checkpoint.metadata
    arrays = load_series(data, metadata.resolution_minutes).arrays()
    length = metadata.context_length
    taken: list[np.ndarray] = []
    step = 0
    while len(taken) < count:
        before = len(taken)
        for series in range(len(arrays.series_ids)):
            values = arrays.values[arrays.offsets[series] : arrays.offsets[series + 1]]
            end = len(values) - step * max(metadata.horizon_length, 1)
            if end <= 0:
                continue
            window = np.full(length, np.nan)
            piece = values[max(0, end - length) : end]
            window[length - len(piece) :] = piece
            taken.append(window)
            if len(taken) == count:
                break
        if len(taken) == before:
            break
        step += 1
    if not taken:
        raise ConfigError(f"{data} has no values to tune on")
    return np.resize(np.asarray(taken, dtype=np.float32), (count, length))


def _worker_config(checkpoint: ResolvedCheckpoint, level: str, threads: int) -> WorkerConfig:
    options = SessionOptionsConfig(
        graph_optimization_level=LEVELS[level], intra_op_num_threads=threads, allow_spinning=False
    )
    return WorkerConfig(checkpoint=checkpoint.weights_path, providers=[CpuProvider()], session_options=options)


def _one_window_s(checkpoint: ResolvedCheckpoint, contexts: np.ndarray) -> float:
    """Seconds of a one-window call on one thread (after a first call), at the default level: what sizes the
    batches a trial can afford (:func:`affordable_batches`)."""
    worker = InferenceWorker.from_config(_worker_config(checkpoint, "all", 1))
    metadata = checkpoint.metadata
    try:
        one = contexts[:1]
        worker.forecast(one, metadata.horizon_length, list(metadata.native_quantiles))
        started = time.perf_counter()
        worker.forecast(one, metadata.horizon_length, list(metadata.native_quantiles))
        return time.perf_counter() - started
    finally:
        worker.close()


class _Measure:
    """One timed trial: ``actors`` sessions of ``threads`` intra-op threads, each forecasting batches of
    ``rows`` windows from its own thread for ``trial_s``; windows per second over them all."""

    def __init__(self, checkpoint: ResolvedCheckpoint, contexts: np.ndarray, trial_s: float) -> None:
        self.checkpoint, self.contexts, self.trial_s = checkpoint, contexts, trial_s
        metadata = checkpoint.metadata
        self.horizon, self.levels = metadata.horizon_length, list(metadata.native_quantiles)

    def of(self, checkpoint: ResolvedCheckpoint) -> _Measure:
        """The same trials of another checkpoint (a variant: the same contexts, the same share of the budget)."""
        return _Measure(checkpoint, self.contexts, self.trial_s)

    def __call__(self, level: str, rows: int, actors: int, threads: int, stage: str = "level") -> dict[str, Any]:
        config = _worker_config(self.checkpoint, level, threads)
        built = time.perf_counter()
        workers = [InferenceWorker.from_config(config) for _ in range(actors)]
        build_s = (time.perf_counter() - built) / actors
        batch = self.contexts[: max(rows, 1)]
        for worker in workers:  # a warm-up call each: the first call allocates
            worker.forecast(batch, self.horizon, self.levels)
        done = [0] * actors
        deadline = time.perf_counter() + self.trial_s
        started = time.perf_counter()

        def run(index: int, forecast: Callable[..., Any]) -> None:
            while True:
                forecast(batch, self.horizon, self.levels)
                done[index] += len(batch)
                if time.perf_counter() >= deadline:
                    return

        _in_threads([functools.partial(run, index, worker.forecast) for index, worker in enumerate(workers)])
        elapsed = time.perf_counter() - started
        for worker in workers:
            worker.close()
        return {
            "stage": stage,
            "graph_optimization": level,
            "rows_per_batch": len(batch),
            "actors": actors,
            "threads": threads,
            "windows_per_s": round(sum(done) / elapsed, 3),
            "session_build_s": round(build_s, 3),
            "seconds": round(elapsed, 3),
        }


def _in_threads(tasks: Sequence[Callable[[], None]]) -> None:
    """Run ``tasks`` at once, one thread each; the first error of any is raised here."""
    errors: list[BaseException] = []

    def guarded(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # raised again below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
