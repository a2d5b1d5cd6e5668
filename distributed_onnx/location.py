"""Where something is read or written: a local path or a URL, parsed once where the user gives it.

Why a type and not a string: locations were strings, handled by each command in its own way, and one class of
defect kept coming back from that. A forecast log's folder was found by cutting a URL at its last ``/``, which
dropped its query (``?endpoint_override=...``), so every write went to another store; a URL given as a checkpoint
went through :class:`~pathlib.Path`, which folds ``https://`` into ``https:/``, so it no longer looked like a URL
and its password was printed. A :class:`Location` is parsed once; it joins, takes its parent and its name keeping
a URL's query; and its own ``str``/``repr``/JSON form is redacted (:mod:`distributed_onnx.redact`), so a message,
a log line or a file built from it cannot show a secret. The whole text, credentials included, is reachable only
through :meth:`Location.reveal`, which the storage layer calls to hand it to pyarrow or fsspec.

>>> from distributed_onnx.location import Location
>>> run = Location.parse("s3://KEY:SECRET@bucket/runs/a?endpoint_override=127.0.0.1:9000")
>>> print(run / "forecasts")
s3://***@bucket/runs/a/forecasts?endpoint_override=***
>>> print(run.parent)
s3://***@bucket/runs?endpoint_override=***
>>> run.name, run.is_url, run.reveal().split("@")[0]
('a', True, 's3://KEY:SECRET')
>>> Location.parse("runs/a").local_path
PosixPath('runs/a')
>>> Location.parse("https://host/model.onnx").suffix
'.onnx'
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from distributed_onnx.redact import (
    MASK,
    USER_INFO_WITHOUT_SLASHES,
    is_url,
    is_url_without_slashes,
    redact,
    redact_text,
    remember,
)

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import core_schema

__all__ = [
    "Location",
    "LocationLike",
]


class Location:
    """A local path or a URL (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``, ``https://``, ``file://``...).

    Built by :meth:`parse` from what a user wrote (a string or a :class:`~pathlib.Path`); frozen and hashable.
    ``file://`` URLs are local paths. A URL keeps its query (a store's options) and user-info through every join,
    and shows neither (:meth:`__str__`); :meth:`reveal` gives the whole text to the library that opens it.
    Pickling keeps the whole text (Ray carries a Location to the actors that write there); JSON gets the redacted
    text (what a run records of its settings).
    """

    __slots__ = ("_path", "_text")

    _text: str
    _path: Path | None

    def __init__(self, value: LocationLike) -> None:
        if isinstance(value, Location):
            text, path = value._text, value._path
        elif isinstance(value, Path):
            text, path = str(value), value
        elif isinstance(value, str):
            text, path = _parse_text(value)
        else:
            raise TypeError(f"a location is a path or a URL string, got {type(value).__name__}")
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_path", path)
        if self._has_secrets():  # masked in every message of this process from now on (redact.py: a library's text)
            secrets = _secrets_of(_secret_parts(text))
            remember(secrets)

    @classmethod
    def parse(cls, value: LocationLike) -> Location:
        """``value`` as a Location (itself when it already is one)."""
        return value if isinstance(value, Location) else cls(value)

    # What it is --------------------------------------------------------------------------------------------

    @property
    def is_url(self) -> bool:
        """True for a remote URL (``file://`` URLs are local paths)."""
        return self._path is None

    @property
    def local_path(self) -> Path | None:
        """The local path, or None for a remote URL."""
        return self._path

    @property
    def scheme(self) -> str:
        """The URL's scheme (``s3``), ``""`` for a local path."""
        return "" if self._path is not None else urlsplit(self._text).scheme.lower()

    @property
    def name(self) -> str:
        """The last component of the path (a URL's without its query)."""
        if self._path is not None:
            return self._path.name
        return PurePosixPath(urlsplit(self._text).path).name

    @property
    def suffix(self) -> str:
        """The lower-case extension of the last component (``.parquet``), ``""`` when it has none."""
        name = self.name
        return "." + name.rsplit(".", 1)[-1].lower() if "." in name.lstrip(".") else ""

    @property
    def stem(self) -> str:
        """The last component without its extension."""
        name, suffix = self.name, self.suffix
        return name[: len(name) - len(suffix)] if suffix else name

    # New locations ------------------------------------------------------------------------------------------

    def join(self, *parts: str) -> Location:
        """``self / part / ...``; a URL's query and user-info stay where they are."""
        if self._path is not None:
            return Location(self._path.joinpath(*parts))
        url = urlsplit(self._text)
        return Location._from_url(url._replace(path="/".join([url.path.rstrip("/"), *parts])))

    def absolute(self) -> Location:
        """A local path made absolute from this process's working folder; a URL as it is. What another process is
        given (a Ray actor, a Serve replica: their working folder is their node's), so that it writes where this
        one reads."""
        if self._path is None or self._path.is_absolute():
            return self
        return Location(self._path.absolute())

    def relative_to(self, base: Location) -> str:
        """This location's path below ``base`` (``day=x/model=y/part.parquet``), ``/``-separated."""
        if self._path is not None and base._path is not None:
            return self._path.relative_to(base._path).as_posix()
        if self._path is None and base._path is None:
            path, prefix = urlsplit(self._text).path, urlsplit(base._text).path.rstrip("/") + "/"
            if path.startswith(prefix):
                return path[len(prefix) :]
        raise ValueError(f"{self} is not below {base}")

    def __truediv__(self, part: str) -> Location:
        return self.join(part)

    @property
    def parent(self) -> Location:
        """The folder holding this location; a URL keeps its query and user-info (a store's options)."""
        if self._path is not None:
            return Location(self._path.parent)
        url = urlsplit(self._text)
        parent = str(PurePosixPath(url.path or "/").parent)
        return Location._from_url(url._replace(path="" if parent in (".", "/") else parent))

    def with_name(self, name: str) -> Location:
        """The same folder, another last component."""
        return self.parent.join(name)

    def require_local(self, what: str, instead: str, *, use: Literal["read", "written"]) -> Path:
        """The local path, or :class:`~distributed_onnx.errors.ConfigError` (exit 2) naming ``what`` (``--checkpoint``)
        and this URL redacted, and saying what to do (``instead``), for what is read from or written to local files
        only. ``use`` is whether the setting names a file the command reads or one it writes: every caller says, so
        the refusal of a file to be written (``export --output``) does not call it read.

        >>> Location.parse("https://user:PASSWORD@host/m.onnx").require_local("--checkpoint", "copy it", use="read")
        Traceback (most recent call last):
        ...
        distributed_onnx.errors.ConfigError: --checkpoint https://***@host/m.onnx is a URL, but it is read from a ...
        >>> Location.parse("s3://b/m.onnx").require_local("--output", "write it here", use="written")
        Traceback (most recent call last):
        ...
        distributed_onnx.errors.ConfigError: --output s3://b/m.onnx is a URL, but it is written to a local file: ...
        """
        if self._path is not None:
            return self._path
        from distributed_onnx.errors import ConfigError

        where = {"read": "read from a local file (or a folder every node mounts)", "written": "written to a local file"}
        raise ConfigError(
            f"{what} {self} is a URL, but it is {where[use]}: {instead}.", key=what.lstrip("-").replace("-", "_")
        )

    # Showing and opening ------------------------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """``text`` (a library's message about this location) with this location's secrets masked wherever they
        appear, in any form: a client may quote the URL's path and query without its scheme, where no redaction
        of URLs in text finds them (``... url: /x.yaml?sig=SECRET``), and a URL given as an option's value by its
        host alone (``Failed to connect to 127.0.0.1:39123``). Secrets of every length are masked here (in a
        message about their own location); :func:`~distributed_onnx.redact.redact_text` masks the longer ones of
        every location in every message.

        >>> Location.parse("https://usr:pw1@h/x.yaml?sig=S01").scrub("GET /x.yaml?sig=S01 as usr:pw1 failed")
        'GET /x.yaml?sig=*** as ***:*** failed'
        >>> Location.parse("s3://b/x?endpoint_override=http://127.0.0.1:39123").scrub("connect to 127.0.0.1:39123")
        'connect to ***'
        """
        for secret in sorted(self._secrets(), key=len, reverse=True):
            text = text.replace(secret, MASK)
        return redact_text(text)

    def _secrets(self) -> frozenset[str]:
        return _secrets_of(_secret_parts(self._text)) if self._has_secrets() else frozenset()

    def _has_secrets(self) -> bool:
        """A URL, or a URL written without its ``//`` (``s3:/b/x?token=T``: a path here, but its options are as
        secret as a URL's), or a local path holding URL-like text its display masks (``./s3:/K:S@b/x?token=T``)."""
        return self._path is None or is_url_without_slashes(self._text) or redact(self._text) != self._text

    def reveal(self) -> str:
        """The whole text, credentials and options included: only for the library that opens it (pyarrow,
        fsspec, an HTTP client), never for a message, a log line or a file."""
        return self._text

    def __str__(self) -> str:
        return redact(self._text)

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __fspath__(self) -> str:
        """A local path's text; a URL is not a local path, so ``Path(url_location)`` and ``open()`` refuse it
        rather than fold ``https://`` into ``https:/``."""
        if self._path is None:
            raise TypeError(f"{self} is a URL, not a local path: open it through distributed_onnx.storage")
        return str(self._path)

    # Identity -----------------------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        """Local locations are equal when their paths are (a :class:`~pathlib.PurePath` too: a local location is
        that path), URLs when their whole texts are."""
        if isinstance(other, PurePath):
            return self._path == other
        if not isinstance(other, Location):
            return NotImplemented
        if self._path is not None or other._path is not None:
            return self._path == other._path
        return self._text == other._text

    def __hash__(self) -> int:
        return hash(self._path) if self._path is not None else hash(self._text)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Location is frozen")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Location, (self._text if self._path is None else self._path,))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """Settings fields typed ``Location`` take a string or a path; JSON dumps show the redacted text."""
        from pydantic_core import core_schema  # here: importing a Location (the CLI does) needs no pydantic

        return core_schema.no_info_plain_validator_function(
            _validate,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str, when_used="json"),
        )

    @staticmethod
    def _from_url(url: Any) -> Location:
        return Location(urlunsplit(url))


#: The characters an HTTP client leaves unquoted in a URL it shows (requests' ``requote_uri``).
_URI_SAFE = "!#$%&'()*+,/:;=?@[]~"
#: Shorter option values (``r``, ``eu``) are not masked in free text: they would mask every such letter in it.
_SHORTEST_SECRET = 3

#: What every function that takes a location accepts: a Location, a path, or the text a user wrote.
LocationLike = Location | Path | str


def _parse_text(text: str) -> tuple[str, Path | None]:
    """The canonical text and the local path (None for a remote URL) of what a user wrote."""
    if not is_url(text):
        path = Path(text)
        shown = _as_written(text, path)
        if shown != str(path) and ":" in path.parts[0]:  # pyarrow reads a relative "s3:/x/..." as a URL
            path = path.absolute()
        return shown, path
    url = urlsplit(text)
    if url.scheme.lower() == "file":  # a local path; its text kept as written, shown redacted (options and all)
        return text, Path(unquote(url.path) or "/")
    trimmed = url._replace(path=url.path.rstrip("/") if url.path not in ("", "/") else url.path)
    return urlunsplit(trimmed), None


def _as_written(text: str, path: Path) -> str:
    """A local path's text: :class:`~pathlib.Path`'s, except that a leading ``./`` the user wrote is kept where it
    is what makes the path plainly local: before a first folder with a colon (``./s3:/x``, a folder ``s3:``, not
    ``s3:/x``, a URL without its ``//``) or before ``-`` (a folder ``-``, not the usual "standard output"). The
    output checks (``evaluation/output_checks.py``) refuse the bare forms and accept these. The path of the first
    is made absolute (:func:`_parse_text`): pyarrow, handed a relative ``s3:/x/part.parquet``, reads it as a URL."""
    shown = str(path)
    if text.startswith("./") and not path.is_absolute() and (":" in path.parts[0] or shown == "-"):
        return "./" + shown
    return shown


#: The user-info of URL-like text inside a local path (``./s3:/K:S@b/x``, ``dir/K:S@host/x``): a segment's text
#: up to its ``@``, after an optional scheme.
_USER_INFO_INSIDE = re.compile(r"(?:^|/)(?:[A-Za-z][A-Za-z0-9+.\-]+:)?([^/@]*:[^/@]*)@")


def _secret_parts(text: str) -> tuple[str, str, str]:
    """What of a URL is secret: its user-info, query and fragment (one key for :func:`_secrets_of`'s cache)."""
    url = urlsplit(text)
    without_slashes = None if url.netloc else USER_INFO_WITHOUT_SLASHES.match(text)
    user_info = without_slashes.group(2) if without_slashes else url.netloc.rpartition("@")[0]
    if not url.netloc and not without_slashes:  # a local path holding URL-like text (``./s3:/K:S@b/x``)
        inside = _USER_INFO_INSIDE.search(url.path)
        user_info = inside.group(1) if inside else ""
    return user_info, url.query, url.fragment


@functools.lru_cache(maxsize=256)
def _secrets_of(parts: tuple[str, str, str]) -> frozenset[str]:
    """Every form in which a library may quote a secret of a URL (:func:`_secret_parts`): the user name, the
    password, each option's value and the fragment, as written, unquoted and quoted; an option whose value is a URL
    itself (``endpoint_override=http://127.0.0.1:39123``) also by its host and port and without its scheme."""
    user_info, query, fragment = parts
    user, _, password = user_info.partition(":")
    values = [option.split("=", 1)[1] for option in query.split("&") if "=" in option]
    pieces = [user, password, fragment, *values]
    for value in values:
        inner = unquote(value)
        if is_url(inner):
            netloc = urlsplit(inner).netloc
            pieces += [netloc, netloc.rpartition("@")[2], inner.split("://", 1)[1]]
    forms = set()
    for piece in filter(None, pieces):
        for each in (piece, unquote(piece)):
            forms |= {each, quote(each, safe=""), quote(each, safe=_URI_SAFE)}
    return frozenset(form for form in forms if len(form) >= _SHORTEST_SECRET)


def _validate(value: Any) -> Location:
    if isinstance(value, str) and not value.strip():  # as a path, ``.``: the working directory, which nobody meant
        raise ValueError("is empty; give a path or a URL (for none, leave the setting out)")
    if isinstance(value, Location | Path | str):
        return Location.parse(value)
    if isinstance(value, os.PathLike):
        return Location(Path(value))
    raise ValueError(f"a location is a path or a URL string, got {type(value).__name__}")
