"""Persistent client state: the store's spill and versioning, and every stateful algorithm's
state across a spill to disk and across a pause/resume (same final bytes as without them)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import rayfl
from rayfl.runtime.state_store import StateStore, prune_after, state_path
from tests.conftest import TINY


def test_store_spills_past_budget_and_reads_back(tmp_path):
    store = StateStore(str(tmp_path), budget_bytes=3 * 400)  # room for three 100-float states
    for c in range(10):
        store.save(c, 0, {"c": torch.full((100,), float(c))})
    assert len(store.cache) == 3 and store.stats["evictions"] == 7
    fresh = StateStore(str(tmp_path), budget_bytes=0)  # nothing cached: everything from disk
    for c in range(10):
        assert torch.equal(fresh.load(c, 0)["c"], torch.full((100,), float(c)))
    assert fresh.stats["disk_reads"] == 10 and not fresh.cache
    assert fresh.load(3, -1) is None  # a client that never trained has no state


def test_resume_prunes_versions_the_checkpoint_does_not_know(tmp_path):
    store = StateStore(str(tmp_path), budget_bytes=0)
    for version in (2, 5, 7):
        store.save(1, version, {"c": torch.zeros(3)})
    versions = np.array([-1, 5], dtype=np.int32)  # the checkpoint was taken after round 5
    assert prune_after(str(tmp_path), versions) == 2
    assert os.path.exists(state_path(str(tmp_path), 1, 5))
    assert not os.path.exists(state_path(str(tmp_path), 1, 7))


RESUMED = [  # client state, or server rules beyond the mean
    ["algorithm.name=scaffold"],
    ["algorithm.name=feddyn"],
    ["algorithm.name=adabest"],
    ["algorithm.name=fedmim", "algorithm.history=participation"],
    ["algorithm.name=fedmsi", "aggregation.weighting=degree"],
    ["algorithm.name=fedspeed"],
    ["algorithm.name=moon"],
    ["algorithm.name=ditto"],
    ["algorithm.name=qfedavg"],  # stateless: its loss at the start, its server division
    ["algorithm.name=fedexp"],
    ["algorithm.name=fedrep", "model.name=mlp"],  # the client's head
    ["algorithm.name=lgfedavg", "model.name=mlp"],  # the client's body
    ["algorithm.name=fedproto", "model.name=mlp"],  # whole models; the server's prototypes
    ["algorithm.name=fedbn", "model.name=examples.bn_model:BNNet",  # its γ, β and statistics
     "data.partition=iid"],
]


@pytest.mark.parametrize("algo", RESUMED, ids=lambda a: a[0].split("=")[1])
def test_state_survives_spill_and_resume(request, tiny, tmp_path, algo):
    """Reference: in this process, roomy memory, one go. Other: no memory (every state read
    back from disk), paused after 3 rounds and resumed — on 1 client actor for SCAFFOLD, in
    this process for the others (the same ClientWorker and state store; one Ray case keeps the
    suite short). The final bytes must be equal."""
    base = tiny + algo + ["rounds=6", "clients_per_round=6"]
    plain = rayfl.run(TINY, base + ["runtime.state_memory_mb=64", "runtime.executor=inprocess"],
                      quiet=True)
    on_ray = algo == RESUMED[0]
    if on_ray:
        request.getfixturevalue("ray_local")
    where = "runtime.num_actors=1" if on_ray else "runtime.executor=inprocess"
    other = base + ["runtime.state_memory_mb=0", where]
    paused = rayfl.run(TINY, other, run_dir=str(tmp_path / "paused"), quiet=True, max_rounds=3)
    assert paused.summary["status"] == "paused" and paused.metrics.num_rows == 3
    resumed = rayfl.resume(str(tmp_path / "paused"), quiet=True)
    assert resumed.summary["model_sha256"] == plain.summary["model_sha256"]
    assert resumed.metrics.column("round").to_pylist() == list(range(1, 7))
