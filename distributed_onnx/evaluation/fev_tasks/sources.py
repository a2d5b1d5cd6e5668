"""Where a fev task's data comes from: its ``dataset_path`` parsed once, as a :class:`~.location.Location`.

fev treats ``dataset_path`` as a plain string. For an object-store URL with options
(``s3://KEY:SECRET@bucket/dir/data.parquet?endpoint_override=http://host:9000&scheme=http``) that went wrong
three ways: fev checked the file type on the whole text, query included (``path must end in one of ['parquet',
'arrow']``: a task that could never load, recorded as worth a rerun); it handed the URL to its own loader, which
knows nothing of the store's options; and it named the task after the text's "folders", which a ``/`` in the
query moved into the query (``dir/data.parquet?endpoint_override=http:``: an option name and the start of its
value, in the error line, ``fev_summary.json`` and the ``pairs/`` folder's name).

So here, once per task: the path is a Location (:func:`dataset_location`; None for a Hugging Face hub dataset,
which fev's own loader fetches); the file type is checked on its path without the query (:func:`check_dataset`);
an object is read through :mod:`distributed_onnx.storage` with the URL's options and handed to fev's loader as a
local copy (:func:`load_dataset`), so fev's own layout and checks still decide what the data is; and a task fev
named after its path is renamed after the Location's redacted path only, never its query (:func:`named`).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError
from distributed_onnx.location import Location

__all__ = ["FILE_TYPES", "check_dataset", "dataset_location", "default_name", "load_dataset", "named"]

#: The file types fev loads a dataset from (``fev.Task._load_dataset``): the suffix of the path, not of the query.
FILE_TYPES = (".parquet", ".arrow")


def dataset_location(task: Any) -> Location | None:
    """The task's ``dataset_path`` as a Location, or None for a hub dataset (``dataset_config`` given: the path is
    a repository's name, which fev's loader fetches)."""
    if task.dataset_config is not None:
        return None
    return Location.parse(str(task.dataset_path))


def default_name(location: Location) -> str:
    """The name fev gives a task without ``task_name`` (its dataset's last two folders: ``dir/sub`` of
    ``dir/sub/data.parquet``), from the Location's redacted text and its path only: a URL's user-info shows as
    ``***`` (``***@bucket/dir``) and its query, whatever ``/`` its values hold, is no part of it."""
    if location.local_path is not None:
        return "/".join(location.local_path.parts[-3:-1])
    shown = urlsplit(str(location))  # redacted: user-info and option values masked
    parts = [shown.netloc, *PurePosixPath(shown.path or "/").parts[1:]]
    return "/".join(parts[-3:-1])


def named(task: Any) -> Any:
    """``task``, or a copy renamed by :func:`default_name` where fev named it after its ``dataset_path`` (its own
    rule, on the whole text: a query's ``/`` moved the name into the query). A name the user gave is kept."""
    location = dataset_location(task)
    if location is None or task.task_name != "/".join(Path(str(task.dataset_path)).parts[-3:-1]):
        return task
    name = default_name(location) or "task"
    if name == task.task_name:  # a local path: fev's rule and this one agree
        return task
    renamed = copy.copy(task)  # the user's own Task object is left as it was
    renamed.task_name = name
    return renamed


def check_dataset(task: Any) -> Location | None:
    """The task's dataset Location once checked (None for a hub dataset): a file of a type fev loads, judged on
    its path without the query; a URL names one object (no glob). A :class:`ConfigError` naming
    ``dataset_path`` otherwise: the task's definition, which no rerun changes."""
    location = dataset_location(task)
    if location is None:
        return None
    if location.suffix not in FILE_TYPES:
        raise ConfigError(
            f"dataset_path {location} does not end in {' or '.join(FILE_TYPES)} (a URL's ?options are no part of "
            f"its name): fev loads a task's data from a Parquet or Arrow file; name one, or give dataset_config "
            "for a Hugging Face hub dataset",
            key="dataset_path",
        )
    if location.is_url and any(mark in urlsplit(location.reveal()).path for mark in "*["):
        raise ConfigError(
            f"dataset_path {location} names several objects (a glob): a task's object-store data is read as one "
            "object; give one object's URL, or a local path (where fev expands the glob)",
            key="dataset_path",
        )
    return location


def load_dataset(task: Any) -> Any:
    """``task.load_full_dataset()`` (fev's loader, its layout and checks; the dataset kept on the task for fev's
    scoring), with the data read from where the Location says: a local file in place, an object through the
    store with its URL's options (to a local copy fev loads, removed once loaded), a hub dataset by fev itself."""
    location = check_dataset(task)
    if location is None:
        return task.load_full_dataset()
    if location.local_path is not None:
        return _loaded_from(task, str(location.local_path))
    with tempfile.TemporaryDirectory(prefix="distributed-onnx-fev-") as folder:
        copied = Path(folder) / f"data{location.suffix}"
        with storage.open_input_stream(location) as source, copied.open("wb") as target:
            shutil.copyfileobj(source, target)
        return _loaded_from(task, str(copied))


def _loaded_from(task: Any, path: str) -> Any:
    """fev's loader on ``task`` with its data at ``path``: fev reads ``dataset_path``, so it is that path while
    fev loads, and the task's own again after (its definition, the records' key, the summaries keep it). fev
    keeps the loaded dataset on the task, so its scoring later reads that, not the path."""
    given = task.dataset_path
    task.dataset_path = path
    try:
        return task.load_full_dataset()
    finally:
        task.dataset_path = given
