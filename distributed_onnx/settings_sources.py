"""Where a command's settings come from: one pydantic-settings model, four sources, one precedence.

Each command has one model (:class:`~distributed_onnx.evaluation.settings.BacktestSettings`,
:class:`~distributed_onnx.serve.settings.ServeSettings`, ``export``'s, ``tune``'s, ``fev``'s, ...: ``cli.COMMANDS``
lists them); its fields are the single source of the names, types, bounds, defaults and help, and its positional
arguments are fields too (``CliPositionalArg``). From lowest to highest precedence a value comes from:

1. the field's default;
1b. a tuned settings file (``backtest --tuned tune.json``, written by ``distributed-onnx tune``): its
   ``settings`` mapping, measured on a machine, above the defaults and below everything a user writes;
2. a YAML file (``--config``): keys are the field names (``n_windows``; ``n-windows`` too); relative paths in
   it are read relative to the file's folder, so a config file means the same from any working directory;
3. the environment: ``DISTRIBUTED_ONNX_<FIELD>`` (``DISTRIBUTED_ONNX_N_WINDOWS=45``), case-insensitive,
   lists comma-separated as on the command line;
4. command-line flags (``--n-windows``, help = the field's description: ``settings_flags.py``), or the arguments
   of the Python API or of a Serve config, whichever calls.

pydantic-settings does the work: ``settings_customise_sources`` orders its sources (``EnvSettingsSource``, an
``InitSettingsSource`` for the file) and its ``CliSettingsSource`` makes and parses the flags. Building a model in
Python (``BacktestSettings(output=...)``) reads nothing but its arguments: the environment and the file only
apply through :meth:`CommandSettings.from_sources`, which the commands call. Kept here, as the library does not
do it:

- :func:`read_yaml`, not ``YamlConfigSettingsSource``: that one passes over a missing file silently and lets a
  PyYAML error (several lines) or a top-level list escape as a traceback; here keys may use ``-``, and relative
  paths are resolved against the file's folder (:func:`_relative_to`);
- :func:`_config_error`: one line naming each bad key (a command line's by its flag, as typed), the source it came
  from (flag, variable or file) and for an unknown key the likely one; pydantic's error knows the key, not the
  source.

The flags themselves (their names, help and metavar, and how a message names a setting) are ``settings_flags.py``'s.
"""

from __future__ import annotations

import argparse
import difflib
import numbers
import re
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from distributed_onnx.errors import ConfigError, describe_validation
from distributed_onnx.local_paths import not_a_file
from distributed_onnx.location import Location, LocationLike
from distributed_onnx.settings_flags import annotation_members, flag_name, flags_model, is_location_field

ENV_PREFIX = "DISTRIBUTED_ONNX_"
#: How an integer setting is written, on a command line, in the environment or in a YAML string: digits, a sign.
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
#: The sources :meth:`CommandSettings.from_sources` asks for beyond the arguments (none for direct construction).
_REQUESTED_SOURCES: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar("requested_sources", default=())


class CommandSettings(BaseSettings):
    """Base of a command's settings model: frozen, unknown keys refused, sources as in the module docstring."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        # Environment values reach the validators as the strings a flag would give ("0.1,0.5", "cuda,cpu").
        enable_decoding=False,
        validate_default=False,
        # Every float setting finite, by one rule rather than each field's: NaN fails every bound's comparison, so
        # "--cpus-per-actor nan" was refused as "less than or equal to 4096", and a field without a bound took it.
        allow_inf_nan=False,
    )

    #: What error messages call these settings: "Invalid {label}: ...".
    label: ClassVar[str] = "settings"

    @field_validator("*", mode="before")
    @classmethod
    def _whole_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Every integer setting takes only a whole number written as one, by one rule rather than each field's:
        pydantic's lax mode read ``--port 18523.0`` as 18523 (and ``3.0``, ``1_000``, ``true`` alike) while
        ``--stride 1.5`` was refused, so a float that happened to be whole passed unnoticed. Runs after a field's
        own "before" validators (pydantic runs a base class's last), on what they made of the value."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None or not set(annotation_members(field.annotation)) <= {int, type(None)} or value is None:
            return value
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value.strip()):
            return value
        try:
            near = float(value)
        except (TypeError, ValueError):
            near = 3.0
        example = int(near) if near.is_integer() else 3
        raise ValueError(f"is {value!r}, not a whole number; give one written as digits only (such as {example})")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The arguments first, then what :meth:`from_sources` asked for (nothing else on direct construction)."""
        return (init_settings, *_REQUESTED_SOURCES.get())

    @classmethod
    def from_sources(
        cls,
        flags: Mapping[str, Any] | None = None,
        config_file: LocationLike | None = None,
        *,
        environment: bool = False,
        source: str = "command line",
        tuned: tuple[str, Mapping[str, Any]] | None = None,
        as_flags: bool = False,
    ) -> Self:
        """Flags > ``DISTRIBUTED_ONNX_*`` (when ``environment``) > ``config_file`` > ``tuned`` > defaults.

        ``flags`` that are None count as not given; ``source`` names them in error messages; ``tuned`` is
        ``(file, settings)`` of a tuned settings file (module docstring). ``config_file`` is a local file (a URL is
        refused in one line naming it redacted). ``as_flags``: ``flags`` are a command line's, and an error names
        each bad one as the user typed it (``--parity-windows``, ``CHECKPOINT``).
        """
        config_path = None
        if config_file is not None:
            config_file = Location.parse(config_file)
            config_path = config_file.require_local("--config", "give the YAML file's local path", use="read")
        given = {key.replace("-", "_"): value for key, value in (flags or {}).items() if value is not None}
        requested: list[tuple[str, PydanticBaseSettingsSource]] = []  # highest precedence first
        if environment:
            requested.append(("environment", EnvSettingsSource(cls)))
        if config_path is not None:
            values = _relative_to(read_yaml(config_path), config_path.parent, cls)
            requested.append((str(config_path), InitSettingsSource(cls, values)))
        if tuned is not None:
            requested.append((tuned[0], InitSettingsSource(cls, dict(tuned[1]))))
        token = _REQUESTED_SOURCES.set(tuple(layer for _, layer in requested))
        try:
            return cls(**given)
        except ValidationError as exc:
            layers = [(source, given), *((label, layer()) for label, layer in requested)]
            raise _config_error(cls, exc, layers, config_path, as_flags=as_flags) from exc
        finally:
            _REQUESTED_SOURCES.reset(token)


class CrossKeyError(ValueError):
    """A key's error about its value beside other keys' (``--grpc-port`` the same as ``--port``): the line names
    the source of each of them (:func:`_config_error`), not only the source of the key that failed, since each may
    have come from another (``--grpc-port`` a flag, the port ``DISTRIBUTED_ONNX_PORT``)."""

    def __init__(self, message: str, *, involves: tuple[str, ...]) -> None:
        super().__init__(message)
        self.involves = involves


class _SettingsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's integers: digits and a sign, read in base 10. YAML 1.1's others
    (``010`` octal, ``0x10``, ``1:00`` sexagesimal, ``1_000``) stay strings, which an integer setting refuses as
    a flag's would, rather than a config file's ``n_windows: 010`` silently running 8 windows (an attack found
    each of these planned as YAML 1.1 read it)."""


_SettingsLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_DECIMAL_TAG = "tag:distributed-onnx,2026:decimal"
_SettingsLoader.add_implicit_resolver(_DECIMAL_TAG, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_SettingsLoader.add_constructor(
    _DECIMAL_TAG,
    lambda loader, node: int(str(loader.construct_scalar(node)), 10),  # type: ignore[arg-type]
)


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping of settings (keys with ``-`` read as ``_``), with errors that name the file."""
    if not path.is_file():  # a name too long for the file system raises here: exit 2 (local_paths)
        there = not_a_file(path)
        found = f"Config file not found: {path}" if there is None else f"Config file {path} {there}; give a YAML file"
        raise ConfigError(found, path=str(path))
    try:
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=_SettingsLoader)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8.", path=str(path)
        ) from exc
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


def settings_model(namespace: argparse.Namespace) -> type[CommandSettings]:
    """The command's settings model, whose flags :func:`~distributed_onnx.settings_flags.add_flags` generated
    for the parsed command."""
    model = flags_model(namespace)
    if not issubclass(model, CommandSettings):
        raise TypeError(f"{model.__name__} is not a command's settings model")
    return model


def _relative_to(values: dict[str, Any], folder: Path, model: type[BaseModel]) -> dict[str, Any]:
    """Relative local paths of the file's path- and location-typed fields, read from ``folder`` (URLs stay as
    they are)."""
    resolved = dict(values)
    for name, value in values.items():
        field = model.model_fields.get(name)
        if field is not None and list[Path] in annotation_members(field.annotation):
            # A list field takes one path too (an older config), or several comma-separated, as on the command line.
            paths: Any = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
            paths = [paths] if isinstance(paths, Path) else paths
            if isinstance(paths, list):
                resolved[name] = [_relative_path(each, folder) for each in paths]
            continue
        if field is not None and is_location_field(field):
            resolved[name] = _relative_path(value, folder)
    return resolved


def _relative_path(value: Any, folder: Path) -> Any:
    """``value`` read from ``folder`` when it is a relative local path; a URL or anything else as it is."""
    if not isinstance(value, str | Path | Location):
        return value
    local = Location.parse(value).local_path
    if local is None or local.is_absolute():
        return value
    return Location(folder / local)


def _config_error(
    model: type[CommandSettings],
    exc: ValidationError,
    layers: list[tuple[str, dict[str, Any]]],
    config_file: Path | None,
    *,
    as_flags: bool = False,
) -> ConfigError:
    """One line: each bad key with the source it came from, and for a missing one the three ways to give it.

    ``layers`` are (name, values) of each source, highest precedence first: a key is blamed on the first that has it;
    with ``as_flags`` the first layer is a command line, and a key from it is named by its flag.
    """
    problems = []
    first_key: str | None = None
    config_path: str | None = None
    for error in exc.errors()[:10]:
        key = str(error["loc"][0]) if error.get("loc") else None
        first_key = first_key or key
        origin = next((label for label, values in layers if key in values), None)
        shown = error
        if as_flags and key is not None and key in layers[0][1] and key in model.model_fields:
            shown = {**error, "loc": (flag_name(model, key), *error["loc"][1:])}
        # A rule across settings (a model validator: no key) names its flags itself; a key's error is named by it.
        text = (
            describe_validation([shown], root="settings")
            if key is not None
            else str(error.get("msg", "invalid")).removeprefix("Value error, ")
        )
        if error["type"] == "missing" and key is not None:
            text += f" (give {flag_name(model, key)}, {ENV_PREFIX}{key.upper()} or '{key}:' in --config)"
        elif error["type"] == "extra_forbidden" and key is not None:
            close = difflib.get_close_matches(key, list(model.model_fields), n=1)
            text += f"; did you mean {close[0]!r}?" if close else ""
        if config_file is not None and origin == str(config_file):
            config_path = config_path or origin
        origin = _named_origin(origin, key)
        own = f"from {origin}" if origin else "by default"
        involved = getattr((error.get("ctx") or {}).get("error"), "involves", ())
        others = [  # each other key's source where it is not the same as the key's own (CrossKeyError)
            f"{flag_name(model, other)} {_origin_of(other, layers)}"
            for other in involved
            if _origin_of(other, layers) != own
        ]
        if origin:
            problems.append(f"{text} [{'; '.join([own, *others])}]")
        elif others and key is not None:
            problems.append(f"{text} [{'; '.join([f'{flag_name(model, key)} {own}', *others])}]")
        else:
            problems.append(text)
    message = "; ".join(problems) if first_key is None else f"Invalid {model.label}: {'; '.join(problems)}"
    return ConfigError(message, key=first_key, path=config_path)


def _named_origin(origin: str | None, key: str | None) -> str | None:
    """A layer's name as an error line gives it: the environment by the key's variable."""
    return f"environment {ENV_PREFIX}{key.upper()}" if origin == "environment" and key is not None else origin


def _origin_of(key: str, layers: list[tuple[str, dict[str, Any]]]) -> str:
    """Where ``key``'s value came from, for a line about another key (:class:`CrossKeyError`)."""
    origin = next((label for label, values in layers if key in values), None)
    return f"from {_named_origin(origin, key)}" if origin else "by default"


def comma_list(value: Any) -> Any:
    """A list field from ``a,b`` (a flag, an environment variable); anything else is left to the field's own
    validation (a YAML list, repeated flags). A value given twice is refused: it is a slip (``--covariates
    temp,temp``), and each entry names one thing; so is an empty entry (``0.5,,0.9``, a trailing comma): dropping it
    would run without what the user meant to write there."""
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")]
        if value.strip() and not all(parts):
            raise ValueError(f"{value!r} has an empty entry between commas: give a value in each, or remove the comma")
        value = [part for part in parts if part]
    if isinstance(value, list):
        twice = sorted({str(each) for each in value if value.count(each) > 1})
        if twice:
            raise ValueError(f"{twice} given more than once: give each once")
    return value
