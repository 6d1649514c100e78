"""The Ray runtime end to end: outputs, determinism across actor counts, spill, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl.analysis.evaluate import select_data
from rayfl.data.store import prepare
from rayfl.metrics.tables import read_table
from rayfl.models import build_for, sha256_of
from tests.conftest import ROOT, TINY


def test_run_directory_holds_everything(ray_local, tiny):
    result = rayfl.run(TINY, tiny + ["rounds=3", "eval.every=2"], quiet=True)
    names = set(os.listdir(result.run_dir))
    assert {"config.yaml", "metrics.parquet", "summary.json", "final_model.npy",
            "accuracy.png", "checkpoints"} <= names
    table = pq.read_table(os.path.join(result.run_dir, "metrics.parquet")).to_pylist()
    assert [r["round"] for r in table] == [1, 2, 3]  # rounds count from 1
    assert [r["test_accuracy"] is not None for r in table] == [False, True, True]
    assert all(r["sampled"] == 5 and r["completed"] == 5 for r in table)
    for phase in ("plan_s", "train_s", "aggregate_s", "round_s", "checkpoint_s"):
        assert all(r[phase] >= 0 for r in table)
    # checkpoint every round: each row after the first carries the previous one's write time
    assert table[0]["checkpoint_s"] == 0 and all(r["checkpoint_s"] > 0 for r in table[1:])
    for r in table:  # one entry per busy actor: their samples add up to the round's
        assert sum(r["actor_samples"]) == r["samples"] and len(r["actor_train_s"]) == 2
        assert max(r["actor_train_s"]) == r["actor_train_s_max"]
        assert r["actor_imbalance"] == pytest.approx(
            max(r["actor_train_s"]) / np.mean(r["actor_train_s"]))
    summary = json.load(open(os.path.join(result.run_dir, "summary.json")))
    assert summary["model_sha256"] == sha256_of(result.params)
    assert summary["final_accuracy"] == table[-1]["test_accuracy"]
    assert result.params.dtype == np.float32 and np.isfinite(result.params).all()


def test_last_rounds_are_evaluated_each_and_the_model_is_unchanged(tiny):
    """eval.every=3 with eval.last_rounds=3 over 7 rounds evaluates rounds 3 and 5, 6, 7: a
    paper's mean over its last rounds without evaluating every round; evaluating never changes
    the model."""
    common = tiny + ["rounds=7", "runtime.executor=inprocess", "eval.last_k=2"]
    sparse = rayfl.run(TINY, common + ["eval.every=3", "eval.last_rounds=3"], quiet=True)
    dense = rayfl.run(TINY, common, quiet=True)
    acc = sparse.metrics.column("test_accuracy").to_pylist()
    assert [i + 1 for i, a in enumerate(acc) if a is not None] == [3, 5, 6, 7]
    assert acc[-2:] == dense.metrics.column("test_accuracy").to_pylist()[-2:]
    assert sparse.summary["model_sha256"] == dense.summary["model_sha256"]
    assert sparse.summary["mean_last_2_evals_accuracy"] == \
        dense.summary["mean_last_2_evals_accuracy"]


def test_test_rows_scores_the_seeded_sample_the_analysis_draws(tiny):
    """eval.test_rows=K scores the final model on the K test rows `rayfl analyze --max-samples K`
    draws with the run's seed (an independent torch evaluation here); the model is unchanged,
    and K at least the test set's size is the whole test set."""
    common = tiny + ["rounds=2", "runtime.executor=inprocess"]
    whole = rayfl.run(TINY, common, quiet=True)
    cfg = config_mod.load(TINY, common)
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    n = len(reader.test()[1])
    sample = rayfl.run(TINY, common + ["eval.test_rows=37"], quiet=True)
    every = rayfl.run(TINY, common + [f"eval.test_rows={n}"], quiet=True)
    assert sample.summary["model_sha256"] == whole.summary["model_sha256"]
    assert every.metrics.column("test_accuracy").to_pylist() == \
        whole.metrics.column("test_accuracy").to_pylist()
    data = select_data(handle, "test", 37, cfg.seed)
    assert len(data.index) == 37 and len(set(data.index.tolist())) == 37
    torch.manual_seed(0)
    module = build_for(cfg.model, handle)
    torch.nn.utils.vector_to_parameters(torch.tensor(sample.params), module.parameters())
    xt, yt = reader.tensors(*data.arrays(reader), "cpu")
    with torch.no_grad():
        correct = int((module(xt).argmax(1) == yt).sum())
    # float32; accuracies are 1/37 apart
    assert sample.summary["final_accuracy"] == pytest.approx(correct / 37, abs=1e-6)
    assert whole.summary["final_accuracy"] != sample.summary["final_accuracy"]


def test_training_learns(ray_local, tiny):
    result = rayfl.run(TINY, tiny + ["rounds=8", "local.epochs=2"], quiet=True)
    acc = result.metrics.column("test_accuracy").to_pylist()
    loss = result.metrics.column("train_loss").to_pylist()
    assert acc[-1] >= 0.5  # twice chance for 4 classes
    assert loss[-1] < 0.8 * loss[0]


def test_same_bytes_for_1_and_3_actors(ray_local, tiny):
    hashes = set()
    for actors in (1, 3):  # all groups on one actor; an uneven split
        res = rayfl.run(TINY, tiny + ["rounds=3", f"runtime.num_actors={actors}",
                                      "runtime.cpus_per_actor=0.5", "algorithm.name=scaffold"],
                        quiet=True)
        hashes.add(res.summary["model_sha256"])
    assert len(hashes) == 1


def test_fractional_gpus_pack_four_actors_on_one_gpu(tmp_path):
    """Logical GPU (no CUDA here): four actors at 0.25 GPU share GPU 0 and fall back to CPU."""
    proc = _rayfl("run", TINY, f"data.cache_dir={tmp_path / 'cache'}", "rounds=1",
                  "runtime.num_actors=4", "runtime.cpus_per_actor=0.5",
                  "runtime.gpus_per_actor=0.25", "runtime.ray_num_gpus=1", "runtime.ray_num_cpus=2",
                  "--quiet", f"--run-dir={tmp_path / 'run'}")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    placement = json.load(open(tmp_path / "run" / "actors.json"))
    assert sorted(placement) == [f"rayfl/run/client-{i}" for i in range(4)]
    assert all(p["gpu_ids"] == ["0"] for p in placement.values())
    assert {p["device"] for p in placement.values()} == {"cpu"}


@pytest.mark.parametrize("gpus, ray_ids, cuda, device", [
    (0.25, ["0"], True, "cuda"),   # Ray gave a GPU and torch sees CUDA
    (0.25, ["0"], False, "cpu"),   # a logical GPU only (this machine)
    (0.25, [], True, "cpu"),       # Ray assigned none
    (0.0, ["0"], True, "cpu"),     # not asked for
])
def test_an_actor_trains_on_cuda_only_when_ray_gave_it_a_gpu_torch_can_see(
        gpus, ray_ids, cuda, device, monkeypatch):
    import ray
    import torch

    from rayfl.runtime import client_actor

    monkeypatch.setattr(client_actor, "in_ray_actor", lambda: True)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ray_ids)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert client_actor.pick_device(gpus) == torch.device(device)


@pytest.mark.parametrize("gpus, cuda, device", [(0.5, True, "cuda"), (0.5, False, "cpu"),
                                                (0.0, True, "cpu")])
def test_in_process_training_takes_the_gpu_share_without_asking_ray(gpus, cuda, device,
                                                                    monkeypatch):
    """``runtime.executor: inprocess`` with a GPU share trains on CUDA when torch sees one; Ray
    is not asked (its ``get_gpu_ids`` starts a local Ray in a process without one)."""
    import ray
    import torch

    from rayfl.runtime import client_actor

    def no_ray():
        raise AssertionError("Ray was asked for GPU ids in-process")

    monkeypatch.setattr(ray, "get_gpu_ids", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert client_actor.pick_device(gpus) == torch.device(device)


def _rayfl(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "rayfl", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_resume_after_sigkill_gives_same_bytes(tmp_path):
    rounds = 20  # killed after 3: 17 rounds of margin between the poll and the kill
    common = [f"data.cache_dir={tmp_path / 'cache'}", f"rounds={rounds}", "algorithm.name=scaffold",
              "data.num_clients=40", "clients_per_round=8", "local.epochs=3"]
    killed_dir = tmp_path / "killed"
    victim = _rayfl("run", TINY, *common, f"--run-dir={killed_dir}", "runtime.num_actors=1",
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = killed_dir / "metrics.parquet"
    while not (metrics.exists() and read_table(metrics).num_rows >= 3):  # the run rewrites it
        assert victim.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert read_table(metrics).num_rows < rounds
    resumed = _rayfl("resume", str(killed_dir), "--quiet")
    out_resumed, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out_resumed
    # the uninterrupted run, in this process (the executors give the same bytes)
    full = rayfl.run(TINY, [*common, "runtime.executor=inprocess"], quiet=True,
                     run_dir=str(tmp_path / "full"))
    s_res = json.load(open(killed_dir / "summary.json"))
    assert s_res["model_sha256"] == full.summary["model_sha256"]
    assert pq.read_table(killed_dir / "metrics.parquet").column("round").to_pylist() == list(
        range(1, rounds + 1))


def test_compare_runs_each_algorithm_on_the_same_setting(ray_local, tiny):
    import yaml

    from rayfl.compare import compare

    over = tiny + ["rounds=2", "local.momentum=0.5", "runtime.executor=inprocess"]
    out, rows = compare(TINY, ["fedavg", "fedmim", "fedavg+ima"], over, quiet=True)
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedmim", "fedavg+ima"]
    assert {"comparison.md", "comparison.parquet", "accuracy.png"} <= set(os.listdir(out))
    table = open(os.path.join(out, "comparison.md")).read()
    assert all(f"| {r['algorithm']} |" in table for r in rows)
    # fedmim swaps momentum ρ for plain SGD at the same effective step η/(1 − ρ)
    mim = yaml.safe_load(open(os.path.join(out, "fedmim", "config.yaml")))
    assert (mim["local"]["momentum"], mim["local"]["lr"]) == (0.0, 0.2)
    # each entry is exactly the run its config describes
    alone = rayfl.run(TINY, over, quiet=True)
    assert rows[0]["model_sha256"] == alone.summary["model_sha256"]


def test_deterministic_gpu_switches_torch_to_deterministic_kernels(monkeypatch):
    """``runtime.deterministic_gpu``: cuBLAS's fixed workspace (unless the user set one) and
    ``torch.use_deterministic_algorithms`` in the client's process (on the H100, 1 and 2 actors
    then gave the same bytes: docs/performance.md)."""
    import torch

    from rayfl.runtime.client_actor import deterministic_kernels

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        deterministic_kernels()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before)
