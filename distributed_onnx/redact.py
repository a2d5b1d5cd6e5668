"""The one redaction of secrets in URLs: what the package prints, logs or writes never carries a credential.

A storage URL may hold credentials: user-info (``s3://KEY:SECRET@bucket``, ``hdfs://user:password@host``) and
options (``?secret_key=``, ``?X-Amz-Signature=``, an Azure SAS's ``sig=``). pyarrow and fsspec accept them, and
their error messages echo them. So every place that shows a location (error lines, the ready line, logs,
``summary.json``, ``run.json``, reports, ``/metrics``, OpenAPI) goes through this module: :func:`redact` for one
location, :func:`redacted` for a JSON-like document, :func:`redact_text` for any text that may contain URLs (an
error message from a library, a log line). Every option's *value* goes, not only the ones known to be secret (a
store's option names vary: ``sv``/``se``/``sp`` of a SAS, ``X-Amz-Credential``, ``token``); the names stay, to say
what was set.

A library's message often quotes a secret without its URL (``Failed to connect to 127.0.0.1:39123``, the value of
``?endpoint_override=http://127.0.0.1:39123``), where no redaction of URLs finds it. So every
:class:`~distributed_onnx.location.Location` parsed in a process remembers its secrets here (:func:`remember`), and
:func:`redact_text` masks them wherever they appear: every message that embeds a library's text and goes out
through it (the CLI's error line, every log line, serve's error bodies) is covered without each place knowing
which locations the library was given.

The same text may carry a file's bytes (a CSV parser quotes the row it failed on, and a PNG renamed ``.csv`` puts
ESC and NUL there): :func:`shown` is what a message line may show, its control and non-printable characters
escaped (``\x1b``) so that no terminal acts on them, and :func:`quoted` bounds a library's text in a message.
A value may be long too (a 5,000-byte path): :func:`one_line` bounds a whole message line by shortening its long
values (:func:`shortened`: their start and end, saying how many bytes were left out), never its reason or what to
do, which followed them and were cut off with the line's end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "MASK",
    "USER_INFO_WITHOUT_SLASHES",
    "is_url",
    "is_url_without_slashes",
    "one_line",
    "quoted",
    "redact",
    "redact_address",
    "redact_name",
    "redact_text",
    "redacted",
    "remember",
    "shortened",
    "shown",
]

T = TypeVar("T")

#: What a secret becomes.
MASK = "***"

#: A URL inside text, at its longest: a scheme, ``://``, then anything up to white space, ``<``, ``>`` or a backtick.
#: Parentheses, brackets, quotes and punctuation may belong to it (``sales(2024).parquet``, ``pa(ss)word``,
#: ``?sig=a'b``): :func:`_url_end` gives back the ones that close the text around it.
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s<>`]*")
#: What ends a sentence rather than a URL, when it is the URL's last character.
_TRAILING = ".,;:!?"
_CLOSING = {")": "(", "]": "[", "}": "{"}


#: A URL written without its ``//`` (``s3:/AKIA:SECRET@bucket/x?token=T``, ``s3:x?sig=S``): a scheme of two or more
#: characters, a colon, no ``//``. Not a URL to open (the commands refuse it, or a store reads it as a path), but
#: its options are as secret as a URL's; a Windows drive (``C:``) has a one-letter scheme and is a path.
_URL_WITHOUT_SLASHES = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:(?!//)")
#: The same inside text, wherever it starts (``No such file or directory: 's3:/K:S@b/x.yaml?token=T#F'``, a folder
#: ``./s3:/K:S@b/x?token=T``, ``-s3:/...``, ``(s3:/...)``), as :data:`_URL_IN_TEXT` finds a URL with its ``//``: a
#: scheme not inside a longer word, a colon, no ``//``, then no white space. Only its user-info, options and
#: fragment are masked, so a word with none (``12:30``, ``T12:30:00``) is left as it is.
_URL_WITHOUT_SLASHES_IN_TEXT = re.compile(r"(?<![A-Za-z0-9:@])[A-Za-z][A-Za-z0-9+.\-]+:(?!//)[^\s<>`]+")
#: A user-info without a scheme and the rest of its word (``user:secret@host/dir?token=T``, as fev names a task
#: after its dataset's path, or ``s3 :/u:pw@b/x?t=T``): the user-info, then what follows it up to white space,
#: whose options and fragment are masked with it (:func:`redact_text`).
_BARE_USER_INFO_WORD = re.compile(r"(?<![\w.~%+-])[\w.~%+-]+:[^\s/@<>`]+@(?=[\w\[])[^\s<>`]*")


#: The user-info of a URL written without its ``//``: whatever precedes the first ``@`` of its first segment
#: (``s3:/K%3ASECRET@b``, ``s3:/K: SECRET@b``: no literal colon, or a space, is still a credential).
USER_INFO_WITHOUT_SLASHES = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+:/*)([^/@?#]*)@")


def is_url_without_slashes(location: object) -> bool:
    """True for ``scheme:rest`` without ``//`` (:data:`_URL_WITHOUT_SLASHES`): shown with its options masked."""
    return isinstance(location, str) and _URL_WITHOUT_SLASHES.match(location) is not None


def is_url(location: object) -> bool:
    """True for ``scheme://...`` strings (a Windows drive letter or a plain path is not a URL)."""
    return isinstance(location, str) and "://" in location and len(urlsplit(location).scheme) > 1


def redact(location: object) -> str:
    """``location`` as it may be shown or recorded: a URL's user-info and option values replaced by ``***``.

    ``s3://KEY:SECRET@bucket/run?access_key=K&secret_key=S&region=eu`` becomes
    ``s3://***@bucket/run?access_key=***&secret_key=***&region=***``. A local path is shown as any text is
    (:func:`redact_text`): as written, except a URL-like part of it (``./s3:/K:S@b/x?token=T#F``, a folder of that
    name) whose user-info, options and fragment are all masked, as they would be anywhere else; a path with no
    URL-like part (``data/a?b.csv``) is shown as written.
    """
    if not is_url(location):
        return redact_text(str(location))
    return _redact_url(str(location))


def redact_address(address: str) -> str:
    """A Ray address (``HOST:PORT``, ``ray://HOST:PORT``) as a message may show it: :func:`redact`-ed, and all of
    what follows its first ``?`` or ``#`` masked. An address has neither, so what follows can only be something the
    user added, a secret as often as not (``127.0.0.1:1?token=T``, which no rule for URLs takes for one).

    >>> redact_address("127.0.0.1:1?token=T0K"), redact_address("ray://u:pw@h:1#F"), redact_address("h:6379")
    ('127.0.0.1:1?***', 'ray://***@h:1#***', 'h:6379')
    """
    text = redact(address)
    cut = min((found for found in (text.find("?"), text.find("#")) if found >= 0), default=-1)
    return text if cut < 0 else text[: cut + 1] + MASK


def redact_name(name: str) -> str:
    """A name (a checkpoint's file stem) as a message may show it: :func:`redact_text`-ed, and its options (after
    ``?``) and fragment (after ``#``) masked as a URL's are. A stem cut from URL-like text (``s3:/u:pw@b/m?tok=T.onnx``
    has the stem ``m?tok=T``) has lost the scheme that marks it as a URL's, so no rule for URLs finds it; and a
    name holding ``?`` or ``#`` is refused anyway, so its message needs only the part before them to say which.

    >>> redact_name("m?tok=SECRET"), redact_name("m#FRAG"), redact_name("x?tok=***#FRAG"), redact_name("chronos-1")
    ('m?tok=***', 'm#***', 'x?tok=***#***', 'chronos-1')
    """
    text = redact_text(name)
    return _masked_options(text) if "?" in text or "#" in text else text


def _redact_url(text: str) -> str:
    """A URL with its ``//`` (:func:`is_url`) with its user-info, option values and fragment masked."""
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


def _redact_url_like(text: str) -> str:
    """One URL-like piece of text (:func:`_redact_match`): a URL, or a URL without its ``//``, whose user-info,
    option values and fragment are masked; or a user-info without a scheme and what follows it
    (:data:`_BARE_USER_INFO_WORD`), masked the same way: wherever a user-info is masked, so are the options and the
    fragment of the text that holds it."""
    if is_url(text):
        return _redact_url(text)
    if _BARE_USER_INFO_WORD.match(text):  # ``user:secret@host/dir``: a user-info, shown as ``***@host/dir``
        return _masked_options(MASK + "@" + text.partition("@")[2])
    return _masked_options(USER_INFO_WITHOUT_SLASHES.sub(lambda found: found.group(1) + MASK + "@", text))


def _masked_options(text: str) -> str:
    """``text``'s option values (after ``?``) and fragment (after ``#``) masked, the rest as written."""
    head, hash_sign, fragment = text.partition("#")
    path, question_mark, query = head.partition("?")
    options = "&".join(
        f"{option.split('=', 1)[0]}={MASK}" if "=" in option else option for option in query.split("&") if option
    )
    return path + question_mark + options + (hash_sign + MASK if fragment else hash_sign)


def redact_text(text: str) -> str:
    """``text`` with every URL in it :func:`redact`-ed (an error message, a log line, a traceback), a URL written
    without its ``//`` (``s3:/K:S@b/x?token=T``) too, and every user-info without a scheme (``user:secret@host``)
    masked: each field (a password, an option's value, a fragment) whole, whatever its length.

    A URL may hold parentheses and quotes (``https://h/sales(2024).parquet?sig=S``, ``s3://K:pa(ss)word@b/x``):
    it runs to white space, and only the characters that close the text around it are given back (a quote it
    was opened in, a bracket it does not open itself, a sentence's last full stop). When in doubt a character is
    taken as the URL's, so that a secret is masked whole.
    """
    if "://" in text:
        text = _URL_IN_TEXT.sub(lambda match: _redact_match(match.string, match.start(), match.group(0)), text)
    if ":" in text and ("?" in text or "#" in text or "@" in text):  # a URL written without its // (attack H)
        text = _URL_WITHOUT_SLASHES_IN_TEXT.sub(
            lambda match: _redact_match(match.string, match.start(), match.group(0)), text
        )
    if "@" in text:  # a user-info without a scheme, and the options of its text (attack I)
        text = _BARE_USER_INFO_WORD.sub(lambda match: _redact_match(match.string, match.start(), match.group(0)), text)
    for secret in _remembered_longest_first:  # a location's secrets quoted without their URL (module docstring)
        if secret in text:
            text = text.replace(secret, MASK)
    return text


#: The secrets of every location parsed in this process (:func:`remember`), longest first (a longer one holding a
#: shorter one is masked whole). At most :data:`_MOST_REMEMBERED`: the locations a process is given are few.
_remembered: set[str] = set()
_remembered_longest_first: list[str] = []
_MOST_REMEMBERED = 4096
#: Shorter secrets are masked only in a message about their own location (``Location.scrub``): masked in every
#: line a process writes, an option value such as ``http`` or ``true`` would mask that word everywhere. Where the
#: URL itself is shown, every field of it is masked whatever its length (:func:`redact`, :func:`redact_text`,
#: with or without its ``//``): a short secret is at risk only when a library quotes it alone, outside its URL.
SHORTEST_REMEMBERED = 6


def remember(secrets: Iterable[str]) -> None:
    """Mask ``secrets`` (a location's user-info and option values, in the forms a library may quote them) in every
    text :func:`redact_text` redacts from now on in this process."""
    new = {secret for secret in secrets if len(secret) >= SHORTEST_REMEMBERED} - _remembered
    if new and len(_remembered) + len(new) <= _MOST_REMEMBERED:
        _remembered.update(new)
        _remembered_longest_first[:] = sorted(_remembered, key=len, reverse=True)


#: How the white space that ends or splits a line is written when a message line escapes it.
_ESCAPES = {ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def shown(text: str) -> str:
    r"""``text`` redacted (:func:`redact_text`) with every control or non-printable character escaped as Python
    writes it (``\x1b``, ``\x00``, ``\u202e``): what an error line, an error body or a log message may show,
    since the text may quote a file's bytes and a terminal acts on ESC sequences.

    >>> print(shown("row: \x1b[2J\x00 s3://k:secret@b/x"))
    row: \x1b[2J\x00 s3://***@b/x
    """
    text = redact_text(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _ESCAPES.get(ord(char)) or _escaped(char) for char in text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


#: The most characters of a library's text a message quotes: enough for its reason, not a file's contents.
QUOTED_LIMIT = 300


def quoted(text: object, limit: int = QUOTED_LIMIT) -> str:
    """A library's message (an exception, a parser's complaint quoting a file's row) as a message may embed it: on
    one line, redacted (:func:`redact_text`: a cut must not leave a secret's part outside its URL), and at most
    about ``limit`` characters, its start and its end kept (a library names the file, then says what is wrong);
    :func:`shown` escapes the rest.

    >>> quoted("CSV parse error: Expected 1 columns, got 3: " + "x" * 1000 + " (row 2)", limit=80)
    'CSV parse error: Expected ...(1,000 bytes left out)...xxxxxxxxxxxxxxxxxx (row 2)'
    """
    return shortened(" ".join(redact_text(str(text)).split()), limit)


#: The most characters of one value (a run of text without white space: a path, a URL, a name) that a message line
#: over :data:`LINE_LIMIT` shows: its start and end say which value it is; the rest would push out the reason.
VALUE_LIMIT = 160
#: The most characters of a message line (the CLI's ``error:`` line): a few long values, never a file's contents.
LINE_LIMIT = 2_000


def shortened(text: str, limit: int = VALUE_LIMIT) -> str:
    """``text`` whole when it has at most ``limit`` characters, else its start and its end around how many bytes
    (UTF-8) were left out, in about ``limit`` characters.

    >>> shortened("/data/" + "e" * 5000 + "/load.parquet", limit=60)
    '/data/eeeeeeeeee...(4,987 bytes left out)...eee/load.parquet'
    """
    if len(text) <= limit:
        return text
    kept = max(limit - 28, 2)  # the note takes about 28 characters
    head, tail = (kept + 1) // 2, kept // 2
    left_out = len(text[head : len(text) - tail].encode("utf-8", "surrogatepass"))
    return f"{text[:head]}...({left_out:,} bytes left out)...{text[len(text) - tail :]}"


def one_line(text: str, limit: int = LINE_LIMIT, *, value_limit: int = VALUE_LIMIT) -> str:
    """``text`` as one message line (an error line): redacted (:func:`redact_text`), its white space one space, and
    over ``limit`` characters each long value :func:`shortened` (a 5,000-byte ``--output``), so that what the line
    says of it (the reason, what to do) stays whole; a line still too long (a thousand values) keeps its start and
    its end, where a message says what is wrong and what to do.

    >>> one_line("--output " + "e" * 5000 + ": its name is 5000 bytes; give a shorter one.", value_limit=40)
    '--output eeeeee...(4,989 bytes left out)...eeeee: its name is 5000 bytes; give a shorter one.'
    """
    line = " ".join(redact_text(text).split())
    if len(line) <= limit:
        return line
    line = " ".join(shortened(word, value_limit) for word in line.split(" "))
    return shortened(line, limit)


def _redact_match(text: str, start: int, found: str) -> str:
    end = _url_end(found, _opened_with(text, start))
    return _redact_url_like(found[:end]) + found[end:]


def _opened_with(text: str, start: int) -> str:
    """The character before a URL found at ``start`` of ``text``, or the quote its word opens with (``'/tmp/a/s3:/...'``
    is quoted whole, the URL-like part starting inside it): the quote that closes it is the text's."""
    word_start = max(text.rfind(space, 0, start) for space in " \t\n") + 1
    if word_start < start and text[word_start] in "'\"":
        return text[word_start]
    return text[start - 1] if start else ""


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
