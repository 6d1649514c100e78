"""A corpus of malformed data: files in each built-in format and user loaders that break the
dataset contract.

Every case goes through the CLI in this process (``rayfl data``, ``rayfl run --dry-run`` or
``rayfl run``) and must end with exit status 2 and exactly one line on stderr naming the file
(a built-in loader) or the component ``module:Name.load`` (a user's loader) and what was wrong,
leaving nothing behind: no run directory, no plot folder, no partition cache entry, no lock file.
The files are small copies in the real formats (gzipped IDX, LEAF json, TFF SQLite, ...) that the
tests write. The second half checks the partition cache key: an edited dataset or loader is
rebuilt, an untouched one is not.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import json
import os
import sqlite3
import struct
import threading

import numpy as np
import pytest

from rayfl import config
from rayfl.cli import main
from rayfl.data import datasets, prepare, sources, store
from rayfl.data.datasets import Arrays
from tests.conftest import TINY
from tests.test_text_data import write_sqlite

HERE = "tests.test_data_boundary"


def refused(tmp_path, capsys, overrides, *, command="data", frames=False) -> str:
    """Run ``command`` on the tiny config with ``overrides``; assert exit 2, one line (then the
    user's frames when ``frames``), and nothing created; return the line."""
    runs, cache, plots = tmp_path / "runs", tmp_path / "cache", tmp_path / "plots"
    argv = {"data": ["data", TINY, "--out", str(plots)], "dry-run": ["run", TINY, "--dry-run"],
            "run": ["run", TINY],
            "compare": ["compare", TINY, "--algorithms", "fedavg,fedprox", "--seeds", "0,1"]
            }[command]
    code = main([*argv, f"output_dir={runs}", f"data.cache_dir={cache}", "clients_per_round=1",
                 *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err and err[0].startswith("rayfl: error: "), err
    if frames:
        assert all(line.startswith(" ") for line in err[1:]), err
    else:
        assert len(err) == 1, err
    assert not runs.exists() and not plots.exists()
    assert not cache.exists(), sorted(os.listdir(cache))  # no store, no lock, no folder made
    return err[0]


# ----- files in the built-in formats -----------------------------------------------------------

def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """An IDX file: magic 0 0 ``code`` ndim, big-endian sizes, the values."""
    return bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + \
        array.astype(np.uint8).tobytes()


FMNIST = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
          "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}


def write_fmnist(root, n_train=20, n_test=10, seed=0, gz=True, **replace) -> dict:
    """A Fashion-MNIST copy in IDX format; ``replace`` maps a key of FMNIST to raw bytes or an
    array written instead. Returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {"x_train": rng.integers(0, 256, (n_train, 28, 28)),
              "y_train": np.arange(n_train) % 10,
              "x_test": rng.integers(0, 256, (n_test, 28, 28)),
              "y_test": np.arange(n_test) % 10}
    os.makedirs(root, exist_ok=True)
    for key, stem in FMNIST.items():
        value = replace.get(key, arrays[key])
        blob = value if isinstance(value, bytes) else idx_bytes(value)
        path = os.path.join(root, stem + (".gz" if gz else ""))
        with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
            f.write(blob)
    return arrays


def write_femnist(root, users=None, edit=None) -> None:
    """LEAF femnist json (train and test, one file each); ``edit(split, blob)`` may spoil it."""
    rng = np.random.default_rng(0)
    users = users or {"f0": (4, 2), "f1": (3, 1)}
    for split, col in (("train", 0), ("test", 1)):
        blob = {"users": list(users), "num_samples": [users[u][col] for u in users],
                "user_data": {u: {"x": (rng.integers(0, 256, (users[u][col], 784)) / 255)
                                  .tolist(), "y": [int(v) for v in rng.integers(0, 62,
                                                                               users[u][col])]}
                              for u in users}}
        if edit:
            edit(split, blob)
        os.makedirs(os.path.join(root, split), exist_ok=True)
        with open(os.path.join(root, split, f"all_data_{split}.json"), "w") as f:
            f.write(blob if isinstance(blob, str) else json.dumps(blob))


def spoil(split="train", **how):
    """An ``edit`` for :func:`write_femnist` applied to the train (or test) file."""
    def edit(s, blob):
        if s != split:
            return
        d = blob["user_data"]["f0"]
        if "pixel" in how:
            d["x"][1][5] = how["pixel"]
        if "width" in how:
            d["x"][0] = d["x"][0][:how["width"]]
        if "label" in how:
            d["y"][1] = how["label"]
        if "num_samples" in how:
            blob["num_samples"][0] = how["num_samples"]
        if "drop_label" in how:
            d["y"].pop()
        if "no_user_data" in how:
            del blob["user_data"]
    return edit


def _femnist(tmp_path, edit=None, extra_file=None):
    write_femnist(tmp_path / "femnist", edit=edit)
    if extra_file:
        with open(tmp_path / "femnist" / "train" / "more.json", "w") as f:
            json.dump(extra_file, f)
    return ["data.dataset=femnist", f"data.root={tmp_path / 'femnist'}", "data.partition=iid",
            "data.num_clients=2"]


def _fmnist(tmp_path, **replace):
    write_fmnist(tmp_path / "fm", **replace)
    return ["data.dataset=fmnist", f"data.root={tmp_path / 'fm'}", "data.partition=iid",
            "data.num_clients=2"]


RNG = np.random.default_rng(7)
IMAGES = RNG.integers(0, 256, (20, 28, 28))
IDX_CASES = [  # (id, replacement, file named, what the line says)
    ("label-out-of-range", {"y_train": np.r_[np.arange(19) % 10, 12]}, FMNIST["y_train"],
     "labels in 0..9 (label 12 at row 19)"),
    ("fewer-labels-than-images", {"y_train": np.arange(19) % 10}, FMNIST["y_train"],
     "19 labels, 20 images"),
    ("truncated-images", {"x_train": idx_bytes(IMAGES)[:-100]}, FMNIST["x_train"],
     "15680 values, the file holds 15580"),
    ("images-not-28x28", {"x_train": RNG.integers(0, 256, (20, 30, 30))}, FMNIST["x_train"],
     "28×28"),
    ("labels-2d", {"y_test": np.zeros((10, 2), int)}, FMNIST["y_test"], "one per image"),
    ("float-idx", {"x_test": idx_bytes(IMAGES[:10], code=0x0D)}, FMNIST["x_test"],
     "not 00 00 08"),
    ("empty-file", {"y_test": b""}, FMNIST["y_test"], "it starts empty"),
    ("header-cut", {"y_test": b"\0\0\x08\x01\0\0"}, FMNIST["y_test"],
     "it ends inside its header (6 bytes)"),
]


@pytest.mark.parametrize("replace, name, says", [c[1:] for c in IDX_CASES],
                         ids=[c[0] for c in IDX_CASES])
def test_malformed_idx_file_is_named(replace, name, says, tmp_path, capsys):
    line = refused(tmp_path, capsys, _fmnist(tmp_path, **replace))
    assert name in line and says in line


def test_a_gz_name_that_is_not_gzip_is_named(tmp_path, capsys):
    over = _fmnist(tmp_path)
    (tmp_path / "fm" / (FMNIST["y_train"] + ".gz")).write_bytes(b"not gzip at all")
    line = refused(tmp_path, capsys, over)
    assert FMNIST["y_train"] in line and "BadGzipFile" in line


def test_emnist_letters_label_outside_1_to_26_is_named(tmp_path, capsys):
    root = tmp_path / "emnist"
    root.mkdir()
    for part, n in (("train", 6), ("test", 3)):
        labels = np.arange(1, n + 1) if part == "test" else np.r_[0, np.arange(1, n)]
        for kind, arr in (("images-idx3", RNG.integers(0, 256, (n, 28, 28))),
                          ("labels-idx1", labels)):
            (root / f"emnist-letters-{part}-{kind}-ubyte").write_bytes(idx_bytes(arr))
    line = refused(tmp_path, capsys, ["data.dataset=emnist", f"data.root={root}",
                                      "data.partition=iid", "data.num_clients=2"])
    assert "emnist-letters-train-labels-idx1-ubyte" in line and "labels in 1..26" in line


TRAIN, TEST = "all_data_train.json", "all_data_test.json"
FEMNIST_CASES = [  # (id, how the file is spoilt, the file named, what the line says)
    ("nan-pixel", spoil(pixel=float("nan")), TRAIN, "finite pixels in [0, 1] (row 1 holds nan)"),
    ("inf-pixel", spoil(pixel=float("inf")), TRAIN, "row 1 holds inf"),
    ("pixel-above-1", spoil(pixel=2.0), TRAIN, "row 1 holds 2.0"),
    ("rows-of-100", spoil(width=100), TRAIN, "x rows of 784 numbers"),
    ("label-70", spoil(label=70), TRAIN, "labels in 0..61 (y[1] is 70)"),
    ("negative-label", spoil(label=-1), TRAIN, "labels in 0..61 (y[1] is -1)"),
    ("fractional-label", spoil(label=3.5), TRAIN, "(y[1] is 3.5)"),
    ("text-label", spoil(label="a"), TRAIN, "(y[1] is 'a')"),
    ("num-samples-wrong", spoil(num_samples=9), TRAIN,
     "num_samples says 9 for user 'f0', who has 4"),
    ("fewer-labels", spoil(drop_label=True), TRAIN, "user 'f0' has 4 rows in x but 3 labels"),
    ("no-user-data", spoil(no_user_data=True), TRAIN,
     "users (a list), num_samples (a list) and user_data (an object)"),
    ("test-label", spoil("test", label=62), TEST, "labels in 0..61 (y[1] is 62)"),
    ("test-num-samples", spoil("test", num_samples=0), TEST, "num_samples says 0"),
]


@pytest.mark.parametrize("edit, name, says", [c[1:] for c in FEMNIST_CASES],
                         ids=[c[0] for c in FEMNIST_CASES])
def test_malformed_leaf_json_is_named(edit, name, says, tmp_path, capsys):
    line = refused(tmp_path, capsys, _femnist(tmp_path, edit))
    assert name in line and says in line, line


def test_leaf_file_that_is_not_json_is_named(tmp_path, capsys):
    over = _femnist(tmp_path)
    (tmp_path / "femnist" / "test" / "all_data_test.json").write_text("{users: [")
    line = refused(tmp_path, capsys, over)
    assert "all_data_test.json" in line and "JSONDecodeError" in line


def test_leaf_user_in_two_files_is_named(tmp_path, capsys):
    twice = {"users": ["f1"], "num_samples": [1], "user_data": {"f1": {"x": [[0.0] * 784],
                                                                       "y": [3]}}}
    line = refused(tmp_path, capsys, _femnist(tmp_path, extra_file=twice))
    assert "more.json" in line and "'f1' is also in" in line and "all_data_train.json" in line


def _leaf_text(tmp_path, dataset, train, test):
    for split, users in (("train", train), ("test", test)):
        os.makedirs(tmp_path / dataset / split, exist_ok=True)
        blob = {"users": list(users), "num_samples": [len(d["y"]) for d in users.values()],
                "user_data": users}
        (tmp_path / dataset / split / f"{split}.json").write_text(json.dumps(blob))
    return [f"data.dataset={dataset}", f"data.root={tmp_path / dataset}", "data.partition=iid",
            "data.num_clients=1"]


S80 = "a" * 80
ROW = ["1", "Mon", "NO_QUERY", "u", "good day"]
LEAF_TEXT_CASES = [
    ("shakespeare-x-79", "leaf_shakespeare", {"P": {"x": [S80, "b" * 79], "y": ["c", "d"]}},
     "x rows of 80 characters (x[1] is 79 characters)"),
    ("shakespeare-y-two-chars", "leaf_shakespeare", {"P": {"x": [S80], "y": ["cd"]}},
     "y labels of one character (y[0] is 'cd')"),
    ("sent140-label-2", "sent140", {"u": {"x": [ROW, ROW], "y": [1, 2]}},
     "labels in 0..1 (y[1] is 2)"),
    ("sent140-row-without-text", "sent140", {"u": {"x": [ROW[:3]], "y": [1]}},
     "text at index 4"),
]


@pytest.mark.parametrize("dataset, train, says", [c[1:] for c in LEAF_TEXT_CASES],
                         ids=[c[0] for c in LEAF_TEXT_CASES])
def test_malformed_leaf_text_is_named(dataset, train, says, tmp_path, capsys):
    good = {"P": {"x": [S80], "y": ["c"]}} if dataset == "leaf_shakespeare" else \
        {"u": {"x": [ROW], "y": [0]}}
    line = refused(tmp_path, capsys, _leaf_text(tmp_path, dataset, train, good))
    assert "train.json" in line and says in line


def test_celeba_image_that_is_not_an_image_is_named(tmp_path, capsys):
    over = _leaf_text(tmp_path, "celeba", {"c": {"x": ["1.jpg"], "y": [1]}},
                      {"c": {"x": ["1.jpg"], "y": [0]}})
    folder = tmp_path / "celeba" / "img_align_celeba"
    folder.mkdir()
    (folder / "1.jpg").write_bytes(b"not a jpeg")
    line = refused(tmp_path, capsys, over)
    assert "1.jpg" in line and "UnidentifiedImageError" in line


def test_celeba_label_that_is_not_0_or_1_is_named(tmp_path, capsys):
    over = _leaf_text(tmp_path, "celeba", {"c": {"x": ["1.jpg"], "y": ["yes"]}},
                      {"c": {"x": ["1.jpg"], "y": [0]}})
    line = refused(tmp_path, capsys, over)
    assert "train.json" in line and "labels in 0..1 (y[0] is 'yes')" in line


# ----- TFF SQLite --------------------------------------------------------------------------------

GOOD_SO = [("train", "u1", {"tokens": b"how to sort"}), ("test", "u1", {"tokens": b"sort"})]


def _tff(tmp_path, make):
    path = tmp_path / "stackoverflow.sqlite"
    make(path)
    return ["data.dataset=stackoverflow", f"data.root={path}", "data.partition=natural",
            "data.num_clients=1", "model.name=transformer_lm"]


def _truncated(path):
    write_sqlite(path, GOOD_SO * 50)
    blob = path.read_bytes()
    path.write_bytes(blob[:len(blob) // 2])


def _sql(*statements):
    def make(path):
        con = sqlite3.connect(path)
        for s in statements:
            con.execute(s)
        con.commit()
        con.close()
    return make


def _garbage_blob(path):
    _sql("CREATE TABLE examples (split_name TEXT, client_id TEXT, serialized_example_proto BLOB)",
         "INSERT INTO examples VALUES ('train', 'u', x'0affff')")(path)


TFF_CASES = [
    ("not-sqlite", lambda p: p.write_text("client_id,tokens\nu,how to\n"),
     "file is not a database"),
    ("truncated", _truncated, "DatabaseError"),
    ("empty-file", lambda p: p.write_bytes(b""), "no such table: examples"),
    ("wrong-table", _sql("CREATE TABLE other (a)"), "no such table: examples"),
    ("wrong-columns", _sql("CREATE TABLE examples (split TEXT, client TEXT, blob BLOB)"),
     "no such column"),
    ("blob-not-a-proto", _garbage_blob, "IndexError"),
    ("feature-missing", lambda p: write_sqlite(p, [("train", "u", {"snippets": b"x"})]),
     "KeyError: 'tokens'"),
    ("no-test-rows", lambda p: write_sqlite(p, GOOD_SO[:1]), "split 'test' for its first 1"),
    ("no-train-rows", lambda p: write_sqlite(p, GOOD_SO[1:]), "split 'train' (it has none)"),
]


@pytest.mark.parametrize("make, says", [c[1:] for c in TFF_CASES], ids=[c[0] for c in TFF_CASES])
def test_malformed_tff_sqlite_is_named(make, says, tmp_path, capsys):
    line = refused(tmp_path, capsys, _tff(tmp_path, make))
    assert "stackoverflow.sqlite" in line and says in line and "Traceback" not in line


# ----- Shakespeare plays, CIFAR, MovieLens ------------------------------------------------------

def test_shakespeare_file_of_garbage_is_named_not_leaf_min_samples(tmp_path, capsys):
    (tmp_path / "plays").mkdir()
    (tmp_path / "plays" / "noise_gut.txt").write_bytes(bytes(range(256)) * 40)
    line = refused(tmp_path, capsys, ["data.dataset=shakespeare",
                                      f"data.root={tmp_path / 'plays'}",
                                      "data.partition=natural", "data.num_clients=1"])
    assert "noise_gut.txt" in line and "no role with more than two lines" in line
    assert "leaf_min_samples" not in line


def test_shakespeare_folder_without_plays_is_named(tmp_path, capsys):
    (tmp_path / "plays").mkdir()
    (tmp_path / "plays" / "notes.txt").write_text("garbage")
    line = refused(tmp_path, capsys, ["data.dataset=shakespeare",
                                      f"data.root={tmp_path / 'plays'}",
                                      "data.partition=natural", "data.num_clients=1"])
    assert str(tmp_path / "plays") in line and "*_gut.txt" in line


def test_cifar_label_out_of_range_is_named(tmp_path, capsys):
    import pickle

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [10, 0] if name == "data_batch_3" else [1, 2]
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels}, f)
    line = refused(tmp_path, capsys, ["data.dataset=cifar10", f"data.root={tmp_path}",
                                      "data.partition=iid", "data.num_clients=2"])
    assert "data_batch_3" in line and "labels 0..10" in line


def test_movielens_ratings_of_garbage_are_named(tmp_path, capsys):
    (tmp_path / "ratings.dat").write_text("1::10::5::100\nthis is not a rating\n")
    (tmp_path / "users.dat").write_text("1::F::25::4::02134\n")
    (tmp_path / "movies.dat").write_text("10::A (1999)::Drama\n")
    line = refused(tmp_path, capsys, ["data.dataset=movielens", f"data.root={tmp_path}",
                                      "data.partition=natural", "data.num_clients=1"])
    assert "ratings.dat" in line and "UserID::MovieID::Rating::Timestamp" in line


def test_movielens_without_a_test_rating_says_so(tmp_path, capsys):
    (tmp_path / "ratings.dat").write_text("1::10::5::100\n2::10::3::100\n")  # one rating each
    (tmp_path / "users.dat").write_text("1::F::25::4::02134\n2::M::25::4::02134\n")
    (tmp_path / "movies.dat").write_text("".join(f"{m}::A (1999)::Drama\n" for m in range(10, 20)))
    line = refused(tmp_path, capsys, ["data.dataset=movielens", f"data.root={tmp_path}",
                                      "data.partition=iid", "data.num_clients=1"])
    assert "ratings.dat" in line and "at least one user who rated two movies" in line


def test_a_built_in_loader_passes_the_same_checks(tmp_path, capsys, monkeypatch):
    from rayfl.data.datasets import digits

    real = digits.load
    monkeypatch.setattr(digits, "load", lambda cfg, seed: dataclasses.replace(
        real(cfg, seed), num_classes=9))  # the digit 9 is now outside the classes
    line = refused(tmp_path, capsys, ["data.dataset=digits", "data.partition=iid",
                                      "data.num_clients=2"])
    folder = os.path.dirname(digits.sources(None)[0])
    assert f"'data.root' = '{folder}'" in line
    assert "digits files the loader can use (y_train holds the label 9" in line


# ----- user loaders breaking the contract -------------------------------------------------------

def good_arrays(n=40, n_test=10, features=16, classes=4) -> Arrays:
    """A well-formed small dataset (what the user loaders below spoil)."""
    rng = np.random.default_rng(0)
    return Arrays(rng.normal(size=(n, features)).astype(np.float32), np.arange(n) % classes,
                  rng.normal(size=(n_test, features)).astype(np.float32),
                  np.arange(n_test) % classes, input_shape=(features,), num_classes=classes)


def _loader(name, make, doc=""):
    """A loader class ``name`` whose load returns ``make(good_arrays())``."""
    return type(name, (), {"__module__": HERE, "__qualname__": name, "__doc__": doc,
                           "load": staticmethod(lambda cfg, seed: make(good_arrays()))})


def _with(**changes):
    return lambda a: dataclasses.replace(a, **changes)


def _set(field, index, value, dtype=None):
    def make(a):
        arr = getattr(a, field).astype(dtype or getattr(a, field).dtype)
        arr[index] = value
        return dataclasses.replace(a, **{field: arr})
    return make


USER_CASES = [  # (class name, what load returns, what the line says)
    ("LabelAboveClasses", _set("y_train", 5, 4),
     "y_train holds the label 4 (row 5); expected labels in 0..3 (num_classes 4)"),
    ("NegativeLabel", _set("y_test", 2, -1), "y_test holds the label -1 (row 2)"),
    ("FewerLabels", lambda a: dataclasses.replace(a, y_train=a.y_train[:33]),
     "x_train has 40 rows but y_train 33 labels"),
    ("NanFeature", _set("x_train", (3, 7), np.nan), "x_train holds nan (row 3); expected finite"),
    ("InfFeature", _set("x_test", (1, 0), -np.inf), "x_test holds -inf (row 1)"),
    ("RowSizeWrong", _with(input_shape=(1, 28, 28)),
     "rows of 16 values, but input_shape (1, 28, 28) needs 784"),
    ("ThreeDimensional", lambda a: dataclasses.replace(a, x_train=a.x_train.reshape(40, 4, 4)),
     "x_train has shape (40, 4, 4)"),
    ("ReturnsNone", lambda a: None, "returned None; expected rayfl.data.datasets.Arrays"),
    ("ReturnsTuple", lambda a: (a.x_train, a.y_train),
     "returned a tuple of 2; expected rayfl.data.datasets.Arrays"),
    ("TorchTensors", lambda a: dataclasses.replace(a, x_train=__import__("torch").from_numpy(
        a.x_train)), "x_train is a float32 tensor of shape (40, 16), not a numpy array"),
    ("ListLabels", lambda a: dataclasses.replace(a, y_test=a.y_test.tolist()),
     "y_test is a list of 10, not a numpy array"),
    ("FloatLabels", lambda a: dataclasses.replace(a, y_train=a.y_train + 0.5),
     "y_train is float64 of shape (40,); expected integer class labels"),
    ("ObjectFeatures", lambda a: dataclasses.replace(a, x_test=a.x_test.astype(object)),
     "x_test is of dtype object"),
    ("BoolFeatures", lambda a: dataclasses.replace(a, x_train=a.x_train > 0),
     "x_train is of dtype bool"),
    ("NoTestRows", lambda a: dataclasses.replace(a, x_test=a.x_test[:0], y_test=a.y_test[:0]),
     "x_test and y_test are empty; expected at least one test row"),
    ("NoTrainRows", lambda a: dataclasses.replace(a, x_train=a.x_train[:0],
                                                  y_train=a.y_train[:0]),
     "x_train and y_train are empty; expected at least one training row"),
    ("TestRowsWider", lambda a: dataclasses.replace(a, x_test=np.hstack([a.x_test,
                                                                         a.x_test])),
     "rows of 16 values in x_train but 32 in x_test"),
    ("ZeroClasses", _with(num_classes=0), "num_classes is 0"),
    ("ScaleNan", _with(scale=float("nan")), "scale is nan"),
    ("UnknownKind", _with(kind="image"), "kind is 'image'"),
    ("TokenOutOfVocab", lambda a: dataclasses.replace(
        a, x_train=np.full((40, 16), 3, np.int64), x_test=np.full((10, 16), 9, np.int64),
        kind="tokens", vocab=(5,)), "x_test holds the id 9 (row 0); expected ids below vocab"),
    ("IdsWithoutVocab", lambda a: dataclasses.replace(
        a, x_train=np.zeros((40, 16), np.int64), x_test=np.zeros((10, 16), np.int64),
        kind="ids", vocab=(3, 3)), "one table size per id column (16)"),
    ("EvalGroupUneven", _with(eval_group=3), "divides the 10 test rows"),
    ("NegativeGroups", lambda a: dataclasses.replace(a, groups=np.arange(40) - 1),
     "groups holds -1"),
]
for _name, _make, _ in USER_CASES:
    globals()[_name] = _loader(_name, _make)


@pytest.mark.parametrize("name, says", [(c[0], c[2]) for c in USER_CASES],
                         ids=[c[0] for c in USER_CASES])
def test_user_loader_breaking_the_contract_is_named(name, says, tmp_path, capsys):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:{name}", "data.partition=iid",
                                      "data.num_clients=2"])
    assert line.startswith(f"rayfl: error: {HERE}:{name}.load: ") and says in line, line


class NaturalWithoutGroups:
    """Says its rows carry users but gives no groups."""

    natural = True

    @staticmethod
    def load(cfg, seed):
        return good_arrays()


def test_natural_loader_without_groups_is_named(tmp_path, capsys):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:NaturalWithoutGroups",
                                      "data.partition=natural", "data.num_clients=2"])
    assert f"{HERE}:NaturalWithoutGroups.load: groups is None" in line


class Raises:
    """A loader whose own code fails."""

    @staticmethod
    def load(cfg, seed):
        rows = {}
        return rows["missing"]


def test_user_loader_that_raises_is_one_line_and_its_frames(tmp_path, capsys):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:Raises"], frames=True)
    assert line == f"rayfl: error: {HERE}:Raises.load: raised KeyError: 'missing'"


class NoLoad:
    """Not a dataset: nothing to call."""


def test_object_without_load_is_refused_on_data_dataset(tmp_path, capsys):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:NoLoad"])
    assert "'data.dataset'" in line and "load(data_cfg, seed)" in line


class BadSources:
    """Names a file that is not there as its source."""

    @staticmethod
    def sources(cfg):
        return ["/nonexistent/rayfl-data.csv"]

    @staticmethod
    def load(cfg, seed):
        return good_arrays()


def test_user_sources_naming_a_missing_file_is_named(tmp_path, capsys):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:BadSources"])
    assert f"{HERE}:BadSources.sources: named '/nonexistent/rayfl-data.csv'" in line


@pytest.mark.parametrize("command", ["dry-run", "run", "compare"])
def test_every_command_refuses_before_making_anything(command, tmp_path, capsys, no_ray):
    line = refused(tmp_path, capsys, [f"data.dataset={HERE}:FewerLabels"], command=command)
    assert "x_train has 40 rows but y_train 33 labels" in line


def test_refusal_keeps_an_existing_cache_as_it_was(tmp_path, capsys):
    over = [f"data.cache_dir={tmp_path / 'cache'}", "data.partition=iid", "data.num_clients=2",
            "clients_per_round=1"]
    assert main(["data", TINY, f"output_dir={tmp_path / 'runs'}", "--out",
                 str(tmp_path / "ok"), *over]) == 0
    before = sorted(os.listdir(tmp_path / "cache"))
    assert len(before) == 1 and not before[0].startswith(".")  # the store alone, no lock file
    capsys.readouterr()
    code = main(["data", TINY, f"output_dir={tmp_path / 'runs'}", "--out", str(tmp_path / "no"),
                 *over, f"data.dataset={HERE}:NanFeature"])
    assert code == 2 and sorted(os.listdir(tmp_path / "cache")) == before


# ----- the partition cache key ------------------------------------------------------------------

def fmnist_cfg(root, cache, **data):
    return config.from_dict({"data": {"dataset": "fmnist", "root": str(root),
                                      "cache_dir": str(cache), "partition": "iid",
                                      "num_clients": 4, **data},
                             "clients_per_round": 1}).data


def stored_labels(handle) -> np.ndarray:
    reader = handle.open()
    return np.sort(np.asarray(reader.y))


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "plain"])
def test_rewritten_training_labels_are_rebuilt_and_seen(gz, tmp_path, capsys):
    written = write_fmnist(tmp_path / "fm", gz=gz)
    argv = ["data", TINY, f"output_dir={tmp_path / 'runs'}", "--out", str(tmp_path / "plots"),
            "data.dataset=fmnist", f"data.root={tmp_path / 'fm'}", "data.partition=iid",
            "data.num_clients=4", f"data.cache_dir={tmp_path / 'cache'}", "clients_per_round=1"]
    assert main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0].split(" | ")[-1]
    labels_file = tmp_path / "fm" / (FMNIST["y_train"] + (".gz" if gz else ""))
    stamp = os.stat(labels_file)
    new = (written["y_train"] + 3) % 10
    write_fmnist(tmp_path / "fm", gz=gz, y_train=new)
    os.utime(labels_file, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # an edit in one clock tick
    if not gz:
        assert os.stat(labels_file).st_size == stamp.st_size
    assert main(argv) == 0
    second = capsys.readouterr().out.splitlines()[0].split(" | ")[-1]
    assert second != first
    np.testing.assert_array_equal(stored_labels(store.DataHandle.at(first)),
                                  np.sort(written["y_train"]))
    np.testing.assert_array_equal(stored_labels(store.DataHandle.at(second)), np.sort(new))
    assert sorted(n for n in os.listdir(tmp_path / "cache") if n.startswith(".")) == []


def test_untouched_dataset_reuses_its_store_and_a_touch_does_not_rebuild(tmp_path):
    write_fmnist(tmp_path / "fm")
    cfg = fmnist_cfg(tmp_path / "fm", tmp_path / "cache")
    first = prepare(cfg, 0)
    stamp = os.stat(os.path.join(first.path, "train.arrow")).st_mtime_ns
    os.utime(tmp_path / "fm" / (FMNIST["x_test"] + ".gz"))  # contents unchanged: same key
    again = prepare(cfg, 0)
    assert again.path == first.path
    assert os.stat(os.path.join(again.path, "train.arrow")).st_mtime_ns == stamp


def test_large_datasets_are_keyed_by_size_and_modification_time(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "HASHED_BYTES", 0)  # every dataset counts as large
    write_fmnist(tmp_path / "fm")
    cfg = fmnist_cfg(tmp_path / "fm", tmp_path / "cache")
    key = store.partition_key(cfg, 0)
    path = tmp_path / "fm" / (FMNIST["x_test"] + ".gz")
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 10**9))
    touched = store.partition_key(cfg, 0)
    assert touched != key
    # the rebuilt store holds the same bytes (the same fingerprint)
    rebuilt = prepare(cfg, 0)
    assert rebuilt.path.endswith(touched)
    fresh = prepare(fmnist_cfg(tmp_path / "fm", tmp_path / "c2"), 0)
    assert rebuilt.fingerprint == fresh.fingerprint


def test_source_identity_follows_contents_for_small_datasets(tmp_path):
    a = tmp_path / "a.bin"
    a.write_bytes(b"12345")
    before = sources.digest([str(tmp_path)])
    a.write_bytes(b"12346")
    assert sources.digest([str(tmp_path)]) != before
    a.write_bytes(b"12345")
    os.utime(a, ns=(0, 123))
    assert sources.digest([str(tmp_path)]) == before  # contents, not the time
    (tmp_path / "b.bin").write_bytes(b"")
    assert sources.digest([str(tmp_path)]) != before  # a new file in a source folder
    assert sources.files([str(a), str(tmp_path / "missing")]) == [str(a)]


USER_MODULE = '''
import numpy as np
from rayfl.data.datasets import Arrays


class Tiny:
    """{doc}"""

    @staticmethod
    def load(cfg, seed):
        x = np.arange(40, dtype=np.float32).reshape(20, 2)
        return Arrays(x, np.arange(20) % 2, x[:4], np.arange(4) % 2, input_shape=(2,),
                      num_classes=2)
'''


def test_user_loader_is_keyed_by_its_module_file_and_data_root(tmp_path, monkeypatch):
    (tmp_path / "mine_loader.py").write_text(USER_MODULE.format(doc="v1"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.csv").write_text("1,2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = config.from_dict({"data": {"dataset": "mine_loader:Tiny", "partition": "iid",
                                     "num_clients": 2, "root": str(tmp_path / "data")},
                            "clients_per_round": 1}).data
    key = store.partition_key(cfg, 0)
    assert store.partition_key(cfg, 0) == key
    (tmp_path / "mine_loader.py").write_text(USER_MODULE.format(doc="v2"))
    edited = store.partition_key(cfg, 0)
    assert edited != key
    (tmp_path / "data" / "rows.csv").write_text("1,3\n")
    assert store.partition_key(cfg, 0) != edited


def test_rayfls_own_loader_code_is_in_the_key(tmp_path, monkeypatch):
    write_fmnist(tmp_path / "fm")
    cfg = fmnist_cfg(tmp_path / "fm", tmp_path / "cache")
    key = store.partition_key(cfg, 0)
    monkeypatch.setattr(sources, "build_code", lambda: "another version")
    assert store.partition_key(cfg, 0) != key


def test_built_in_sources_are_the_files_each_loader_reads(tmp_path):
    write_fmnist(tmp_path / "fm")
    (tmp_path / "fm" / "README").write_text("not read")
    got = datasets.sources(fmnist_cfg(tmp_path / "fm", tmp_path / "cache"))
    assert sorted(os.path.basename(p) for p in got) == sorted(s + ".gz" for s in FMNIST.values())
    write_femnist(tmp_path / "leaf")
    os.makedirs(tmp_path / "leaf" / "all_data")
    (tmp_path / "leaf" / "all_data" / "all.json").write_text("{}")  # LEAF's raw data: not read
    cfg = config.from_dict({"data": {"dataset": "femnist", "root": str(tmp_path / "leaf")},
                            "clients_per_round": 1}).data
    assert sorted(os.path.relpath(p, tmp_path / "leaf") for p in datasets.sources(cfg)) == \
        ["test/all_data_test.json", "train/all_data_train.json"]


# ----- the lock that keeps one builder per store -------------------------------------------------

def test_the_lock_file_is_removed_and_a_waiter_locks_the_next_one(tmp_path):
    path = str(tmp_path / ".key.lock")
    entered, leave = threading.Event(), threading.Event()

    def waiter():
        with store._locked(path):
            entered.set()
            leave.wait(10)

    with store._locked(path):
        other = threading.Thread(target=waiter)
        other.start()
        with open(path) as probe, pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not entered.is_set()
    assert entered.wait(10)  # the waiter holds the lock on the file now at the path
    with open(path) as probe, pytest.raises(BlockingIOError):
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    leave.set()
    other.join(10)
    assert not os.path.exists(path)
