"""The CPU's model and the instruction sets that decide an int8 or bf16 graph's speed, recorded beside a figure.

An int8 variant's speed over its fp32 parent depends on the CPU more than on the graph: int8 dot products
(AVX512-VNNI, AVX-VNNI) or AMX's tiles speed its MatMuls far more than plain AVX2 does (the project's figures from
CPUs with and without them are kept apart: ``benchmarks/results/published_defaults.md``). A speed figure without the
CPU it came from cannot be compared with another, so ``tune`` writes :func:`detect_cpu` beside its timings (its
file's ``machine.cpu``).

:func:`cpu_features` is pure (the text of ``/proc/cpuinfo`` in, the record out); :func:`detect_cpu` is the one read.
Where there is no ``/proc/cpuinfo`` (macOS, Windows) the flags are None: unknown, not absent.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

__all__ = ["FLAGS", "cpu_features", "detect_cpu"]

#: The flags recorded, as Linux names them: the vector widths, int8 dot products, bf16 arithmetic and AMX.
FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
_CPUINFO = Path("/proc/cpuinfo")


def cpu_features(cpuinfo: str | None, fallback_model: str = "") -> dict[str, Any]:
    """``{"model", "flags", "int8_dot_product"}`` from the text of ``/proc/cpuinfo`` (its first processor; None:
    not readable). ``flags`` maps each of :data:`FLAGS` to whether the CPU has it (None when unknown);
    ``int8_dot_product`` names the fastest int8 instructions it has (``amx_int8``, ``avx512_vnni``, ``avx_vnni``),
    ``"none"``, or None when unknown.

    >>> cpu_features("model name : Some CPU\\nflags : fpu avx2 avx512f avx512_vnni\\n")["int8_dot_product"]
    'avx512_vnni'
    >>> cpu_features(None, "arm")
    {'model': 'arm', 'flags': None, 'int8_dot_product': None}
    """
    if cpuinfo is None:
        return {"model": fallback_model or None, "flags": None, "int8_dot_product": None}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is the machine's (every core of a host alike)
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    present = set(fields.get("flags", fields.get("Features", "")).split())
    flags = {flag: flag in present for flag in FLAGS}
    dot = next((flag for flag in ("amx_int8", "avx512_vnni", "avx_vnni") if flags[flag]), "none")
    model = fields.get("model name") or fields.get("Hardware") or fallback_model or None
    return {"model": model, "flags": flags, "int8_dot_product": dot}


def detect_cpu() -> dict[str, Any]:
    """This machine's :func:`cpu_features`: the one read of ``/proc/cpuinfo``."""
    try:
        text: str | None = _CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = None
    return cpu_features(text, platform.processor())
