"""Run directories written by rayfl 0.1 (paused after round 2 of 4, holding client state, wrapper
state, transform state, model buffers, selector and event-loop state) resume under today's code
to the bytes their uninterrupted runs reached then (tests/fixtures/legacy_runs/expected.json)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

import rayfl

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "legacy_runs")
with open(os.path.join(FIXTURES, "expected.json")) as f:
    EXPECTED = json.load(f)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_paused_run_of_the_previous_version_resumes_to_the_uninterrupted_bytes(name, tmp_path):
    run_dir = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), run_dir)
    path = run_dir / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")  # a key a resume may change
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    result = rayfl.resume(str(run_dir), quiet=True)
    assert result.summary["model_sha256"] == EXPECTED[name]["model_sha256"]
    assert [r["round"] for r in result.metrics.to_pylist()] == [1, 2, 3, 4]
