"""How many parts a backtest is cut into by default: enough for every actor, few enough for one driver.

A part is the unit an actor runs, writes and the driver hears of once. Too few, and a cluster of more actors
than parts leaves actors idle, and the last parts decide when the run ends (an actor that starts a long part
at the end keeps everyone waiting: the tail). Too many, and the driver's cost per part (a call, a wait, a
receipt, a file to merge) adds up, and each part writes its own small files. So the default follows the
actors: :data:`PARTS_PER_ACTOR` parts per actor (the pull of idle actors evens out their speeds over those
parts, and the last wave is a small share of each actor's work), never fewer than :data:`MIN_PARTS` (a small
cluster keeps a fine grain for resume and progress) and never more than :data:`MAX_PARTS` (the driver's
ceiling, ``docs/driver.md``). Each part is a whole number of model batches, from one to
:data:`MAX_BATCHES_PER_PART`; a GPU actor's parts hold at least :data:`GPU_MIN_BATCHES_PER_PART`, because
one GPU batch takes milliseconds and a part must stay long against a call's fixed cost.

The batch (``rows_per_batch``, windows per model call) follows the work too (:func:`default_rows_per_batch`):
never more than a part's share of the windows, so that a small run is cut into parts for every actor (32
windows on 2 actors: 8 parts of 4 windows, not one part of one 256-row batch that leaves an actor idle), nor
fewer than :data:`MIN_DEFAULT_ROWS` where two parts per actor remain (a call of one or two rows costs more per
window); and never more than the graph's cost allows (:func:`batch_cap`): a large graph's activations for a
large batch outgrow the CPU's caches, and smaller batches run it faster per window.

The part and batch sizes enter the run's fingerprint, so a rerun must plan the same parts to resume. The sizes
chosen are therefore recorded in the run directory's manifest (``run.json``), and a rerun that does not set
them takes them from there, whatever its cluster (:func:`recorded_part_size`); a directory written before the
sizes were recorded gets the sizes the default gave then (batches of :data:`LEGACY_ROWS_PER_BATCH`, about 64
parts or 8 per actor).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import NamedTuple

from distributed_onnx import storage
from distributed_onnx.evaluation.data.windows import PartSpec, WindowPlan
from distributed_onnx.location import Location
from distributed_onnx.runtime.addresses import AUTO

__all__ = [
    "GPU_MIN_BATCHES_PER_PART",
    "MAX_BATCHES_PER_PART",
    "MAX_PARTS",
    "MIN_PARTS",
    "LEGACY_ROWS_PER_BATCH",
    "RecordedPlan",
    "batch_cap",
    "default_rows_per_batch",
    "PARTS_PER_ACTOR",
    "UNKNOWN_ACTORS_PARTS",
    "default_windows_per_part",
    "planning_actors",
    "dispatch_order",
    "plan_parts",
    "recorded_part_size",
]

#: Parts per actor at the default: the ramp and the tail are a small share of each actor's work.
PARTS_PER_ACTOR = 8
#: The fewest parts of a default plan for known actors: a run on one or two actors keeps a grain for resume and
#: progress (each part is also a cost of the driver's: a call, a receipt, a sums file to verify and merge).
MIN_PARTS = 16
#: The parts of a plan whose actors are not known (``--address`` without ``--actors``), and of every default plan
#: before the default followed the actors: a run directory planned then resumes with them.
UNKNOWN_ACTORS_PARTS = 64
#: The most parts of a default plan: the driver's per-part cost stays small (``docs/driver.md``).
MAX_PARTS = 8192
MAX_BATCHES_PER_PART = 64
GPU_MIN_BATCHES_PER_PART = 16
#: The keys of the run's manifest that record the part size and the ramp's width the run was planned with.
MANIFEST_KEY = "windows_per_part"
RAMP_KEY = "ramp_width"
ROWS_KEY = "rows_per_batch"
#: The batch of every default plan before the batch followed the work (a directory planned then resumes with it).
LEGACY_ROWS_PER_BATCH = 256
#: The batch caps by graph cost (the graph's bytes x its context length, a proxy of the work and activation
#: memory of one window): ``(cost below, largest batch)``, then :data:`LARGE_GRAPH_BATCH` above the last.
#: The bundled reference graph (4 MB, context 512) costs about the same per window from 2 to 128 rows; above it
#: (Chronos-Bolt at bolt-small's shapes, 193 MB at context 2048; Chronos-2's, 480 MB at 8192) a window costs
#: least at a few rows a call and more from 16 rows up, as a large graph's activations outgrow the caches
#: (benchmarks/results/published_defaults.md, "Batches").
BATCH_CAPS: tuple[tuple[float, int], ...] = ((2e10, 256),)
LARGE_GRAPH_BATCH = 16
#: The smallest default batch where the windows allow two parts per actor: a call of one or two rows of a large
#: graph costs more per window (benchmarks/results/published_defaults.md, "Batches").
MIN_DEFAULT_ROWS = 4


def batch_cap(graph_bytes: int, context_length: int) -> int:
    """The largest default batch for a graph of ``graph_bytes`` reading ``context_length`` steps (see
    :data:`BATCH_CAPS`): a large graph's activations for a large batch outgrow the caches."""
    cost = float(max(graph_bytes, 1)) * max(context_length, 1)
    for below, cap in BATCH_CAPS:
        if cost < below:
            return cap
    return LARGE_GRAPH_BATCH


def _target_parts(actors: int | None) -> int:
    return UNKNOWN_ACTORS_PARTS if actors is None else min(max(actors * PARTS_PER_ACTOR, MIN_PARTS), MAX_PARTS)


def default_rows_per_batch(planned: int, actors: int | None, cap: int, *, gpu_actors: bool = False) -> int:
    """Windows per model call by default: a part's share of the default plan (``planned`` over its parts), at
    least :data:`MIN_DEFAULT_ROWS` where that still leaves two parts per actor, at most ``cap``
    (:func:`batch_cap`), so a small run still makes parts for every actor. A GPU actor keeps
    :data:`LEGACY_ROWS_PER_BATCH` (its calls are cheap per row and its parts long, see the module's docstring)."""
    if gpu_actors:
        return LEGACY_ROWS_PER_BATCH
    share = -(-max(planned, 1) // _target_parts(actors))
    floor = min(MIN_DEFAULT_ROWS, -(-max(planned, 1) // (2 * actors))) if actors else 1
    return max(min(max(share, floor), cap), 1)


class RecordedPlan(NamedTuple):
    """The sizes a run directory's manifest records (0: not recorded) and its run's fingerprint."""

    windows_per_part: int
    ramp_width: int
    fingerprint: str
    rows_per_batch: int = 0


def default_windows_per_part(
    planned: int, rows_per_batch: int, actors: int | None = None, *, gpu_actors: bool = False
) -> int:
    """The part size of the default plan: ``PARTS_PER_ACTOR`` parts per actor, within the bounds above.

    ``actors`` None (not known when planning) plans :data:`UNKNOWN_ACTORS_PARTS` parts, as every run did before
    the default followed the actors. A pure function of its arguments, so the same settings plan the same parts.
    """
    target = _target_parts(actors)
    wanted = -(-max(planned, 1) // target)
    fewest = GPU_MIN_BATCHES_PER_PART if gpu_actors and actors is not None else 1
    batches_per_part = min(max(-(-wanted // rows_per_batch), fewest, 1), MAX_BATCHES_PER_PART)
    return batches_per_part * rows_per_batch


def planning_actors(
    actors: int | None, address: str | None, cpus_per_actor: float, gpus_per_actor: float
) -> int | None:
    """The actors a plan is cut for: the count asked for; for a Ray on this machine (no address: started here;
    ``auto``: the one ``ray start`` left running, else started here), what this machine's CPUs hold; None when
    only the cluster knows (an address and no count: ``--actors`` tells it)."""
    if actors is not None:
        return actors
    if (address is not None and address != AUTO) or gpus_per_actor > 0:
        return None
    return max(int((os.cpu_count() or 1) // max(cpus_per_actor, 1e-9)), 1)


def recorded_part_size(output: Location, manifest_name: str) -> RecordedPlan | None:
    """The part size, ramp width, run fingerprint and batch of the run directory's manifest, if it has one.

    A manifest without a size or batch (one written before they were recorded) gives 0: the caller then
    finds them by the fingerprint. No manifest, or one that cannot be read: None (a new run; a file that
    is not a manifest is refused later, naming it)."""
    path = storage.join(output, manifest_name)
    try:
        if not storage.is_file(path):
            return None
        document = json.loads(storage.read_bytes(path))
    except Exception:  # unreadable here is refused, with its cause, by the output's own check
        return None
    if not isinstance(document, dict):
        return None
    size, width, rows = document.get(MANIFEST_KEY), document.get(RAMP_KEY, 1), document.get(ROWS_KEY)
    fingerprint = str(document.get("fingerprint"))
    rows = rows if isinstance(rows, int) and rows > 0 else 0
    if not isinstance(size, int) or size <= 0:
        return RecordedPlan(0, 1, fingerprint, rows)
    return RecordedPlan(size, width if isinstance(width, int) and width > 0 else 1, fingerprint, rows)


def default_ramp_width(actors: int | None) -> int:
    """Parts of each ramp size in a default plan: one per actor, so the run's last wave is of small parts."""
    return 1 if actors is None else max(actors, 1)


def plan_parts(windows: WindowPlan, windows_per_part: int, first_part: int, ramp_width: int = 1) -> list[PartSpec]:
    """The run's parts: a ramp from ``first_part`` windows, doubling, ``ramp_width`` parts of each size (the
    first part alone), then parts of ``windows_per_part``; with a width of 1, :meth:`WindowPlan.parts`.

    The dispatcher hands out the first part first and then the largest first, so the ramp's parts are also the
    run's last: a wave of parts half as large, then a quarter... one per actor each, and the actors finish
    within a small part of each other (a tail of full parts left the fastest idle while the slowest worked).
    Deterministic, so a rerun with the same width and size plans the same parts.
    """
    if ramp_width <= 1:
        return windows.parts(windows_per_part, first_part=first_part)
    if windows_per_part < 1:
        raise ValueError(f"windows_per_part must be >= 1, got {windows_per_part}")
    planned, sizes, covered = windows.planned, [], 0
    size = min(first_part, windows_per_part)
    sizes.append(min(size, planned))
    covered = sizes[0]
    while covered < planned and size < windows_per_part:
        for _ in range(ramp_width):
            if covered >= planned:
                break
            take = min(size, planned - covered)
            sizes.append(take)
            covered += take
        size = min(size * 2, windows_per_part)
    while covered < planned:
        take = min(windows_per_part, planned - covered)
        sizes.append(take)
        covered += take
    parts, start = [], 0
    for index, take in enumerate(sizes):
        parts.append(PartSpec(index, start, start + take))
        start += take
    return parts


def dispatch_order(parts: Sequence[PartSpec], first_wave: int = 0) -> list[PartSpec]:
    """The order the dispatcher hands ``parts`` out: the plan's first part, then ``first_wave`` of the smallest
    (one per actor: each actor's speed is measured on a small part before it holds a large one, so a slow actor
    never starts the run with a part that outlasts it), then the largest first (the small ones end the run).

    With no first wave, :func:`~..data.windows.dispatch_order`'s order. Only the order changes: the parts, their
    indices and files are the plan's.
    """
    if not parts:
        return []
    first, *rest = parts
    wave = sorted(rest, key=lambda part: part.n_windows)[: max(first_wave, 0)]
    taken = {part.index for part in wave}
    others = sorted((part for part in rest if part.index not in taken), key=lambda part: -part.n_windows)
    return [first, *wave, *others]
