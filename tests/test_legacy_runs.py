"""Run directories written by rayfl 0.1 (paused after round 2 of 4, holding client state, wrapper
state, transform state, model buffers, selector and event-loop state) resume under today's code
to their uninterrupted run.

Rounds 1-2 of a fixture were computed on the machine that wrote it, rounds 3-4 on this one, so
the resumed model is held to the uninterrupted run recomputed here within ``RTOL``/``ATOL`` (a
different CPU kernel set moves the last bits, a lost or misread state moves far more), and to
the exact bytes recorded in ``expected.json`` only on a machine whose fingerprint
(:mod:`tests.machine`) matches the record's. ``python -m tests.test_legacy_runs`` records this
machine's bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest
import yaml

import rayfl
from tests.machine import fingerprint, recorded_here

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "legacy_runs")
EXPECTED = os.path.join(FIXTURES, "expected.json")
with open(EXPECTED) as f:
    RECORD = json.load(f)
RUNS = sorted(RECORD["runs"])
RTOL, ATOL = 1e-4, 1e-6  # observed across kernel sets: at most 2e-7 on weights of order 1


def _config(run_dir, tmp_path) -> dict:
    path = run_dir / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["data"]["cache_dir"] = str(tmp_path / "cache")  # a key a resume may change
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def _resume(name: str, tmp_path):
    run_dir = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), run_dir)
    cfg = _config(run_dir, tmp_path)
    return cfg, rayfl.resume(str(run_dir), quiet=True)


def _buffers(result):
    path = os.path.join(result.run_dir, "final_buffers.npy")
    return np.load(path) if os.path.isfile(path) else None


@pytest.mark.parametrize("name", RUNS)
def test_a_paused_run_of_the_previous_version_resumes_to_the_uninterrupted_run(name, tmp_path):
    cfg, resumed = _resume(name, tmp_path)
    assert [r["round"] for r in resumed.metrics.to_pylist()] == [1, 2, 3, 4]
    straight = rayfl.run({**cfg, "output_dir": str(tmp_path / "runs")}, quiet=True)
    np.testing.assert_allclose(resumed.params, straight.params, rtol=RTOL, atol=ATOL)
    ours, theirs = _buffers(resumed), _buffers(straight)
    assert (ours is None) == (theirs is None)
    if ours is not None:
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)
    record = recorded_here(RECORD["recorded"])
    if record is not None:  # the same kernels, PyTorch and threads as the recording: exact bytes
        assert resumed.summary["model_sha256"] == record["model_sha256"][name]


def test_a_record_is_compared_only_on_its_own_machine():
    here = fingerprint()
    assert recorded_here([{"machine": here}]) == {"machine": here}
    for key in here:
        assert recorded_here([{"machine": {**here, key: "elsewhere"}}]) is None


def _record() -> None:
    """Resume every fixture here and store the bytes with this machine's fingerprint."""
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        hashes = {name: _resume(name, Path(tmp))[1].summary["model_sha256"] for name in RUNS}
    here = fingerprint()
    RECORD["recorded"] = [r for r in RECORD["recorded"] if r["machine"] != here] + [
        {"machine": here, "model_sha256": hashes}]
    with open(EXPECTED, "w") as f:
        json.dump(RECORD, f, indent=1)
        f.write("\n")
    print(f"recorded {len(hashes)} runs for {here}", file=sys.stderr)


if __name__ == "__main__":
    _record()
