"""The runnable examples in the public API's docstrings (doctests), run as tests: one test per docstring.

Collected here rather than with ``--doctest-modules`` so that only the listed modules are imported (not the
export modules, which need torch, nor the test helpers) and so that the two tiers of tests/conftest.py hold:
a docstring whose example builds an ONNX Runtime session or runs a backtest on Ray is marked ``integration``
(``make test-unit`` leaves it out, and the unit tier's guard fails any other that would), and a backtest's
example runs on the session's shared local Ray. A module's examples run with ELLIPSIS and NORMALIZE_WHITESPACE.
"""

from __future__ import annotations

import doctest
import importlib
from collections.abc import Iterator

import pytest
from conftest import start_test_ray

#: The modules whose docstrings' examples are run: the public API (``backtest``, ``OnnxBackend``), the error
#: tree, a family adapter, the metric registry, the rules each written once (bounds, the redaction and the bounds
#: of a message line, what a local path is when it is not a file, quantile levels, the default season, a parity
#: report's statistics: numpy only, unlike the rest of export/; a variant's accuracy gate, the
#: CPU's flags read, the size of tune's gate), and Ray's side of the backtest (the dispatcher and the worker actors,
#: as Ray's own ``actor_pool.py`` shows its pool, what a pool asks of the cluster, and the raylet's command line
#: with stand-in agents).
MODULES = (
    "distributed_onnx.api",
    "distributed_onnx.errors",
    "distributed_onnx.bounds",
    "distributed_onnx.redact",
    "distributed_onnx.local_paths",
    "distributed_onnx.model.quantiles",
    "distributed_onnx.model.adapters.context_quantiles",
    "distributed_onnx.model.backend.onnx",
    "distributed_onnx.evaluation.scoring.registry",
    "distributed_onnx.evaluation.scoring.conventions",
    "distributed_onnx.evaluation.scoring.naive",
    "distributed_onnx.export.parity",
    "distributed_onnx.evaluation.scoring.variants",
    "distributed_onnx.model.backend.cpu_features",
    "distributed_onnx.tune_gate",
    "distributed_onnx.runtime.dispatch",
    "distributed_onnx.runtime.actors",
    "distributed_onnx.runtime.pool_room",
    "distributed_onnx.runtime.ray_private",
    "distributed_onnx.runtime.agent_stand_in",
)
#: The docstrings needing Ray get the session's shared local Ray (started before the example runs): a backtest,
#: the dispatcher's actors, worker actors and the cluster's resources.
NEEDS_RAY = {
    "distributed_onnx.api.backtest",
    "distributed_onnx.runtime.dispatch.Dispatcher",
    "distributed_onnx.runtime.dispatch.Dispatcher.run",
    "distributed_onnx.runtime.actors.PinnedWorker",
    "distributed_onnx.runtime.actors.WorkerActor",
    "distributed_onnx.runtime.actors.start_pool",
    "distributed_onnx.runtime.actors.has_room",
    "distributed_onnx.runtime.actors.default_actor_count",
    "distributed_onnx.runtime.pool_room.check_fits",
}
#: Docstrings whose examples build an ONNX Runtime session or use Ray: the integration tier.
INTEGRATION = NEEDS_RAY | {"distributed_onnx.model.backend.onnx.OnnxBackend"}
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _docstrings() -> Iterator[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    for name in MODULES:
        found = finder.find(importlib.import_module(name))
        yield from sorted((test for test in found if test.examples), key=lambda test: test.name)


DOCSTRINGS = list(_docstrings())


@pytest.mark.parametrize(
    "docstring",
    [
        pytest.param(test, id=test.name, marks=[pytest.mark.integration] if test.name in INTEGRATION else [])
        for test in DOCSTRINGS
    ],
)
def test_the_examples_run_as_written(docstring: doctest.DocTest) -> None:
    if docstring.name in NEEDS_RAY:
        start_test_ray()
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    report: list[str] = []
    runner.run(docstring, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_the_public_api_has_examples() -> None:
    """Each part of the public API named in the issue keeps an example (a removed one fails here, not silently)."""
    named = {test.name for test in DOCSTRINGS}
    assert named >= INTEGRATION | {
        "distributed_onnx.errors.DistributedOnnxError",
        "distributed_onnx.model.adapters.context_quantiles.ContextQuantilesAdapter.build_inputs",
        "distributed_onnx.evaluation.scoring.registry",
        "distributed_onnx.runtime.actors.local_device_chain",
        "distributed_onnx.runtime.actors.worker_actor_options",
    }
    assert set(INTEGRATION) <= named  # every integration name is a real docstring (no stale entry)
