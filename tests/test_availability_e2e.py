"""End to end: mid-round dropouts never corrupt server state (real Ray, tiny config)."""

from __future__ import annotations

import os

import numpy as np

import rayfl

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                    "test", "tiny.yaml")


def test_dropout_run_keeps_server_state_finite(ray_local, tiny):
    result = rayfl.run(TINY, tiny + ["availability.dropout=0.5"], quiet=True)
    rows = result.metrics.to_pylist()
    assert len(rows) == 4
    assert sum(r["dropped"] for r in rows) > 0
    for r in rows:
        assert r["completed"] + r["dropped"] == r["sampled"] == 5
    assert np.isfinite(result.params).all()
    assert result.summary.get("diverged_at_round") is None
