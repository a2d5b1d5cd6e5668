"""What a benchmark's JSON records of the machine, and a ``ray start`` head for the commands to join.

Figures from different CPUs are not comparable: ONNX Runtime's MLAS picks its kernels by the CPU's features
(AVX-512, VNNI for int8, AMX and AVX-512 BF16), so every results file names the CPU model and those flags, read
from ``/proc/cpuinfo``, with the core count and the load average.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The ``/proc/cpuinfo`` flags that change which kernels ONNX Runtime runs.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_facts() -> dict[str, Any]:
    """The CPU model, core count, the kernel-relevant flags present, the platform and Python."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value:
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "cpu_flags": [flag for flag in KERNEL_FLAGS if flag in flags],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


@contextmanager
def started_head() -> Iterator[dict[str, str]]:
    """A ``ray start --head`` on 127.0.0.1 with Ray's multi-node switch off (as docs/cluster.md tells a user to
    start one), for commands given ``--address auto``: yields the environment they run with (its token, and
    ``RAY_TMPDIR`` where its address file is). Stopped afterwards by its own processes, never ``ray stop``."""
    from ray_head import ray_head  # tests/ray_head.py: own temp dir, token, free ports, stopped by pid

    with ray_head(loopback_only=True) as head:  # the user's HOME: matplotlib's font cache is there
        yield head.client_env(RAY_TMPDIR=str(head.ray_tmpdir), HOME=os.environ.get("HOME", str(Path.home())))
