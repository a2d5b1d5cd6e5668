"""How a command's settings appear on its command line: one flag per field, named, helped and shown by one rule.

Every command's flags are generated from its settings model
(:class:`~distributed_onnx.settings_sources.CommandSettings`) by pydantic-settings' ``CliSettingsSource``
(:func:`add_flags`); every message about a setting names it as the command line does (:func:`flag_name`), so a
refusal points at what the user typed. Kept apart from where the values come from (``settings_sources.py``: the
four sources and their precedence), which reads this module to name a bad key by its flag.

Written here, as the library does not do it: the flags' help and metavar. The library lists an enum by its
member names (``AUTO``) where users write the values (``auto``), and appends ``(default: null)`` to descriptions
that already say what None means.
"""

from __future__ import annotations

import argparse
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSettingsSource

from distributed_onnx.location import Location

#: Where :func:`add_flags` leaves the command's ``CliSettingsSource`` in the argparse namespace.
_CLI_SOURCE = "settings_cli_source"


def add_flags(parser: argparse.ArgumentParser, model: type[BaseSettings]) -> None:
    """One ``--flag`` per field of ``model`` (pydantic-settings' ``CliSettingsSource``): kebab-case names,
    ``--x/--no-x`` for booleans, lists comma-separated (or the flag repeated), help from the description; a field
    annotated ``CliPositionalArg[...]`` is a positional argument named by its first example (``CHECKPOINT.onnx``).

    Values stay strings for pydantic to validate (so a bad flag reads like a bad YAML value). Flags not given
    are absent from the namespace (see :func:`given_flags`); the others are stored under their field names, so a
    command's own options (``--config``) must not reuse a field's name.
    """

    def add_argument(target: Any, *names: str, **options: Any) -> Any:
        positional = bool(names) and not names[0].startswith("-")
        field = model.model_fields.get(names[0] if positional else options.get("dest", ""))
        if field is not None:
            options["help"] = _help(field).replace("%", "%%")
            if "metavar" in options or positional:
                options["metavar"] = flag_name(model, names[0]) if positional else _metavar(field, options["metavar"])
        return target.add_argument(*names, **options)

    source: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
        model,
        root_parser=parser,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_hide_none_type=True,
        add_argument_method=add_argument,
    )
    parser.set_defaults(**{_CLI_SOURCE: source})


def given_flags(namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings flags :func:`add_flags` parsed, by field name."""
    source: CliSettingsSource[Any] = getattr(namespace, _CLI_SOURCE)
    fields = source.settings_cls.model_fields
    parsed = {dest: value for dest, value in vars(namespace).items() if dest in fields}
    return source(parsed_args=parsed)()


def flags_model(namespace: argparse.Namespace) -> type[BaseSettings]:
    """The settings model whose flags :func:`add_flags` generated for the parsed command."""
    source: CliSettingsSource[Any] = getattr(namespace, _CLI_SOURCE)
    return source.settings_cls


def flag_name(model: type[BaseModel], key: str) -> str:
    """How the command line names setting ``key``: ``--parity-windows``, or a positional argument's name
    (``CHECKPOINT``, the one :func:`add_flags` shows)."""
    field = model.model_fields[key]
    if is_positional(field):
        return str(field.examples[0]) if field.examples else key.upper()
    return flag_of(key)


def flag_of(key: str) -> str:
    """The flag :func:`add_flags` makes of a settings field ``key`` (kebab case): what a message about that field's
    value names, in code that every command with the field reaches (``--checkpoint`` from ``checkpoint``)."""
    return "--" + key.replace("_", "-")


def is_positional(field: FieldInfo) -> bool:
    """Whether the field is a positional argument on the command line (annotated ``CliPositionalArg``)."""
    # pydantic-settings marks it with its (private) class in the annotation's metadata; matched by name, so that a
    # rename there fails this package's own tests of positional arguments rather than an import.
    return any(getattr(marker, "__name__", "") == "_CliPositionalArg" for marker in field.metadata)


def _metavar(field: FieldInfo, generated: str) -> str:
    """The field's example (``0.1,0.5,0.9`` rather than ``list[float]``), an enum's values, PATH, or the library's."""
    if field.examples:
        return str(field.examples[0])
    kind = field.annotation
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "{" + ",".join(str(member.value) for member in kind) + "}"
    return "PATH" if is_location_field(field) else generated


def _help(field: FieldInfo) -> str:
    """The description, plus the default where the description does not already say it."""
    text = (field.description or "").strip()
    if field.is_required():
        return f"{text} (required)"
    default = None if field.default_factory is not None else field.default
    if default is None or "default" in text.lower() or isinstance(default, Path | Location) or default == []:
        return text
    shown = default.value if isinstance(default, Enum) else default
    return f"{text} (default: {shown})"


def is_location_field(field: FieldInfo) -> bool:
    """Whether a settings field names a place to read or write: typed :class:`Location` or :class:`Path` (or a
    list of either). Its flag takes a path or a URL, and what it holds is shown redacted."""
    members = annotation_members(field.annotation)
    return any(kind in members for kind in (Location, Path, list[Location], list[Path]))


def annotation_members(annotation: Any) -> tuple[Any, ...]:
    """The types a (possibly Optional, Union or Annotated) annotation admits."""
    if typing.get_origin(annotation) is typing.Annotated:
        return annotation_members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(member for arg in typing.get_args(annotation) for member in annotation_members(arg))
    return (annotation,)
