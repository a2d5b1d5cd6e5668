"""The standing property-based suite (Hypothesis): the planner, the as-of join, grouping and the metric sums,
each against a plain loop or plain numpy written here, on inputs Hypothesis draws (issue 40).

Each property runs inside a plain test that counts the cases Hypothesis generated and reports them: printed to
the terminal (``N Hypothesis cases``, whatever the capture) and recorded as the test's ``hypothesis_cases``
property (pytest's ``record_property``, in ``--junitxml``). The example counts are sized so that the file runs in
well under a minute on two busy cores; the database is off, so a run is reproducible from its seed alone.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distributed_onnx.errors import DataError
from distributed_onnx.evaluation.data.layout import Series, SeriesArrays
from distributed_onnx.evaluation.data.table import read_table
from distributed_onnx.evaluation.data.windows import WindowSpec, plan_origins, plan_series, plan_windows
from distributed_onnx.evaluation.dataset._groups import series_groups
from distributed_onnx.evaluation.dataset._vintages import MAX_LATENCY_MINUTES, index_vintages
from distributed_onnx.evaluation.grouping import plan_groups
from distributed_onnx.evaluation.scoring.metrics import MetricsAccumulator
from distributed_onnx.location import Location
from distributed_onnx.model.quantiles import central_intervals

MINUTE_US = 60_000_000
BASE_US = int(datetime(2024, 3, 30, tzinfo=UTC).timestamp()) * 1_000_000  # a DST change inside the span
CASES: dict[str, int] = {}


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _count(name: str) -> None:
    CASES[name] = CASES.get(name, 0) + 1


def _run_counted(
    name: str,
    prop: Callable[[], None],
    record_property: Callable[[str, object], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run the property, then report how many cases it ran (at least one, or the property tested nothing)."""
    CASES[name] = 0
    prop()
    record_property("hypothesis_cases", CASES[name])
    with capsys.disabled():
        print(f"\n{name}: {CASES[name]} Hypothesis cases")
    assert CASES[name] > 0


# --------------------------------------------------------------------------------------------- the planner


@st.composite
def _series_and_spec(draw: st.DrawFn) -> tuple[list[Series], WindowSpec]:
    step_us = draw(st.sampled_from([1, 5, 30, 60])) * MINUTE_US
    series = []
    for index in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 60))
        observed = np.asarray(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        values = np.where(observed, 1.0, np.nan)
        start = BASE_US + draw(st.integers(-30, 30)) * step_us
        series.append(Series(f"s{index}", start, step_us, values, np.empty((0, n))))
    context, horizon, stride = draw(st.integers(1, 12)), draw(st.integers(1, 8)), draw(st.integers(1, 5))
    coverage = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    if draw(st.booleans()):
        spec = WindowSpec(
            context_length=context,
            horizon=horizon,
            n_windows=draw(st.integers(1, 15)),
            stride=stride,
            min_context_coverage=coverage,
        )
    else:
        first = draw(st.integers(-50, 100))
        last = first + draw(st.integers(0, 120))
        start_us = BASE_US + first * step_us + draw(st.sampled_from([0, 1, step_us // 2]))
        spec = WindowSpec(
            context_length=context,
            horizon=horizon,
            start_us=start_us,
            end_us=max(start_us, BASE_US + last * step_us),
            stride=stride,
            min_context_coverage=coverage,
        )
    return series, spec


def _plain_origins(series: Series, spec: WindowSpec) -> tuple[list[int], int]:
    """The windows of one series by their definition, one candidate at a time: (kept origins, capped)."""
    n, step = series.n_points, series.step_us
    if spec.n_windows is not None:
        last = n - spec.horizon  # the last window's horizon ends at the series' last step
        candidates = [last - spec.stride * k for k in range(spec.n_windows)][::-1]
        inside = [origin for origin in candidates if 1 <= origin <= n]
        capped = len(candidates) - len(inside)
    else:
        assert spec.start_us is not None and spec.end_us is not None
        grid = [series.start_us + i * step for i in range(-400, n + 400)]
        first = next(i - 400 for i, t in enumerate(grid) if t >= spec.start_us)  # the first grid step >= start
        inside = [
            origin
            for origin in range(1, n + 1)
            if spec.start_us <= series.start_us + origin * step <= spec.end_us and (origin - first) % spec.stride == 0
        ]
        capped = 0
    kept = []
    for origin in inside:
        observed = sum(1 for i in range(max(origin - spec.context_length, 0), origin) if np.isfinite(series.values[i]))
        coverage = observed / spec.context_length
        if coverage > 0 and coverage >= spec.min_context_coverage:
            kept.append(origin)
    return kept, capped


@_settings(250)
@given(_series_and_spec())
def _planner_property(case: tuple[list[Series], WindowSpec]) -> None:
    _count("planner")
    series, spec = case
    expected = [_plain_origins(one, spec) for one in series]
    arrays = SeriesArrays.from_series(series)
    plan_list, plan_flat = plan_windows(series, spec), plan_windows(arrays, spec)
    flat_series, flat_origins = plan_origins(arrays, spec, 0, len(series))
    for index, (one, (origins, capped)) in enumerate(zip(series, expected, strict=True)):
        planned = plan_series(one, spec)
        assert planned.origins.tolist() == origins  # the planner equals the plain loop
        assert planned.capped == capped
        assert flat_origins[flat_series == index].tolist() == origins
        for origin in origins:
            assert 1 <= origin <= one.n_points  # some history; at most one step past the data
            if spec.n_windows is not None:  # never past the data's end, on the stride's grid from it
                assert origin + spec.horizon <= one.n_points
                assert (one.n_points - spec.horizon - origin) % spec.stride == 0
            else:
                assert spec.start_us is not None and spec.end_us is not None
                stamp = one.start_us + origin * one.step_us
                assert spec.start_us <= stamp <= spec.end_us
        assert all(b - a >= spec.stride and (b - a) % spec.stride == 0 for a, b in itertools.pairwise(origins))
    counts = [len(origins) for origins, _ in expected]
    assert plan_list.counts.tolist() == counts == plan_flat.counts.tolist()
    assert plan_list.offsets.tolist() == plan_flat.offsets.tolist() == [0, *itertools.accumulate(counts)]
    assert plan_list.capped == plan_flat.capped == sum(capped for _, capped in expected)


def test_the_planner_equals_a_plain_loop(
    record_property: Callable[[str, object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    _run_counted("planner", _planner_property, record_property, capsys)


# -------------------------------------------------------------------------------------------- the as-of join

ZONES = ["UTC", "Europe/Berlin", "Asia/Kolkata", "America/St_Johns", "Australia/Lord_Howe"]


@st.composite
def _vintage_case(draw: st.DrawFn) -> dict[str, object]:
    step_us = draw(st.sampled_from([1, 15, 30, 60, 1440])) * MINUTE_US
    n_series = draw(st.integers(1, 4))
    integer_ids = draw(st.booleans())
    ids = [str(7 + 13 * i) if integer_ids else f"s{i}" for i in range(n_series)]
    per_series = draw(st.booleans())
    phase = draw(st.integers(0, step_us // MINUTE_US - 1)) * MINUTE_US if step_us > MINUTE_US else 0
    starts, lengths = [], []
    for _ in ids:  # per-series tables may put each series on its own phase of the grid
        own = draw(st.integers(0, step_us // MINUTE_US - 1)) * MINUTE_US if per_series and step_us > MINUTE_US else 0
        starts.append(BASE_US + phase + own + draw(st.integers(-20, 20)) * step_us)
        lengths.append(draw(st.integers(2, 40)))
    rows: dict[tuple[str, int, int], float] = {}
    for _ in range(draw(st.integers(1, 60))):
        owner = draw(st.integers(0, n_series - 1))
        key = ids[owner] if per_series else ""
        if per_series and draw(st.integers(0, 9)) == 0:
            key = "x" + str(owner) if not integer_ids else str(10_000 + owner)  # a series not in the run
        stamp = starts[owner] + draw(st.integers(-5, lengths[owner] + 5)) * step_us
        # Off the grid by whole seconds or minutes (issue times need not lie on it); exact in every unit.
        issued = stamp + draw(st.integers(-48, 6)) * step_us + draw(st.sampled_from([0, 1_000_000, MINUTE_US]))
        rows[(key, stamp, issued)] = draw(st.floats(-1e6, 1e6, allow_nan=False) | st.just(float("nan")))
    latency_minutes = draw(
        st.sampled_from([0, 1, 30, 60, 1440]) | st.integers(0, 10_000) | st.just(MAX_LATENCY_MINUTES)
    )
    return {
        "step_us": step_us,
        "ids": ids,
        "integer_ids": integer_ids,
        "per_series": per_series,
        "starts": starts,
        "lengths": lengths,
        "rows": rows,
        "latency_us": latency_minutes * MINUTE_US,
        "zone": draw(st.sampled_from(ZONES)),
        "unit": draw(st.sampled_from(["s", "ms", "us", "ns"])),
        "as_csv": draw(st.booleans()),
        "id_type": draw(st.sampled_from(["string", "large_string", "dictionary", "int64"])),
        "context": draw(st.integers(1, 12)),
        "horizon": draw(st.integers(1, 8)),
        "origins": draw(st.lists(st.tuples(st.integers(0, n_series - 1), st.integers(-5, 45)), min_size=1, max_size=8)),
    }


def _vintage_table(case: dict[str, object]) -> pa.Table:
    """The case's rows as the user may write them: Arrow timestamps of any unit and zone, or CSV text carrying
    each instant's local offset in that zone; ids as text, dictionary or integers."""
    rows = case["rows"]
    assert isinstance(rows, dict)
    keys = sorted(rows)
    stamps = np.asarray([stamp for _, stamp, _ in keys], dtype=np.int64)
    issued = np.asarray([issue for _, _, issue in keys], dtype=np.int64)
    values = [rows[key] for key in keys]
    zone, unit = str(case["zone"]), str(case["unit"])
    if case["as_csv"]:
        local = ZoneInfo(zone)

        def text(instants: np.ndarray) -> list[str]:
            return [
                datetime.fromtimestamp(int(us) / 1e6, UTC).astimezone(local).isoformat() for us in instants.tolist()
            ]

        lines = ["timestamp,available_at,wind" + (",series_id" if case["per_series"] else "")]
        for i, (key, _, _) in enumerate(keys):
            value = "" if np.isnan(values[i]) else repr(values[i])
            extra = f",{key}" if case["per_series"] else ""
            lines.append(f"{text(stamps[i : i + 1])[0]},{text(issued[i : i + 1])[0]},{value}{extra}")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "vintages.csv"
            path.write_text("\n".join(lines) + "\n")
            return read_table(Location(path))
    scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}[unit]
    factor = 1_000 if unit == "ns" else 1
    kind = pa.timestamp(unit, tz=zone)
    columns: dict[str, pa.Array] = {
        "timestamp": pa.array(stamps // scale * factor, kind),
        "available_at": pa.array(issued // scale * factor, kind),
        "wind": pa.array(values, pa.float64()),
    }
    if case["per_series"]:
        ids = [key for key, _, _ in keys]
        id_type = case["id_type"]
        if id_type == "int64" and case["integer_ids"]:
            columns["series_id"] = pa.array([int(one) for one in ids], pa.int64())
        elif id_type == "dictionary":
            columns["series_id"] = pa.array(ids, pa.string()).dictionary_encode()
        elif id_type == "large_string":
            columns["series_id"] = pa.array(ids, pa.large_string())
        else:
            columns["series_id"] = pa.array(ids, pa.string())
    return pa.table(columns)


def _plain_as_of(
    rows: list[tuple[str, int, int, float]], series_id: str, stamp_us: int, limit_us: int
) -> tuple[float, int | None]:
    """The latest vintage of ``(series_id, stamp_us)`` issued at or before ``limit_us``: a loop over the rows
    (``series_id`` None in a row: the row holds for every series)."""
    best: tuple[float, int] | None = None
    for owner, stamp, issued, value in rows:
        if owner is not None and owner != series_id:
            continue
        if stamp != stamp_us or issued > limit_us or np.isnan(value):
            continue
        if best is None or issued > best[1]:
            best = (value, issued)
    return (float("nan"), None) if best is None else best


def _rows_of(table: pa.Table, per_series: bool) -> list[tuple[str, int, int, float]]:
    """The table's rows as plain Python values, read back from what the user wrote (any unit, zone or id type)."""
    stamps, issued = _micros(table["timestamp"]), _micros(table["available_at"])
    values = [float("nan") if v is None else float(v) for v in table["wind"].to_pylist()]
    ids = [str(one) for one in table["series_id"].to_pylist()] if per_series else [None] * table.num_rows
    return list(zip(ids, stamps, issued, values, strict=True))  # type: ignore[arg-type]


def _micros(column: pa.ChunkedArray) -> list[int]:
    kind = column.type
    raw = column.cast(pa.int64()).to_pylist()
    if kind.unit == "ns":
        return [value // 1_000 for value in raw]
    return [value * {"s": 1_000_000, "ms": 1_000, "us": 1}[kind.unit] for value in raw]


@_settings(200)
@given(_vintage_case())
def _as_of_property(case: dict[str, object]) -> None:
    _count("as_of")
    table = _vintage_table(case)
    step_us, latency_us = int(case["step_us"]), int(case["latency_us"])  # type: ignore[call-overload]
    ids, starts = list(case["ids"]), np.asarray(case["starts"], dtype=np.int64)  # type: ignore[call-overload]
    per_series = bool(case["per_series"])
    matched = per_series and bool(set(map(str, table["series_id"].to_pylist())) & set(ids))
    if per_series and not matched:  # ids of other series only: refused, never a run of missing values
        with pytest.raises(DataError, match="none of its series_id"):
            index_vintages(table, ["wind"], step_us, ids, latency_us, series_start_us=starts)
        return
    vintages = index_vintages(table, ["wind"], step_us, ids, latency_us, series_start_us=starts)
    context, horizon = int(case["context"]), int(case["horizon"])  # type: ignore[call-overload]
    owners = np.asarray([owner for owner, _ in case["origins"]], dtype=np.int64)  # type: ignore[attr-defined]
    origin_us = starts[owners] + np.asarray([o for _, o in case["origins"]], dtype=np.int64) * step_us  # type: ignore[attr-defined]
    cutoff_us = origin_us - step_us
    first_us = origin_us - context * step_us
    keys = vintages.keys_of([ids[owner] for owner in owners])
    joined = vintages.as_of("wind", keys, cutoff_us, first_us, context + horizon)
    rows = _rows_of(table, per_series)
    for w, owner in enumerate(owners.tolist()):
        limit = int(cutoff_us[w]) - latency_us
        for j in range(context + horizon):
            value, issued = _plain_as_of(rows, ids[owner], int(first_us[w]) + j * step_us, limit)
            if issued is None:
                assert not joined.found[w, j] and np.isnan(joined.values[w, j])
            else:
                assert joined.found[w, j] and joined.values[w, j] == value
                assert int(joined.available_us[w, j]) == issued <= limit  # nothing issued after cutoff - latency


def test_the_as_of_join_equals_a_plain_loop(
    record_property: Callable[[str, object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    _run_counted("as_of", _as_of_property, record_property, capsys)


@_settings(100)
@given(
    st.sampled_from([15, 30, 60]),
    st.integers(1, 14),
    st.integers(0, 30),
    st.booleans(),
)
def _off_grid_property(step_minutes: int, shift_minutes: int, row: int, per_series: bool) -> None:
    """A vintage off the data's grid by any whole minutes is refused naming its row, even on a grid of its own."""
    _count("off_grid")
    step_us = step_minutes * MINUTE_US
    shift = (shift_minutes % step_minutes or 1) * MINUTE_US
    stamps = BASE_US + np.arange(31, dtype=np.int64) * step_us
    stamps[row] += shift
    utc = pa.timestamp("us", tz="UTC")
    columns = {"timestamp": pa.array(stamps, utc), "available_at": pa.array(stamps, utc), "wind": [1.0] * 31}
    if per_series:
        columns["series_id"] = pa.array(["a"] * 31)
    with pytest.raises(DataError, match=rf"off the data's {step_minutes}-minute grid at rows \[{row}\]"):
        index_vintages(pa.table(columns), ["wind"], step_us, ["a"], series_start_us=np.asarray([BASE_US]))
    moved = BASE_US + np.arange(31, dtype=np.int64) * step_us + shift  # on a grid of its own, all of it off
    everywhere = pa.table({**columns, "timestamp": pa.array(moved, utc), "available_at": pa.array(moved, utc)})
    with pytest.raises(DataError, match=r"off the data's .* at rows \[0, 1, 2, 3, 4\] and 26 more"):
        index_vintages(everywhere, ["wind"], step_us, ["a"], series_start_us=np.asarray([BASE_US]))


def test_vintages_off_the_datas_grid_are_always_refused(
    record_property: Callable[[str, object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    _run_counted("off_grid", _off_grid_property, record_property, capsys)


# ----------------------------------------------------------------------------------------------- grouping


@st.composite
def _grouping_case(draw: st.DrawFn) -> tuple[list[Series], list[str], int, WindowSpec]:
    n_series = draw(st.integers(1, 12))
    step_us = 30 * MINUTE_US
    series = []
    for index in range(n_series):
        n = draw(st.integers(1, 30))
        start = BASE_US + draw(st.integers(-3, 3)) * step_us
        series.append(Series(f"s{index:02d}", start, step_us, np.ones(n), np.empty((0, n))))
    labels = [draw(st.sampled_from(["north", "south", "7", ""])) for _ in range(n_series)]
    spec = WindowSpec(
        context_length=draw(st.integers(1, 6)),
        horizon=draw(st.integers(1, 4)),
        n_windows=draw(st.integers(1, 6)),
        stride=draw(st.integers(1, 3)),
    )
    return series, labels, draw(st.integers(1, 5)), spec


@_settings(150)
@given(_grouping_case())
def _grouping_property(case: tuple[list[Series], list[str], int, WindowSpec]) -> None:
    _count("grouping")
    series, labels, max_size, spec = case
    arrays = SeriesArrays.from_series(series)
    grouped = plan_groups(arrays, spec, labels, max_size)
    plain_series, plain_origins = plan_origins(arrays, spec, 0, len(series))
    windows = sorted(zip(grouped.series_index.tolist(), grouped.origin_index.tolist(), strict=True))
    assert windows == sorted(zip(plain_series.tolist(), plain_origins.tolist(), strict=True))  # each exactly once
    assert len(set(windows)) == len(windows)
    for g in range(len(grouped.starts) - 1):
        rows = slice(int(grouped.starts[g]), int(grouped.starts[g + 1]))
        members = grouped.series_index[rows]
        assert (grouped.group[rows] == g).all()
        assert len({labels[s] for s in members.tolist()}) == 1  # a group never mixes values
        origins = {
            int(arrays.start_us[s]) + int(o) * arrays.step_us
            for s, o in zip(members, grouped.origin_index[rows], strict=True)
        }
        assert len(origins) == 1  # one origin per group
        assert len(members) <= max_size and len(set(members.tolist())) == len(members)
    # Each series in exactly one chunk of its value (whatever the origin): the series that ever share a group
    # (joined across origins) form chunks of at most max_size series of one value, so the groups of different
    # origins never mix series of two chunks (a group is the part of its chunk with a window at that origin).
    chunk_root = list(range(len(series)))

    def root(s: int) -> int:
        while chunk_root[s] != s:
            chunk_root[s] = chunk_root[chunk_root[s]]
            s = chunk_root[s]
        return s

    for g in range(len(grouped.starts) - 1):
        members_list = grouped.series_index[int(grouped.starts[g]) : int(grouped.starts[g + 1])].tolist()
        for s in members_list[1:]:
            chunk_root[root(s)] = root(members_list[0])
    chunks: dict[int, set[int]] = {}
    for s in range(len(series)):
        chunks.setdefault(root(s), set()).add(s)
    for chunk in chunks.values():
        assert len(chunk) <= max_size and len({labels[s] for s in chunk}) == 1


@_settings(60)
@given(
    st.lists(st.sampled_from([1.0, 2.0, 2.5, float("nan"), None]), min_size=1, max_size=6),
    st.integers(2, 5),
)
def _group_keys_property(keys: list[float | None], rows_per_series: int) -> None:
    """Null and NaN keys are refused naming their rows; any other float key is a group of its own series."""
    _count("group_keys")
    ids = [f"s{i}" for i in range(len(keys)) for _ in range(rows_per_series)]
    column = [key for key in keys for _ in range(rows_per_series)]
    table = pa.table({"series_id": ids, "region": pa.array(column, pa.float64(), from_pandas=False)})
    bad = [row for row, key in enumerate(column) if key is None or (isinstance(key, float) and np.isnan(key))]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.parquet"
        pq.write_table(table, path)
        series_ids = [f"s{i}" for i in range(len(keys))]
        if bad:
            with pytest.raises(DataError, match=rf"null or NaN at rows \[{bad[0]}"):
                series_groups(read_table(Location(path)), "region", series_ids, str(path))
            return
        labels = series_groups(read_table(Location(path)), "region", series_ids, str(path))
    assert len(set(labels)) == len({key for key in keys})
    assert "nan" not in labels


def test_grouping_puts_every_window_in_exactly_one_group(
    record_property: Callable[[str, object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    _run_counted("grouping", _grouping_property, record_property, capsys)


def test_null_and_nan_group_keys_are_refused(
    record_property: Callable[[str, object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    _run_counted("group_keys", _group_keys_property, record_property, capsys)


# ---------------------------------------------------------------------------------------------- metric sums

LEVEL_SETS = [(0.5,), (0.1, 0.5, 0.9), (0.05, 0.25, 0.5, 0.75, 0.95), (0.2, 0.8)]


@st.composite
def _metrics_case(draw: st.DrawFn) -> dict[str, object]:
    quantiles = draw(st.sampled_from(LEVEL_SETS))
    n_windows, horizon = draw(st.integers(1, 25)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    ids = [str(one) for one in rng.choice(["a", "b", "c", "d"], size=n_windows)]
    actual = np.round(rng.normal(5.0, 3.0, size=(n_windows, horizon)), draw(st.sampled_from([0, 3])))
    actual[rng.random(actual.shape) < draw(st.sampled_from([0.0, 0.3]))] = np.nan
    spread = rng.normal(0, 2, size=(n_windows, horizon, len(quantiles)))
    forecast = np.sort(np.nan_to_num(actual, nan=1.0)[..., None] + spread, axis=-1).astype(np.float32)
    forecast[rng.random(forecast.shape) < draw(st.sampled_from([0.0, 0.05]))] = np.nan
    scale = rng.uniform(0.5, 2.0, size=n_windows)
    scale[rng.random(n_windows) < 0.2] = np.nan
    order = rng.permutation(n_windows)
    cuts = sorted(set(draw(st.lists(st.integers(0, n_windows), max_size=6))))
    return {
        "quantiles": quantiles,
        "ids": ids,
        "actual": actual,
        "forecast": forecast,
        "scale": scale,
        "order": order,
        "cuts": cuts,
        "merge_order": draw(st.permutations(range(len(cuts) + 1))),
    }


def _plain_sums(case: dict[str, object]) -> dict[str, dict[str, np.ndarray]]:
    """Per series, the sums by their definition (registry.py), in plain numpy over the whole batch."""
    quantiles = np.asarray(case["quantiles"])
    y, f = np.asarray(case["actual"]), np.asarray(case["forecast"], dtype=np.float64)
    ids = np.asarray(case["ids"])
    valid = np.isfinite(y) & np.isfinite(f).all(axis=2)
    intervals = central_intervals(list(quantiles))
    out = {}
    for series in sorted(set(ids.tolist())):
        mine = ids == series
        v, ys, fs = valid[mine], y[mine], f[mine]
        u = ys[..., None] - fs
        rho = np.where(v[..., None], quantiles * u - np.minimum(u, 0.0), 0.0).sum(axis=(0, 1))
        sums = {"pairs": np.asarray([v.sum()], dtype=np.float64), "abs_y": np.asarray([np.abs(ys[v]).sum()])}
        sums["rho"] = rho
        hits = []
        for low, high in intervals:
            lo, hi = fs[..., list(quantiles).index(low)], fs[..., list(quantiles).index(high)]
            hits.append(float((v & (lo <= ys) & (ys <= hi)).sum()))
        sums["hits"] = np.asarray(hits)
        if 0.5 in quantiles.tolist():
            e = np.where(v, ys - fs[..., list(quantiles).index(0.5)], 0.0)
            sums["abs_err"], sums["sq_err"] = np.asarray([np.abs(e).sum()]), np.asarray([np.square(e).sum()])
        out[series] = sums
    return out


def _by_series(accumulator: MetricsAccumulator) -> dict[str, dict[str, np.ndarray]]:
    sums = accumulator.series_sums()
    return {
        sid: {name: np.atleast_1d(values[row]) for name, values in sums.items()}
        for row, sid in enumerate(accumulator.series_ids)
    }


@_settings(150)
@given(_metrics_case())
def _metric_sums_property(case: dict[str, object]) -> None:
    _count("metric_sums")
    quantiles = case["quantiles"]
    assert isinstance(quantiles, tuple)
    ids, actual, forecast, scale = case["ids"], case["actual"], case["forecast"], case["scale"]
    assert isinstance(ids, list) and isinstance(actual, np.ndarray)
    assert isinstance(forecast, np.ndarray) and isinstance(scale, np.ndarray)
    horizon = actual.shape[1]
    whole = MetricsAccumulator(quantiles, horizon)
    whole.update(ids, actual, forecast, scale)
    order = np.asarray(case["order"])
    bounds = [0, *case["cuts"], len(ids)]  # type: ignore[misc]
    parts = []
    for lo, hi in itertools.pairwise(bounds):
        part = MetricsAccumulator(quantiles, horizon)
        rows = order[lo:hi]
        part.update([ids[r] for r in rows], actual[rows], forecast[rows], scale[rows])
        parts.append(part)
    merged = MetricsAccumulator(quantiles, horizon)
    for index in case["merge_order"]:  # type: ignore[attr-defined]
        merged.merge(MetricsAccumulator.from_state(parts[index].state()))  # through the part's sums file form
    assert (merged.n_windows, merged.n_missing_pairs, merged.n_unscaled_windows) == (
        whole.n_windows,
        whole.n_missing_pairs,
        whole.n_unscaled_windows,
    )
    got, expected = _by_series(merged), _by_series(whole)
    assert got.keys() == expected.keys()
    for series, sums in expected.items():
        for name, values in sums.items():
            np.testing.assert_allclose(got[series][name], values, rtol=1e-12, atol=1e-9, err_msg=f"{series} {name}")
    np.testing.assert_allclose(merged.state()["leads"], whole.state()["leads"], rtol=1e-12, atol=1e-9)
    plain = _plain_sums(case)
    for series, sums in plain.items():
        if series not in expected:
            assert sums["pairs"][0] == 0
            continue
        for name, values in sums.items():
            np.testing.assert_allclose(expected[series][name], values, rtol=1e-9, atol=1e-6, err_msg=f"{series} {name}")


def test_merged_part_sums_equal_the_whole_and_plain_numpy(
    record_property: Callable[[str, object], None], capsys: pytest.CaptureFixture[str]
) -> None:
    _run_counted("metric_sums", _metric_sums_property, record_property, capsys)
