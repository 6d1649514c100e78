"""Per-client persistent state: immutable versioned files plus a bounded in-memory cache.

Client ``i``'s state after training in round ``t`` is written once to
``<root>/<i // 1000>/<i>.r<t>.npz`` and never modified, so a checkpoint of round ``c`` is valid
as long as each client's newest version ≤ ``c`` survives (the server tracks versions and
deletes superseded files only after a newer checkpoint commits). Each actor keeps recently used
states in memory up to a byte budget; everything else is read back from disk on demand. A
registered client that never trained has no file and costs nothing.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import torch


def state_path(root: str, client: int, version: int) -> str:
    """Where version ``version`` (the round it was written) of a client's state lives."""
    return os.path.join(root, str(client // 1000), f"{client}.r{version}.npz")


def parse_version(name: str) -> tuple[int, int] | None:
    """(client, version) from a state file name, or None for anything else."""
    stem, dot, ext = name.rpartition(".")
    client, sep, ver = stem.partition(".r")
    if ext != "npz" or not sep or not client.isdigit() or not ver.isdigit():
        return None
    return int(client), int(ver)


class StateStore:
    """Load/save client state by (client, version) with an LRU cache of at most ``budget`` bytes."""

    def __init__(self, root: str, budget_bytes: float):
        self.root, self.budget = root, budget_bytes
        self.cache: OrderedDict[tuple[int, int], dict[str, torch.Tensor]] = OrderedDict()
        self.cached_bytes = 0
        self.stats = {"hits": 0, "disk_reads": 0, "writes": 0, "evictions": 0}

    @staticmethod
    def _nbytes(state: dict[str, torch.Tensor]) -> int:
        return sum(v.numel() * v.element_size() for v in state.values())

    def _remember(self, key: tuple[int, int], state: dict[str, torch.Tensor]) -> None:
        size = self._nbytes(state)
        if size > self.budget:
            return
        self.cache[key] = state
        self.cached_bytes += size
        while self.cached_bytes > self.budget:
            _, old = self.cache.popitem(last=False)
            self.cached_bytes -= self._nbytes(old)
            self.stats["evictions"] += 1

    def load(self, client: int, version: int) -> dict[str, torch.Tensor] | None:
        """The state written in round ``version`` (None when the client has none yet)."""
        if version < 0:
            return None
        key = (client, version)
        if key in self.cache:
            self.cache.move_to_end(key)
            self.stats["hits"] += 1
            return self.cache[key]
        with np.load(state_path(self.root, client, version)) as z:
            state = {k: torch.from_numpy(z[k].copy()) for k in z.files}
        self.stats["disk_reads"] += 1
        self._remember(key, state)
        return state

    def save(self, client: int, version: int, state: dict[str, torch.Tensor]) -> None:
        """Write a new immutable version (atomically), and cache it."""
        state = {k: v.detach().cpu() for k, v in state.items()}
        path = state_path(self.root, client, version)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp.npz"
        np.savez(tmp, **{k: v.numpy() for k, v in state.items()})
        os.replace(tmp, path)
        self.stats["writes"] += 1
        self._remember((client, version), state)

    def forget(self, client: int, version: int) -> None:
        """Drop a cached entry (its file is being deleted)."""
        old = self.cache.pop((client, version), None)
        if old is not None:
            self.cached_bytes -= self._nbytes(old)


def delete_versions(root: str, pairs) -> None:
    """Remove superseded state files ``(client, version)``; missing files are fine."""
    for client, version in pairs:
        try:
            os.remove(state_path(root, client, version))
        except FileNotFoundError:
            pass


def prune_after(root: str, versions: np.ndarray) -> int:
    """After a resume: delete every file that is not the checkpoint's version of its client."""
    removed = 0
    if not os.path.isdir(root):
        return 0
    for sub in os.scandir(root):
        if not sub.is_dir():
            continue
        for entry in os.scandir(sub.path):
            parsed = parse_version(entry.name)
            if parsed is None:
                os.remove(entry.path)  # a torn temporary file
                removed += 1
            elif versions[parsed[0]] != parsed[1]:
                os.remove(entry.path)
                removed += 1
    return removed
