"""The documentation site builds strictly: the repository's pages build, and a broken link or anchor fails it.

``make docs`` (run by ``.ci/run``) is ``mkdocs build`` with ``strict: true`` and link validation at ``warn`` in
mkdocs.yml; ``docs/hooks/repository_links.py`` resolves links to repository files outside ``docs/`` and checks
the README's. The failing cases build a small site of their own with the repository's own mkdocs.yml settings.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mkdocs", "build", "--config-file", str(config), "--site-dir", str(site)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _project(tmp_path: Path, pages: dict[str, str], readme: str = "# A project\n") -> Path:
    """A copy of the repository's mkdocs settings over ``pages`` (name -> Markdown) and a README beside them."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["hooks"] = [str(ROOT / "docs" / "hooks" / "repository_links.py")]
    config["nav"] = list(pages)
    (tmp_path / "docs").mkdir()
    for name, text in pages.items():
        (tmp_path / "docs" / name).write_text(text)
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "code.py").write_text("")
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_repository_docs_build_strictly(tmp_path: Path) -> None:
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "repository" / "benchmarks" / "results" / "gpu.md").exists()


def test_a_sound_small_site_builds(tmp_path: Path) -> None:
    pages = {
        "index.md": "# Home\n\nSee [the code](../code.py) and [other](other.md#part).\n",
        "other.md": "# Other\n\n## Part\n",
    }
    built = _build(_project(tmp_path, pages, "# A project\n\n[docs](docs/other.md#part)\n"), tmp_path / "site")
    assert built.returncode == 0, built.stderr


@pytest.mark.parametrize(
    ("index", "readme", "named"),
    [
        ("[gone](missing.md)", "", "'missing.md', but the target is not found"),
        ("[gone](other.md#nowhere)", "", "does not contain an anchor '#nowhere'"),
        ("[gone](../missing.py)", "", "'../missing.py', but the target is not found"),
        ("", "[gone](docs/missing.md)", "README.md links to 'docs/missing.md', which does not exist"),
        ("", "[gone](docs/other.md#nowhere)", "docs/other.md has no heading with that anchor"),
    ],
)
def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path, index: str, readme: str, named: str) -> None:
    pages = {"index.md": f"# Home\n\n{index}\n", "other.md": "# Other\n\n## Part\n"}
    built = _build(_project(tmp_path, pages, f"# A project\n\n{readme}\n"), tmp_path / "site")
    assert built.returncode != 0
    assert named in built.stderr
    assert "Aborted with 1 warnings in strict mode" in built.stdout + built.stderr


def test_the_home_page_links_every_page_and_has_a_quickstart() -> None:
    """Issue 46: docs/index.md linked neither first-hour, export nor the family pages (only the menu did), and
    had no quickstart: the two commands, a backtest of one's own data (with Nixtla's column flags), one serve."""
    import re

    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", home))
    pages = {page.name for page in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert sorted(pages - linked) == []
    quickstart = home.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for command in ("make backtest", "make test", "--id-col unique_id --time-col ds", "distributed-onnx serve"):
        assert command in quickstart, command
