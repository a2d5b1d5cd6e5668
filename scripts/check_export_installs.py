"""Check every exporter install docs/export.md documents: each in a fresh venv, imported, exporting a tiny model.

The page's section "Installing an exporter" holds one ```bash block per install: a comment naming the families it
serves (``# chronos2, chronos_bolt``; a colon ends the names), then ``pip install`` lines. For each block this
script makes a fresh virtual environment, runs the block's lines in it from the repository root (as a user with a
checkout does), imports every module the families' exporters import (read from their source: the exporter module,
its random-weights writer, the shared export code and the family's adapter) and runs ``distributed-onnx export
FAMILY --random-weights --size tiny``, which builds the model from the upstream package's classes and checks its
parity with upstream's own pipeline through ONNX Runtime. The check follows the page, not a copy of it: change a
block and the check runs the change.

Time: what every block installs is installed once. All blocks begin with the same torch line and install the
package with extras of which some are common to all (``cpu,export``); those two are installed into a base
environment, which each block's venv sees through a ``.pth`` file (after its own site-packages, so a version the
block installs wins). A block's venv therefore holds exactly what its own lines install, the base being a part of
it; its lines still run in full (the torch line finds torch satisfied).

    python scripts/check_export_installs.py                     # every block
    python scripts/check_export_installs.py --family toto       # the blocks naming toto
    python scripts/check_export_installs.py --workdir /tmp/x    # keep the venvs and exports there

Stdlib only: it runs under any Python 3.11 (the venvs are made with the interpreter that runs it). Exit codes: 0
every block installs, imports and exports; 1 some block did not (each failure named with its last output lines);
2 the page has no such section, or a block this script cannot read.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "export.md"
SECTION = "## Installing an exporter"
#: What an export of the tiny random-weight models needs besides the family (no data: the resolution is given).
EXPORT_FLAGS = ("--random-weights", "--size", "tiny", "--resolution-minutes", "60", "--parity-windows", "2")
#: The package's editable install in a block: ``pip install -e '.[cpu,export,chronos]'``.
_EDITABLE = re.compile(r"^-e$|^--editable$")
_EXTRAS = re.compile(r"^\.\[([a-z0-9_,-]+)\]$")


@dataclasses.dataclass(frozen=True)
class InstallBlock:
    """One documented install: the families it serves and its ``pip install`` argument lists, in order."""

    families: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]

    @property
    def extras(self) -> frozenset[str]:
        """The package's extras the block installs (``-e '.[cpu,export,chronos]'``: cpu, export, chronos)."""
        found: set[str] = set()
        for command in self.commands:
            for previous, argument in zip(("", *command), command, strict=False):
                match = _EXTRAS.match(argument)
                if match and _EDITABLE.match(previous):
                    found.update(match.group(1).split(","))
        return frozenset(found)


def read_blocks(page: str) -> list[InstallBlock]:
    """The install blocks of ``page``'s section :data:`SECTION`; ValueError when it has none or one is unreadable."""
    start = page.find(f"\n{SECTION}\n")
    if start < 0:
        raise ValueError(f"no section {SECTION!r}")
    end = page.find("\n## ", start + 1)
    section = page[start : end if end >= 0 else len(page)]
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
        if not lines or not lines[0].startswith("#"):
            raise ValueError(f"a block does not begin with a comment naming its families: {body!r}")
        names = lines[0].lstrip("#").split(":")[0]
        families = tuple(name.strip() for name in names.split(",") if name.strip())
        commands = []
        for line in lines[1:]:
            words = shlex.split(line, comments=True)
            if words[:2] != ["pip", "install"]:
                raise ValueError(f"a block line is not a pip install: {line!r}")
            commands.append(tuple(words[2:]))
        if not families or not commands:
            raise ValueError(f"a block names no family or installs nothing: {body!r}")
        blocks.append(InstallBlock(families, tuple(commands)))
    if not blocks:
        raise ValueError(f"section {SECTION!r} holds no ```bash block")
    return blocks


def shared_part(blocks: list[InstallBlock]) -> tuple[tuple[str, ...], ...]:
    """What every block installs, to install once: the first line when all blocks begin with it (torch), then the
    package with the extras every block asks for. Empty when the blocks share nothing."""
    first = {block.commands[0] for block in blocks}
    shared: list[tuple[str, ...]] = [first.pop()] if len(first) == 1 else []
    common = frozenset.intersection(*(block.extras for block in blocks))
    if common:
        shared.append(("-e", f".[{','.join(sorted(common))}]"))
    return tuple(shared)


# ------------------------------------------------------------------------------------ inside a block's venv


#: The export code every family's exporter shares (``distributed_onnx/export/``): read for its imports as the
#: exporter module is, those inside functions included.
SHARED_EXPORT_CODE = (
    "context_model",
    "digests",
    "graph",
    "metadata",
    "parity",
    "parity_check",
    "pretrained",
    "progress",
    "scratch",
    "torch_extra",
    "torch_patches",
)


def imported_modules(family: str) -> list[str]:
    """The modules ``family``'s exporter imports, read from its source: the exporter module and the shared export
    code (every import, inside functions too), its random-weights writer function and its adapter's module.

    Runs inside the block's venv (the package is installed there): reads the family's record from the package."""
    from distributed_onnx.model import families

    record = families.family(family)
    sources: list[tuple[str, str | None]] = [(f"distributed_onnx.export.{name}", None) for name in SHARED_EXPORT_CODE]
    if record.exporter is not None:
        sources.append((record.exporter, None))
    for path in (record.random_weights, record.adapter):
        if path is not None:
            module, _, attribute = path.partition(":")
            sources.append((module, attribute.split(".")[0] if path == record.random_weights else None))
    names: list[str] = []
    for module, function in sources:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ImportError(f"{module} not found")
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        scope = tree
        if function is not None:
            scope = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function)
        names.append(module)
        for node in ast.walk(scope):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.append(node.module)
    return list(dict.fromkeys(names))


def import_all(family: str) -> int:
    """Import every module of :func:`imported_modules`, one line per failure; 0 when all import."""
    failures = 0
    modules = imported_modules(family)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an import failing in any way is what this reports
            failures += 1
            print(f"  cannot import {name}: {type(exc).__name__}: {exc}")
    print(f"  {family}: {len(modules) - failures} of {len(modules)} modules its exporter imports import")
    return 1 if failures else 0


# ------------------------------------------------------------------------------------------- the driver


@dataclasses.dataclass
class Outcome:
    """One block's result: the seconds of each step, and the first failure (its step and last output lines)."""

    families: tuple[str, ...]
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    failure: str | None = None


def _run(argv: list[str], step: str, outcome: Outcome, environment: dict[str, str]) -> bool:
    """Run ``argv`` from the repository root, timing it as ``step``; on failure record its last output lines."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=environment, capture_output=True, text=True, check=False)
    outcome.seconds[step] = outcome.seconds.get(step, 0.0) + time.perf_counter() - started
    if done.returncode == 0:
        return True
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    outcome.failure = f"{step} exited {done.returncode}: {shlex.join(argv)}\n{tail}"
    return False


def _environment(workdir: Path) -> dict[str, str]:
    """This process's environment (the machine's pip configuration included) without what would import another
    copy of the package (``PYTHONPATH``) or share its optimized-graph cache."""
    environment = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    environment["DISTRIBUTED_ONNX_CACHE"] = str(workdir / "cache")
    environment["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return environment


def _make_venv(path: Path, base: Path | None, environment: dict[str, str], outcome: Outcome) -> bool:
    if not _run([sys.executable, "-m", "venv", "--clear", str(path)], "venv", outcome, environment):
        return False
    if base is not None:  # the shared part, after the venv's own site-packages (see the module docstring)
        (_site_packages(path) / "_shared_base.pth").write_text(f"{_site_packages(base)}\n", encoding="utf-8")
    return True


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages")) or sorted(venv.glob("Lib/site-packages"))
    return found[0]


def _python(venv: Path, name: str = "python") -> str:
    return str(venv / ("Scripts" if os.name == "nt" else "bin") / name)


def install(venv: Path, commands: tuple[tuple[str, ...], ...], outcome: Outcome, environment: dict[str, str]) -> bool:
    for arguments in commands:
        if not _run([_python(venv), "-m", "pip", "install", "--quiet", *arguments], "install", outcome, environment):
            return False
    return True


def check_block(
    block: InstallBlock, workdir: Path, base: Path | None, environment: dict[str, str], families: set[str]
) -> Outcome:
    """Install ``block`` into a fresh venv, then import and export each of its families (those in ``families``)."""
    outcome = Outcome(block.families)
    venv = workdir / ("venv-" + "-".join(block.families))
    if not _make_venv(venv, base, environment, outcome) or not install(venv, block.commands, outcome, environment):
        return outcome
    for family in block.families:
        if family not in families:
            continue
        imports = [_python(venv), str(Path(__file__).resolve()), "--imports-of", family]
        if not _run(imports, f"imports {family}", outcome, environment):
            return outcome
        output = workdir / "exports" / family / f"{family}.onnx"
        shutil.rmtree(output.parent, ignore_errors=True)
        export = [_python(venv, "distributed-onnx"), "export", family, "--output", str(output), *EXPORT_FLAGS]
        if not _run(export, f"export {family}", outcome, environment):
            return outcome
        if not output.with_suffix(".metadata.json").is_file():
            outcome.failure = f"export {family} exited 0 but wrote no {output.with_suffix('.metadata.json')}"
            return outcome
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page to read (default {PAGE.relative_to(REPO)})")
    parser.add_argument("--family", action="append", help="check only the blocks naming this family (repeatable)")
    parser.add_argument("--workdir", type=Path, help="where the venvs and exports go, kept (default: a temporary one)")
    parser.add_argument("--imports-of", help=argparse.SUPPRESS)  # inside a block's venv: import_all(FAMILY)
    args = parser.parse_args(argv)
    if args.imports_of:
        return import_all(args.imports_of)
    try:
        blocks = read_blocks(args.page.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {args.page}: {exc}", file=sys.stderr)
        return 2
    wanted = set(args.family or [family for block in blocks for family in block.families])
    chosen = [block for block in blocks if wanted & set(block.families)]
    if not chosen:
        print(f"error: no block of {args.page} names {sorted(wanted)}", file=sys.stderr)
        return 2
    with _workdir(args.workdir) as workdir:
        return _check(blocks, chosen, wanted, workdir)


@contextlib.contextmanager
def _workdir(given: Path | None) -> Iterator[Path]:
    """``--workdir`` as given (kept), or a temporary folder removed afterwards."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="export-installs-") as folder:
        yield Path(folder)


def _check(blocks: list[InstallBlock], chosen: list[InstallBlock], wanted: set[str], workdir: Path) -> int:
    environment = _environment(workdir)
    started = time.perf_counter()
    shared = shared_part(blocks)
    base: Path | None = None
    if shared and len(chosen) > 1:
        base_outcome = Outcome(("shared part",))
        base = workdir / "venv-shared"
        print(f"shared part: {'; '.join('pip install ' + shlex.join(each) for each in shared)}", flush=True)
        if not _make_venv(base, None, environment, base_outcome) or not install(
            base, shared, base_outcome, environment
        ):
            print(f"FAILED shared part: {base_outcome.failure}")
            return 1
        print(f"  installed in {sum(base_outcome.seconds.values()):.0f} s", flush=True)
    outcomes = []
    for block in chosen:
        print(f"{', '.join(block.families)}: {len(block.commands)} pip install line(s)", flush=True)
        outcome = check_block(block, workdir, base, environment, wanted)
        steps = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in outcome.seconds.items())
        print(f"  {'FAILED' if outcome.failure else 'ok'}: {steps}", flush=True)
        if outcome.failure:
            print("  " + outcome.failure.replace("\n", "\n    "), flush=True)
        outcomes.append(outcome)
    failed = [outcome for outcome in outcomes if outcome.failure]
    total = time.perf_counter() - started
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} documented installs export; {total:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
