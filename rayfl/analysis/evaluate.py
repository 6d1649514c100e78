"""Many models evaluated as Ray tasks: each task rebuilds the model once and scores a chunk.

Models are given as affine combinations ``origin + c · dirs`` (a grid in a plane, points on a
line, averages of client models), so a task receives the few basis vectors once (through the
object store) and only the coefficients of its chunk. Sums run in float64 and are rounded to
float32 once, so a combination that reproduces a stored model gives its exact parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import ray
import torch

from rayfl.data.store import seeded_subset
from rayfl.models.metrics import criterion
from rayfl.runtime import actor_pool
from rayfl.runtime.client_actor import model_for
from rayfl.schema import ConfigError


@dataclass(frozen=True)
class EvalData:
    """Rows to evaluate on: the test set or the training rows, optionally a subset of them."""

    split: str = "test"  # "test" | "train"
    index: np.ndarray | None = None  # row indices into that split (None: all rows)
    label: str = "test set"

    def arrays(self, reader) -> tuple[np.ndarray, np.ndarray]:
        """Raw (inputs, labels) of these rows from an open reader."""
        x, y = reader.test() if self.split == "test" else (reader.x, reader.y)
        return (x, y) if self.index is None else (x[self.index], y[self.index])


def select_data(handle, spec: str = "test", max_samples: int | None = None,
                seed: int = 0) -> EvalData:
    """``test`` or ``clients:ID,ID,...`` (those clients' training rows), at most
    ``max_samples`` of them (a seeded uniform subset)."""
    reader = handle.open()
    if spec == "test":
        split, index, label = "test", None, "test set"
    elif spec.startswith("clients:") and spec[8:]:
        try:
            ids = [int(i) for i in spec[8:].split(",")]
        except ValueError:
            raise ConfigError("--data", spec, "test or clients:ID,ID,...") from None
        bad = [i for i in ids if not 0 <= i < handle.num_clients]
        if bad:
            raise ConfigError("--data", spec, f"client ids in [0, {handle.num_clients - 1}]")
        off = reader.offsets
        split, label = "train", f"training data of clients {','.join(map(str, ids))}"
        index = np.concatenate([np.arange(off[i], off[i + 1]) for i in ids])
    else:
        raise ConfigError("--data", spec, "test or clients:ID,ID,...")
    rows = len(reader.test()[1]) if index is None else len(index)
    pick = seeded_subset(rows, max_samples, seed)
    if pick is not None:
        index, label = pick if index is None else index[pick], f"{label} ({max_samples} rows)"
    return EvalData(split, index, label)


def _tensors(cfg, handle, data: EvalData):
    torch.set_num_threads(1)
    reader = handle.open()
    model = model_for(cfg.model, cfg.seed, handle, "cpu")
    return model, *reader.tensors(*data.arrays(reader), "cpu")


def _point(origin: np.ndarray, dirs: np.ndarray, c: np.ndarray) -> torch.Tensor:
    return torch.from_numpy((origin + c @ dirs).astype(np.float32))


@ray.remote(num_cpus=1)
def _score_chunk(cfg, handle, data: EvalData, origin, dirs, coeffs, batch_size) -> np.ndarray:
    """(loss, accuracy) of ``origin + c · dirs`` for every row c of ``coeffs``."""
    model, x, y = _tensors(cfg, handle, data)
    loss_fn = criterion(handle)
    return np.array([model.evaluate(_point(origin, dirs, c), x, y, loss_fn, batch_size)
                     for c in coeffs])


@ray.remote(num_cpus=1)
def _predict_chunk(cfg, handle, data: EvalData, origin, dirs, coeffs, batch_size) -> np.ndarray:
    """Softmax outputs (points × rows × classes, float32) of ``origin + c · dirs``."""
    model, x, _ = _tensors(cfg, handle, data)
    out = np.empty((len(coeffs), len(x), handle.num_classes), dtype=np.float32)
    model.module.eval()
    with torch.no_grad():
        for j, c in enumerate(coeffs):
            model.load(_point(origin, dirs, c))
            for i in range(0, len(x), batch_size):
                out[j, i:i + batch_size] = torch.softmax(model.module(x[i:i + batch_size]),
                                                         1).numpy()
    return out


def _run(task, cfg, handle, data, origin, dirs, coeffs, batch_size, chunks):
    origin = np.asarray(origin, dtype=np.float64)
    dirs = np.atleast_2d(np.asarray(dirs, dtype=np.float64))
    coeffs = np.atleast_2d(np.asarray(coeffs, dtype=np.float64))
    actor_pool.make_room()  # an idle pooled actor's CPUs are these tasks'
    cpus = int(ray.cluster_resources().get("CPU", 1))
    parts = np.array_split(np.arange(len(coeffs)), min(len(coeffs), chunks or 2 * cpus))
    refs = [ray.put(v) for v in (cfg, handle, data, origin, dirs)]
    out = ray.get([task.remote(*refs, coeffs[p], batch_size) for p in parts if len(p)])
    return np.concatenate(out)


def score(cfg, handle, data: EvalData, origin, dirs, coeffs, batch_size: int = 1000,
          chunks: int | None = None) -> np.ndarray:
    """(points × 2) array of (mean cross-entropy, accuracy) at ``origin + coeffs @ dirs``;
    ``chunks`` Ray tasks (default twice the cluster's CPUs)."""
    return _run(_score_chunk, cfg, handle, data, origin, dirs, coeffs, batch_size, chunks)


def predict(cfg, handle, data: EvalData, origin, dirs, coeffs, batch_size: int = 1000,
            chunks: int | None = None) -> np.ndarray:
    """(points × rows × classes) softmax outputs at ``origin + coeffs @ dirs`` (Ray tasks)."""
    return _run(_predict_chunk, cfg, handle, data, origin, dirs, coeffs, batch_size, chunks)
