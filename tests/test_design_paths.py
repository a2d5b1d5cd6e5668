"""Unit tier: every module or file path that docs/design.md names exists, so the design stays true to the tree.

The design names paths in backticks, mostly relative to the package (``evaluation/driver/merge.py``), sometimes
to the repository (``tests/test_loopback.py``), sometimes shortened in context (``report/page.py``, ``rows.py``).
A path counts as existing when some file or folder of the repository ends with it; a ``module.attribute``
(``runtime/local_ray.connect``) when the module exists and defines the attribute. Not checked: routes
(``/v1/forecast``) and a run directory's contents (``forecasts/model=NAME/part-NNNNNN.parquet``, ``forecasts/``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
SEARCHED = ("distributed_onnx", "tests", "benchmarks", "scripts", "jobs", "docs", ".ci")
#: A backticked path: words, dots and dashes, with a ``/`` in it or ending in ``.py``.
_PATH = re.compile(r"`([\w.-]*(?:/[\w.-]*)+|[\w.-]+\.py)`")
#: Folders of a run directory (docs/outputs.md), not of the repository.
RUN_FOLDERS = {"forecasts/", "scores/"}
_FILE_SUFFIXES = {".py", ".md", ".json", ".yaml", ".yml", ".toml", ".txt", ""}


def _repository_paths() -> set[str]:
    """Every file and folder of the repository, as POSIX paths from its root (folders end with ``/``)."""
    paths = {f"{top}/" for top in SEARCHED}
    for top in SEARCHED:
        for path in (ROOT / top).rglob("*"):
            if "__pycache__" in path.parts:
                continue
            name = path.relative_to(ROOT).as_posix()
            paths.add(f"{name}/" if path.is_dir() else name)
    return paths | {"pyproject.toml", "Makefile", "README.md", "mkdocs.yml"}


def named_paths(text: str) -> list[str]:
    """The paths ``text`` names in backticks, less routes and placeholders."""
    return [
        name
        for name in _PATH.findall(text)
        if not name.startswith("/") and "=" not in name and "NNN" not in name and name not in RUN_FOLDERS
    ]


def missing_paths(text: str, paths: set[str]) -> list[str]:
    """The names of :func:`named_paths` that no repository path ends with (see the module's docstring)."""

    def exists(name: str) -> bool:
        return any(path == name or path.endswith(f"/{name}") for path in paths)

    missing = []
    for name in named_paths(text):
        if exists(name):
            continue
        module, _, attribute = name.rpartition(".")
        if f".{attribute}" not in _FILE_SUFFIXES and exists(f"{module}.py"):
            source = next(ROOT / p for p in sorted(paths) if p == f"{module}.py" or p.endswith(f"/{module}.py"))
            if re.search(rf"^(?:def|class|async def) {attribute}\b|^{attribute}\b", source.read_text(), re.M):
                continue
        missing.append(name)
    return missing


def test_every_path_docs_design_names_exists() -> None:
    text = DESIGN.read_text()
    assert len(named_paths(text)) > 50  # the check reads the design's paths, not nothing
    assert missing_paths(text, _repository_paths()) == []


def test_a_path_that_does_not_exist_is_named() -> None:
    paths = {"distributed_onnx/evaluation/report/page.py", "distributed_onnx/runtime/local_ray.py", "tests/x.py"}
    text = "`report/page.py`, `report/live.py`, `tests/x.py`, `runtime/local_ray.nowhere`, `/v1/forecast`"
    assert missing_paths(text, paths) == ["report/live.py", "runtime/local_ray.nowhere"]
