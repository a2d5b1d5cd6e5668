"""Headless Chromium for the tests that look at a report as the user sees it.

A page is loaded with a script appended that writes what it measured into ``data-*`` attributes of ``<body>``,
which ``--dump-dom`` prints. Where Chromium is not installed the tests skip with a reason, except where
``DISTRIBUTED_ONNX_REQUIRE_CHROMIUM=1`` (set by ``.ci/run``, which installs Chromium): there a missing browser
fails them, so CI cannot pass by skipping what the user opens.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
REQUIRED = os.environ.get("DISTRIBUTED_ONNX_REQUIRE_CHROMIUM") == "1"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def needs_chromium() -> None:
    """Skip (or, where CI requires the browser, fail) a test when Chromium is not installed."""
    if CHROMIUM is not None:
        return
    if REQUIRED:
        pytest.fail("DISTRIBUTED_ONNX_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
    pytest.skip("no Chromium here (apt-get install chromium; CI installs it and requires it)")


def measured_dom(page: Path, script: str, width: int, height: int = 2000) -> dict[str, str]:
    """The ``data-*`` attributes ``script`` (run at load) set on ``<body>`` of ``page`` in a ``width`` px window."""
    assert CHROMIUM is not None
    measured = page.with_name(f"measured-{width}.html")
    measured.write_text(page.read_text() + f"<script>window.addEventListener('load',function(){{{script}}});</script>")
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "--dump-dom",
             measured.as_uri()],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[-500:]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
