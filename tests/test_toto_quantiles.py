"""The Toto adapter's mixture quantiles against scipy's Student-t, without the model (pure logic, unit tier)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from distributed_onnx.errors import CheckpointGraphMismatchError, ConfigError
from distributed_onnx.model.adapters import adapter_for
from distributed_onnx.model.adapters.toto import mixture_quantiles
from distributed_onnx.model.checkpoint import CheckpointMetadata

LEVELS = [0.01, 0.1, 0.5, 0.9, 0.99]


def _metadata(**changes: object) -> CheckpointMetadata:
    fields = {
        "model_family": "toto",
        "input_names": ["context"],
        "output_name": "student_t_mixture",
        "native_quantiles": LEVELS,
        "context_length": 16,
        "output_patch_size": 4,
        "horizon_patches": 1,
        "resolution_minutes": 60,
        "missing_value": "nan",
        "output_distribution": "student_t_mixture",
    }
    return CheckpointMetadata.model_validate({**fields, **changes})


def test_one_component_is_its_student_t() -> None:
    params = np.array([[[[1.0, 3.5, 10.0, 2.0]]]], dtype=np.float32)  # [1 row, 1 step, 1 component, 4]
    ours = mixture_quantiles(params, LEVELS)[0, :, 0]
    np.testing.assert_allclose(ours, stats.t.ppf(LEVELS, 3.5, loc=10.0, scale=2.0), rtol=1e-6)


def test_a_mixture_s_cdf_at_each_quantile_is_its_level() -> None:
    rng = np.random.default_rng(0)
    params = np.stack(
        [
            rng.dirichlet(np.ones(5), size=(3, 4)),  # weights
            2.0 + rng.exponential(3.0, size=(3, 4, 5)),  # df > 2, as Toto's softplus gives
            rng.normal(0.0, 50.0, size=(3, 4, 5)),
            rng.exponential(5.0, size=(3, 4, 5)) + 1e-3,
        ],
        axis=-1,
    ).astype(np.float32)
    quantiles = mixture_quantiles(params, LEVELS).astype(np.float64)  # [3, Q, 4]
    weight, df, loc, scale = (params[..., index].astype(np.float64) for index in range(4))
    weight = weight / weight.sum(-1, keepdims=True)
    for level_index, level in enumerate(LEVELS):
        x = quantiles[:, level_index, :, None]
        cdf = (weight * special.stdtr(df, (x - loc) / scale)).sum(-1)
        np.testing.assert_allclose(cdf, level, atol=1e-5)  # the float32 rounding of the quantile, times the density
    assert (np.diff(quantiles, axis=1) > 0).all()


def test_the_adapter_needs_the_mixture_and_its_shape() -> None:
    with pytest.raises(ConfigError, match="output_distribution"):
        adapter_for(_metadata(output_distribution=None))
    adapter = adapter_for(_metadata())
    good = np.tile(np.array([1.0, 4.0, 0.0, 1.0], dtype=np.float32), (2, 4, 3, 1))
    assert adapter.decode({"student_t_mixture": good}, np.arange(2)).shape == (2, len(LEVELS), 4)
    with pytest.raises(CheckpointGraphMismatchError, match=r"\(2, 4, components, 4\)"):
        adapter.decode({"student_t_mixture": good[:, :3]}, np.arange(2))


def test_every_root_converges_in_a_few_newton_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixtures like Toto's published head gives (24 heavy-tailed components spread wide): a root reached to
    float64's resolution stays where it is. Bisecting from it once threw it back into a bracket whose other side
    had never narrowed, and tens of steps crawled back; with 8 steps at most every root is its exact value."""
    from distributed_onnx.model.adapters import toto

    rng = np.random.default_rng(3)
    shape = (4, 16, 24)  # rows, steps, components
    params = np.stack(
        [
            rng.dirichlet(np.ones(24), size=shape[:2]),
            2.4 + rng.uniform(0.0, 0.8, shape),
            rng.normal(0.0, 30.0, shape),
            rng.uniform(25.0, 60.0, shape),
        ],
        axis=-1,
    ).astype(np.float32)
    levels = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    exact = mixture_quantiles(params, levels)
    monkeypatch.setattr(toto, "MAX_STEPS", 8)
    np.testing.assert_array_equal(mixture_quantiles(params, levels), exact)


def test_a_call_computes_only_the_levels_the_run_asks_with_the_same_values() -> None:
    """Each level's root is its own: a run asking 3 of the native levels has the adapter compute those 3 (a third of
    the work), equal to the same columns of all of them; a level between native ones keeps every native level."""
    from distributed_onnx.model.worker import call_levels

    rng = np.random.default_rng(5)
    shape = (2, 4, 6)
    params = np.stack(
        [
            rng.dirichlet(np.ones(6), size=shape[:2]),
            2.0 + rng.exponential(3.0, shape),
            rng.normal(0.0, 20.0, shape),
            rng.uniform(1.0, 10.0, shape),
        ],
        axis=-1,
    ).astype(np.float32)
    metadata = _metadata()
    every = adapter_for(metadata).decode({"student_t_mixture": params}, np.arange(2))  # [rows, levels, steps]
    asked = call_levels(metadata, [0.99, 0.01, 0.5])
    assert asked.native_quantiles == [0.01, 0.5, 0.99]
    some = adapter_for(asked).decode({"student_t_mixture": params}, np.arange(2))
    np.testing.assert_array_equal(some, every[:, [0, 2, 4]])
    assert call_levels(metadata, [0.05, 0.5]).native_quantiles == LEVELS
