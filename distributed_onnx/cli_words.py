"""The command line's words before and after argparse: forms people type, errors that point, help in plain text.

argparse alone answered a typo (``backtest --n-windw 2``) with the *top-level* usage and "unrecognized
arguments", refused ``--n_windows`` and ``-v`` after the command, and said nothing when a list was given with
spaces (``--quantiles 0.1 0.5 0.9``). Here:

- :func:`normalized_words`: ``--n_windows`` is read as ``--n-windows`` (the YAML keys and environment variables
  use underscores, so people type them), and ``-v``/``--verbose`` anywhere on the line is the top-level flag;
- :func:`parse_words` and :class:`PointingParser`: an error shows the usage of the command it is about, then
  one ``error:`` line, then a hint: the closest flag of that command (difflib, as the YAML path's "did you mean"
  does), or for stray values after a list flag its comma-separated form; the words it quotes redacted (a
  location's credentials given to a misspelt flag are a location's credentials still): every word of the line that
  is a location is shown as :func:`~distributed_onnx.redact.redact` shows it, wherever argparse quotes it
  (:func:`masked_words`), so that a URL written without its ``//`` and a secret of one character are masked too;
- :func:`plain_text` and :func:`plain_help`: the help is read in a terminal, so the docstrings' reStructuredText
  (````x````, ``:class:`~a.B```) becomes plain text, and a metavar never reads ``list[Path]``.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from distributed_onnx.redact import is_url, is_url_without_slashes, redact, redact_text

__all__ = ["PointingParser", "masked_words", "normalized_words", "parse_words", "plain_help", "plain_text"]

_VERBOSE = ("-v", "--verbose")
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_INTERPRETED = re.compile(r"`([^`]+)`")
#: What a generated metavar becomes (pydantic-settings writes the annotation: ``list[Path]``, ``int``).
_METAVARS = {
    "list[Path]": "PATH",
    "list[str]": "NAME",
    "list[float]": "X,Y,...",
    "list[int]": "N,M,...",
    "int": "N",
    "float": "X",
    "str": "TEXT",
}


def normalized_words(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``-v``/``--verbose`` first wherever it was, and underscores in flag names read as hyphens."""
    words = list(argv)
    if "--" in words:  # after "--" nothing is a flag
        cut = words.index("--")
        head, tail = words[:cut], words[cut:]
    else:
        head, tail = words, []
    verbose = [word for word in head if word in _VERBOSE]
    rest = [_kebab(word) for word in head if word not in _VERBOSE]
    return verbose[:1] + rest + tail


def _kebab(word: str) -> str:
    if not word.startswith("--") or "_" not in word.split("=", 1)[0]:
        return word
    name, equals, value = word.partition("=")
    return name.replace("_", "-") + equals + value


def parse_words(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """Parse ``words``; words no flag took are an error of the command they follow (:class:`PointingParser`)."""
    _tell_words(parser, tuple(words))
    args, extras = parser.parse_known_args(words)
    if extras:
        command = _command_parser(parser, getattr(args, "command", None))
        if isinstance(command, PointingParser):
            command.unrecognized(extras, words)
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _tell_words(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
    """Give ``parser`` and its commands' parsers the words being parsed: an error masks them (:func:`masked_words`)."""
    if isinstance(parser, PointingParser):
        parser.words = words
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                _tell_words(command, words)


def masked_words(text: str, words: Sequence[str]) -> str:
    """``text`` (an argparse error, its hints) with each of ``words`` (the command line) that holds a secret
    shown as :func:`~distributed_onnx.redact.redact` shows it, then :func:`~distributed_onnx.redact.redact_text`.

    :func:`~distributed_onnx.redact.redact_text` alone finds ``scheme://`` URLs and user-info in free text, but not
    a URL written without its ``//`` (``s3:/b/x?secret_key=S``), whose option values argparse then printed; and it
    masks only the secrets of 6 characters or more that it remembers. A word of the line is a whole location: each
    of its fields (a password, an option's value, a fragment) is masked whatever its length, in every form argparse
    quotes it (as typed, or in ``repr``'s quotes: ``invalid choice: 's3:/b/x?k=V'``), a flag's ``--flag=VALUE``
    and each entry of a comma-separated list included.

    >>> masked_words("unrecognized arguments: s3:/K:S@b/x?k=V#F", ["s3:/K:S@b/x?k=V#F"])
    'unrecognized arguments: s3:/***@b/x?k=***#***'
    """
    pieces = set()
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        pieces |= {word, value, *value.split(",")}
    for piece in sorted(filter(_is_location, pieces), key=len, reverse=True):
        shown = redact(piece)
        if shown != piece:
            for form in {piece, repr(piece)[1:-1]}:
                text = text.replace(form, shown)
    return redact_text(text)


def _is_location(word: str) -> bool:
    return is_url(word) or is_url_without_slashes(word)


def _command_parser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    return parser


#: What reads as a negative number on a command line (:class:`PointingParser`).
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class PointingParser(argparse.ArgumentParser):
    """An argparse parser whose errors show its own usage, the problem, and what was probably meant."""

    #: The words being parsed (:func:`parse_words` tells them): the locations among them an error masks.
    words: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A word that reads as a negative number is a value, not a flag (no flag of ours looks like one): argparse
        # knows only -1 and -.5, so --accuracy-margin -inf was "expected one argument" and the range check never
        # spoke; with every number Python reads (-1e3, -inf, -nan), each numeric flag's own check says what is wrong.
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        hints = []
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            hints = self.hints(unknown.group(1).split(), [])
        choice = re.match(r"argument command: invalid choice: (.+?) \(choose from ", message)
        if choice:
            hints = self.command_hints(_quoted_word(choice.group(1)))
        self._fail(message, hints)

    def command_hints(self, word: str) -> list[str]:
        """For a mistyped command (``backtst``): the closest command, as :meth:`hints` does for flags."""
        subparsers = [action for action in self._actions if isinstance(action, argparse._SubParsersAction)]
        commands = [name for action in subparsers for name in action.choices]
        close = difflib.get_close_matches(word, commands, n=1, cutoff=0.6)
        if close:
            return [f"did you mean {close[0]}? ({self.prog} --help lists every command)"]
        return [f"{word} is not a command ({self.prog} --help lists them)"]

    def unrecognized(self, extras: list[str], words: list[str]) -> NoReturn:
        self._fail(f"unrecognized arguments: {' '.join(extras)}", self.hints(extras, words))

    def hints(self, extras: list[str], words: list[str]) -> list[str]:
        """A hint per unknown flag (the closest of this command's) and per run of values after a flag."""
        flags = [option for action in self._actions for option in action.option_strings if option.startswith("--")]
        hints = []
        for word in extras:
            if word.startswith("-"):
                name = word.split("=", 1)[0]
                close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
                if close:
                    hints.append(f"did you mean {close[0]}? ({self.prog} --help lists every flag)")
                else:
                    hints.append(f"{name} is not a flag of {self.prog.split()[-1]} ({self.prog} --help lists them)")
        hints += self._stray_values(extras, words)
        return hints

    def _stray_values(self, extras: list[str], words: list[str]) -> list[str]:
        """For values no flag took: the flag they follow and its comma-separated form."""
        hints = []
        index = 0
        while index < len(words):
            word = words[index]
            values = []
            if word.startswith("--") and "=" not in word:
                cursor = index + 2
                while cursor < len(words) and not words[cursor].startswith("-") and words[cursor] in extras:
                    values.append(words[cursor])
                    cursor += 1
            if values and index + 1 < len(words):
                joined = ",".join([words[index + 1], *values])
                hints.append(
                    f"{word} takes one value; for a list, join the values with commas: {word} {joined} "
                    f"(or repeat the flag: {' '.join(f'{word} {value}' for value in [words[index + 1], *values])})"
                )
                index = cursor
                continue
            index += 1
        return hints

    def _fail(self, message: str, hints: list[str]) -> NoReturn:
        """Usage, the error and its hints, every URL and user-info in them redacted: argparse quotes the words it
        could not take (``unrecognized arguments: --outptu s3://KEY:SECRET@b/x``), and the hints repeat them
        (:func:`masked_words`)."""
        self.print_usage(sys.stderr)
        lines = [f"error: {message}", *(f"hint: {hint}" for hint in hints)]
        self.exit(2, masked_words("\n".join(lines), self.words) + "\n")


def _quoted_word(quoted: str) -> str:
    """The word argparse quoted with ``repr`` (``'it\\'s'`` -> ``it's``): whole, so that a URL in it is redacted
    whole (cut at its first quote, a password's end would be shown without the ``@`` that marks it)."""
    try:
        word = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        return quoted
    return word if isinstance(word, str) else quoted


def plain_text(text: str) -> str:
    """reStructuredText roles and literals as plain text: ``:class:`~a.B``` -> ``B``, double backticks dropped."""
    text = _ROLE.sub(lambda match: match.group(1).rsplit(".", 1)[-1], text)
    text = _LITERAL.sub(r"\1", text)
    return _INTERPRETED.sub(r"\1", text)


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Every help text and metavar of ``parser`` in plain text (see the module docstring)."""
    if parser.description:
        parser.description = plain_text(parser.description)
    for action in parser._actions:
        if isinstance(action.help, str):
            action.help = plain_text(action.help)
        if isinstance(action.metavar, str):
            action.metavar = _METAVARS.get(action.metavar, action.metavar)
