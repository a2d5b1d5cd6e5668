"""The model families, each declared once: built in (:data:`BUILT_IN`) or by an installed plugin's entry point.

A :class:`Family` record is all the package knows about a family: its adapter, its exporter, its published
weights, how to build it with random weights, its :class:`FamilyRules` and which int8 quantizations its graphs take
(:class:`Int8`). The adapters, the exporters,
``export``'s help and ``inspect`` read these records, so adding a family is one entry in :data:`BUILT_IN` (plus its
adapter and exporter modules). Code is named here, never imported: listing the families costs nothing, and the
backtest never imports torch or the export package through this module.

A plugin is an entry point of the group :data:`PLUGIN_GROUP` whose name is the family and whose object is its
adapter's factory (a callable taking the checkpoint's metadata) or a whole :class:`Family` (to bring an exporter).
Plugins are listed by name unloaded, and loaded the first time their family is looked up, in whatever process
looks (the driver, every actor, every Serve replica), so a plugin installed on the nodes reaches all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib import metadata as importlib_metadata
from typing import Any

from pydantic import BaseModel, ConfigDict

from distributed_onnx.errors import ConfigError, PluginError
from distributed_onnx.model.checkpoint import LongHorizon, MissingValue, OutputLayout, QuantizeMode, ShortHorizon

#: The entry-point group of model-family plugins: ``family name = "module:factory"`` (or ``"module:FAMILY"``).
PLUGIN_GROUP = "distributed_onnx.model_families"


class FamilyRules(BaseModel):
    """Where families' tensor contracts differ, declared once: the exporter writes these into the metadata and the
    adapter refuses metadata that breaks them."""

    model_config = ConfigDict(frozen=True)

    #: What ``missing_value: null`` means: 'nan' (the graph derives its mask from NaN) or 'zero' (0.0, plus a mask
    #: input where the family has one); None: the adapter reads it from the checkpoint (Chronos-2: by variant).
    missing_value: MissingValue | None
    #: The settings its graphs can take: a graph deriving its mask from NaN would read a zero as an observed 0.
    missing_values: frozenset[MissingValue] = frozenset({"zero", "nan"})
    output_layout: OutputLayout = "quantile_step"
    long_horizon: LongHorizon = "refuse"
    #: What ``short_horizon: null`` means: how a horizon shorter than one call is reached
    #: (``distributed_onnx/model/horizons.py``). 'first_steps' where each forecast step is the same whatever horizon
    #: upstream is asked (checked against upstream's own code for Moirai 2 and TimesFM: a shorter prediction length
    #: is the first steps of a longer one to float32 rounding; Chronos-Bolt, TiRex and Toto compute whole calls and
    #: cut them, as the graph does).
    short_horizon: ShortHorizon = "first_steps"

    def metadata_fields(self) -> dict[str, Any]:
        """The metadata fields an exporter of the family writes: ``CheckpointMetadata(**rules.metadata_fields())``."""
        return self.model_dump(include={"missing_value", "output_layout", "long_horizon", "short_horizon"})


#: The plain family's rules: no mask in the graph, so missing values zero-filled unless its metadata says 'nan'.
_PLAIN = FamilyRules(missing_value="zero")


class Int8(BaseModel):
    """Which of ONNX Runtime's int8 quantizations (``export --quantize int8 --quantize-mode``) the family's graphs
    take. A mode is listed once it was tried on the family's tiny random-weight export: the graph quantized, the
    variant ran, and its forecasts stayed within :data:`~distributed_onnx.export.variants.VARIANT_TOLERANCE` of its
    parent's (``benchmarks/int8_families.py``; the tests keep exporting each family's variant:
    ``tests/test_nan_families.py``, ``tests/test_chronos2_pipeline.py``). ``export`` refuses any other mode before
    building anything, with ``why_not``. Whether a variant's accuracy holds on a user's data is not decided here: a
    backtest of both says so, and ``tune`` chooses (docs/comparisons.md)."""

    model_config = ConfigDict(frozen=True)

    modes: tuple[QuantizeMode, ...] = ()
    #: What ``export`` says when refusing a mode not in ``modes``.
    why_not: str = (
        "its family record declares no int8 quantization tried on its graphs (Family.int8 in "
        "distributed_onnx/model/families.py, or the plugin's record)"
    )


#: Both modes: dynamic and static quantization tried on the family's tiny export (:class:`Int8`).
_INT8_BOTH = Int8(modes=("dynamic", "static"))


class Family(BaseModel):
    """One model family: its code by ``"module:attribute"`` name (imported when used) and its rules."""

    model_config = ConfigDict(frozen=True)

    name: str  #: the metadata's model_family
    adapter: str  #: its adapter's factory, called with the checkpoint's metadata
    rules: FamilyRules = _PLAIN  #: its tensor contract; the plain family's unless it says otherwise
    exporter: str | None = None  #: the module whose export(request) exports it; None: not exportable
    int8: Int8 = Int8()  #: the int8 quantizations export --quantize gives it; none unless it says so
    random_weights: str | None = None  #: (directory, size, seed) -> a pretrained folder with random weights
    hub_repository: str | None = None  #: where its published weights are (never downloaded here)
    provider: str = "distributed-onnx"  #: the distribution that provides it


_NAN: frozenset[MissingValue] = frozenset({"nan"})
_ADAPTERS, _EXPORTERS = "distributed_onnx.model.adapters", "distributed_onnx.export"
_RANDOM = f"{_EXPORTERS}.random_weights"

BUILT_IN: tuple[Family, ...] = (
    Family(
        name="chronos2",
        adapter=f"{_ADAPTERS}.chronos2:Chronos2Adapter",
        # Missing values by variant: OpenSTEF's zero-filled and masked, upstream's NaN. Its output patches attend to
        # each other, so a graph of more patches cut to a horizon is not upstream's forecast for it: a graph that
        # does not say otherwise (this package's exports take the patch count from the future's width) refuses one.
        rules=FamilyRules(missing_value=None, short_horizon="refuse"),
        exporter=f"{_EXPORTERS}.chronos2",
        int8=_INT8_BOTH,
        random_weights=f"{_RANDOM}:write_chronos2",
        hub_repository="amazon/chronos-2",
    ),
    Family(
        # Its encoder masks NaN and its InstanceNorm scales by the non-NaN mean and spread: a zero would be observed.
        name="chronos_bolt",
        adapter=f"{_ADAPTERS}.context_quantiles:ContextQuantilesAdapter",
        rules=FamilyRules(missing_value="nan", missing_values=_NAN, long_horizon="quantile_paths"),
        exporter=f"{_EXPORTERS}.chronos_bolt",
        int8=_INT8_BOTH,
        random_weights=f"{_RANDOM}:write_chronos_bolt",
        hub_repository="amazon/chronos-bolt-small",
    ),
    Family(
        name="context_quantiles",
        adapter=f"{_ADAPTERS}.context_quantiles:ContextQuantilesAdapter",
        rules=_PLAIN,
    ),
    Family(
        # Its tokenizer scales by the non-NaN mean and spread and feeds a NaN mask: a zero would be observed.
        name="tirex",
        adapter=f"{_ADAPTERS}.context_quantiles:ContextQuantilesAdapter",
        rules=FamilyRules(
            missing_value="nan", missing_values=_NAN, output_layout="step_quantile", long_horizon="append_missing"
        ),
        exporter=f"{_EXPORTERS}.tirex",
        int8=_INT8_BOTH,
        random_weights=f"{_RANDOM}:write_tirex",
        hub_repository="NX-AI/TiRex",
    ),
    Family(
        # Its graph holds all of upstream's forecast (leading NaN masked, inner NaN interpolated, normalization, flip
        # invariance, the decode up to the exported horizon): a zero would be an observed 0. Beyond it: export again.
        name="timesfm",
        adapter=f"{_ADAPTERS}.context_quantiles:ContextQuantilesAdapter",
        rules=FamilyRules(missing_value="nan", missing_values=_NAN, output_layout="step_quantile"),
        exporter=f"{_EXPORTERS}.timesfm",
        int8=_INT8_BOTH,
        random_weights=f"{_RANDOM}:write_timesfm",
        hub_repository="google/timesfm-2.5-200m-pytorch",
    ),
    Family(
        # Its forecast marks a NaN unobserved before imputing it: a zero would be observed. Horizons beyond one
        # call grow the context (upstream's rule) inside the graph, up to the horizon it was exported for.
        name="moirai2",
        adapter=f"{_ADAPTERS}.context_quantiles:ContextQuantilesAdapter",
        rules=FamilyRules(missing_value="nan", missing_values=_NAN),
        exporter=f"{_EXPORTERS}.moirai2",
        int8=_INT8_BOTH,
        random_weights=f"{_RANDOM}:write_moirai2",
        hub_repository="Salesforce/moirai-2.0-R-small",
    ),
    Family(
        # Its graph turns a NaN into upstream's padding mask (0.0, not a value): a zero would be observed. It emits
        # a Student-t mixture per step, whose quantiles the adapter computes; beyond one call upstream samples.
        name="toto",
        adapter=f"{_ADAPTERS}.toto:TotoAdapter",
        rules=FamilyRules(missing_value="nan", missing_values=_NAN, output_layout="step_quantile"),
        exporter=f"{_EXPORTERS}.toto",
        int8=_INT8_BOTH,
        random_weights=f"{_RANDOM}:write_toto",
        hub_repository="Datadog/Toto-Open-Base-1.0",
    ),
)
_BUILT_IN = {family.name: family for family in BUILT_IN}
#: Built-in families already checked for a plugin claiming their name (once per process: it reads the venv).
_SHADOW_CHECKED: set[str] = set()
#: Plugin families loaded in this process, and adapter factories imported, by family.
_LOADED: dict[str, Family] = {}
_FACTORIES: dict[str, Any] = {}


def rules_of(name: str) -> FamilyRules:
    """The rules of the family ``name`` (built in, or a loaded plugin's); the plain family's for any other."""
    return (_BUILT_IN.get(name) or _LOADED.get(name) or _BUILT_IN["context_quantiles"]).rules


def plugin_names() -> dict[str, str]:
    """The installed plugin families, not loaded: name -> the distribution declaring it."""
    return {entry.name: _distribution(entry) for entry in _plugins()}


def names() -> dict[str, str]:
    """Every family this environment has, built-ins first, plugins not loaded: name -> who provides it."""
    return {**{family.name: family.provider for family in BUILT_IN}, **plugin_names()}


def family(name: str, *, registered: Sequence[str] = ()) -> Family:
    """The family ``name``: built in (refused if a plugin claims the name too) or an installed plugin's, loaded.

    Raises :class:`ConfigError` when nobody declares it (listing the families, ``registered`` ones included: known in
    this process by ``register_adapter``), :class:`PluginError` when its plugin fails to load or is unusable.
    """
    if name in _BUILT_IN:
        refuse_shadowing_plugin(name)
        return _BUILT_IN[name]
    found = _LOADED.get(name) or _load_plugin(name)
    if found is None:
        raise ConfigError(
            f"No adapter for model_family {name!r}; known families: {sorted({*_BUILT_IN, *registered})}, installed "
            f"plugins: {sorted(plugin_names())}. Install the package that provides it on every node (it declares "
            f"the family under the entry-point group {PLUGIN_GROUP!r}: docs/plugins.md); register_adapter reaches "
            "only the process that calls it, not Ray's actors or Serve's replicas.",
            model_family=name,
        )
    return found


def describe(name: str) -> dict[str, Any]:
    """``inspect``'s view of a checkpoint's family: its record, or why it is unknown here and which families are."""
    try:
        return {"known": True, **family(name).model_dump(mode="json")}
    except (ConfigError, PluginError) as exc:
        return {"name": name, "known": False, "problem": str(exc), "families": names()}


def adapter_factory(declared: Family) -> Any:
    """The family's adapter factory, imported once per process."""
    if declared.name not in _FACTORIES:
        _FACTORIES[declared.name] = load_object(declared.adapter, declared)
    return _FACTORIES[declared.name]


def load_object(path: str, declared: Family, *, record: bool = False) -> Any:
    """The callable ``"module:attribute"`` names (or, with ``record``, a :class:`Family`); a failure to import it
    or anything else is a :class:`PluginError` naming the family and where it comes from."""
    module, _, attribute = path.partition(":")
    try:
        loaded: Any = importlib.import_module(module)
        for part in attribute.split(".") if attribute else ():
            loaded = getattr(loaded, part)
    except (Exception, SystemExit) as exc:  # a plugin that exits at import must not take the worker with it
        raise _plugin_error(
            declared, path, f"failed to load: {type(exc).__name__}: {exc}; fix or reinstall it"
        ) from exc
    if not callable(loaded) and not (record and isinstance(loaded, Family)):
        raise _plugin_error(declared, path, f"is a {type(loaded).__name__}, not {_WANTED}")
    return loaded


def refuse_shadowing_plugin(name: str) -> None:
    """A plugin declaring a family this process already has (``chronos2``) would be ignored without a word: refuse
    it, naming the plugin, so its author renames the family (every time, not only the first)."""
    if name in _SHADOW_CHECKED:
        return
    for entry in _plugins():
        if entry.name == name:
            raise PluginError(
                f"The plugin {entry.value!r} (from {_distribution(entry)}) declares model_family {name!r}, which "
                f"distributed_onnx already provides: it would never be used. Give the plugin's family another name "
                f"(its entry point in the group {PLUGIN_GROUP!r}) or uninstall {_distribution(entry)}.",
                model_family=name,
                plugin=entry.value,
            )
    _SHADOW_CHECKED.add(name)


def _load_plugin(name: str) -> Family | None:
    """The family an installed plugin declares as ``name`` (loaded once per process); None if none does."""
    importlib.invalidate_caches()  # a package installed while this process runs is found too
    entry = next((entry for entry in _plugins() if entry.name == name), None)
    if entry is None:
        return None
    declared = Family(name=name, adapter=entry.value, provider=_distribution(entry))
    loaded = load_object(entry.value, declared, record=True)
    if not isinstance(loaded, Family):
        _FACTORIES[name] = loaded
    elif loaded.name == name:
        declared = loaded.model_copy(update={"provider": declared.provider})
    else:
        raise _plugin_error(declared, entry.value, f"is the Family {loaded.name!r}, not {name!r}: name both alike")
    _LOADED[name] = declared
    return declared


#: What a plugin's entry point must name.
_WANTED = "the adapter's factory (a callable taking the checkpoint's metadata) or a families.Family record"


def _plugin_error(declared: Family, path: str, what: str) -> PluginError:
    return PluginError(
        f"The plugin for model_family {declared.name!r} ({path!r}, from {declared.provider}) {what}.",
        model_family=declared.name,
        plugin=path,
    )


def _plugins() -> list[importlib_metadata.EntryPoint]:
    return list(importlib_metadata.entry_points(group=PLUGIN_GROUP))


def _distribution(entry: importlib_metadata.EntryPoint) -> str:
    return entry.dist.name if entry.dist is not None else "an unknown distribution"
