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

#: A URL inside text, at its longest: a scheme, ``://``, then anything up to white space, ``<``, ``>`` or a backtick.
#: Parentheses, brackets, quotes and punctuation may belong to it (``sales(2024).parquet``, ``pa(ss)word``,
#: ``?sig=a'b``): :func:`_url_end` gives back the ones that close the text around it.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s<>`]*")
#: User-info without a scheme (``user:secret@host/dir``, as fev names a task after its dataset's path): a name, a
#: colon, a password without white space, ``/`` or ``@``, then ``@`` and a host.
_BARE_USER_INFO = re.compile(r"(?<![\w.~%+-])[\w.~%+-]+:[^\s/@<>`]+@(?=[\w\[])")
#: What ends a sentence rather than a URL, when it is the URL's last character.
_TRAILING = ".,;:!?"
_CLOSING = {")": "(", "]": "[", "}": "{"}


def is_url(location: object) -> bool:
    """True for ``scheme://...`` strings (a Windows drive letter or a plain path is not a URL)."""
    return isinstance(location, str) and "://" in location and len(urlsplit(location).scheme) > 1


def redact(location: object) -> str:
    """``location`` as it may be shown or recorded: a URL's user-info and option values replaced by ``***``.

    ``s3://KEY:SECRET@bucket/run?access_key=K&secret_key=S&region=eu`` becomes
    ``s3://***@bucket/run?access_key=***&secret_key=***&region=***``; a local path is returned as it is.
    """
    if not is_url(location):
        return _BARE_USER_INFO.sub(MASK + "@", str(location))
    text = str(location)
    try:
        url = urlsplit(text)
    except ValueError:  # an unparseable URL (a bad IPv6 host): show its scheme only
        return text.split("://", 1)[0] + "://" + MASK
    if "@" not in url.netloc and not url.query and not url.fragment:
        return text  # nothing to mask: shown as written (urlunsplit would turn ``s3://`` into ``s3:``)
    netloc = url.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{option.split('=', 1)[0]}={MASK}" if "=" in option else option for option in url.query.split("&") if option
    )
    fragment = MASK if url.fragment else ""  # a signed URL's fragment is the client's secret as often as not
    return urlunsplit(url._replace(netloc=netloc, query=query, fragment=fragment))


def redact_text(text: str) -> str:
    """``text`` with every URL in it :func:`redact`-ed (an error message, a log line, a traceback), and every
    user-info without a scheme (``user:secret@host``) masked.

    A URL may hold parentheses and quotes (``https://h/sales(2024).parquet?sig=S``, ``s3://K:pa(ss)word@b/x``):
    it runs to white space, and only the characters that close the text around it are given back (a quote it
    was opened in, a bracket it does not open itself, a sentence's last full stop). When in doubt a character is
    taken as the URL's, so that a secret is masked whole.
    """
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda match: _redact_match(match.string, match.start(), match.group(0)), text)
    return _BARE_USER_INFO.sub(MASK + "@", text) if "@" in text else text


def _redact_match(text: str, start: int, found: str) -> str:
    end = _url_end(found, text[start - 1] if start else "")
    return redact(found[:end]) + found[end:]


def _url_end(found: str, before: str) -> int:
    """How much of ``found`` (a URL and what follows it up to white space) is the URL; ``before`` is the character
    before it (a quote the URL was opened in closes it)."""
    end = len(found)
    while end > 0:
        last = found[end - 1]
        url = found[:end]
        if last in _TRAILING:
            end -= 1
        elif last in _CLOSING and url.count(last) > url.count(_CLOSING[last]):
            end -= 1  # a bracket the URL does not open: the text's
        elif last in "'\"" and before == last:
            end -= 1  # the quote the URL was opened in
        else:
            break
    return end


def redacted(document: T) -> T:
    """A JSON-like ``document`` (dicts, lists, strings) with every URL in it redacted: what a run records
    (``summary.json``, ``run.json``) and shows (``report.html``) of its settings."""
    if isinstance(document, str):
        return redact_text(document)  # type: ignore[return-value]
    if isinstance(document, Path):
        return document
    if hasattr(document, "reveal"):  # a Location: its own text is redacted
        return str(document)  # type: ignore[return-value]
    if isinstance(document, dict):
        return {key: redacted(value) for key, value in document.items()}  # type: ignore[return-value]
    if isinstance(document, list | tuple):
        return type(document)(redacted(value) for value in document)
    return document
