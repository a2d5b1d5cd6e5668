"""The one exception tree of distributed_onnx.

Every error the package raises on purpose derives from :class:`DistributedOnnxError`, so callers can
catch the family with one clause and the CLI can turn it into a one-line message and a non-zero exit.
The exit code is the class's ``exit_code`` (``cli_errors.describe_error`` reads it): 2, bad input or settings,
unless a base says otherwise; 3 under :class:`EnvironmentFailedError` (the environment failed, not the
input: rerunning resumes); 1 for :class:`BatchError` (some parts failed; the run is resumable)::

    DistributedOnnxError               exit 2 (bad input or settings)
    ├── MissingExtraError              an optional dependency is not installed (message has the install hint)
    ├── ConfigError                    a setting is invalid (names the key and, when known, the file)
    │   └── NotABacktestError          ``score --backtest DIR`` names a directory that is not a backtest's
    │                                  output (names what it lacks)
    ├── CheckpointError
    │   ├── CheckpointNotFoundError    the weights or metadata file does not exist
    │   ├── CheckpointMetadataError    the metadata is not valid JSON or violates the schema
    │   ├── CheckpointIntegrityError   the weights' sha256 differs from the metadata's
    │   ├── CheckpointCorruptError     ONNX Runtime cannot load the weights
    │   ├── CheckpointGraphMismatchError  the graph's inputs/outputs disagree with the metadata
    │   └── ParityError            an export's graph does not reproduce upstream's forecasts (NaN, or beyond
    │                              the tolerance); the checkpoint is removed, the parity report kept
    ├── ProviderError
    │   ├── ProviderUnavailableError   an explicitly requested accelerator was not realized
    │   ├── ProviderNotAllowedError    a CUDA/TensorRT chain was asked for where no GPU was assigned
    │   └── GraphCaptureError          an explicit chain asked for CUDA graphs this checkpoint cannot use
    ├── BackendClosedError             ``run`` after ``close``
    ├── InputValidationError           tensors that do not match the session (name, dtype, rank, dims) or the
    │                                  model family's value rule (NaN/inf)
    ├── DataError                      the input table is unusable (names the file and rows)
    ├── PluginError                    a plugin's entry point failed to load or registers something unusable
    │                                  (names the plugin and its distribution)
    ├── EnvironmentFailedError         exit 3 (the environment failed; rerunning resumes)
    │   ├── InferenceError             ONNX Runtime failed while running valid-looking inputs
    │   ├── StorageError               a part could not be written after its retries (names the path)
    │   ├── WorkerStartError           worker actors did not become ready in time (names what was asked)
    │   │   └── RayStartError          Ray could not be started or joined (the Python API's ray.init)
    │   ├── UnsupportedRayError        the installed Ray lacks a private part this package relies on (names it
    │   │                              and the Ray version tested)
    │   ├── RayLostError               the Ray under a running ``serve`` or run went away (names the process or GCS)
    │   └── LoopbackError              the embedded Ray or Serve listens beyond 127.0.0.1 (names the sockets)
    └── BatchError                     exit 1: dispatched work failed (names the parts; their windows are listed)

Errors cross process boundaries (Ray pickles them), so every class keeps all its constructor arguments
in ``args``: ``__reduce__`` rebuilds it from the message and the keyword fields.

What to do about an error, where it is a setting to change, is a :class:`Suggestion` beside the message, not
words in it: the same error reaches commands with different flags (the data layer's missing column reaches
``backtest``, which has ``--id-col``, and ``tune``, which has not) and the Python API, which has keywords. Whoever
shows the error renders its suggestions in the user's words (:meth:`DistributedOnnxError.render`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from distributed_onnx.redact import redact_text


class DistributedOnnxError(Exception):
    """Base class of every error raised on purpose by distributed_onnx.

    One clause catches the family; the class says what to do, its ``exit_code`` what the command exits with,
    and the keyword fields (here ``key``) stay on the error, through Ray's pickling too:

    >>> import pickle
    >>> from distributed_onnx.errors import ConfigError, DistributedOnnxError, StorageError
    >>> try:
    ...     raise ConfigError("horizon: must be positive, got 0", key="horizon")
    ... except DistributedOnnxError as exc:
    ...     caught = exc
    >>> type(caught).__name__, caught.exit_code, caught.key, str(caught)
    ('ConfigError', 2, 'horizon', 'horizon: must be positive, got 0')
    >>> pickle.loads(pickle.dumps(caught)).key
    'horizon'
    >>> isinstance(StorageError("part 3 not written"), EnvironmentFailedError), StorageError.exit_code
    (True, 3)
    >>> BatchError.exit_code  # some parts failed; rerunning resumes
    1
    """

    #: The command's exit code when this error ends it (the module docstring's tree).
    exit_code: ClassVar[int] = 2

    def __init__(self, message: str, *, suggestions: Iterable[Suggestion] = (), **fields: Any) -> None:
        message = redact_text(message)  # a URL's secrets never reach a message, wherever it is shown (redact.py)
        super().__init__(message)
        self.message = message
        self.suggestions = tuple(suggestions)
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray unpickles exceptions by calling the class again: keep the keyword fields and suggestions too.
        return (_rebuild, (type(self), self.message, {**self.fields, "suggestions": self.suggestions}))

    def __str__(self) -> str:
        return self.render(None)

    def render(self, flags: Mapping[str, str] | None) -> str:
        """The message and its suggestions, for a command whose flags are ``flags`` (setting name -> flag), or
        for Python (``None``: settings as keywords). A suggestion naming a setting the command has no flag for
        is left out: it would tell the user to type what the command refuses."""
        shown = (suggestion.render(flags) for suggestion in self.suggestions)
        return " ".join([self.message, *(text for text in shown if text is not None)])


@dataclass(frozen=True)
class Suggestion:
    """What a user can change to get past an error: a sentence naming settings by their field names.

    ``text`` holds one ``{}`` per entry of ``settings`` (field name, value to give; ``True`` for a switch; ``None``
    for the setting itself, "lower {}"), or one ``{}`` for all of them together. The command line shows the flag
    of the running command
    (``--clamp-quantiles``, ``--id-col unique_id``, ``--actors``), and nothing when that command has no flag for one
    of them; Python shows keywords (``clamp_quantiles=True``, ``id_col='unique_id'``, ``actors``):

    >>> from distributed_onnx.errors import Suggestion
    >>> hint = Suggestion("Pass {} if that column holds the ids.", (("id_col", "unique_id"),))
    >>> hint.render(None)
    "Pass id_col='unique_id' if that column holds the ids."
    >>> hint.render({"id_col": "--id-col"}), hint.render({"output": "--output"})
    ('Pass --id-col unique_id if that column holds the ids.', None)
    """

    text: str
    settings: tuple[tuple[str, object], ...]
    #: Show the settings the command has and leave out the others ("lower --actors, --cpus-per-actor" where there
    #: is no --gpus-per-actor), rather than leaving the whole suggestion out; with one ``{}`` for them all.
    partial: bool = False
    #: What joins the flags in one ``{}`` (keywords are joined by commas).
    separator: str = " "

    def render(self, flags: Mapping[str, str] | None) -> str | None:
        """The sentence for a command with ``flags`` (setting -> flag), for Python with ``None``; None when the
        command lacks a flag it names."""
        if flags is None:
            shown = [name if value is None else f"{name}={value!r}" for name, value in self.settings]
            separator = ", "
        else:
            settings = [(name, value) for name, value in self.settings if name in flags or not self.partial]
            if not settings or any(name not in flags for name, _ in settings):
                return None
            shown = [flags[name] if value in (True, None) else f"{flags[name]} {value}" for name, value in settings]
            separator = self.separator
        if self.text.count("{}") == 1 and len(shown) > 1:  # one place for them all
            shown = [separator.join(shown)]
        return self.text.format(*shown)

    @property
    def names(self) -> tuple[str, ...]:
        """The settings it names."""
        return tuple(name for name, _ in self.settings)


def describe_validation(errors: Iterable[Mapping[str, Any]], *, root: str = "<root>", limit: int = 10) -> str:
    """Pydantic's validation errors as one line naming each field: ``series.0.y.3: Input should be ...; ...``.

    Used wherever a pydantic model meets outside input (metadata files, settings, HTTP bodies), so every such
    message reads the same; FastAPI's leading ``body`` location is dropped.
    """
    parts = []
    for error in list(errors)[:limit]:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")  # pydantic's prefix says nothing
        parts.append(f"{location or root}: {message}")
    return "; ".join(parts)


def _rebuild(cls: type[DistributedOnnxError], message: str, fields: dict[str, Any]) -> DistributedOnnxError:
    return cls(message, **fields)


class MissingExtraError(DistributedOnnxError):
    """An optional dependency is missing; the message says which extra installs it."""

    @classmethod
    def for_package(cls, package: str, extra: str, cause: ImportError | None = None) -> MissingExtraError:
        """``package`` (its import name) failed to import with ``cause``: not installed, or installed but missing a
        module it imports (an extra that lacks one of its dependencies), said as such rather than "not installed"."""
        missing = getattr(cause, "name", None) or ""
        if cause is None or missing.partition(".")[0] == package.partition(".")[0]:
            what = f"{package} is not installed"
        else:
            what = f"{package} is installed but cannot be imported ({cause})"
        return cls(
            f"{what}. Install it with: pip install 'distributed-onnx[{extra}]'",
            package=package,
            extra=extra,
        )


class ConfigError(DistributedOnnxError):
    """A setting is invalid or inconsistent."""


class NotABacktestError(ConfigError):
    """``score --backtest DIR``: DIR holds no backtest's outputs (``summary.json``, ``metrics.parquet``,
    ``leaderboard.parquet``), or they are not a backtest's; the message names what is missing or wrong."""


class CheckpointError(DistributedOnnxError):
    """A checkpoint cannot be resolved or loaded."""


class CheckpointNotFoundError(CheckpointError):
    """The weights or the metadata file does not exist."""


class CheckpointMetadataError(CheckpointError):
    """The metadata file is not valid JSON or violates the schema."""


class CheckpointIntegrityError(CheckpointError):
    """The weights file's sha256 differs from the one recorded in the metadata."""


class CheckpointCorruptError(CheckpointError):
    """ONNX Runtime could not load the weights file."""


class CheckpointGraphMismatchError(CheckpointError):
    """The graph's input or output names disagree with the metadata."""


class ParityError(CheckpointError):
    """``export``: ONNX Runtime's forecasts differ from the upstream pipeline's beyond the tolerance, or are not
    finite (inf weights gave ``max_abs_diff: NaN``); the checkpoint is not left behind looking valid."""


class ProviderError(DistributedOnnxError):
    """An execution-provider chain cannot be realized as asked."""


class ProviderUnavailableError(ProviderError):
    """An explicitly requested accelerator was not realized by ONNX Runtime."""


class ProviderNotAllowedError(ProviderError):
    """A GPU provider was requested in a process that holds no GPU."""


class GraphCaptureError(ProviderError):
    """An explicit chain asked for CUDA graphs (``CudaProvider.cuda_graph``) this checkpoint or batch cannot use."""


class BackendClosedError(DistributedOnnxError):
    """The backend was used after ``close()``."""


class InputValidationError(DistributedOnnxError):
    """Input tensors do not match what the session expects."""


class PluginError(DistributedOnnxError):
    """A plugin (a Python entry point of the package's groups) failed to load or registered something unusable."""


class EnvironmentFailedError(DistributedOnnxError):
    """The environment failed, not the input: storage, Ray or the cluster, the runtime. Rerunning resumes."""

    exit_code = 3


class InferenceError(EnvironmentFailedError):
    """ONNX Runtime failed while running the model."""


class DataError(DistributedOnnxError):
    """The input table cannot be used as it is."""


class StorageError(EnvironmentFailedError):
    """Writing a run file failed after its retries; the run records the part as failed and stays resumable."""


class WorkerStartError(EnvironmentFailedError):
    """Worker actors did not become ready within their timeout (no room in the cluster, or a slow start)."""


class UnsupportedRayError(EnvironmentFailedError):
    """The installed Ray lacks a private or experimental part the package relies on (``runtime/ray_private.py``)."""


class RayLostError(EnvironmentFailedError):
    """The Ray a running command relied on went away (its GCS or raylet stopped): ``runtime/ray_watch.py``."""


class LoopbackError(EnvironmentFailedError):
    """A process of the embedded Ray (or its Serve) listens on an address beyond loopback it was not asked for."""


class BatchError(DistributedOnnxError):
    """Dispatched work failed: ``failed_parts`` lists the parts; ``failed_windows.json`` their window ids."""

    exit_code = 1


class RayStartError(WorkerStartError):
    """Ray did not start or could not be joined (``ray.init`` failed: a GCS that does not answer, no room)."""
