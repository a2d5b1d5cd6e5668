"""Screenshots of ``report.html`` at 2, 4 and 8 models (``docs/report-N-models.png``), as a user opens it.

Each run is a real ``distributed-onnx backtest`` on the bundled half-hourly data of the bundled reference
checkpoint and small real ONNX graphs (``tests/graphs.py``: the mean of the last N steps, a copy of the last
day; from 4 models on one deliberately far off, the mean scaled by 100), a few windows, on a local Ray. The page
is then drawn by headless Chromium in a 1280 px wide window as tall as the page (capped, see ``MAX_HEIGHT``),
with the details of the second checkpoint unfolded.

    python scripts/report_screenshots.py               # all three, into docs/
    python scripts/report_screenshots.py --models 4 --output /tmp/shots

Needs Chromium (``chromium`` on PATH) and the ``cpu`` extra; takes about a minute per run on 2 cores.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from browser import CHROMIUM, FLAGS  # noqa: E402 - tests/ is put on the path just above
from graphs import write_report_models  # noqa: E402

from distributed_onnx import cli  # noqa: E402

#: The backtest of each screenshot: 8 windows of 48 half-hours, every day (small, fast, and the fans overlap).
BACKTEST = ["--horizon", "48", "--n-windows", "8", "--stride", "48", "--quantiles", "0.1,0.5,0.9"]
BACKTEST += ["--actors", "2", "--rows-per-batch", "4", "--no-progress"]
WIDTH = 1280
#: The tallest screenshot drawn, in px (the page below it is cut off).
MAX_HEIGHT = 16_000


#: Added to the page shown: the first folded checkpoint's details open, so the screenshot shows one.
OPEN_FIRST = "<script>var d = document.querySelector('details.checkpoint'); if (d) d.open = true;</script>"


def page_height(page: Path) -> int:
    """The page's height at ``WIDTH`` px, as Chromium lays it out."""
    assert CHROMIUM is not None
    measured = page.with_name("height.html")
    script = "document.body.setAttribute('data-height', document.documentElement.scrollHeight)"
    measured.write_text(page.read_text() + f"<script>window.addEventListener('load',function(){{{script}}});</script>")
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},2000", "--dump-dom",
             measured.as_uri()],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
    found = re.search(r'data-height="(\d+)"', dom)
    assert found, dom[-300:]
    return int(found.group(1))


def screenshot(page: Path, png: Path) -> None:
    assert CHROMIUM is not None
    shown = page.with_name("shown.html")
    shown.write_text(page.read_text() + OPEN_FIRST)
    height = min(page_height(shown), MAX_HEIGHT)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}",
             "--hide-scrollbars", f"--screenshot={png}", shown.as_uri()],
            capture_output=True, text=True, timeout=180, check=True,
        )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, action="append", choices=range(2, 9), help="default: 2, 4 and 8")
    parser.add_argument("--output", type=Path, default=ROOT / "docs", help="where report-N-models.png go")
    parser.add_argument("--keep", type=Path, help="keep each run's output folder here (default: a temporary one)")
    args = parser.parse_args()
    if CHROMIUM is None:
        print("error: no Chromium on PATH: install it (apt-get install chromium) and rerun", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        for count in args.models or [2, 4, 8]:
            folder = work / f"{count}-models"
            shutil.rmtree(folder, ignore_errors=True)  # a fresh run, not a resumed one
            folder.mkdir(parents=True)
            checkpoints = write_report_models(folder, count)
            argv = ["backtest", "--output", str(folder / "run"), *BACKTEST]
            for checkpoint in checkpoints:
                argv += ["--checkpoint", str(checkpoint)]
            code = cli.main(argv)
            if code != 0:
                return code
            png = args.output / f"report-{count}-models.png"
            screenshot(folder / "run" / "report.html", png)
            print(f"{png} ({count} models: {', '.join(path.stem for path in checkpoints)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
