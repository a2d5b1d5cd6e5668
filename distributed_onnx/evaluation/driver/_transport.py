"""How a run's actors get its series: the choice between the object store and the input file, made once.

The rule itself is :func:`~..data.series_source.choose_transport` (documented and measured there); this module
applies it to a plan: a streamed input (:class:`~..data.rows.SeriesRows`) is read by the actors from the file
already, otherwise the series are laid out once and either put in the object store or read back from the
input Parquet by each actor, by size against the smallest node's object store.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed_onnx.evaluation.data.rows import SeriesRows
from distributed_onnx.evaluation.data.series_source import (
    ParquetSeriesReader,
    SeriesSource,
    SeriesStore,
    SeriesTransport,
)
from distributed_onnx.evaluation.data.series_source import choose_transport as choose_series_transport
from distributed_onnx.evaluation.planning import RunPlan
from distributed_onnx.runtime import cluster

logger = logging.getLogger(__name__)


def series_source_for(plan: RunPlan) -> tuple[SeriesSource, dict[str, Any]]:
    """The run's series source and what summary.json says of it (transport, reason, bytes)."""
    if isinstance(plan.table.series, SeriesRows):  # streamed: the values stay in the file, read by the actors
        rows = plan.table.series
        reason = f"{rows.n_rows:,} sorted rows checked in streamed chunks; each actor reads its parts' row ranges"
        logger.info("Series transport: input_file (%s)", reason)
        return rows, {"series_transport": "input_file", "reason": reason, "series_bytes": rows.nbytes}
    store = SeriesStore.from_table(plan.table)
    smallest = cluster.smallest_object_store_bytes()
    transport, reason = choose_series_transport(
        plan.settings.series_transport, store.nbytes, smallest, plan.dataset.source
    )
    logger.info("Series transport: %s (%s)", transport.value, reason)
    info: dict[str, Any] = {"series_transport": transport.value, "reason": reason, "series_bytes": store.nbytes}
    if transport is SeriesTransport.OBJECT_STORE:
        return store, info
    reader = ParquetSeriesReader(
        plan.dataset.source,
        store.series_ids,
        tuple(int(n) for n in store.offsets[1:] - store.offsets[:-1]),
        plan.table.resolution_minutes,
        tuple(plan.table.covariate_names),
        names=plan.dataset.names,
    )
    return reader, info
