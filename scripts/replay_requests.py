"""Send a running ``distributed-onnx serve`` the requests a backtest's windows would have been: live traffic to score.

For each series of an input table (the backtest's own ``--data``), the windows that ``backtest --n-windows N
--stride S`` plans (the last window's horizon ends at the series' last timestamp, the others step back by S
steps) become one ``/v1/forecast`` request each: the ``context_length`` values before the origin as ``y`` and the
first of their timestamps as ``start``, so the service's forecast log places each answer on the window the
backtest scored, and ``distributed-onnx score --backtest`` compares like with like::

    python scripts/replay_requests.py --data distributed_onnx/resources/taylor.parquet --n-windows 20 --stride 48

The standard library and pyarrow only (no client package): this is a demo and a check, not a load generator
(``benchmarks/serve_bench.py`` is that). Run by a Python without pyarrow (the system's ``python``), it re-runs
itself with the repository's ``.venv/bin/python`` when there is one. It waits for the service to be ready
(``--wait-s``), so it can follow a ``serve ... &`` at once, and returns once the log has had time to write the answers
(``--settle-s``), so ``score`` can follow it at once; the port defaults to ``DISTRIBUTED_ONNX_PORT``, as
``serve``'s does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

VENV_PYTHON = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"

try:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
except ImportError:  # the system's python: the venv's has pyarrow
    if VENV_PYTHON.exists() and Path(sys.executable).resolve() != VENV_PYTHON.resolve():
        os.execv(VENV_PYTHON, [str(VENV_PYTHON), *sys.argv])
    sys.exit("error: this script needs pyarrow: run it with .venv/bin/python (make install creates .venv)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="long input table (.parquet): series_id, timestamp, y")
    port = os.environ.get("DISTRIBUTED_ONNX_PORT", "8000")
    parser.add_argument("--url", default=f"http://127.0.0.1:{port}/v1/forecast")
    parser.add_argument("--wait-s", type=float, default=180.0, help="how long to wait for the service to be ready")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=2.5,
        help="seconds to wait after the last answer: the service's forecast log writes every second, so a score "
        "run right after this script finds every answer logged",
    )
    parser.add_argument("--model", default=None, help="the served model to ask (default: the service's first)")
    parser.add_argument("--n-windows", type=int, default=20)
    parser.add_argument("--stride", type=int, default=48, help="steps between origins")
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--context-length", type=int, default=512)
    args = parser.parse_args()
    if not _wait_ready(args.url, args.wait_s):
        print(f"error: no service answered at {args.url} within {args.wait_s:g} s; is serve running?", file=sys.stderr)
        return 1
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
    time.sleep(args.settle_s)
    print(f"sent {sent} requests to {args.url}")
    return 0


def _wait_ready(url: str, wait_s: float) -> bool:
    """Poll the service's /v2/health/ready until it answers 200 (or ``wait_s`` passes)."""
    ready = url.split("/v1/", maxsplit=1)[0] + "/v2/health/ready"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(ready, timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    sys.exit(main())
