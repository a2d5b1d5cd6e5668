"""Horizons up to one call: what a checkpoint computes for a run's horizon, so that it is its family's forecast.

A graph emits ``horizon_length`` steps per call (``output_patch_size`` x ``horizon_patches``; longer horizons are
``long_horizon``'s, :mod:`distributed_onnx.model.unroll`). A run asking fewer steps must get what the family's
own pipeline computes for that prediction length, which is not always the first steps of a longer forecast. The
checkpoint's ``short_horizon`` (or its family's default, :class:`~distributed_onnx.model.families.FamilyRules`)
says which way holds:

- ``first_steps``: each forecast step is the same whatever horizon is asked (a causal decoder, a head that emits
  a whole call and is cut): the call's first steps are the forecast.
- ``output_patches``: the graph computes the output patches a call asks, and is asked
  ``ceil(horizon / output_patch_size)``: Chronos-2 as exported here as many as the future it is sent is long (as
  ``Chronos2Pipeline`` runs the model for that prediction length), TimesFM as exported here as many as its
  :data:`NUM_OUTPUT_PATCHES` input says (the autoregressive steps beyond them are not run: the same first steps
  at less cost). The forecast is cut within the last patch, as upstream cuts it.
- ``refuse``: the graph always computes ``horizon_patches`` patches, which attend to each other (Chronos-2 graphs
  of a fixed patch count: OpenSTEF's, the upstream exporter's): its first patches are not the forecast for fewer,
  so a horizon of another patch count is refused, naming the export that fits it. Never a silent cut.

One definition, read by the backtest's plan (before any actor starts), the worker (every call) and serve (every
request), so each refuses the same horizons in the same words. Pure logic: no ONNX Runtime, no Ray.
"""

from __future__ import annotations

from distributed_onnx.model.checkpoint import CheckpointMetadata, ShortHorizon
from distributed_onnx.model.families import rules_of

#: The 0-d int64 input of a graph that computes the output patches it is told (TimesFM as exported here; some
#: upstream Chronos-2 exports trace it to one value): ``ceil(horizon / output_patch_size)`` of the call.
NUM_OUTPUT_PATCHES = "num_output_patches"


def short_horizon_of(metadata: CheckpointMetadata) -> ShortHorizon:
    """The checkpoint's ``short_horizon``, or its family's default when the metadata leaves it unset."""
    return metadata.short_horizon or rules_of(metadata.model_family).short_horizon


def patches_for(metadata: CheckpointMetadata, horizon: int) -> int:
    """The output patches ``horizon`` steps span: ``ceil(horizon / output_patch_size)``."""
    return -(-horizon // metadata.output_patch_size)


def call_metadata(metadata: CheckpointMetadata, horizon: int) -> CheckpointMetadata:
    """The checkpoint as the call for ``horizon`` steps (at most one call) sees it: with ``output_patches``, a
    graph of ``ceil(horizon / output_patch_size)`` patches (what its adapter lays the future out for); otherwise
    ``metadata`` itself."""
    if short_horizon_of(metadata) != "output_patches" or horizon >= metadata.horizon_length:
        return metadata
    return metadata.model_copy(update={"horizon_patches": patches_for(metadata, horizon)})


def short_horizon_problem(metadata: CheckpointMetadata, horizon: int) -> str | None:
    """Why the checkpoint cannot forecast ``horizon`` steps (at most one call) as its family's pipeline does,
    in words for the user, or None when it can."""
    if short_horizon_of(metadata) != "refuse" or horizon > metadata.horizon_length:
        return None
    needed, computed, size = patches_for(metadata, horizon), metadata.horizon_patches, metadata.output_patch_size
    if needed == computed:
        return None
    return (
        f"horizon {horizon} spans {needed} output patch(es) of {size} steps, but this {metadata.model_family} graph "
        f"always computes {computed} ({metadata.horizon_length} steps), whose patches attend to each other: its "
        f"first {needed} are not the model's forecast for {horizon} steps (its pipeline computes {needed}), and a "
        f"cut of the longer forecast is not offered. Export the checkpoint again (distributed-onnx export "
        f"{metadata.model_family} --horizon {horizon}), or ask a horizon of {computed} patches "
        f"({(computed - 1) * size + 1} to {metadata.horizon_length} steps)"
    )
