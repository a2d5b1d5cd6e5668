"""Unit tier: quantile names, validation and native -> requested interpolation (no Ray, no ORT)."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_onnx.errors import ConfigError
from distributed_onnx.model.quantiles import (
    ClampedLevel,
    central_intervals,
    clamped_levels,
    describe_clamped,
    interpolate_quantiles,
    quantile_column_name,
    validate_quantiles,
)

NATIVE = (0.1, 0.5, 0.9)


def _fan(shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.sort(rng.normal(size=(*shape, len(NATIVE))), axis=-1).astype(dtype)


@pytest.mark.parametrize(("q", "name"), [(0.1, "q0.1"), (0.25, "q0.25"), (0.5, "q0.5"), (0.975, "q0.975")])
def test_column_name(q: float, name: str) -> None:
    assert quantile_column_name(q) == name


@pytest.mark.parametrize(
    "levels",
    [(0.1000001, 0.1000002), (0.9999999, 0.99999991), (0.1234567, 0.1234568), (1e-7, 1.1e-7), (0.5, 0.5000001)],
)
def test_column_names_never_collide(levels: tuple[float, ...]) -> None:
    """Six significant digits (``format(q, "g")``) merged such levels into one column, one of them silently lost."""
    names = [quantile_column_name(q) for q in levels]
    assert len(set(names)) == len(levels), names
    assert all(float(name[1:]) == q for name, q in zip(names, levels, strict=True))


def test_level_near_one_is_not_named_q1() -> None:
    assert quantile_column_name(0.9999999) == "q0.9999999"


def test_native_levels_are_exact_copies() -> None:
    preds = _fan((4, 3))
    preds[0, 0, 2] = np.nan
    out = interpolate_quantiles(preds, NATIVE, (0.1, 0.9))
    assert out.dtype == np.float32
    assert out.shape == (4, 3, 2)
    np.testing.assert_array_equal(out, preds[..., [0, 2]])
    out[...] = 0.0  # a copy, never a view of the model's buffer
    assert preds[1, 1, 0] != 0.0


def test_native_levels_stay_exact_next_to_interpolated_ones() -> None:
    preds = _fan((5,))
    preds[0, 2] = np.inf  # would turn inf - inf into NaN if natives went through arithmetic
    out = interpolate_quantiles(preds, NATIVE, (0.1, 0.3, 0.5, 0.9))
    np.testing.assert_array_equal(out[:, [0, 2, 3]], preds)


def test_linear_between_native_levels() -> None:
    preds = np.array([[0.0, 10.0, 30.0], [-4.0, 0.0, 4.0]])
    out = interpolate_quantiles(preds, NATIVE, (0.2, 0.3, 0.6, 0.8))
    expected = np.array([[2.5, 5.0, 15.0, 25.0], [-3.0, -2.0, 1.0, 3.0]])
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_level_with_float_noise_counts_as_native() -> None:
    preds = _fan((3,), np.float64)
    out = interpolate_quantiles(preds, NATIVE, (1.0 - 0.9, 0.5 + 1e-12))
    np.testing.assert_array_equal(out, preds[:, :2])


def test_clamped_outside_native_range() -> None:
    preds = _fan((6,))
    out = interpolate_quantiles(preds, NATIVE, (0.01, 0.05, 0.95, 0.99))
    np.testing.assert_array_equal(out, preds[:, [0, 0, 2, 2]])


@pytest.mark.parametrize("shape", [(), (7,), (2, 3), (2, 3, 4)])
def test_shapes_follow_leading_axes(shape: tuple[int, ...]) -> None:
    preds = _fan(shape)
    out = interpolate_quantiles(preds, NATIVE, (0.05, 0.25, 0.5, 0.75))
    assert out.shape == (*shape, 4)


def test_dtypes() -> None:
    assert interpolate_quantiles(_fan((2,), np.float64), NATIVE, (0.3,)).dtype == np.float64
    assert interpolate_quantiles(_fan((2,), np.float32), NATIVE, (0.3,)).dtype == np.float32
    ints = np.array([[0, 10, 20]])
    out = interpolate_quantiles(ints, NATIVE, (0.3,))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [[5.0]])


def test_float32_interpolation_matches_float64_rounded_once() -> None:
    preds = _fan((50, 8))
    out = interpolate_quantiles(preds, NATIVE, (0.2, 0.7))
    reference = interpolate_quantiles(preds.astype(np.float64), NATIVE, (0.2, 0.7)).astype(np.float32)
    np.testing.assert_array_equal(out, reference)


def test_wrong_last_axis_is_reported() -> None:
    with pytest.raises(ConfigError, match=r"last axis of 3 native quantiles.*\(4, 2\)"):
        interpolate_quantiles(np.zeros((4, 2)), NATIVE, (0.5,))


@pytest.mark.parametrize("levels", [(), (0.5, 0.1), (0.1, 0.1), (0.0, 0.5), (0.5, 1.0)])
def test_invalid_levels_are_rejected(levels: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError):
        validate_quantiles(levels)


def test_central_intervals() -> None:
    assert central_intervals([0.1, 0.25, 0.5, 0.75, 0.9]) == [(0.1, 0.9), (0.25, 0.75)]
    assert central_intervals([0.9, 0.1]) == [(0.1, 0.9)]
    assert central_intervals([0.1, 0.5, 0.8]) == []
    assert central_intervals([0.5]) == []
    assert central_intervals([0.2, 0.8 + 1e-12]) == [(0.2, 0.8 + 1e-12)]


# --- which requested levels are clamped ---------------------------------------------------------------------


def test_clamped_levels_name_the_level_used() -> None:
    clamped = clamped_levels([0.01, 0.05, 0.1, 0.5, 0.95], NATIVE)
    assert clamped == [ClampedLevel(0.01, 0.1), ClampedLevel(0.05, 0.1), ClampedLevel(0.95, 0.9)]
    assert [c.as_record() for c in clamped][2] == {"requested": 0.95, "served_by": 0.9}


def test_levels_inside_the_native_range_are_not_clamped() -> None:
    assert clamped_levels([0.1, 0.25, 0.5, 0.9], NATIVE) == []
    assert clamped_levels([1 - 0.9 - 1e-12, 0.9 + 1e-12], NATIVE) == []  # float noise: the native level itself


def test_clamped_levels_agree_with_interpolation() -> None:
    requested = [0.02, 0.1, 0.3, 0.97, 0.99]
    preds = _fan((5, 4))
    mapped = interpolate_quantiles(preds, NATIVE, requested)
    clamped = clamped_levels(requested, NATIVE)
    assert [c.requested for c in clamped] == [0.02, 0.97, 0.99]
    for level in clamped:
        column = requested.index(level.requested)
        np.testing.assert_array_equal(mapped[..., column], preds[..., NATIVE.index(level.served_by)])


def test_clamped_levels_validate_their_inputs() -> None:
    with pytest.raises(ConfigError, match="requested quantiles"):
        clamped_levels([0.5, 0.1], NATIVE)
    with pytest.raises(ConfigError, match="native quantiles"):
        clamped_levels([0.5], [0.0, 0.5])


def test_describe_clamped_is_one_line_naming_each_level() -> None:
    text = describe_clamped(clamped_levels([0.05, 0.5, 0.95], NATIVE), NATIVE)
    assert "\n" not in text
    assert "native range 0.1..0.9" in text and "0.05 -> 0.1, 0.95 -> 0.9" in text
