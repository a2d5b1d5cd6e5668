"""Send a running ``distributed-onnx serve`` the requests a backtest's windows would have been: live traffic to score.

For each series of an input table (the backtest's own ``--data``), the windows that ``backtest --n-windows N
--stride S`` plans (the last window's horizon ends at the series' last timestamp, the others step back by S
steps) become one ``/v1/forecast`` request each: the ``context_length`` values before the origin as ``y`` and the
first of their timestamps as ``start``, so the service's forecast log places each answer on the window the
backtest scored, and ``distributed-onnx score --backtest`` compares like with like::

    python scripts/replay_requests.py --data distributed_onnx/resources/taylor.parquet --n-windows 20 --stride 48

The standard library and pyarrow only (no client package): this is a demo and a check, not a load generator
(``benchmarks/serve_bench.py`` is that).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.request
from datetime import UTC, datetime

import pyarrow.compute as pc
import pyarrow.parquet as pq


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="long input table (.parquet): series_id, timestamp, y")
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1/forecast")
    parser.add_argument("--model", default=None, help="the served model to ask (default: the service's first)")
    parser.add_argument("--n-windows", type=int, default=20)
    parser.add_argument("--stride", type=int, default=48, help="steps between origins")
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--context-length", type=int, default=512)
    args = parser.parse_args()
    table = pq.read_table(args.data, columns=["series_id", "timestamp", "y"])
    sent = 0
    for series_id in pc.unique(table["series_id"]).to_pylist():
        rows = table.filter(pc.equal(table["series_id"], series_id)).sort_by("timestamp")
        stamps = rows["timestamp"].to_pylist()
        values = [None if y is None or math.isnan(y) else y for y in rows["y"].to_pylist()]
        last_origin = len(stamps) - args.horizon
        for k in reversed(range(args.n_windows)):
            origin = last_origin - k * args.stride
            if origin - args.context_length < 0:
                continue  # not enough history before this origin (the backtest would cap it too)
            first = origin - args.context_length
            body: dict[str, object] = {
                "series": [{"series_id": series_id, "y": values[first:origin], "start": _iso(stamps[first])}],
                "horizon": args.horizon,
            }
            if args.model:
                body["model"] = args.model
            request = urllib.request.Request(
                args.url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                if response.status != 200:
                    print(f"{series_id} origin {_iso(stamps[origin])}: HTTP {response.status}", file=sys.stderr)
                    return 1
            sent += 1
    print(f"sent {sent} requests to {args.url}")
    return 0


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    sys.exit(main())
