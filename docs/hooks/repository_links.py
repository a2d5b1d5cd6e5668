"""mkdocs hook: links from the pages to files of the repository outside ``docs/`` are checked, not warned about.

The pages link to the code and to ``benchmarks/results/`` with plain relative paths (``../benchmarks/results/
gpu.md``), so they read the same in a repository browser as in the site. mkdocs knows only the files under
``docs/``: each such link would be a "not found" warning, and ``strict: true`` would fail on every one of them,
hiding the broken ones among the sound. This hook adds each target that exists to the build as a plain file
(copied under ``repository/`` in the site, never rendered as a page), so mkdocs resolves the link; a target that
does not exist stays unknown to mkdocs and its own ``not_found`` check fails the strict build, naming the page.

``README.md`` is not a page of the site, so mkdocs never reads it: its relative links and their anchors are
checked here, and a broken one is a warning on mkdocs' logger (which ``strict`` counts).
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

log = logging.getLogger("mkdocs.hooks.repository_links")

#: ``[text](target)`` and ``![alt](target)``; the target ends at whitespace or ``)``.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~)")


class RepositoryFile(File):
    """A repository file a page links to: copied as it is, never rendered (even a ``.md`` one)."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def _links(markdown: str) -> list[str]:
    """The link targets of ``markdown`` outside fenced code blocks."""
    targets, fenced = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            targets += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return targets


def _is_relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith(("/", "#"))


def on_files(files: Files, config: Any) -> Files:
    """Add every repository file outside ``docs/`` that a page links to and that exists."""
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    added: set[str] = set()
    for page in list(files.documentation_pages()):
        for target in _links(Path(str(page.abs_src_path)).read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not path or not _is_relative(path):
                continue
            uri = posixpath.normpath(posixpath.join(posixpath.dirname(page.src_uri), path))
            if not uri.startswith("../") or uri in added:
                continue
            on_disk = (docs_dir / uri).resolve()
            if not on_disk.is_relative_to(root) or not on_disk.exists() or on_disk.is_dir():
                continue  # left to mkdocs: a "not found" warning, which the strict build fails on
            repository_path = on_disk.relative_to(root).as_posix()
            files.append(
                RepositoryFile(
                    uri,
                    str(docs_dir),
                    config["site_dir"],
                    config["use_directory_urls"],
                    dest_uri=f"repository/{repository_path}",
                    inclusion=InclusionLevel.NOT_IN_NAV,
                )
            )
            added.add(uri)
    return files


def _anchors(markdown: str) -> set[str]:
    """The heading anchors of ``markdown`` as GitHub and mkdocs' default slugs write them (lower case, spaces to
    hyphens, punctuation dropped)."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            text = re.sub(r"[`*_]", "", heading.group(1)).strip().lower()
            anchors.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text)))
    return anchors


def on_pre_build(config: Any) -> None:
    """Check README.md's relative links (files and anchors): it is not a page, so mkdocs does not."""
    root = Path(config["docs_dir"]).resolve().parent
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    for target in _links(text):
        if not _is_relative(target) and not target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        file = (root / path).resolve() if path else readme
        if not file.exists():
            log.warning("README.md links to '%s', which does not exist", target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text(encoding="utf-8")):
            log.warning("README.md links to '%s', but %s has no heading with that anchor", target, path or "it")
