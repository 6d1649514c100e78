"""The reference workload every simulator in the peers' benchmark runs: the same data, model,
local loop and round plan, in a file that needs only torch and numpy (it is imported by each
peer's script in its own environment, where rayfl is not installed).

``export`` (run in rayfl's environment) writes the workload file: Fashion-MNIST partitioned and
sampled exactly as ``configs/quickstart.yaml`` does (100 clients, Dirichlet(0.1), 10 a round),
inputs already scaled, and the clients of every round. Each peer then trains, round after
round, those clients with ``train_client`` — SGD (lr 0.01, momentum 0.9, weight decay 0.001),
batch 50, one epoch, the FMNIST CNN in channels-last layout (rayfl's default) — and averages
their weights by sample count; it reports the samples and seconds of each round
(``report``), and the benchmark compares samples per second over the steady rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

LOOP = {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.001, "batch_size": 50, "epochs": 1}


@dataclass
class Workload:
    """Scaled inputs (N, 1, 28, 28), labels, each client's row offsets and each round's clients."""

    x: torch.Tensor
    y: torch.Tensor
    offsets: np.ndarray
    plan: np.ndarray  # (rounds, clients_per_round) client ids

    @classmethod
    def load(cls, path: str) -> "Workload":
        with np.load(path) as f:
            return cls(torch.from_numpy(f["x"]), torch.from_numpy(f["y"]), f["offsets"],
                       f["plan"])

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    def client(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``c``'s rows (views)."""
        lo, hi = int(self.offsets[c]), int(self.offsets[c + 1])
        return self.x[lo:hi], self.y[lo:hi]

    def size(self, c: int) -> int:
        return int(self.offsets[c + 1] - self.offsets[c])


def build_model() -> nn.Module:
    """rayfl's ``fmnist_cnn`` (conv5-32, pool, conv5-32, pool, FC 512-384-128-10), seeded, in
    channels-last layout."""
    torch.manual_seed(0)
    side = ((28 - 4) // 2 - 4) // 2
    model = nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Conv2d(32, 32, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(32 * side * side, 384), nn.ReLU(inplace=True),
        nn.Linear(384, 128), nn.ReLU(inplace=True),
        nn.Linear(128, 10))
    return model.to(memory_format=torch.channels_last)


def train_client(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> int:
    """The local loop: ``LOOP``'s SGD over one epoch of shuffled batches; returns the samples."""
    opt = torch.optim.SGD(model.parameters(), lr=LOOP["lr"], momentum=LOOP["momentum"],
                          weight_decay=LOOP["weight_decay"])
    loss_fn, gen, batch = nn.CrossEntropyLoss(), torch.Generator().manual_seed(seed), \
        LOOP["batch_size"]
    model.train()
    for _ in range(LOOP["epochs"]):
        perm = torch.randperm(len(y), generator=gen)
        for b in range(0, len(y), batch):
            idx = perm[b:b + batch]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
    return len(y) * LOOP["epochs"]


def arguments(doc: str) -> argparse.ArgumentParser:
    """The command line every peer script takes (``doc``: its module docstring); a script adds
    its own options."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--workload", required=True, help="the workload file (``export``)")
    p.add_argument("--out", required=True, help="the report; the final model goes to OUT.pt")
    p.add_argument("--rounds", type=int, default=None, help="default: every planned round")
    p.add_argument("--workers", type=int, default=2, help="parallel workers, 1 thread each")
    return p


def client_seed(t: int, c: int) -> int:
    """The shuffling seed of client ``c`` in round ``t`` (any framework may use it)."""
    return t * 1_000_003 + c


def weighted_mean(states: list[dict], weights: list[float]) -> dict:
    """Σ w_i state_i / Σ w_i, key by key."""
    total = float(sum(weights))
    return {k: sum(s[k].float() * (w / total) for s, w in zip(states, weights))
            for k in states[0]}


def report(path: str, system: str, rounds: list[tuple[int, float]], **facts) -> None:
    """Write one system's result: the (samples, seconds) of every round, and what it ran with."""
    with open(path, "w") as f:
        json.dump({"system": system, "rounds": rounds, **facts}, f)


class RoundTimer:
    """(samples, seconds) of each round, measured from the end of the previous round."""

    def __init__(self):
        self.rounds: list[tuple[int, float]] = []
        self._last = time.perf_counter()

    def tick(self, samples: int) -> None:
        now = time.perf_counter()
        self.rounds.append((int(samples), now - self._last))
        self._last = now


def export(path: str, rounds: int, config_path: str = "configs/quickstart.yaml") -> dict:
    """Write the workload file from rayfl's own partition and sampler (rayfl's environment)."""
    from rayfl import config
    from rayfl.availability import make_sampler
    from rayfl.data import prepare
    from rayfl.runtime.local import spec_from_config

    cfg = config.load(config_path, [f"rounds={rounds}"])
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    sampler = make_sampler(cfg.availability, handle, cfg.clients_per_round, cfg.seed,
                           spec_from_config(cfg.local))
    x, y = reader.tensors(reader.x, reader.y, "cpu")
    plan = np.array([sampler.plan(t).clients for t in range(rounds)], dtype=np.int64)
    offsets = np.asarray(reader.offsets, dtype=np.int64)
    np.savez(path, x=x.contiguous().numpy(), y=y.numpy(), offsets=offsets, plan=plan)
    loop = cfg.local
    assert (loop.lr, loop.momentum, loop.weight_decay, loop.batch_size, loop.epochs) == (
        LOOP["lr"], LOOP["momentum"], LOOP["weight_decay"], LOOP["batch_size"],
        LOOP["epochs"]), "the workload's loop drifted from configs/quickstart.yaml"
    return {"clients": handle.num_clients, "rows": int(offsets[-1]),
            "per_round": int(plan.shape[1]), "rounds": rounds,
            "mean_client_rows": float(np.mean(np.diff(offsets))),
            "params": sum(p.numel() for p in build_model().parameters()),
            "steps_per_client": float(np.mean([math.ceil(n / LOOP["batch_size"])
                                               for n in np.diff(offsets)]))}
