"""Cluster entry point of the backtest: ``ray job submit --working-dir . -- python jobs/backtest.py --config ...``.

Thin on purpose: the same settings as ``distributed-onnx backtest`` (YAML < environment < flags), the same run,
the same exit codes (0 done, 1 a run that failed part-way, 2 bad input, 3 storage or cluster failed, 4 an internal
error: docs/cli.md's table), plus two cluster defaults:

- it joins the cluster it was submitted to (``ray job submit`` sets ``RAY_ADDRESS`` for this driver);
- when neither the config, the environment nor a flag sets ``gpus_per_actor`` and the cluster has GPUs, each
  actor takes one GPU, so the pool is one actor per GPU of the cluster (``actors`` in the config overrides the
  count).

``output`` must be reachable from every node under the same name on every run (a shared filesystem path or a
URL such as ``s3://bucket/runs/x``): the actors write the forecast parts there, the driver the summaries.
``data`` is read by the driver (and, with ``series_transport: input_file``, by the actors too).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

# The working directory that `ray job submit --working-dir .` uploaded: import the package from it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from distributed_onnx import cli
from distributed_onnx.errors import DistributedOnnxError
from distributed_onnx.evaluation.settings import read_yaml
from distributed_onnx.runtime.local_ray import connect
from distributed_onnx.settings_sources import ENV_PREFIX

logger = logging.getLogger("distributed_onnx.jobs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--config", type=Path, required=True, help="backtest settings (YAML)")
    args, overrides = parser.parse_known_args(argv)
    flags = ["backtest", "--config", str(args.config), *overrides]
    try:
        configured = read_yaml(args.config)
        connect(configured.get("address"))
        given = "gpus_per_actor" in configured or f"{ENV_PREFIX}GPUS_PER_ACTOR" in os.environ
        if not given and not any(flag.startswith("--gpus-per-actor") for flag in overrides):
            gpus = _cluster_gpus()
            if gpus:
                logger.info("The cluster has %g GPUs: one actor per GPU", gpus)
                flags += ["--gpus-per-actor", "1"]
    except DistributedOnnxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return cli.main(flags)


def _cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


if __name__ == "__main__":
    sys.exit(main())
