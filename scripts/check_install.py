"""Prove what an install pulls in: resolve it with ``pip install --dry-run --report`` and refuse CUDA packages.

``python scripts/check_install.py`` resolves the main job's install (``.[cpu]``, what ``make backtest`` installs)
against PyPI alone, ignoring this machine's pip configuration (its local wheels and mirrors), as a fresh
clone on an ordinary Linux machine would, and fails if the resolution holds any CUDA package (``nvidia-*``,
``cuda-*``, ``triton``, a ``+cu`` build, ``onnxruntime-gpu``) or torch at all. It prints every package it
would install, so the output is the evidence.

    python scripts/check_install.py                       # the main job: .[cpu]
    python scripts/check_install.py '.[cpu,dev]' --index-url https://pypi.org/simple
    python scripts/check_install.py 'torch==2.13.0' --expect-cuda   # shows why the Makefile pins +cpu

Exit codes: 0 no CUDA package (or, with ``--expect-cuda``, some), 1 the opposite, 2 pip could not resolve.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org/simple"

# Distributions that only exist to bring CUDA (or that a CPU-only install must not carry at all).
_CUDA_NAME = re.compile(r"^(nvidia-.*|cuda-.*|cupy.*|triton|onnxruntime-gpu|tensorrt.*|jax-cuda.*|.*-cu\d+)$")
_CUDA_VERSION = re.compile(r"\+cu\d+")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cuda_packages(installs: Iterable[Mapping[str, Any]], *, allow_torch: bool = False) -> list[str]:
    """The ``name==version`` of every CUDA package in a pip report's ``install`` list (torch too, unless allowed).

    A CPU torch (``2.13.0+cpu``) carries no CUDA, but the main job needs no torch at all, so by default any
    torch counts: its presence would mean a dependency leaked out of the ``export`` extra.
    """
    found = []
    for item in installs:
        metadata = item["metadata"]
        name, version = _canonical(metadata["name"]), str(metadata["version"])
        is_cuda = bool(_CUDA_NAME.match(name)) or bool(_CUDA_VERSION.search(version))
        if is_cuda or (name == "torch" and not allow_torch):
            found.append(f"{name}=={version}")
    return sorted(found)


def resolve(requirements: list[str], index_url: str | None) -> list[dict[str, Any]]:
    """pip's dry-run resolution of ``requirements`` in a fresh environment: the report's ``install`` list.

    With ``index_url`` the machine's pip configuration is ignored (``PIP_CONFIG_FILE=os.devnull``, no ``PIP_*``
    variables), so local wheels and mirrors cannot hide what the index would serve.
    """
    environment = dict(os.environ)
    if index_url is not None:
        environment = {key: value for key, value in environment.items() if not key.startswith("PIP_")}
        environment["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        command += ["--report", str(report), *(["--index-url", index_url] if index_url else []), *requirements]
        completed = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, check=False)
        if completed.returncode != 0 or not report.is_file():
            raise RuntimeError(f"pip could not resolve {requirements}: {completed.stderr.strip()[-2000:]}")
        document: dict[str, Any] = json.loads(report.read_text())
    return list(document["install"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("requirements", nargs="*", default=[".[cpu]"], help="what to resolve (default: .[cpu])")
    parser.add_argument("--index-url", default=PYPI, help=f"the only index to use (default {PYPI})")
    parser.add_argument("--local", action="store_true", help="use this machine's pip configuration instead")
    parser.add_argument("--allow-torch", action="store_true", help="a CPU torch is fine (the export extra)")
    parser.add_argument("--expect-cuda", action="store_true", help="succeed only if CUDA packages are found")
    args = parser.parse_args(argv)
    index_url = None if args.local else args.index_url
    try:
        installs = resolve(args.requirements, index_url)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = "this machine's pip configuration" if index_url is None else index_url
    print(f"{' '.join(args.requirements)} resolved against {where}: {len(installs)} packages")
    for item in sorted(installs, key=lambda entry: _canonical(entry["metadata"]["name"])):
        print(f"  {_canonical(item['metadata']['name'])}=={item['metadata']['version']}")
    cuda = cuda_packages(installs, allow_torch=args.allow_torch)
    print(f"CUDA packages: {', '.join(cuda) if cuda else 'none'}")
    return 0 if bool(cuda) == args.expect_cuda else 1


if __name__ == "__main__":
    sys.exit(main())
