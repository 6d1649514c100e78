"""Atomic checkpoints of the server side: algorithm state, client-state versions, counters.

Client state itself lives in the versioned state store; a checkpoint records which version of
each client's state belongs to it (``versions``), so writing one costs the server state only.
"""

from __future__ import annotations

import os

import torch

from rayfl.runtime.state_store import prune_after

NAME = "checkpoint.pt"


def path_of(run_dir: str) -> str:
    """The run's checkpoint file."""
    return os.path.join(run_dir, "checkpoints", NAME)


def save(run_dir: str, payload: dict) -> None:
    """Write the checkpoint atomically (a crash leaves the previous one intact)."""
    path = path_of(run_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(run_dir: str) -> dict:
    """The last committed checkpoint of ``run_dir``."""
    return torch.load(path_of(run_dir), weights_only=False)


def exists(run_dir: str) -> bool:
    """Whether ``run_dir`` has a committed checkpoint."""
    return os.path.isfile(path_of(run_dir))


def prune_state(state_root: str, versions) -> int:
    """Drop client-state files the checkpoint does not reference (written after it)."""
    return prune_after(state_root, versions)
