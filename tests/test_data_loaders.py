"""Dataset loaders on small files the tests write in each dataset's real on-disk format."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import sys

import numpy as np
import pytest
import torch

from rayfl import config
from rayfl.data import datasets, prepare
from rayfl.schema import ConfigError


def data_cfg(**data):
    """A validated DataConfig from ``data.*`` keys."""
    return config.from_dict({"data": data, "clients_per_round": 1}).data


# ----- CIFAR: the python-pickle batches torchvision reads ------------------------------------

def write_cifar10(root, per_batch=6, seed=0):
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        blob = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                b"filenames": [f"img{i}.png".encode() for i in range(per_batch)]}
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump(blob, f, protocol=2)
        batches[name] = (data, labels)
    return batches


def test_cifar10_reads_the_pickled_batches_in_order(tmp_path):
    batches = write_cifar10(tmp_path)
    a = datasets.load(data_cfg(dataset="cifar10", root=str(tmp_path)), 0)
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    np.testing.assert_array_equal(a.x_train, np.concatenate([d for d, _ in train]))
    assert a.y_train.tolist() == sum((labels for _, labels in train), [])
    np.testing.assert_array_equal(a.x_test, batches["test_batch"][0])
    assert (a.input_shape, a.num_classes, a.scale) == ((3, 32, 32), 10, 1 / 255)
    # channel-major: the first 1024 values of a row are the red plane
    handle = prepare(data_cfg(dataset="cifar10", root=str(tmp_path), num_clients=3,
                              partition="iid", cache_dir=str(tmp_path / "c")), 0)
    reader = handle.open()
    x, _ = reader.tensors(*reader.test(), "cpu")
    assert x.shape == (6, 3, 32, 32)
    assert float(x[0, 0, 0, 1]) == pytest.approx(batches["test_batch"][0][0, 1] / 255)
    assert float(x[0, 1, 0, 0]) == pytest.approx(batches["test_batch"][0][0, 1024] / 255)


def test_cifar100_uses_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in (("train", 8), ("test", 4)):
        blob = {b"filenames": [b"x"] * n, b"batch_label": b"b",
                b"fine_labels": list(range(90, 90 + n)), b"coarse_labels": [1] * n,
                b"data": np.full((n, 3072), 7, dtype=np.uint8)}
        with open(folder / name, "wb") as f:
            pickle.dump(blob, f, protocol=2)
    a = datasets.load(data_cfg(dataset="cifar100", root=str(tmp_path)), 0)
    assert a.num_classes == 100 and a.y_train.tolist() == list(range(90, 98))
    assert a.x_test.shape == (4, 3072)


def test_missing_cifar_files_are_named(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        datasets.load(data_cfg(dataset="cifar10", root=str(tmp_path)), 0)
    assert e.value.key == "data.root"
    assert "data_batch_2" in e.value.expected and "test_batch" in e.value.expected
    with pytest.raises(ConfigError, match="data_batch_1"):
        datasets.load(data_cfg(dataset="cifar10"), 0)  # no root at all


# ----- FEMNIST: LEAF json, one client per writer ---------------------------------------------

def write_leaf(root, users, seed=0):
    """LEAF's femnist layout; ``users`` maps writer id -> (train count, test count)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, col in (("train", 0), ("test", 1)):
        os.makedirs(os.path.join(root, split))
        names = sorted(users, reverse=True)  # files list writers in any order
        for part, chunk in enumerate((names[:2], names[2:])):
            blob = {"users": chunk, "num_samples": [users[u][col] for u in chunk], "user_data": {}}
            for u in chunk:
                n = users[u][col]
                x = rng.integers(0, 256, size=(n, 784)) / 255.0
                y = rng.integers(0, 62, size=n)
                blob["user_data"][u] = {"x": x.tolist(), "y": y.tolist()}
                out[(split, u)] = (x, y)
            with open(os.path.join(root, split, f"all_data_{part}_niid_0_keep_0_{split}_9.json"),
                      "w") as f:
                json.dump(blob, f)
    return out


def test_femnist_natural_partition_is_one_client_per_writer(tmp_path):
    users = {"f0003_11": (5, 1), "f0001_40": (3, 2), "f0100_07": (7, 1), "f0042_33": (2, 1)}
    written = write_leaf(tmp_path, users)
    cfg = data_cfg(dataset="femnist", root=str(tmp_path), partition="natural", num_clients=4,
                   cache_dir=str(tmp_path / "c"))
    reader = prepare(cfg, 0).open()
    for i, u in enumerate(sorted(users)):  # clients are the writers, sorted by id
        x, y = reader.client(i)
        wx, wy = written[("train", u)]
        np.testing.assert_array_equal(y, wy)
        np.testing.assert_array_equal(x, np.rint(wx * 255).astype(np.uint8))
    assert len(reader.test()[1]) == sum(t for _, t in users.values())
    first2 = prepare(cfg.__class__(**{**vars(cfg), "num_clients": 2}), 0)
    assert first2.sizes().tolist() == [users[u][0] for u in sorted(users)[:2]]
    with pytest.raises(ConfigError, match="4 writers"):
        prepare(cfg.__class__(**{**vars(cfg), "num_clients": 5}), 0)


def test_femnist_error_names_the_leaf_layout(tmp_path):
    with pytest.raises(ConfigError, match=r"train/\*\.json"):
        datasets.load(data_cfg(dataset="femnist", root=str(tmp_path)), 0)


# ----- EMNIST: IDX files -----------------------------------------------------------------------

def write_idx(path, array):
    code = {1: 0x0801, 3: 0x0803}[array.ndim]
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", code) + struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def test_emnist_letters_are_upright_and_zero_based(tmp_path):
    rng = np.random.default_rng(1)
    imgs = {p: rng.integers(0, 256, size=(n, 28, 28)) for p, n in (("train", 9), ("test", 4))}
    labels = {p: rng.integers(1, 27, size=len(imgs[p])) for p in imgs}
    for p in imgs:
        write_idx(tmp_path / f"emnist-letters-{p}-images-idx3-ubyte.gz", imgs[p])
        write_idx(tmp_path / f"emnist-letters-{p}-labels-idx1-ubyte.gz", labels[p])
    a = datasets.load(data_cfg(dataset="emnist", root=str(tmp_path)), 0)
    assert a.num_classes == 26
    np.testing.assert_array_equal(a.y_train, labels["train"] - 1)
    np.testing.assert_array_equal(a.x_test.reshape(-1, 28, 28), imgs["test"].transpose(0, 2, 1))
    with pytest.raises(ConfigError, match="emnist-digits-train-images-idx3-ubyte"):
        datasets.load(data_cfg(dataset="emnist", root=str(tmp_path), emnist_split="digits"), 0)


# ----- MovieLens-1M: ratings.dat, users.dat, movies.dat --------------------------------------

def write_movielens(root, ratings):
    """``ratings``: list of (user, movie, rating, timestamp); 150 movies, 5 users."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "ratings.dat"), "w") as f:
        f.writelines(f"{u}::{m}::{r}::{t}\n" for u, m, r, t in ratings)
    with open(os.path.join(root, "users.dat"), "w") as f:
        f.writelines(f"{u}::F::25::4::0213{u}\n" for u in range(1, 6))
    with open(os.path.join(root, "movies.dat"), "wb") as f:
        for m in range(1, 151):
            f.write(f"{m}::Caf\xe9: Part {m} (1999)::Drama|Comedy\n".encode("latin-1"))


ML_RATINGS = [  # user 1: latest is movie 30; user 2 rated twice at the same time (tie → 77)
    (1, 10, 5, 100), (1, 30, 3, 300), (1, 20, 4, 200), (1, 40, 1, 150),
    (2, 77, 4, 50), (2, 5, 2, 50), (2, 6, 5, 10),
    (3, 1, 5, 7), (3, 2, 5, 8), (3, 3, 5, 9),
    (5, 150, 2, 1), (5, 149, 3, 2),
]


def test_movielens_leave_one_out_and_sampled_negatives(tmp_path):
    write_movielens(tmp_path, ML_RATINGS)
    cfg = data_cfg(dataset="movielens", root=str(tmp_path), partition="natural", num_clients=4)
    a = datasets.load(cfg, 0)
    assert a.kind == "ids" and a.vocab == (5, 150) and a.eval_group == 100
    rated = {(u - 1, m - 1) for u, m, _, _ in ML_RATINGS}
    test = a.x_test.reshape(4, 100, 2)
    assert test[:, 0].tolist() == [[0, 29], [1, 76], [2, 2], [4, 148]]  # latest per user
    assert (a.y_test.reshape(4, 100)[:, 0] == 1).all() and a.y_test.sum() == 4
    for g in test:
        negs = [tuple(p) for p in g[1:]]
        assert len(set(negs)) == 99 and not set(negs) & rated and {u for u, _ in negs} == {g[0, 0]}
    pos = a.x_train[a.y_train == 1]
    assert sorted(map(tuple, pos)) == sorted(rated - {tuple(g[0]) for g in test})
    neg = a.x_train[a.y_train == 0]
    assert len(neg) == 4 * len(pos) and not {tuple(p) for p in neg} & rated
    for u in (0, 1, 2, 4):  # 4 negatives per training positive, for the same user
        assert (neg[:, 0] == u).sum() == 4 * (pos[:, 0] == u).sum()
    np.testing.assert_array_equal(a.groups, np.searchsorted([0, 1, 2, 4], a.x_train[:, 0]))
    again = datasets.load(cfg, 0)
    np.testing.assert_array_equal(again.x_train, a.x_train)
    assert not np.array_equal(datasets.load(cfg, 1).x_train, a.x_train)


def test_movielens_store_gives_id_tensors_per_user(tmp_path):
    write_movielens(tmp_path, ML_RATINGS)
    cfg = data_cfg(dataset="movielens", root=str(tmp_path), partition="natural", num_clients=4,
                   cache_dir=str(tmp_path / "c"))
    handle = prepare(cfg, 0)
    reader = handle.open()
    x, y = reader.tensors(*reader.client(0), "cpu")
    assert x.dtype == torch.int64 and x.shape == (15, 2) and (x[:, 0] == 0).all()
    assert int(y.sum()) == 3 and handle.sizes().tolist() == [15, 10, 10, 5]


def test_movielens_missing_files_are_named(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::1::5::1\n")
    with pytest.raises(ConfigError, match="users.dat, movies.dat"):
        datasets.load(data_cfg(dataset="movielens", root=str(tmp_path)), 0)


# ----- scikit-learn digits and FedProx Synthetic(α, β) ----------------------------------------

def test_digits_split_and_scale():
    a = datasets.load(data_cfg(dataset="digits"), 0)
    assert (len(a.y_train), len(a.y_test)) == (1438, 359)
    assert a.x_train.max() == 16 and a.scale == 1 / 16 and a.input_shape == (1, 8, 8)


def test_digits_without_sklearn_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ConfigError, match="scikit-learn"):
        datasets.load(data_cfg(dataset="digits"), 0)


def test_fedprox_synthetic_follows_its_generator():
    cfg = data_cfg(dataset="synthetic_fedprox", partition="natural", num_clients=300,
                   features=60, samples_per_client=40, sizes="lognormal", sigma=0.5,
                   test_samples=500)
    a = datasets.load(cfg, 3)
    sizes = np.bincount(a.groups)
    assert len(sizes) == 300 and sizes.min() >= 1 and abs(np.log(sizes).std() - 0.5) < 0.07
    assert a.x_train.shape == (sizes.sum(), 60) and len(a.y_test) == 500
    # within a client, feature j has variance j^-1.2 around the client's mean v_k
    within = np.concatenate([a.x_train[a.groups == k] - a.x_train[a.groups == k].mean(0)
                             for k in range(300)])
    var = within.var(0) * len(within) / (len(within) - 300)
    np.testing.assert_allclose(var, np.arange(1, 61) ** -1.2, rtol=0.06)
    np.testing.assert_array_equal(datasets.load(cfg, 3).x_train, a.x_train)
    # β spreads client means: Synthetic(0, 0) clients sit closer together than Synthetic(1, 1)
    spread = {}
    for b in (0.0, 1.0):
        c = cfg.__class__(**{**vars(cfg), "synthetic_alpha": b, "synthetic_beta": b})
        s = datasets.load(c, 3)
        means = np.stack([s.x_train[s.groups == k, 0].mean() for k in range(300)])
        spread[b] = means.std()
    assert spread[1.0] > 1.2 * spread[0.0]
