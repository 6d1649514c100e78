"""Where the server actor runs: on the node of the user's process, so that the run directory it
writes (``metrics.parquet``, ``summary.json``, plots, kept models) is the one the user reads.

On a cluster whose nodes share no filesystem (KubeRay's head with ``num-cpus: 0``, cloud VMs),
Ray would otherwise place the CPU-less server actor on any node, and its outputs would land on
that node's disk. Client state and checkpoints go through :mod:`rayfl.runtime.storage` instead.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def on_driver_node() -> dict:
    """``.options(...)`` that pin an actor to the node this process runs on (hard affinity: a
    lost node is an error, never a silent move to another disk)."""
    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}
