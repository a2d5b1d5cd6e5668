"""The report's figures, drawn by matplotlib and returned as inline SVG text (no pyplot, no global state).

matplotlib renders axes, ticks, date labels and legends that a hand-written SVG would have to reimplement;
SVG keeps the page self-contained and sharp at any zoom. Text stays text (``svg.fonttype: none``): the
files are smaller and a reader can search them, and so can the report's test. Element ids are salted
deterministically, so the same run draws the same bytes.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

MODEL_COLOR = "#1f5fa8"
NAIVE_COLOR = "#c0392b"
ACTUAL_COLOR = "#111111"
CLAMPED_COLOR = "#b9770e"
ORIGIN_COLOR = "#666666"
#: At most this many horizons of history are drawn before the origin: three left the forecast a quarter of the
#: width; one gives it half.
HISTORY_HORIZONS = 1
HISTORY_COLOR = "#8a8a8a"
#: The line styles of the skill curves by lead, one per metric in turn (the first solid, as the primary's).
SKILL_STYLES = ("-", "--", ":", "-.")
_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "distributed-onnx-report",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "timezone": "UTC",
}


#: A model is drawn off the scale when keeping it would stretch the axis to more than this many times the span of
#: everything else (a model off by 100x flattened every other curve into a line at 0).
OFF_SCALE_FACTOR = 5.0
OFF_SCALE_COLOR = "#a61b1b"


@dataclass(frozen=True)
class Scale:
    """The y limits a figure draws, and the models left off them (named on the figure and beside it)."""

    low: float
    high: float
    off: tuple[str, ...] = ()

    def note(self) -> str:
        """The sentence that names the models off the scale ("" when none is)."""
        if not self.off:
            return ""
        return f"off the scale: {', '.join(self.off)} (the axis shows the other models)"


def _span(values: Sequence[np.ndarray]) -> tuple[float, float] | None:
    finite = [v[np.isfinite(v)] for v in (np.asarray(x, float).ravel() for x in values)]
    finite = [v for v in finite if v.size]
    if not finite:
        return None
    return min(float(v.min()) for v in finite), max(float(v.max()) for v in finite)


def robust_scale(anchors: Sequence[np.ndarray], curves: Mapping[str, Sequence[np.ndarray]]) -> Scale:
    """Y limits that every ``anchors`` value and every model's ``curves`` fit, except the models far off.

    A model is left off (the worst first, one at a time) while keeping it would stretch the span of the anchors and
    the other models more than :data:`OFF_SCALE_FACTOR` times; the last model is never left off. Deterministic and
    free of quantiles, so it holds with two models as with eight. The limits get a 5% margin.
    """
    kept = {name: list(values) for name, values in curves.items() if _span(list(values)) is not None}
    off: list[str] = []
    while len(kept) > 1:
        whole = _span([*anchors, *(v for values in kept.values() for v in values)])
        assert whole is not None
        stretch = {}
        for name in kept:
            rest = _span([*anchors, *(v for other, values in kept.items() if other != name for v in values)])
            if rest is None or rest[1] <= rest[0]:
                continue
            stretch[name] = (whole[1] - whole[0]) / (rest[1] - rest[0])
        worst = max(stretch, key=lambda name: stretch[name], default=None)
        if worst is None or stretch[worst] <= OFF_SCALE_FACTOR:
            break
        off.append(worst)
        del kept[worst]
    span = _span([*anchors, *(v for values in kept.values() for v in values)]) or (0.0, 1.0)
    margin = 0.05 * (span[1] - span[0]) or 0.5 * abs(span[0]) or 1.0
    return Scale(span[0] - margin, span[1] + margin, tuple(off))


def mark_off_scale(axis: Axes, scale: Scale) -> None:
    """Name the models off the scale on the figure: above the axes, right (the title is left), never on a curve."""
    if scale.off:
        axis.text(1.0, 1.02, scale.note(), transform=axis.transAxes, ha="right", va="bottom", fontsize=8,
                  color=OFF_SCALE_COLOR)  # fmt: skip


def legend_below(entries: int, axes_height_in: float, ncols: int = 4) -> tuple[float, float, float]:
    """The figure's height and bottom margin (inches) and the legend's anchor (in axes heights) for a legend of
    ``entries`` under axes ``axes_height_in`` tall: the margin grows with the legend's rows (a fixed one cut the
    third row of 8 models off)."""
    bottom_in = 0.55 + 0.2 * max(1, -(-entries // ncols))
    return axes_height_in + 0.32 + bottom_in, bottom_in, -0.5 / axes_height_in


def _compact(value: float, _position: object = None) -> str:
    """A tick label of at most 5 characters: 32k, 1.5M; no offset or exponent text apart from the ticks."""
    magnitude = abs(value)
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= size:
            return f"{value / size:.4g}{suffix}"
    return f"{value:.4g}"


COMPACT = FuncFormatter(_compact)


@dataclass(frozen=True)
class Fan:
    """What one fan figure draws: the window's arrays and its texts (see report.FanWindow)."""

    title: str
    origin_us: int
    step_us: int
    history: np.ndarray
    actual: np.ndarray
    bands: Sequence[tuple[float, float, np.ndarray, np.ndarray, bool]]  # (lower q, upper q, low, high, clamped)
    median: np.ndarray | None
    #: The run's other models on the same window: (name, median [H]), drawn as lines over the fan.
    others: Sequence[tuple[str, np.ndarray]] = ()
    #: The model whose fan (bands and median) this is: named when its fan is off the scale.
    model: str = "model"


def _drawn_history(window: Fan) -> np.ndarray:
    return window.history[-HISTORY_HORIZONS * max(window.actual.shape[0], 1) :]


def fan_scale(window: Fan) -> Scale:
    """The fan's y limits: the history and actuals drawn, and every model's forecast except those far off."""
    curves: dict[str, list[np.ndarray]] = {
        window.model: [*(band[2] for band in window.bands), *(band[3] for band in window.bands)]
        + ([] if window.median is None else [window.median])
    }
    for name, values in window.others:
        curves.setdefault(name, []).append(values)
    return robust_scale([_drawn_history(window), window.actual], curves)


def _svg(figure: Figure) -> str:
    buffer = io.StringIO()
    with rc_context(_RC):
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML declaration and DOCTYPE: the SVG is inlined in HTML


def _figure(
    width_in: float,
    height_in: float,
    columns: int = 1,
    *,
    bottom_in: float = 0.5,
    gap_in: float = 0.8,
    top_in: float = 0.32,
    left_in: float = 0.75,
) -> tuple[Figure, list[Axes]]:
    """A figure with fixed margins (in inches: room for tick labels, axis labels, titles and a bottom legend).

    Fixed, not matplotlib's constrained layout or a tight bounding box: those re-measure every text element
    several times, which more than doubled the report's CPU.
    """
    right_in = 0.15
    with rc_context(_RC):
        figure = Figure(figsize=(width_in, height_in))
        axes = figure.subplots(1, columns, squeeze=False)[0]
        plot_width = (width_in - left_in - right_in - gap_in * (columns - 1)) / columns
        figure.subplots_adjust(
            left=left_in / width_in,
            right=1 - right_in / width_in,
            top=1 - top_in / height_in,
            bottom=bottom_in / height_in,
            wspace=gap_in / plot_width if columns > 1 else 0.0,
        )
    return figure, list(axes)


def _times(start_us: int, step_us: int, count: int) -> np.ndarray:
    return (start_us + step_us * np.arange(count, dtype=np.int64)).astype("datetime64[us]")


def warm_up() -> None:
    """Draw a small dated figure and discard it: matplotlib's first figure pays for loading its font and its
    date machinery (~0.2 s, ``benchmarks/results/time_to_results.md``), so the report process pays it during the
    dispatch (``evaluation/driver/report_process.py``) instead of at the end of the run."""
    fan(Fan("", 0, 3_600_000_000, np.zeros(2), np.zeros(2), [(0.1, 0.9, np.zeros(2), np.ones(2), False)], None))


@dataclass(frozen=True)
class LegendEntry:
    """One entry of a fan's legend, drawn in HTML beside the figure (see :class:`FanCanvas`)."""

    label: str
    color: str
    kind: Literal["band", "line", "dashed", "dotted"] = "line"  # a band is a filled swatch at ``alpha``
    alpha: float = 1.0


def _band_style(lower: float, clamped: bool, widest: float) -> tuple[str, float]:
    """A central interval's colour and alpha: the widest palest; clamped levels in their own colour."""
    nominal = 1 - 2 * lower
    return CLAMPED_COLOR if clamped else MODEL_COLOR, 0.12 + 0.35 * (1 - nominal / widest) if widest > 0 else 0.3


def fan_legend(window: Fan) -> list[LegendEntry]:
    """What :meth:`FanCanvas.draw` draws for ``window``, in drawing order, with the colours it uses; a model off
    the scale (:func:`fan_scale`) says so in its entry."""
    widest = max((1 - 2 * lower for lower, *_ in window.bands), default=1.0)
    off = set(fan_scale(window).off)
    entries = []
    mark = " (off the scale)" if window.model in off else ""
    for lower, upper, _, _, clamped in window.bands:
        color, alpha = _band_style(lower, clamped, widest)
        label = f"{1 - 2 * lower:.0%} interval (q{lower:g}-q{upper:g})" + (", clamped" if clamped else "")
        entries.append(LegendEntry(label + mark, color, "band", alpha))
    if window.median is not None:
        entries.append(LegendEntry("median forecast" + mark, MODEL_COLOR))
    palette = colormaps["tab10"]
    for index, (name, _) in enumerate(window.others):
        label = f"{name} median" + (" (off the scale)" if name in off else "")
        entries.append(LegendEntry(label, to_hex(palette((index + 1) % 10)), "dashed"))
    entries.append(LegendEntry("history", HISTORY_COLOR))
    entries.append(LegendEntry("actual (dots)", ACTUAL_COLOR, "dotted"))
    entries.append(LegendEntry("forecast origin", ORIGIN_COLOR, "dashed"))
    return entries


class FanCanvas:
    """One figure that draws the report's fans one after another: history, actuals, central intervals (widest
    palest) and the median of a window, on a UTC time axis.

    Each fan is drawn on the same axes, cleared of the previous fan's data, and its title and legend are HTML
    beside the figure (:func:`fan_legend`): a fresh figure per fan rebuilt its axes' ticks, and a title and a
    legend inside the SVG cost a text-layout pass each (``benchmarks/fan_drawing.py``, results in
    ``benchmarks/results/time_to_results.md``). The bytes stay deterministic: the same fans in the same
    order draw the same SVG.
    """

    def __init__(self) -> None:
        with rc_context(_RC):
            # The left margin holds compact tick labels (32k, 1.5M) and the y label whole.
            self.figure, (self.axis,) = _figure(5.6, 2.9, bottom_in=0.55, top_in=0.12, left_in=0.85)
            self.axis.set_xlabel("time (UTC)")
            self.axis.set_ylabel("y (units of the data)")
            self.axis.yaxis.set_major_formatter(COMPACT)
            self.note = self.axis.text(0.01, 0.97, "", transform=self.axis.transAxes, ha="left", va="top",
                                       fontsize=7.5, color=OFF_SCALE_COLOR, zorder=10,
                                       bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8})  # fmt: skip
            locator = AutoDateLocator()  # type: ignore[no-untyped-call]
            self.axis.xaxis.set_major_locator(locator)
            self.axis.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]

    def draw(self, window: Fan) -> str:
        """``window``'s fan as inline SVG; its title (``window.title``) and legend (:func:`fan_legend`) are the
        caller's to place."""
        axis = self.axis
        with rc_context(_RC):
            for artist in [*axis.lines, *axis.collections]:
                artist.remove()
            axis.relim()  # data limits of no data: the new fan's artists set them afresh
            horizon = window.actual.shape[0]
            history = _drawn_history(window)
            past = _times(window.origin_us - history.shape[0] * window.step_us, window.step_us, history.shape[0])
            future = _times(window.origin_us, window.step_us, horizon)
            widest = max((1 - 2 * lower for lower, *_ in window.bands), default=1.0)
            for lower, _, low, high, clamped in window.bands:
                color, alpha = _band_style(lower, clamped, widest)
                axis.fill_between(future, low, high, color=color, alpha=alpha, lw=0)
            if window.median is not None:
                axis.plot(future, window.median, color=MODEL_COLOR, lw=2.0, zorder=3)
            palette = colormaps["tab10"]
            for index, (_, values) in enumerate(window.others):
                axis.plot(future, values, color=palette((index + 1) % 10), lw=1.1, ls="--")
            # History grey, the actuals black dots over the horizon, the median a thick blue line: three marks
            # that cannot be taken for one another (a thin black line through the median read as one).
            axis.plot(past, history, color=HISTORY_COLOR, lw=1.0)
            axis.plot(future, window.actual, color=ACTUAL_COLOR, lw=0, marker="o", ms=2.2, zorder=4)
            axis.axvline(future[0] if horizon else past[-1], color=ORIGIN_COLOR, ls="--", lw=0.8)
            axis.autoscale_view(scaley=False)
            scale = fan_scale(window)
            axis.set_ylim(scale.low, scale.high)
            self.note.set_text(scale.note())
        return _svg(self.figure)


def fan(window: Fan) -> str:
    """One fan on a figure of its own (:class:`FanCanvas` draws many on one)."""
    return FanCanvas().draw(window)


def skill_by_lead(
    leads: np.ndarray,
    model: Mapping[str, np.ndarray],
    naive: Mapping[str, np.ndarray],
    model_name: str,
    lead_label: str,
    *,
    scored: str,
    skills: Sequence[tuple[str, np.ndarray | None]],
) -> str:
    """Left: ``scored`` by lead, model against seasonal naive. Right: skill 1 - model/naive by lead of each of
    ``skills`` (the report passes the registry's choice, the primary metric then the headline skill metrics, each
    with its skill by lead, None where the model or the naive has no value: its line style stays reserved)."""
    label = scored.upper()
    with rc_context(_RC):
        figure, (scores, skill) = _figure(10.5, 3.7, columns=2, bottom_in=1.0)
        if scored in model:
            scores.plot(leads, model[scored], color=MODEL_COLOR, lw=1.6, label=model_name)
        if scored in naive:
            scores.plot(leads, naive[scored], color=NAIVE_COLOR, lw=1.6, label="seasonal naive")
        scores.set_ylim(bottom=0)
        scores.set_xlabel(lead_label)
        scores.set_ylabel(f"{label} (lower is better)")
        scores.set_title(f"{label} by lead", loc="left")
        below = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (0.0, -0.22), "ncols": 3, "frameon": False}
        scores.legend(**below)  # below the axes: a legend inside them sat on a curve
        for (metric, ratio), style in zip(skills, itertools.cycle(SKILL_STYLES)):
            if ratio is not None:
                skill.plot(leads, ratio, color=MODEL_COLOR, ls=style, lw=1.6, label=f"{metric.upper()} skill")
        skill.axhline(0, color=NAIVE_COLOR, lw=1, label="seasonal naive (skill 0)")
        skill.set_ylim(top=1)
        skill.set_xlabel(lead_label)
        skill.set_ylabel("skill = 1 - model / naive")
        skill.set_title("Skill against seasonal naive (higher is better, 1 = perfect)", loc="left")
        skill.legend(**below)
    return _svg(figure)


def skill_by_lead_every_model(
    leads: np.ndarray, skills: Mapping[str, tuple[int, np.ndarray]], metric: str, lead_label: str
) -> tuple[str, Scale]:
    """``metric``'s skill against seasonal naive by lead, one line per model (``skills``: its colour index and
    curve), and the scale drawn: a model far off (skill -370) would flatten every other curve, so it is left off
    the scale and named."""
    palette = colormaps["tab10"]
    scale = robust_scale([np.array([0.0, 1.0])], {model: [skill] for model, (_, skill) in skills.items()})
    with rc_context(_RC):
        height_in, bottom_in, anchor = legend_below(len(skills) + 1, 2.58)
        figure, (axis,) = _figure(10.5, height_in, bottom_in=bottom_in)
        for model, (index, skill) in skills.items():
            label = model + (" (off the scale)" if model in scale.off else "")
            axis.plot(leads, skill, color=palette(index % 10), lw=1.5, label=label)
        axis.axhline(0, color=NAIVE_COLOR, lw=1, label="seasonal naive (skill 0)")
        axis.set_ylim(scale.low, 1)
        mark_off_scale(axis, scale)
        axis.set_xlabel(lead_label)
        axis.set_ylabel(f"1 - {metric.upper()} / naive {metric.upper()}")
        axis.set_title(f"{metric.upper()} skill by lead, every model (pooled; higher is better)", loc="left")
        # Below the axes, never on a curve: the legend's place does not depend on the data.
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, anchor), ncols=4, frameon=False)
    return _svg(figure), scale


def calibration(
    nominal: np.ndarray,
    empirical: np.ndarray,
    clamped: np.ndarray,
    labels: Sequence[str],
    *,
    per_series: Sequence[tuple[float, float]] = (),
    by_lead: tuple[np.ndarray, Sequence[np.ndarray]] | None = None,
    lead_label: str = "lead",
) -> str:
    """Left: empirical coverage of each central interval against its nominal level (the diagonal is calibrated).
    Right, when given: the coverage of each interval by lead, against its nominal level (dotted)."""
    with rc_context(_RC):
        figure, axes = _figure(10.5, 4.0, columns=2) if by_lead is not None else _figure(4.6, 4.2)
        axis = axes[0]
        axis.plot([0, 1], [0, 1], color="#888888", lw=1, ls=":", label="perfectly calibrated")
        if per_series:
            xs, ys = zip(*per_series, strict=True)
            axis.scatter(xs, ys, s=9, color=MODEL_COLOR, alpha=0.25, lw=0, label="one series")
        fine = ~clamped
        axis.plot(nominal, empirical, color=MODEL_COLOR, lw=1, alpha=0.6)
        axis.scatter(nominal[fine], empirical[fine], s=30, color=MODEL_COLOR, zorder=3, label="all series")
        if clamped.any():
            axis.scatter(
                nominal[clamped],
                empirical[clamped],
                s=42,
                facecolors="none",
                edgecolors=CLAMPED_COLOR,
                lw=1.5,
                zorder=3,
                label="clamped to the native range",
            )
        for x, y, label in zip(nominal, empirical, labels, strict=True):
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7)
        axis.set(xlim=(0, 1), ylim=(0, 1), aspect="equal")
        axis.set_xlabel("nominal coverage of the central interval")
        axis.set_ylabel("empirical coverage (share of actuals inside)")
        axis.set_title("Calibration over all leads", loc="left")
        axis.legend(loc="upper left", fontsize=7)
        if by_lead is not None:
            leads, curves = by_lead
            lead_axis = axes[1]
            palette = colormaps["viridis"]
            for index, (level, curve, label, mark) in enumerate(zip(nominal, curves, labels, clamped, strict=True)):
                color = palette(0.85 * index / max(len(curves) - 1, 1))
                suffix = " (clamped)" if mark else ""
                lead_axis.plot(leads, curve, color=color, lw=1.4, label=f"{label} interval{suffix}")
                lead_axis.axhline(level, color=color, lw=0.9, ls=":")
            lead_axis.set_ylim(0, 1)
            lead_axis.set_xlabel(lead_label)
            lead_axis.set_ylabel("empirical coverage")
            lead_axis.set_title("Coverage by lead (dotted: nominal)", loc="left")
            lead_axis.legend(loc="lower left", fontsize=7, ncols=2)
    return _svg(figure)


def score_by_origin(origins_us: np.ndarray, curves: Mapping[str, np.ndarray], metric_label: str) -> str:
    """Each model's score per forecast origin (one point per origin, the fev convention), on a UTC time axis."""
    palette = colormaps["tab10"]
    times = np.asarray(origins_us, dtype=np.int64).astype("datetime64[us]")
    scale = robust_scale([np.zeros(1)], {name: [values] for name, values in curves.items()})
    with rc_context(_RC):
        height_in, bottom_in, anchor = legend_below(len(curves), 2.28)
        figure, (axis,) = _figure(10.5, height_in, bottom_in=bottom_in)
        for index, (name, values) in enumerate(curves.items()):
            naive = name == "seasonal_naive"
            color = NAIVE_COLOR if naive else palette(index % 10)
            label = name + (" (off the scale)" if name in scale.off else "")
            axis.plot(times, values, color=color, lw=1.0 if naive else 1.3, ls="--" if naive else "-", label=label,
                      marker="o" if times.size <= 60 else None, ms=2.5)  # fmt: skip
        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        axis.xaxis.set_major_locator(locator)
        axis.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        axis.set_ylim(0, scale.high)
        mark_off_scale(axis, scale)
        axis.set_xlabel("forecast origin (UTC)")
        axis.set_ylabel(f"{metric_label} of the origin's windows")
        axis.set_title(f"{metric_label} by forecast origin (each origin's windows scored; lower is better)", loc="left")
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, anchor), ncols=4, frameon=False)
    return _svg(figure)
