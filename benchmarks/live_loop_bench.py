"""The replica's event loop while an answer is logged and shadowed: the work in a thread against on the loop.

In-process, no server (issue 29, defect 10): :class:`LiveTraffic` logs a large answered request and a shadow
plans its own forecast of it (the real ``plan_job`` on the tiny plain graph's metadata; the model call itself
is faked, it runs in the model's thread either way). A ticker coroutine on the same loop wakes every
millisecond; the longest gap between its wake-ups is how long any other request would have waited. Two modes,
alternating per round: ``thread`` (the code as it is: ``asyncio.to_thread``) and ``loop`` (``asyncio.to_thread``
replaced by a direct call, the code before the fix). Requests: a /v1-style request of ``--series`` series of
``--steps`` steps each.

Reproduce: ``.venv/bin/python benchmarks/live_loop_bench.py``; writes ``results/live_loop.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from graphs import write_tiny_context_quantiles

from distributed_onnx.live.log.writer import ForecastLog
from distributed_onnx.serve import core, live_log
from distributed_onnx.serve.log.traffic import LiveTraffic
from distributed_onnx.serve.operations.metrics import LiveMetrics
from distributed_onnx.serve.wire.forecasting import plan_job
from distributed_onnx.serve.wire.schemas import ForecastRequest

RESULTS = Path(__file__).resolve().parent / "results"


class Shadow:
    """A shadow that plans as :meth:`ModelCore.shadow_forecast` does (in a thread, or inline) and fakes the call."""

    def __init__(self, metadata: Any) -> None:
        self.name, self.checkpoint_sha256, self.metadata = "shadow", "0" * 64, metadata
        self.resolution_minutes = metadata.resolution_minutes

    async def shadow_forecast(self, request: ForecastRequest) -> tuple[np.ndarray, tuple[float, ...]]:
        job = await asyncio.to_thread(plan_job, request, self.metadata, time.perf_counter())
        return np.ones((len(request.series), job.horizon, len(job.quantiles)), np.float32), job.quantiles


async def _inline(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


async def _one_round(traffic: LiveTraffic, request: ForecastRequest, primary: Any) -> float:
    """The longest gap (ms) between wake-ups of a 1 ms ticker while one answer is logged and shadowed."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append((now - last) * 1000.0)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    forecasts = np.ones((len(request.series), 8, 3), np.float32)
    traffic.answered(primary, request, forecasts, (0.1, 0.5, 0.9), "bench", 0)
    await traffic.drain()
    done.set()
    await task
    return max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        metadata = write_tiny_context_quantiles(Path(folder) / "models").metadata
        request = ForecastRequest.model_validate(
            {
                "series": [
                    {"series_id": f"s{i}", "y": [float(i % 7)] * args.steps, "start": "2026-12-01T00:00:00Z"}
                    for i in range(args.series)
                ],
                "horizon": 8,
            }
        )
        log = ForecastLog(Path(folder) / "log", flush_interval_s=60.0)
        shadow = Shadow(metadata)
        traffic = LiveTraffic(log, LiveMetrics(log, replica="bench"), [shadow])
        primary = Shadow(metadata)
        primary.name = "primary"
        rounds: dict[str, list[float]] = {"thread": [], "loop": []}
        original = asyncio.to_thread
        for number in range(args.rounds + 1):
            for mode in ("thread", "loop") if number % 2 else ("loop", "thread"):
                asyncio.to_thread = original if mode == "thread" else _inline  # type: ignore[assignment]
                stall = asyncio.run(_one_round(traffic, request, primary))
                log.flush()  # written between rounds, so the queue never fills
                if number:  # the first round warms both up
                    rounds[mode].append(stall)
        asyncio.to_thread = original
        log.close()
    medians = {mode: statistics.median(values) for mode, values in rounds.items()}
    load = os.getloadavg()[0]
    record = {
        "series": args.series,
        "steps": args.steps,
        "rounds": rounds,
        "median_max_stall_ms": medians,
        "ratio_loop_over_thread": medians["loop"] / medians["thread"],
        "load_1min_at_end": load,
        "python": platform.python_version(),
        "modules": [core.__name__, live_log.__name__],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "live_loop.json").write_text(json.dumps(record, indent=2))
    rows = "\n".join(
        f"| {mode} | {medians[mode]:.1f} | {', '.join(f'{value:.1f}' for value in values)} |"
        for mode, values in rounds.items()
    )
    (RESULTS / "live_loop.md").write_text(
        f"""# The event loop while an answer is logged and shadowed: in a thread against on the loop (issue 29)

Reproduce: `.venv/bin/python benchmarks/live_loop_bench.py` (in-process, no server); writes this file and
`live_loop.json`.

Conditions: 2 cores shared with other sessions (1-minute load average {load:.2f} at the end: above 2 means
other processes shared the machine), Python {platform.python_version()}; one /v1-style answer of {args.series}
series of {args.steps} steps, logged and planned by one shadow (the tiny plain graph's metadata; the model
call faked). The longest gap between wake-ups of a 1 ms ticker on the same loop: how long another request
would have waited. {args.rounds} rounds, the two modes alternating (order swapped every round), a warm-up
round left out.

| mode | median of the longest stall, ms | longest stall by round, ms |
|---|---:|---|
{rows}

`loop` / `thread`: {record["ratio_loop_over_thread"]:.1f}x (medians). In `thread` mode the work still takes
the GIL: the loop gets it back at the interpreter's switch interval (5 ms) or when a single C call that holds
it (a pydantic or numpy call over the whole request) returns, rather than after the whole work; that is what
remains of the stall. Noisy machine: compare the two columns of one run, not runs of different days.
"""
    )
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
