"""The partition store: client-ordered Arrow files every actor memory-maps.

``prepare`` loads a dataset (checked by :mod:`rayfl.data.validate`), partitions it and writes,
once per (settings, seed, dataset files, loader code: :func:`partition_key`):

- ``train.arrow``: one record batch, rows grouped by client (``x`` a fixed-size list, ``y``);
  training clients first, then the ``data.validation_clients`` validation clients;
- ``offsets.npy``: client ``i`` owns rows ``offsets[i]:offsets[i+1]``;
- ``test.arrow`` and ``meta.json`` (shapes, counts, and a fingerprint of the files' bytes);
- with ``data.client_holdout`` > 0, ``holdout.arrow`` and ``holdout_offsets.npy``: each training
  client's held-out rows (carved out of its rows by :mod:`rayfl.data.holdout`), laid out the same
  way; the training rows above are then the rest.

A :class:`DataHandle` (small and picklable) names that directory and carries the config and
seed that made it. :meth:`DataHandle.open` memory-maps the files so that reading a client's rows
is a zero-copy slice and only the pages of clients that train are touched. A process that cannot
see the directory (a node without the driver's filesystem) re-derives the same bytes into its own
cache — ``prepare`` is deterministic — and checks them against the fingerprint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import torch

from rayfl import registry, schema
from rayfl.creatable import check_creatable
from rayfl.data import datasets, fetch, sources
from rayfl.data import partition as part
from rayfl.data.config import DataConfig
from rayfl.data.datasets import READ_ERRORS
from rayfl.data.holdout import carve
from rayfl.data.regime import RoundData
from rayfl.schema import ConfigError

FORMAT_VERSION = 2
FILES = ("train.arrow", "test.arrow", "offsets.npy")
HOLDOUT_FILES = ("holdout.arrow", "holdout_offsets.npy")


def default_cache_dir() -> str:
    """``$RAYFL_CACHE`` or ``~/.cache/rayfl`` (of the process that asks)."""
    return os.environ.get("RAYFL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                         "rayfl")


def loader_identity(cfg: DataConfig) -> dict:
    """What a store was built from besides the settings: the loader (``module:qualname``), the
    code that built it (rayfl's loaders and partitioners; a user's loader: its module file
    too) and the dataset's files (:mod:`rayfl.data.sources`), so that a swapped or edited
    loader or an edited dataset never reads another's cache."""
    loader = cfg.component()
    out = {"loader": registry.identity(loader), "code": sources.build_code(),
           "sources": sources.digest(datasets.sources(cfg))}
    if not datasets.is_rayfls(loader):
        out["loader_source"] = sources.module_code(loader)
    return out


def partition_key(cfg: DataConfig, seed: int) -> str:
    """Cache key: every setting that changes the store's bytes, the loader's identity and its
    own parameters included, and what the store is built from (:func:`loader_identity`)."""
    fields = {k: v for k, v in schema.to_dict(cfg).items()
              if k not in ("cache_dir", "regime", "partition", "fetch")}
    if not fields.get("client_holdout"):
        fields.pop("client_holdout", None)  # off: the key (and store) of a config without it
    blob = json.dumps({"v": FORMAT_VERSION, "seed": seed, "stored": cfg.stored_partition,
                       **loader_identity(cfg), **fields}, sort_keys=True, default=str)
    name = re.sub(r"[^A-Za-z0-9_]+", "_", cfg.dataset).strip("_")
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _table(x: np.ndarray, y: np.ndarray) -> pa.Table:
    flat = pa.array(np.ascontiguousarray(x).reshape(-1))
    xs = pa.FixedSizeListArray.from_arrays(flat, x.shape[1])
    ys = pa.array(y.astype(np.int32)) if y.ndim == 1 else pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(y, dtype=np.int32).reshape(-1)), y.shape[1])
    return pa.table({"x": xs, "y": ys})


def _write_arrow(path: str, table: pa.Table) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=max(table.num_rows, 1))


def _plain(value):
    """A loader's numpy number (``num_classes`` as ``np.int64``) as the Python number JSON
    holds."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} in the store's meta data")


def _fingerprint(path: str) -> str:
    """sha256 over the digests of the store's data files (what re-derivation must reproduce)."""
    h = hashlib.sha256()
    for name in FILES + HOLDOUT_FILES:
        if name in HOLDOUT_FILES and not os.path.isfile(os.path.join(path, name)):
            continue
        with open(os.path.join(path, name), "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()


def _build(cfg: DataConfig, seed: int, tmp: str) -> None:
    arrays = datasets.load(cfg, seed)
    order, offsets = part.split(cfg, arrays, seed)
    if cfg.client_holdout > 0:
        num_train = cfg.num_clients - cfg.validation_clients
        order, offsets, held, held_offsets = carve(order, offsets, num_train,
                                                   cfg.client_holdout, seed)
        _write_arrow(os.path.join(tmp, "holdout.arrow"),
                     _table(arrays.x_train[held], arrays.y_train[held]))
        np.save(os.path.join(tmp, "holdout_offsets.npy"), held_offsets[:num_train + 1])
    if len(order) == len(arrays.y_train) and np.array_equal(order, np.arange(len(order))):
        x, y = arrays.x_train, arrays.y_train  # already client-ordered: no copy
    else:
        x, y = arrays.x_train[order], arrays.y_train[order]
    _write_arrow(os.path.join(tmp, "train.arrow"), _table(x, y))
    _write_arrow(os.path.join(tmp, "test.arrow"), _table(arrays.x_test, arrays.y_test))
    np.save(os.path.join(tmp, "offsets.npy"), offsets)
    meta = {"input_shape": list(arrays.input_shape), "num_classes": arrays.num_classes,
            "scale": arrays.scale, "num_clients": cfg.num_clients - cfg.validation_clients,
            "num_validation_clients": cfg.validation_clients, "kind": arrays.kind,
            "vocab": list(arrays.vocab), "eval_group": arrays.eval_group,
            "client_holdout": cfg.client_holdout, "fingerprint": _fingerprint(tmp),
            "label_len": int(arrays.y_train.shape[1]) if arrays.y_train.ndim == 2 else 0,
            "ignore_index": arrays.ignore_index, "unscored": list(arrays.unscored)}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, default=_plain)


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created), removed on release so that the
    cache keeps no lock files. A process that gets the lock on a file another holder has
    already removed takes the lock again on the file now at ``path``."""
    while True:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = open(path, "a")  # noqa: SIM115 (held across the yield, closed below)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.path.samestat(os.fstat(lock.fileno()), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still holding the lock: the next holder checks it is current
        lock.close()


def _remove_empty(path: str, stop: str) -> None:
    """Remove ``path`` and its parents below ``stop`` while they are empty (folders a refused
    build made)."""
    while os.path.abspath(path) != os.path.abspath(stop):
        try:
            os.rmdir(path)
        except OSError:
            return
        path = os.path.dirname(path)


def prepare(cfg: DataConfig, seed: int, root: Optional[str] = None) -> "DataHandle":
    """Build (or reuse) the partition store for ``cfg`` under ``root`` (default: ``cfg.cache_dir``
    or :func:`default_cache_dir`) and return its handle. Processes preparing the same store
    take turns on a lock file, so a node builds it once. A refused build leaves nothing behind:
    no store, no lock file, no cache folder it made. With ``data.fetch``, a missing dataset is
    fetched first (:func:`rayfl.data.fetch.ensure`)."""
    cfg = fetch.ensure(cfg)
    root = os.path.abspath(root or cfg.cache_dir or default_cache_dir())
    key = partition_key(cfg, seed)
    path = os.path.join(root, key)
    if not os.path.isfile(os.path.join(path, "meta.json")) or damaged(path):
        existing = check_creatable(root, "data.cache_dir")  # a file, /proc, read-only: refused
        try:
            with _locked(os.path.join(root, f".{key}.lock")):
                why = damaged(path) if os.path.isfile(os.path.join(path, "meta.json")) else None
                if why:  # said, then built again: the same settings give the same bytes
                    print(f"rayfl: the partition store {path} is damaged ({why}); building it "
                          "again", file=sys.stderr, flush=True)
                    shutil.rmtree(path)
                if not os.path.isfile(os.path.join(path, "meta.json")):
                    _build_into(cfg, seed, root, path)
        except BaseException:
            _remove_empty(root, existing)
            raise
    return dataclasses.replace(DataHandle.at(path), cfg=cfg, seed=seed)


def damaged(path: str) -> str | None:
    """What is wrong with the stored partition at ``path`` (a file missing, cut short or
    overwritten: its meta data, Arrow files and offsets read and checked against each other,
    without reading the rows), or None."""
    try:
        handle = DataHandle.at(path)
        offsets = np.load(os.path.join(path, "offsets.npy"), mmap_mode="r")
        files = [("train.arrow", offsets, handle.num_clients + handle.num_validation_clients)]
        if handle.client_holdout > 0:
            files.append(("holdout.arrow", np.load(os.path.join(path, "holdout_offsets.npy"),
                                                   mmap_mode="r"), handle.num_clients))
        for name, offs, clients in files:
            rows = _rows(os.path.join(path, name))
            if offs.ndim != 1 or len(offs) != clients + 1 or int(offs[-1]) != rows:
                return (f"{name} holds {rows} rows, its offsets {len(offs)} entries ending at "
                        f"{int(offs[-1]) if len(offs) else None}")
        _rows(os.path.join(path, "test.arrow"))
    except READ_ERRORS as e:
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None


def _rows(path: str) -> int:
    """The rows of an Arrow file, read from its footer and batch headers."""
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        if reader.schema.names != ["x", "y"]:
            raise ValueError(f"{os.path.basename(path)} has columns {reader.schema.names}")
        return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def _build_into(cfg: DataConfig, seed: int, root: str, path: str) -> None:
    """Build the store in a fresh folder of ``root``, then move it to ``path`` in one step; a
    write that fails (a full disk, a folder made read-only) is a ConfigError on
    ``data.cache_dir``, with nothing left behind."""
    tmp = None
    try:
        tmp = tempfile.mkdtemp(dir=root, prefix=".tmp-")
        _build(cfg, seed, tmp)
        os.rename(tmp, path)
    except OSError as e:
        if not os.path.isfile(os.path.join(path, "meta.json")):  # not a lost race
            why = " ".join(str(e.strerror or e).split())
            raise ConfigError("data.cache_dir", root, f"a folder the partition store can be "
                              f"written to (writing {e.filename or path} failed: {why})") \
                from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


_LOCAL: dict[tuple[str, str], "DataHandle"] = {}  # this process's resolved stores


@dataclass(frozen=True)
class DataHandle:
    """Names a prepared partition; cheap to send to every actor.

    ``num_clients`` counts the clients that train (ids ``0..num_clients-1``, the ones to sample);
    the ``num_validation_clients`` after them hold validation data only.
    """

    path: str
    input_shape: tuple[int, ...]
    num_classes: int
    scale: float
    num_clients: int
    num_validation_clients: int = 0
    kind: str = "dense"  # "ids": integer columns the model embeds (MovieLens); "tokens": text
    vocab: tuple[int, ...] = ()
    eval_group: int = 0  # >0: the test set ranks consecutive groups of this many rows
    fingerprint: str = ""
    client_holdout: float = 0.0  # fraction of each training client's rows held out
    label_len: int = 0  # >0: every row has this many labels (one per position: next token)
    ignore_index: int = -100  # label of padding: in neither loss nor accuracy
    unscored: tuple[int, ...] = ()  # labels in the loss but not in the accuracy
    cfg: Optional[DataConfig] = None  # with seed: how to re-derive the store elsewhere
    seed: int = 0

    @classmethod
    def at(cls, path: str) -> "DataHandle":
        with open(os.path.join(path, "meta.json")) as f:
            m = json.load(f)
        return cls(path, tuple(m["input_shape"]), m["num_classes"], m["scale"], m["num_clients"],
                   m["num_validation_clients"], m["kind"], tuple(m["vocab"]), m["eval_group"],
                   m["fingerprint"], m.get("client_holdout", 0.0), m.get("label_len", 0),
                   m.get("ignore_index", -100), tuple(m.get("unscored", ())))

    @property
    def num_train_clients(self) -> int:
        """Clients that may be sampled for training (= ``num_clients``)."""
        return self.num_clients

    def local(self) -> "DataHandle":
        """This handle's store as this process sees it: its path when readable, else the same
        partition re-derived into this node's cache (checked against the fingerprint)."""
        if self.cfg is None or os.path.isfile(os.path.join(self.path, "meta.json")):
            return self
        key = (self.path, self.fingerprint)
        if key not in _LOCAL:
            here = prepare(self.cfg, self.seed, root=default_cache_dir())
            if here.fingerprint != self.fingerprint:
                raise RuntimeError(
                    f"the partition re-derived at {here.path} differs from the driver's "
                    f"{self.path} (fingerprint {here.fingerprint[:12]} vs "
                    f"{self.fingerprint[:12]}): give every node the same dataset files and "
                    "library versions, or a shared data.cache_dir")
            _LOCAL[key] = dataclasses.replace(here, cfg=self.cfg, seed=self.seed)
        return _LOCAL[key]

    def sizes(self) -> np.ndarray:
        """n_i for every training client (int64 array of length ``num_clients``)."""
        offsets = np.load(os.path.join(self.local().path, "offsets.npy"))
        return np.diff(offsets[:self.num_clients + 1])

    def open(self) -> "DataReader":
        """Memory-map the store (call inside the process that reads it)."""
        return DataReader(self.local())


def seeded_subset(n: int, k: int | None, seed) -> np.ndarray | None:
    """Sorted indices of a uniform draw of ``k`` of ``n`` rows keyed by ``seed``; None (every
    row) when ``k`` is None or not below ``n``."""
    if k is None or k >= n:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, k, replace=False))


def _mapped(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) columns of an Arrow file, zero-copy over a read-only memory map advised for
    random access: a round touches a few clients' rows scattered over the file, and the
    kernel's read-ahead would otherwise map (and count in this process's RSS) pages around
    each of them."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    table = pa.ipc.open_file(pa.py_buffer(mapped)).read_all()

    def one(name):
        col = table.column(name)
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()

    xcol, ycol = one("x"), one("y")
    x = xcol.values.to_numpy(zero_copy_only=True).reshape(-1, xcol.type.list_size)
    if pa.types.is_fixed_size_list(ycol.type):  # one label per position (next-token)
        return x, ycol.values.to_numpy(zero_copy_only=True).reshape(-1, ycol.type.list_size)
    return x, ycol.to_numpy(zero_copy_only=True)


class DataReader:
    """Zero-copy access to one client's rows, the validation clients' rows and the test set.

    ``x``, ``y`` and ``offsets`` cover the training clients only.
    """

    def __init__(self, handle: DataHandle):
        self.handle = handle
        offsets = np.load(os.path.join(handle.path, "offsets.npy"), mmap_mode="r")
        x, y = _mapped(os.path.join(handle.path, "train.arrow"))
        end = int(offsets[handle.num_clients])
        self.offsets = offsets[:handle.num_clients + 1]
        self.x, self.y = x[:end], y[:end]
        self._validation = x[end:], y[end:]
        self.holdout_offsets = None
        if handle.client_holdout > 0:
            self.holdout_offsets = np.load(os.path.join(handle.path, "holdout_offsets.npy"),
                                           mmap_mode="r")
            self._holdout = _mapped(os.path.join(handle.path, "holdout.arrow"))

    def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``i``'s raw inputs and labels (views into the mapped file)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.x[lo:hi], self.y[lo:hi]

    def holdout(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``i``'s held-out rows (views; empty without ``data.client_holdout``)."""
        if self.holdout_offsets is None:
            return self.x[:0], self.y[:0]
        lo, hi = int(self.holdout_offsets[i]), int(self.holdout_offsets[i + 1])
        return self._holdout[0][lo:hi], self._holdout[1][lo:hi]

    def holdout_sizes(self) -> np.ndarray:
        """k_i, the held-out row count of every training client (zeros without the option)."""
        if self.holdout_offsets is None:
            return np.zeros(self.handle.num_clients, dtype=np.int64)
        return np.diff(np.asarray(self.holdout_offsets, dtype=np.int64))

    def rows(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Training rows by index (a copy; used for per-round re-splits, see ``regime``)."""
        return self.x[idx], self.y[idx]

    def round(self, t: int, round_clients) -> "RoundData":  # noqa: F821 (imported in the body)
        """The rows of each client in round ``t`` (``round_clients``: every client dispatched
        that round, which a drift regime re-splits among them; see :mod:`rayfl.data.regime`)."""
        return RoundData(self, t, round_clients)

    def validation(self) -> tuple[np.ndarray, np.ndarray]:
        """The validation clients' rows, pooled (views; empty without validation clients)."""
        return self._validation

    def test(self, rows: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The held-out test set (raw inputs, labels); with ``rows``, a seeded uniform sample
        of that many of them (in their order; all of them when there are no more)."""
        x, y = _mapped(os.path.join(self.handle.path, "test.arrow"))
        pick = seeded_subset(len(y), rows, seed)
        return (x, y) if pick is None else (x[pick], y[pick])

    def tensors(self, x: np.ndarray, y: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Model-ready inputs on ``device`` — float32 scaled and reshaped, or int64 ids for
        ``kind == "ids"`` or ``"tokens"`` — and int64 labels (one per row, or per position)."""
        if self.handle.kind in ("ids", "tokens"):
            xt = torch.from_numpy(np.array(x, dtype=np.int64))
        else:
            xt = torch.from_numpy(np.array(x, dtype=np.float32))
            if self.handle.scale != 1.0:  # × 1 is exact: skipped (it runs once a client)
                xt = xt * self.handle.scale
        xt = xt.reshape(len(x), *self.handle.input_shape)
        yt = torch.from_numpy(np.array(y, dtype=np.int64))
        if torch.device(device).type == "cpu":
            return xt, yt
        return xt.to(device), yt.to(device)
