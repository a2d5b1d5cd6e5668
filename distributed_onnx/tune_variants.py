"""``tune``'s choice between a checkpoint and its variants, and ``backtest --tuned`` running that choice.

A variant (an int8 quantization, ``export --quantize``) replaces its parent only through this choice or the user's
own, and never silently:

1. **Found** (:func:`variants_beside`): the checkpoints beside CHECKPOINT named ``NAME-*.onnx`` whose metadata names
   it as their parent by identity (:mod:`distributed_onnx.model.identity`). One naming another identity of it is left
   out, and the file says why.
2. **Gated**: each against the parent on the data's windows by the backtest's own code (:mod:`.tune_gate`), whose
   verdict is the report's; :func:`~.evaluation.scoring.variants.accuracy_holds` decides (one definition).
3. **Timed**: those that pass, each beside the parent, one trial each at the settings tune chose for the parent.
4. **Chosen** (:func:`choose`): the fastest that ran at least :data:`MIN_SPEEDUP` times the parent's windows per
   second; else the parent. The reason is written in words (``choice.reason``).

``backtest --tuned FILE`` then runs the chosen variant in place of the parent (:meth:`Choice.apply`): found beside
the run's parent by its file name and checked to have the identity tune weighed, named on stderr, in
``summary.json``'s ``tuned`` and in the report's notes. A run that holds the variant itself replaces nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_onnx import names
from distributed_onnx.errors import CheckpointError, ConfigError
from distributed_onnx.evaluation.scoring.variants import ALPHA, DEFAULT_MARGIN, accuracy_holds
from distributed_onnx.model.checkpoint import LocalCheckpoint, ResolvedCheckpoint
from distributed_onnx.model.identity import CheckpointIdentity, describe_differences, identity_of
from distributed_onnx.redact import redact_text

__all__ = ["MIN_SPEEDUP", "Choice", "choose", "variants_beside"]

#: A variant replaces its parent only when it ran at least this many times the parent's windows per second in
#: tune's trials: one trial each on a machine doing other work moves by several percent, and a variant has to
#: earn the place of the checkpoint the user gave.
MIN_SPEEDUP = 1.1


def variants_beside(parent: ResolvedCheckpoint) -> tuple[list[ResolvedCheckpoint], list[str]]:
    """The variants of ``parent`` beside it (module docstring, 1.) and, for each ``NAME-*.onnx`` left out though
    it names ``parent``'s name as its parent, why."""
    identity = identity_of(parent)
    found: list[ResolvedCheckpoint] = []
    left_out: list[str] = []
    for path in sorted(parent.weights_path.parent.glob(f"{parent.name}-*.onnx")):
        try:
            candidate = LocalCheckpoint(path=path).resolve()
        except CheckpointError as exc:
            left_out.append(f"{path.name}: not a checkpoint ({exc})")
            continue
        named = candidate.metadata.parent
        if named is None:
            continue  # NAME-v2.onnx: another checkpoint, not a variant
        recorded = CheckpointIdentity.from_record(named.identity)
        if recorded is None:
            if named.name == parent.name:
                left_out.append(
                    f"{candidate.name}: written before variants recorded their parent's identity, so nothing says "
                    f"it is {parent.name}'s variant; export it again (distributed-onnx export --quantize int8)"
                )
            continue
        differences = recorded.differences(identity)
        if not differences:
            found.append(candidate)
        elif named.name == parent.name:
            said = describe_differences(differences, "its parent", parent.name)
            left_out.append(f"{candidate.name}: names another identity of {parent.name} as its parent ({said})")
    return found, left_out


def choose(
    parent: ResolvedCheckpoint,
    variants: Sequence[ResolvedCheckpoint],
    verdicts: Sequence[dict[str, Any]],
    speed: dict[str, float],
    margin: float = DEFAULT_MARGIN,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each variant's record (its verdict, whether it passed the gate, its speed over the parent's) and the choice
    (:data:`MIN_SPEEDUP`). ``speed``: windows per second at the tuned settings, by name, of the parent and of
    every variant that passed (:func:`~.evaluation.scoring.variants.accuracy_holds`, within ``margin``)."""
    by_variant = {verdict["variant"]: verdict for verdict in verdicts if verdict.get("parent") == parent.name}
    precision = parent.metadata.precision
    records: list[dict[str, Any]] = []
    for variant in variants:
        verdict = by_variant.get(variant.name)
        passed = verdict is not None and accuracy_holds(verdict, margin)
        speedup = speed[variant.name] / speed[parent.name] if passed and speed.get(parent.name) else None
        records.append(
            {
                "name": variant.name,
                "file": variant.weights_path.name,
                "precision": variant.metadata.precision,
                "identity": identity_of(variant).record(),
                "verdict": verdict,
                "accuracy_holds": passed,
                "windows_per_s": speed.get(variant.name),
                "speedup": round(speedup, 3) if speedup is not None else None,
                "why": _why(variant.metadata.precision, precision, parent.name, verdict, passed, speedup, margin),
            }
        )
    fast = [r for r in records if r["speedup"] is not None and r["speedup"] >= MIN_SPEEDUP]
    kept = {
        "parent": parent.name,
        "chosen": parent.name,
        "file": parent.weights_path.name,
        "precision": precision,
        "identity": identity_of(parent).record(),
        "replaces_parent": False,
    }
    if not fast:
        why = "; ".join(record["why"] for record in records)
        return records, kept | {"speedup": None, "reason": f"{precision} kept: {why}"}
    best = max(fast, key=lambda record: float(record["speedup"]))
    chosen = {key: best[key] for key in ("file", "precision", "identity", "speedup")}
    return records, kept | chosen | {
        "chosen": best["name"],
        "replaces_parent": True,
        "reason": f"{best['precision']} chosen: {best['why']}",
    }


def _why(
    mine: str,
    theirs: str,
    parent: str,
    verdict: dict[str, Any] | None,
    passed: bool,
    speedup: float | None,
    margin: float = DEFAULT_MARGIN,
) -> str:
    """One variant's part of the reason, in words: its accuracy against the parent (from the verdict), its speed."""
    if verdict is None:
        return f"{mine} was not compared with {parent}: the gate's windows gave no test of the two"
    name, p_value, n = verdict["variant"], verdict["p_value"], verdict["n"]
    change = f"pooled {str(verdict['metric']).upper()} {verdict['relative_change']:+.2%}"
    if verdict["differs"] is None:
        return (
            f"{name} ({mine}): its accuracy could not be told from {parent}'s (the Diebold-Mariano test is undefined "
            f"on {n} windows: identical losses, or too few), so nothing says it held"
        )
    if not passed:
        return (
            f"{name} ({mine}) differs in accuracy from {parent} ({theirs}): worse, Diebold-Mariano p {p_value:.3g} "
            f"< {ALPHA} on {n} windows, {change}, beyond the {margin:.2%} accepted"
        )
    if verdict["differs"] and float(verdict["dm_statistic"]) >= 0:
        accuracy = (
            f"accuracy within the {margin:.2%} accepted of {theirs}, though the test tells them apart (Diebold-Mariano "
            f"p {p_value:.3g} < {ALPHA} on {n} windows, {change})"
        )
    elif verdict["differs"]:
        accuracy = f"accuracy better than {theirs} (Diebold-Mariano p {p_value:.3g} < {ALPHA} on {n} windows, {change})"
    else:
        accuracy = (
            f"accuracy not distinguishable from {theirs} (Diebold-Mariano p {p_value:.3g} >= {ALPHA} on {n} windows, "
            f"{change})"
        )
    if speedup is None:
        return f"{name} ({mine}): {accuracy}, but it could not be timed"
    faster = f"{speedup:.2f}x the windows per second of {parent} ({theirs}) at the tuned settings"
    if speedup < MIN_SPEEDUP:
        return f"{name} ({mine}): {accuracy}, but it ran only {faster}, below the {MIN_SPEEDUP}x a variant needs"
    return f"{name} ran {faster}, {accuracy}"


def _check_choice(record: dict[str, Any], source: str) -> None:
    """A choice whose ``file`` is not one checkpoint file beside the parent (``../m/x.onnx``, ``/etc/passwd``), or
    whose ``chosen`` names another checkpoint than that file, is refused naming the key: a backtest would otherwise
    crash on the name, or say it ran one checkpoint while it ran another (the file is what runs)."""
    file, chosen = record["file"], record["chosen"]
    again = "write the file again with distributed-onnx tune, or run distributed-onnx backtest without --tuned"
    problem = names.name_problem(file.removesuffix(".onnx")) if isinstance(file, str) else "not a string"
    if problem is None and (not file.endswith(".onnx") or "/" in file or "\\" in file):
        problem = "not a .onnx file name"
    if problem is not None:
        raise ConfigError(
            f"Invalid tuned settings: choice.file {file!r} [from {source}] is not the file name of a checkpoint "
            f"beside the parent ({problem}): {again}",
            key="tuned",
            path=source,
        )
    if chosen != file.removesuffix(".onnx"):
        raise ConfigError(
            f"Invalid tuned settings: choice.chosen {chosen!r} [from {source}] is not the checkpoint choice.file "
            f"{file!r} names (a checkpoint's name is its file's stem): {again}",
            key="tuned",
            path=source,
        )


@dataclass(frozen=True)
class Choice:
    """A tuned file's ``choice`` (:func:`choose`), read back for ``backtest --tuned``."""

    record: dict[str, Any]
    source: str  #: the tuned file, as it is named (redacted)

    @classmethod
    def from_record(cls, record: Any, source: str) -> Choice | None:
        """The file's ``choice``, or None when it has none (``null``: ``--no-variants``, or no ``choice`` key: written
        before choices). Anything else must be the record tune writes: ``5`` or a mapping without the chosen file
        was once read as "no choice" and the parent ran, while the file said a variant was chosen."""
        if record is None:
            return None
        keys = ("chosen", "parent", "file", "identity")
        if not isinstance(record, dict) or not set(keys) <= set(record):
            shown = redact_text(" ".join(json.dumps(record, default=str).split()))[:80]
            missing = f", without {[key for key in keys if key not in record]}" if isinstance(record, dict) else ""
            raise ConfigError(
                f"Invalid tuned settings: choice [from {source}] holds {type(record).__name__} ({shown}){missing}, "
                f"not the record tune writes (a mapping with {', '.join(keys)}) or null for no choice: the file was "
                "edited or damaged; write it again with distributed-onnx tune, or run distributed-onnx backtest "
                "without --tuned",
                key="tuned",
                path=source,
            )
        _check_choice(record, source)
        return cls(dict(record), source)

    @property
    def identity(self) -> CheckpointIdentity | None:
        return CheckpointIdentity.from_record(self.record.get("identity"))

    def apply(
        self, run: Sequence[tuple[Path, CheckpointIdentity]], tuned: CheckpointIdentity
    ) -> tuple[list[Path], dict[str, Any]]:
        """The run's checkpoints with the chosen variant in place of each that has the ``tuned`` identity (its
        parent's), and what ``summary.json`` records of it (``said``: the sentence shown)."""
        choice, paths = self.record, [path for path, _ in run]
        record: dict[str, Any] = {"file": self.source, "choice": choice, "replaced": {}}
        head = f"distributed-onnx backtest --tuned {self.source}"
        if not choice.get("replaces_parent"):
            return paths, record | {"said": f"{head}: ran {choice['parent']}, tune's choice: {choice['reason']}"}
        chosen = self.identity
        if chosen is not None and any(not chosen.differences(found) for _, found in run):
            said = (
                f"{head}: tune chose {choice['chosen']} over {choice['parent']} ({choice['reason']}); this run holds "
                f"{choice['chosen']} itself, so nothing was replaced"
            )
            return paths, record | {"said": said}
        replaced: list[Path] = []
        for path, found in run:
            if tuned.differences(found):
                replaced.append(path)
                continue
            variant = path.with_name(str(choice["file"]))
            self._check_variant(variant, path)
            record["replaced"][path.stem] = variant.stem
            replaced.append(variant)
        said = f"{head}: ran {choice['chosen']} in place of its parent {choice['parent']}, tune's choice: "
        return replaced, record | {"said": said + str(choice["reason"])}

    def _check_variant(self, variant: Path, parent: Path) -> None:
        """The chosen variant beside the run's parent, with the identity tune weighed: else refused, naming it."""
        chosen = self.identity
        again = f"tune again (distributed-onnx tune {parent}), or run distributed-onnx backtest without --tuned"
        try:
            found = identity_of(LocalCheckpoint(path=variant).resolve())
        except CheckpointError as exc:
            raise ConfigError(
                f"{self.source} chose {self.record['chosen']} in place of {parent.stem}, but {variant} is not a "
                f"checkpoint beside it ({exc}): {again}",
                key="tuned",
                path=self.source,
            ) from exc
        if chosen is None or chosen.differences(found):
            said = describe_differences(chosen.differences(found), "weighed by tune", "found") if chosen else "none"
            raise ConfigError(
                f"{self.source} chose {self.record['chosen']} in place of {parent.stem}, but {variant} is not the "
                f"checkpoint tune weighed (identity {found.digest}): {said}. {again[0].upper()}{again[1:]}",
                key="tuned",
                path=self.source,
            )
