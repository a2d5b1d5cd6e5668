"""The one redaction of secrets in URLs: what the package prints, logs or writes never carries a credential.

A storage URL may hold credentials: user-info (``s3://KEY:SECRET@bucket``, ``hdfs://user:password@host``) and
options (``?secret_key=``, ``?X-Amz-Signature=``, an Azure SAS's ``sig=``). pyarrow and fsspec accept them, and
their error messages echo them. So every place that shows a location (error lines, the ready line, logs,
``summary.json``, ``run.json``, reports, ``/metrics``, OpenAPI) goes through this module: :func:`redact` for one
location, :func:`redacted` for a JSON-like document, :func:`redact_text` for any text that may contain URLs (an
error message from a library, a log line). Every option's *value* goes, not only the ones known to be secret (a
store's option names vary: ``sv``/``se``/``sp`` of a SAS, ``X-Amz-Credential``, ``token``); the names stay, to say
what was set.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MASK", "is_url", "redact", "redact_text", "redacted"]

T = TypeVar("T")

#: What a secret becomes.
MASK = "***"

#: A URL inside text: a scheme, ``://``, then anything up to white space, a quote or a bracket that ends it (a
#: sentence's last full stop or comma is not part of it).
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`()\[\]{}]*[^\s'\"<>`()\[\]{}.,;:!?]")


def is_url(location: object) -> bool:
    """True for ``scheme://...`` strings (a Windows drive letter or a plain path is not a URL)."""
    return isinstance(location, str) and "://" in location and len(urlsplit(location).scheme) > 1


def redact(location: Path | str) -> str:
    """``location`` as it may be shown or recorded: a URL's user-info and option values replaced by ``***``.

    ``s3://KEY:SECRET@bucket/run?access_key=K&secret_key=S&region=eu`` becomes
    ``s3://***@bucket/run?access_key=***&secret_key=***&region=***``; a local path is returned as it is.
    """
    if not is_url(location):
        return str(location)
    text = str(location)
    try:
        url = urlsplit(text)
    except ValueError:  # an unparseable URL (a bad IPv6 host): show its scheme only
        return text.split("://", 1)[0] + "://" + MASK
    netloc = url.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{option.split('=', 1)[0]}={MASK}" if "=" in option else option for option in url.query.split("&") if option
    )
    fragment = MASK if url.fragment else ""  # a signed URL's fragment is the client's secret as often as not
    return urlunsplit(url._replace(netloc=netloc, query=query, fragment=fragment))


def redact_text(text: str) -> str:
    """``text`` with every URL in it :func:`redact`-ed (an error message, a log line, a traceback)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda match: redact(match.group(0)), text)


def redacted(document: T) -> T:
    """A JSON-like ``document`` (dicts, lists, strings) with every URL in it redacted: what a run records
    (``summary.json``, ``run.json``) and shows (``report.html``) of its settings."""
    if isinstance(document, str):
        return redact_text(document)  # type: ignore[return-value]
    if isinstance(document, Path):
        return document
    if isinstance(document, dict):
        return {key: redacted(value) for key, value in document.items()}  # type: ignore[return-value]
    if isinstance(document, list | tuple):
        return type(document)(redacted(value) for value in document)
    return document
