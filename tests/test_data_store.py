"""The partition store (memory-mapped, cached, re-derivable), drift regimes and `rayfl data`."""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil

import numpy as np
import pytest

from rayfl import cli, config
from rayfl.data import prepare, store
from rayfl.data.inspect import regime_drift
from rayfl.data.regime import regime_rows


def make_cfg(tmp_path, **data):
    base = {"dataset": "synthetic", "num_clients": 60, "samples_per_client": 30, "features": 3,
            "classes": 10, "test_samples": 20, "partition": "label_dirichlet", "alpha": 0.05,
            "cache_dir": str(tmp_path / "cache")}
    return config.from_dict({"data": {**base, **data}, "clients_per_round": 10}).data


def test_client_rows_are_zero_copy_views_of_the_mapped_file(tmp_path):
    reader = prepare(make_cfg(tmp_path), 0).open()
    x, y = reader.client(5)
    assert np.shares_memory(x, reader.x) and np.shares_memory(y, reader.y)
    assert not x.flags.writeable  # pages of a read-only memory map, not a copy
    lo, hi = int(reader.offsets[5]), int(reader.offsets[6])
    np.testing.assert_array_equal(reader.rows(np.arange(lo, hi))[1], y)


def test_prepare_reuses_the_cached_store(tmp_path):
    cfg = make_cfg(tmp_path)
    first = prepare(cfg, 0)
    stamp = os.stat(os.path.join(first.path, "train.arrow")).st_mtime_ns
    second = prepare(cfg, 0)
    assert second.path == first.path
    assert os.stat(os.path.join(second.path, "train.arrow")).st_mtime_ns == stamp
    # regime and cache_dir do not change the bytes; settings that do change the key
    same = store.partition_key(dataclasses.replace(cfg, regime="both"), 0)
    assert same == store.partition_key(dataclasses.replace(cfg, cache_dir="/elsewhere"), 0)
    assert same == store.partition_key(cfg, 0) != store.partition_key(cfg, 1)
    assert store.partition_key(dataclasses.replace(cfg, regime="client_only"), 0) == \
        store.partition_key(dataclasses.replace(cfg, partition="iid"), 0)


def test_a_process_without_the_drivers_store_rederives_it(tmp_path, monkeypatch):
    handle = prepare(make_cfg(tmp_path), 0)
    want = handle.open().client(7)[0].copy()
    shipped = pickle.loads(pickle.dumps(handle))  # what an actor on another node receives
    shutil.rmtree(handle.path)
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "node2"))
    monkeypatch.setattr(store, "_LOCAL", {})
    reader = shipped.open()
    assert reader.handle.path.startswith(str(tmp_path / "node2"))
    np.testing.assert_array_equal(reader.client(7)[0], want)
    assert shipped.sizes().sum() == 60 * 30
    forged = dataclasses.replace(shipped, fingerprint="0" * 64)
    with pytest.raises(RuntimeError, match="differs from the driver's"):
        forged.open()


def pooled(reader, ids):
    return np.sort(np.concatenate([np.arange(reader.offsets[i], reader.offsets[i + 1])
                                   for i in ids]))


@pytest.mark.parametrize("regime", ["iid", "both", "period_only", "client_only"])
def test_regime_rows_repartition_the_sampled_pool(tmp_path, regime):
    cfg = make_cfg(tmp_path, regime=regime)
    reader = prepare(cfg, 0).open()
    ids = [42, 3, 17, 8, 30]
    rows = regime_rows(reader, regime, ids, t=4, seed=0)
    assert sorted(rows) == sorted(ids)
    for i in ids:  # sizes kept
        assert len(rows[i]) == reader.offsets[i + 1] - reader.offsets[i]
    np.testing.assert_array_equal(np.sort(np.concatenate(list(rows.values()))),
                                  pooled(reader, ids))
    again = regime_rows(reader, regime, list(reversed(ids)), t=4, seed=0)
    assert all(np.array_equal(again[i], rows[i]) for i in ids)
    moved = regime_rows(reader, regime, ids, t=5, seed=0)
    same = all(np.array_equal(moved[i], rows[i]) for i in ids)
    assert same == (regime in ("iid", "both"))
    if regime in ("iid", "both"):
        for i in ids:
            np.testing.assert_array_equal(rows[i], np.arange(reader.offsets[i],
                                                             reader.offsets[i + 1]))


def test_regimes_separate_period_drift_from_client_drift(tmp_path):
    """Period drift = the sampled pool's labels vs the population; client drift = each sampled
    client's labels vs the pool. Each regime switches exactly its own kind on."""
    drift = {}
    for regime in ("iid", "period_only", "client_only", "both"):
        reader = prepare(make_cfg(tmp_path, regime=regime), 0).open()
        period, client = regime_drift(reader, regime, 10, 30, 0, 10)
        drift[regime] = period.mean(), client.mean()
    low_period = max(drift["iid"][0], drift["client_only"][0])
    assert drift["period_only"][0] > 2 * low_period and drift["both"][0] > 2 * low_period
    low_client = max(drift["iid"][1], drift["period_only"][1])
    assert drift["client_only"][1] > 2 * low_client and drift["both"][1] > 2 * low_client


def test_rayfl_data_prints_and_plots(tmp_path, capsys):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text("name: look\nclients_per_round: 5\nrounds: 6\ndata:\n  dataset: synthetic"
                        "\n  num_clients: 30\n  samples_per_client: 20\n  partition: dirichlet\n"
                        "  alpha: 0.5\n  min_samples: 1\n  validation_clients: 3\n")
    code = cli.main(["data", str(cfg_path), "data.regime=period_only",
                     f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={tmp_path / 'runs'}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "clients 27 training + 3 validation" in out
    assert "samples per client: min" in out and "regime period_only over 6 rounds" in out
    for name in ("labels.png", "drift.png"):
        with open(tmp_path / "runs" / "data-look" / name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["data", str(cfg_path), "data.partition=natural"]) == 2
    assert "data.partition" in capsys.readouterr().err


PAPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "papers")
DATASET_CONFIGS = ["adabest_cifar100", "adabest_emnist_letters", "fedeve_cifar100",
                   "fedeve_drift", "fedeve_femnist_dirichlet", "fedeve_femnist_natural",
                   "fedeve_movielens", "fedmim_cifar10", "fedprox_synthetic",
                   "ima_cifar10_shards"]


@pytest.mark.parametrize("name", DATASET_CONFIGS)
def test_paper_dataset_configs_validate(name):
    cfg = config.load(os.path.join(PAPERS, f"{name}.yaml"))
    assert cfg.clients_per_round <= cfg.data.num_clients - cfg.data.validation_clients

