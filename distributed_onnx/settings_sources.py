"""Where a command's settings come from: one pydantic-settings model, four sources, one precedence.

Each command has one model (:class:`~distributed_onnx.evaluation.settings.BacktestSettings`,
:class:`~distributed_onnx.serve.settings.ServeSettings`); its fields are the single source of the names, types,
defaults and help. From lowest to highest precedence a value comes from:

1. the field's default;
2. a YAML file (``--config``): keys are the field names (``n_windows``; ``n-windows`` too); relative paths in
   it are read relative to the file's folder, so a config file means the same from any working directory;
3. the environment: ``DISTRIBUTED_ONNX_<FIELD>`` (``DISTRIBUTED_ONNX_N_WINDOWS=45``), case-insensitive,
   lists comma-separated as on the command line (pydantic-settings' ``EnvSettingsSource``);
4. command-line flags, generated from the fields by :func:`add_flags` (``--n-windows``, help = the field's
   description).

Building a model in Python (``BacktestSettings(output=...)``) reads nothing but its arguments: the
environment and the file only apply through :meth:`CommandSettings.from_sources`, which the commands call.
An invalid value is one line naming each bad key and where it came from (file, variable or flag).
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from distributed_onnx import storage
from distributed_onnx.errors import ConfigError, describe_validation

ENV_PREFIX = "DISTRIBUTED_ONNX_"
#: Where :func:`add_flags` puts parsed flags in the argparse namespace (apart from the command's own options).
FLAG_DEST_PREFIX = "settings."


class CommandSettings(BaseSettings):
    """Base of a command's settings model: frozen, unknown keys refused, sources as in the module docstring."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        # Environment values reach the validators as the strings a flag would give ("0.1,0.5", "cuda,cpu").
        enable_decoding=False,
        validate_default=False,
    )

    #: What error messages call these settings: "Invalid {label}: ...".
    label: ClassVar[str] = "settings"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Direct construction reads only its arguments (see :meth:`from_sources` for the commands' sources)."""
        return (init_settings,)

    @classmethod
    def from_sources(
        cls,
        flags: Mapping[str, Any] | None = None,
        config_file: Path | None = None,
        *,
        environment: bool = False,
        source: str = "command line",
    ) -> Self:
        """Flags > ``DISTRIBUTED_ONNX_*`` (when ``environment``) > ``config_file`` > defaults.

        ``flags`` that are None count as not given; ``source`` names them in error messages.
        """
        layers: list[tuple[str, dict[str, Any]]] = []  # lowest precedence first
        if config_file is not None:
            layers.append((str(config_file), _relative_to(read_yaml(config_file), config_file.parent, cls)))
        if environment:
            layers.append(("environment", _environment(cls)))
        given = {key.replace("-", "_"): value for key, value in (flags or {}).items() if value is not None}
        layers.append((source, given))
        values: dict[str, Any] = {}
        for _, layer in layers:
            values.update(layer)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise _config_error(cls, exc, layers) from exc


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping of settings (keys with ``-`` read as ``_``), with errors that name the file."""
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}", path=str(path))
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())  # PyYAML's message spans lines: keep the CLI's one line
        raise ConfigError(f"Config file {path} is not valid YAML: {problem}", path=str(path)) from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(
            f"Config file {path} must hold a mapping of settings, found {type(document).__name__}", path=str(path)
        )
    return {str(key).replace("-", "_"): value for key, value in document.items()}


def add_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One ``--flag`` per field of ``model``: kebab-case name, the field's description as help.

    Values stay strings for pydantic to validate (so a bad flag reads like a bad YAML value); booleans get
    ``--x/--no-x``. Flags not given are absent from the namespace (see :func:`given_flags`).
    """
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        options: dict[str, Any] = {"dest": FLAG_DEST_PREFIX + name, "default": argparse.SUPPRESS}
        options["help"] = _help(field).replace("%", "%%")
        if _inner(field.annotation) is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **options)
        elif isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("repeatable"):
            parser.add_argument(flag, action="append", metavar=_metavar(name, field), **options)
        else:
            parser.add_argument(flag, metavar=_metavar(name, field), **options)


def given_flags(namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings flags :func:`add_flags` parsed, by field name."""
    return {
        dest.removeprefix(FLAG_DEST_PREFIX): value
        for dest, value in vars(namespace).items()
        if dest.startswith(FLAG_DEST_PREFIX)
    }


def _environment(model: type[BaseSettings]) -> dict[str, Any]:
    return {key: value for key, value in EnvSettingsSource(model, case_sensitive=False)().items()}


def _relative_to(values: dict[str, Any], folder: Path, model: type[BaseModel]) -> dict[str, Any]:
    """Relative local paths of the file's path-typed fields, read from ``folder`` (URLs stay as they are)."""
    resolved = dict(values)
    for name, value in values.items():
        field = model.model_fields.get(name)
        if field is not None and list[Path] in _members(field.annotation):
            # A list field takes one path too (an older config), or several comma-separated, as on the command line.
            paths: Any = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
            paths = [paths] if isinstance(paths, Path) else paths
            if isinstance(paths, list):
                resolved[name] = [_relative_path(each, folder) for each in paths]
            continue
        if field is None or Path not in _members(field.annotation) or not isinstance(value, str | Path):
            continue
        if storage.is_url(str(value)) or Path(value).is_absolute():
            continue
        resolved[name] = folder / Path(value)
    return resolved


def _relative_path(value: Any, folder: Path) -> Any:
    if not isinstance(value, str | Path) or storage.is_url(str(value)) or Path(value).is_absolute():
        return value
    return folder / Path(value)


def _config_error(
    model: type[CommandSettings], exc: ValidationError, layers: list[tuple[str, dict[str, Any]]]
) -> ConfigError:
    """One line: each bad key with the source it came from, and for a missing one the three ways to give it."""
    problems = []
    first_key: str | None = None
    config_path: str | None = None
    for error in exc.errors()[:10]:
        key = str(error["loc"][0]) if error.get("loc") else None
        first_key = first_key or key
        origin = next((label for label, layer in reversed(layers) if key in layer), None)
        text = describe_validation([error], root="settings")
        if error["type"] == "missing" and key is not None:
            text += f" (give --{key.replace('_', '-')}, {ENV_PREFIX}{key.upper()} or '{key}:' in --config)"
        elif error["type"] == "extra_forbidden" and key is not None:
            close = difflib.get_close_matches(key, list(model.model_fields), n=1)
            text += f"; did you mean {close[0]!r}?" if close else ""
        if origin == "environment" and key is not None:
            origin = f"environment {ENV_PREFIX}{key.upper()}"
        elif origin is not None and origin.endswith((".yaml", ".yml")):
            config_path = config_path or origin
        problems.append(f"{text} [from {origin}]" if origin else text)
    message = f"Invalid {model.label}: {'; '.join(problems)}"
    return ConfigError(message, key=first_key, path=config_path)


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types a (possibly Optional, Union or Annotated) annotation admits."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(member for arg in typing.get_args(annotation) for member in _members(arg))
    return (annotation,)


def _inner(annotation: Any) -> Any:
    """The one non-None type of an annotation, or the annotation itself when it admits several."""
    members = [member for member in _members(annotation) if member is not type(None)]
    return members[0] if len(members) == 1 else annotation


def _metavar(name: str, field: FieldInfo) -> str:
    if field.examples:
        return str(field.examples[0])
    kind = _inner(field.annotation)
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return "{" + ",".join(str(choice) for choice in typing.get_args(kind)) + "}"
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "{" + ",".join(str(member.value) for member in kind) + "}"
    if origin is list:
        return "A,B"
    if Path in _members(field.annotation):
        return "PATH"
    names = {int: "N", float: "X", datetime: "TIMESTAMP"}
    return names.get(kind, name.upper())


def _help(field: FieldInfo) -> str:
    """The description, plus the default where the description does not already say it."""
    text = (field.description or "").strip()
    if field.is_required():
        return f"{text} (required)"
    default = None if field.default_factory is not None else field.default
    if default is None or "default" in text.lower() or isinstance(default, Path) or default == []:
        return text
    shown = default.value if isinstance(default, Enum) else default
    return f"{text} (default: {shown})"
