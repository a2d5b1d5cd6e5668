"""Issue 46: the README's serve example forecasts the bundled series at a date its actuals cover.

It forecast series ``"a"`` in 2024, which the bundled actuals do not hold, so the ``score`` command after it
scored nothing. Pure data: the request body is read from the README and checked against the bundled table.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from distributed_onnx.model.checkpoint import LocalCheckpoint
from distributed_onnx.resources import REFERENCE_CHECKPOINT, REFERENCE_DATASET

README = Path(__file__).resolve().parent.parent / "README.md"


def _serve_request() -> dict[str, object]:
    section = README.read_text(encoding="utf-8").split("## One serve", 1)[1].split("\n## ", 1)[0]
    body = re.search(r"/v1/forecast -d '(\{.*?\})'", section, re.S)
    assert body is not None, "no curl request in the README's serve section"
    request: dict[str, object] = json.loads(body.group(1))
    assert "distributed-onnx score" in section and str(REFERENCE_DATASET.relative_to(README.parent)) in section
    return request


def test_the_readmes_serve_request_is_the_bundled_series_where_it_has_actuals() -> None:
    request = _serve_request()
    step = timedelta(minutes=LocalCheckpoint(path=REFERENCE_CHECKPOINT).resolve().metadata.resolution_minutes)
    actuals = {(row["series_id"], row["timestamp"]): row["y"] for row in pq.read_table(REFERENCE_DATASET).to_pylist()}
    horizon = int(request["horizon"])  # type: ignore[call-overload]
    for series in request["series"]:  # type: ignore[attr-defined]
        start = datetime.fromisoformat(series["start"].replace("Z", "+00:00"))
        history = series["y"]
        for i, value in enumerate(history):  # the history is the bundled series' own values
            if value is not None:
                assert actuals.get((series["series_id"], start + i * step)) == value, (series, i)
        for lead in range(horizon):  # every forecast step has an actual: score scores the window
            when = start + (len(history) + lead) * step
            assert actuals.get((series["series_id"], when)) is not None, (series["series_id"], when)
