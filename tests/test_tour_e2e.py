"""The tour on real tiny runs (local Ray): trackers, provenance, 1-based rounds, seeded
comparisons, and Ctrl-C / SIGTERM leaving a resumable run without a traceback."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import rayfl
from rayfl import cli
from rayfl import config as config_mod
from rayfl.metrics.provenance import config_hash
from tests.conftest import ROOT, TINY


def test_run_feeds_tensorboard_and_mlflow_and_records_provenance(ray_local, tiny, tmp_path):
    import ray
    import torch
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = rayfl.run(TINY, tiny + ["eval.every=2", "keep.rounds=[1,4]",
                                     "loggers.tensorboard=true", "loggers.mlflow=true"],
                       quiet=True)
    rows = pq.read_table(os.path.join(result.run_dir, "metrics.parquet")).to_pylist()
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert sorted(os.listdir(os.path.join(result.run_dir, "models"))) == [
        "round-00001", "round-00004"]
    acc = [(r["round"], r["test_accuracy"]) for r in rows if r["test_accuracy"] is not None]
    assert [t for t, _ in acc] == [2, 4]

    events = EventAccumulator(os.path.join(result.run_dir, "tensorboard"))
    events.Reload()
    assert {"train_loss", "test_accuracy", "round_s"} <= set(events.Tags()["scalars"])
    tb = [(e.step, e.value) for e in events.Scalars("test_accuracy")]
    assert [s for s, _ in tb] == [2, 4] and np.allclose([v for _, v in tb], [a for _, a in acc])
    assert [e.step for e in events.Scalars("train_loss")] == [1, 2, 3, 4]

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=str(tmp_path / "runs" / "mlruns"))
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "fedavg" and run.data.params["rounds"] == "4"
    history = client.get_metric_history(run.info.run_id, "test_accuracy")
    got = sorted((m.step, m.value) for m in history)
    assert [t for t, _ in got] == [2, 4] and np.allclose([v for _, v in got], [a for _, a in acc])

    prov = result.summary["provenance"]
    assert prov["python"] == platform.python_version()
    assert prov["torch"] == torch.__version__ and prov["ray"] == ray.__version__
    assert prov["rayfl_version"] == rayfl.__version__
    assert prov["command_lines"] == [" ".join(sys.argv)]
    saved = config_mod.load(os.path.join(result.run_dir, "config.yaml"))
    assert prov["config_sha256"] == config_hash(saved)
    assert prov["git_commit"] is None or len(prov["git_commit"].split("+")[0]) == 40
    assert "mean_last_10_evals_accuracy" in result.summary
    assert result.summary["mean_last_10_evals_accuracy"] == pytest.approx(
        np.mean([a for _, a in acc]))


def test_compare_over_seeds_reports_mean_and_std(ray_local, tiny, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert cli.main(["compare", TINY, *tiny, "rounds=4", "eval.every=2",
                     "runtime.executor=inprocess",
                     "--algorithms", "fedavg,fedprox", "--seeds", "0,1", "--out", str(out)]) == 0
    table = pq.read_table(out / "comparison.parquet").to_pylist()
    assert [r["algorithm"] for r in table] == ["fedavg", "fedprox"]
    for row in table:
        finals = []
        for seed in (0, 1):
            with open(out / row["algorithm"] / f"seed-{seed}" / "summary.json") as f:
                finals.append(json.load(f)["final_accuracy"])
        assert row["final_accuracy"] == pytest.approx(np.mean(finals))
        assert row["final_accuracy_std"] == pytest.approx(np.std(finals))
    runs = pq.read_table(out / "comparison-runs.parquet").to_pylist()
    assert sorted((r["algorithm"], r["seed"]) for r in runs) == [
        ("fedavg", 0), ("fedavg", 1), ("fedprox", 0), ("fedprox", 1)]
    assert len({r["model_sha256"] for r in runs}) == 4
    printed = capsys.readouterr().out
    assert "± " in printed and "== [4/4] fedprox seed 1" in printed
    assert (out / "accuracy.png").stat().st_size > 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_prints_the_resume_hint_without_traceback(tmp_path, sig):
    """A run far too long to finish is interrupted once it has printed its first round."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ROOT}
    # SIGINT at its default disposition whatever this process inherited: a test runner started
    # in the background (nohup, `cmd &`) ignores SIGINT, and the child would inherit that
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayfl", "run", TINY, f"data.cache_dir={tmp_path / 'cache'}",
         "rounds=1000000", "runtime.num_actors=1", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if line.startswith("round 1/"):
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert f"interrupted; continue with: rayfl resume {run_dir}" in err
    assert "Traceback" not in err and "SIGTERM received" not in err, err
    assert os.path.isfile(run_dir / "config.yaml")
