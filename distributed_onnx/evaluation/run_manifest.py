"""The run's record, ``run.json``: written when a run directory is made, compared when one is resumed.

``run.json`` records the settings' fingerprint and the settings it digests (``fingerprinted``): a directory is
never resumed by a run with other settings, and refusing one names each setting that differs, with both values.
Making the directory asks the output folder's checks first (:mod:`.output_checks`); the file's name and the
folders made are the layout's (:mod:`.outputs`).
"""

from __future__ import annotations

import json
from typing import Any

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, StorageError
from distributed_onnx.evaluation.output_checks import check_output_folder, check_run_entries, check_run_folder
from distributed_onnx.evaluation.outputs import FORECASTS_DIR, MANIFEST, SCORES_DIR
from distributed_onnx.location import Location

#: The key of ``run.json`` that holds what the fingerprint digests (the plan's ``fingerprinted``).
FINGERPRINTED_KEY = "fingerprinted"


def prepare_output(output: Location, fingerprint: str, manifest: dict[str, Any]) -> None:
    """Create the directory, or check that the existing one belongs to the same run.

    ``manifest[FINGERPRINTED_KEY]``, when given, is what ``fingerprint`` digests: another run's folder is refused
    naming each of those settings that differs, with both values (a folder written before they were recorded:
    each differing setting of the recorded ``settings``)."""
    _make_run_directory(output)
    path = storage.join(output, MANIFEST)
    check_run_folder(output)
    if storage.is_file(path):
        previous = _manifest_fingerprint(path)
        if previous != fingerprint:
            differences = _setting_differences(_read_manifest(path), manifest)
            raise ConfigError(
                f"{output} holds a backtest with other settings ({differences}; fingerprint {previous}, this run "
                f"{fingerprint}); use another --output directory, rerun with the recorded settings, or delete that "
                "one.",
                key="output",
            )
        return
    document = storage.redacted({"fingerprint": fingerprint, **manifest})  # a URL's secrets stay in the URL
    storage.write_bytes(path, json.dumps(document, indent=2, default=str).encode())


def _make_run_directory(output: Location) -> None:
    """Create ``output/forecasts``; a path that names a file, or that cannot be created, is a setting to fix. Asked
    under the run's lock (:mod:`.run_lock`), these refuse what changed in the folder since the up-front checks
    (:mod:`.up_front`): an entry now in the way of what the run writes is refused (exit 2), not an I/O error."""
    check_output_folder(output)
    check_run_entries(output)
    try:
        storage.make_dirs(storage.join(output, FORECASTS_DIR))
        storage.make_dirs(storage.join(output, SCORES_DIR))
    except (FileExistsError, NotADirectoryError, PermissionError) as exc:
        raise ConfigError(f"Cannot create the run directory {output}: {exc}", key="output") from exc
    except OSError as exc:
        raise StorageError(f"Cannot create the run directory {output}: {exc}", path=str(output)) from exc


def _read_manifest(path: Location) -> dict[str, Any]:
    document = json.loads(storage.read_retrying(lambda: storage.read_bytes(path), str(path)).decode("utf-8"))
    return document if isinstance(document, dict) else {}


def _setting_differences(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """Each setting the two manifests' fingerprinted settings (else their ``settings``) differ in, both values."""
    from distributed_onnx.model.identity import Difference, describe_differences

    key = FINGERPRINTED_KEY if isinstance(recorded.get(FINGERPRINTED_KEY), dict) else "settings"
    before, now = _flat(recorded.get(key)), _flat(current.get(key))
    if key == "settings":  # the folder itself is the same; only what it was computed with is compared
        before.pop("output", None)
        now.pop("output", None)
    differences = [
        Difference(name, before.get(name, "(not set)"), now.get(name, "(not set)"))
        for name in sorted(before.keys() | now.keys())
        if before.get(name) != now.get(name)
    ]
    if not differences:
        return "which settings differ is not recorded there"
    return describe_differences(differences, "recorded", "this run", limit=8)


def _flat(document: Any) -> dict[str, Any]:
    """``{"spec": {"stride": 2}}`` as ``{"stride": 2}``: a nested setting by its own name, unless the top level
    already holds that name (the spec's ``horizon`` is the run's ``horizon``)."""
    if not isinstance(document, dict):
        return {}
    top = {name: value for name, value in document.items() if not isinstance(value, dict)}
    for value in document.values():
        if isinstance(value, dict):
            top |= {name: inner for name, inner in value.items() if name not in document}
    return json.loads(json.dumps(top, default=str))  # as run.json holds them: tuples as lists, paths as text


def _manifest_fingerprint(path: Location) -> Any:
    """The fingerprint a ``run.json`` records; a file that is not a manifest is refused, naming it."""
    payload = storage.read_retrying(lambda: storage.read_bytes(path), str(path))
    try:
        document = json.loads(payload.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, or not JSON
        document, problem = None, f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    else:
        kind = "object without one" if isinstance(document, dict) else type(document).__name__
        problem = f"a JSON {kind}"
    if not isinstance(document, dict) or "fingerprint" not in document:
        raise ConfigError(
            f"{path} is not a backtest manifest (expected a JSON object with a 'fingerprint', found {problem:.200}); "
            "the folder's files cannot be told to be a run's: use another --output directory.",
            key="output",
        )
    return document["fingerprint"]
