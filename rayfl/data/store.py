"""The partition store: client-ordered Arrow files every actor memory-maps.

``prepare`` loads a dataset, partitions it and writes, once per (dataset, partition, seed):

- ``train.arrow``: one record batch, rows grouped by client (``x`` a fixed-size list, ``y``);
- ``offsets.npy``: client ``i`` owns rows ``offsets[i]:offsets[i+1]``;
- ``test.arrow`` and ``meta.json``.

A :class:`DataHandle` (small and picklable) names that directory; :meth:`DataHandle.open` in an
actor memory-maps the files so that reading a client's rows is a zero-copy slice and only the
pages of clients that train are ever touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from rayfl.data import partition as part
from rayfl.data.config import DataConfig
from rayfl.data.datasets import Arrays

FORMAT_VERSION = 1


def default_cache_dir() -> str:
    """``$RAYFL_CACHE`` or ``~/.cache/rayfl``."""
    return os.environ.get("RAYFL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                         "rayfl")


def load_arrays(cfg: DataConfig, seed: int) -> Arrays:
    """The central dataset named by ``cfg.dataset``."""
    if cfg.dataset == "fmnist":
        from rayfl.data.datasets import fmnist

        return fmnist.load(cfg.root)
    from rayfl.data.datasets import synthetic

    return synthetic.load(cfg.features, cfg.classes, cfg.num_clients * cfg.samples_per_client,
                          cfg.test_samples, seed)


def partition_key(cfg: DataConfig, seed: int) -> str:
    """Cache key: every setting that changes the partition's bytes."""
    fields = {k: v for k, v in vars(cfg).items() if k != "cache_dir"}
    blob = json.dumps({"v": FORMAT_VERSION, "seed": seed, **fields}, sort_keys=True)
    return f"{cfg.dataset}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def split(cfg: DataConfig, labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, offsets) for the configured partitioner."""
    rng = np.random.default_rng([seed, 0xDA7A])
    if cfg.partition == "iid":
        return part.iid(len(labels), cfg.num_clients, rng)
    return part.dirichlet(labels, cfg.num_clients, cfg.alpha, rng, cfg.min_samples)


def _table(x: np.ndarray, y: np.ndarray) -> pa.Table:
    flat = pa.array(np.ascontiguousarray(x).reshape(-1))
    xs = pa.FixedSizeListArray.from_arrays(flat, x.shape[1])
    return pa.table({"x": xs, "y": pa.array(y.astype(np.int32))})


def _write_arrow(path: str, table: pa.Table) -> None:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=max(table.num_rows, 1))


def prepare(cfg: DataConfig, seed: int) -> "DataHandle":
    """Build (or reuse) the partition store for ``cfg`` and return its handle."""
    root = cfg.cache_dir or default_cache_dir()
    path = os.path.join(root, partition_key(cfg, seed))
    if not os.path.isfile(os.path.join(path, "meta.json")):
        arrays = load_arrays(cfg, seed)
        order, offsets = split(cfg, arrays.y_train, seed)
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=root, prefix=".tmp-")
        _write_arrow(os.path.join(tmp, "train.arrow"),
                     _table(arrays.x_train[order], arrays.y_train[order]))
        _write_arrow(os.path.join(tmp, "test.arrow"), _table(arrays.x_test, arrays.y_test))
        np.save(os.path.join(tmp, "offsets.npy"), offsets)
        meta = {"input_shape": list(arrays.input_shape), "num_classes": arrays.num_classes,
                "scale": arrays.scale, "num_clients": cfg.num_clients}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f)
        try:
            os.rename(tmp, path)
        except OSError:  # another process won the race: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    return DataHandle.at(path)


@dataclass(frozen=True)
class DataHandle:
    """Names a prepared partition; cheap to send to every actor."""

    path: str
    input_shape: tuple[int, ...]
    num_classes: int
    scale: float
    num_clients: int

    @classmethod
    def at(cls, path: str) -> "DataHandle":
        with open(os.path.join(path, "meta.json")) as f:
            m = json.load(f)
        return cls(path, tuple(m["input_shape"]), m["num_classes"], m["scale"], m["num_clients"])

    def sizes(self) -> np.ndarray:
        """n_i for every client (int64 array of length N)."""
        return np.diff(np.load(os.path.join(self.path, "offsets.npy")))

    def open(self) -> "DataReader":
        """Memory-map the store (call inside the process that reads it)."""
        return DataReader(self)


def _mapped(path: str) -> tuple[np.ndarray, np.ndarray]:
    table = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    xcol, ycol = table.column("x").combine_chunks(), table.column("y").combine_chunks()
    width = xcol.type.list_size
    x = xcol.values.to_numpy(zero_copy_only=True).reshape(-1, width)
    return x, ycol.to_numpy(zero_copy_only=True)


class DataReader:
    """Zero-copy access to one client's rows, and to the test set."""

    def __init__(self, handle: DataHandle):
        self.handle = handle
        self.offsets = np.load(os.path.join(handle.path, "offsets.npy"), mmap_mode="r")
        self.x, self.y = _mapped(os.path.join(handle.path, "train.arrow"))

    def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``i``'s raw inputs and labels (views into the mapped file)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.x[lo:hi], self.y[lo:hi]

    def test(self) -> tuple[np.ndarray, np.ndarray]:
        """The held-out test set (raw inputs, labels)."""
        return _mapped(os.path.join(self.handle.path, "test.arrow"))

    def tensors(self, x: np.ndarray, y: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Model-ready float32 inputs (scaled, reshaped) and int64 labels on ``device``."""
        xt = torch.from_numpy(np.array(x, dtype=np.float32)) * self.handle.scale
        xt = xt.reshape(len(x), *self.handle.input_shape).to(device)
        return xt, torch.from_numpy(np.array(y, dtype=np.int64)).to(device)
