"""System heterogeneity: each client's compute speed and bandwidth, and its round time.

Speeds come from log-normal distributions (``speed_*``, ``bandwidth_*``) or from FedScale's
``client_device_capacity`` pickle, where client i uses profile ``i mod M`` (sorted ids). A
client's local step costs ``speed · min(batch_size, n_i)`` seconds (FedScale: batch × steps ×
s/sample) and the model travels down and its update up once at its bandwidth.
"""

from __future__ import annotations

import numpy as np

from rayfl import safe_pickle
from rayfl.availability.base import READ_ERRORS, one_line
from rayfl.rng import DEVICE, stream
from rayfl.availability.config import AvailabilityConfig
from rayfl.schema import ConfigError

KEY = "availability.capacity_path"
FORMAT = ("a FedScale client_device_capacity pickle: {client_id: {'computation': ms per sample "
          "> 0, 'communication': kbps > 0}}")
FEDSCALE_TRAIN_FACTOR = 3.0  # FedScale: 'computation' is inference latency; training ≈ 3×


def lognormal(mean: float, sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n log-normal draws with this mean and log-space σ."""
    return mean * rng.lognormal(-sigma**2 / 2, sigma, size=n)


class Devices:
    """``speed`` (seconds per sample) and ``bandwidth`` (Mbit/s) of every client."""

    def __init__(self, cfg: AvailabilityConfig, n: int, seed: int):
        if cfg.capacity_path is not None:
            comp, comm = _read_capacity(cfg.capacity_path)
            self.speed = np.resize(comp * FEDSCALE_TRAIN_FACTOR / 1000.0, n)
            self.bandwidth = np.resize(comm / 1000.0, n)
        else:
            rng = stream(seed, DEVICE)
            self.speed = lognormal(cfg.speed_mean, cfg.speed_sigma, n, rng)
            self.bandwidth = lognormal(cfg.bandwidth_mean, cfg.bandwidth_sigma, n, rng)

    def times(self, clients: np.ndarray, sizes: np.ndarray, batch_size: int,
              model_bytes: int, upload_bytes: float | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(transfer seconds down + up, seconds per local step) of ``clients`` with ``sizes``;
        the upload is ``upload_bytes`` (a compressed update) or the model's size."""
        up = model_bytes if upload_bytes is None else upload_bytes
        comm = (model_bytes + up) * 8.0 / (self.bandwidth[clients] * 1e6)
        step = self.speed[clients] * np.clip(sizes, 1, batch_size)
        return comm, step


def _read_capacity(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            raw = safe_pickle.load(f)
        ids = sorted(raw)
        comp = np.array([float(raw[k]["computation"]) for k in ids])
        comm = np.array([float(raw[k]["communication"]) for k in ids])
    except READ_ERRORS as e:
        raise ConfigError(KEY, path, f"{FORMAT} ({one_line(e)})") from None
    if not ids or not (np.isfinite(comp).all() and np.isfinite(comm).all()) or \
            not ((comp > 0).all() and (comm > 0).all()):
        raise ConfigError(KEY, path, FORMAT + ", all finite")
    return comp, comm
