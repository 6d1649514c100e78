"""Per-client persistent state: immutable versioned files plus a bounded in-memory cache.

Client ``i``'s state after training in round ``t`` is written once to
``<root>/<i // 1000>/<i>.r<t>.npz`` and never modified, so a checkpoint of round ``c`` is valid
as long as each client's newest version ≤ ``c`` survives (the server tracks versions and
deletes superseded files only after a newer checkpoint commits). Each actor keeps recently used
states in memory up to a byte budget; everything else is read back from storage on demand. A
registered client that never trained has no file and costs nothing.

``root`` is a :mod:`rayfl.runtime.storage` location: a local directory or an object-store URI,
so actors on nodes that share no file system find each other's states. Files are plain ``.npz``
arrays, read without pickle.

Each file also records the run that wrote it (``_run.seed``, ``_run.algorithm``, ``_run.config``:
:func:`rayfl.runtime.checkpoint.state_stamp`); a store given its run's stamp refuses a file of
another run with a :class:`~rayfl.runtime.storage.CheckpointError` naming what differs, and
the client and round it was written for (``_run.owner``), refusing a file copied over another
client's or round's. Files without them (rayfl 0.1, 0.2) are read as they are.
"""

from __future__ import annotations

import os
import zipfile
from collections import OrderedDict

import numpy as np
import torch

from rayfl.runtime.messages import message_round
from rayfl.runtime.storage import CheckpointError, Storage

STAMP = "_run."  # the entries naming the run that wrote a file (not part of the state)
OWNER = "owner"  # the stamp's (client, version) a file was written for


def state_name(client: int, version: int) -> str:
    """The name (relative to the state root) of version ``version`` of a client's state."""
    return f"{client // 1000}/{client}.r{version}.npz"


def state_path(root: str, client: int, version: int) -> str:
    """Where version ``version`` (the round it was written) of a client's state lives."""
    return Storage(root).path(state_name(client, version))


def parse_version(name: str) -> tuple[int, int] | None:
    """(client, version) from a state file name, or None for anything else."""
    stem, dot, ext = name.rpartition(".")
    client, sep, ver = stem.partition(".r")
    if ext != "npz" or not sep or not client.isdigit() or not ver.isdigit():
        return None
    return int(client), int(ver)


class StateStore:
    """Load/save client state by (client, version) with an LRU cache of at most ``budget`` bytes;
    ``stamp``: the run's (:func:`rayfl.runtime.checkpoint.state_stamp`), written into every file
    and checked on every file read."""

    def __init__(self, root: str, budget_bytes: float, stamp: dict | None = None):
        self.root, self.budget, self.stamp = root, budget_bytes, stamp
        self.storage = Storage(root)
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
        state = read_state(self.storage, client, version, self.stamp)
        self.stats["disk_reads"] += 1
        self._remember(key, state)
        return state

    def save(self, client: int, version: int, state: dict[str, torch.Tensor]) -> None:
        """Write a new immutable version (atomically), and cache it."""
        state = {k: v.detach().cpu() for k, v in state.items()}
        arrays = {k: v.numpy() for k, v in state.items()}
        arrays.update({STAMP + k: v for k, v in (self.stamp or {}).items()})
        if self.stamp:
            arrays[STAMP + OWNER] = np.array([client, version], dtype=np.int64)
        self.storage.write_with(state_name(client, version), lambda f: np.savez(f, **arrays))
        self.stats["writes"] += 1
        self._remember((client, version), state)

    def forget(self, client: int, version: int) -> None:
        """Drop a cached entry (its file is being deleted)."""
        old = self.cache.pop((client, version), None)
        if old is not None:
            self.cached_bytes -= self._nbytes(old)


def read_state(storage: Storage, client: int, version: int,
               stamp: dict | None = None) -> dict[str, torch.Tensor]:
    """One stored state; a missing or damaged file, or one whose stamp is not ``stamp`` (another
    run's), is a :class:`~rayfl.runtime.storage.CheckpointError` naming it."""
    name = state_name(client, version)
    try:
        with storage.open(name) as f, np.load(f, allow_pickle=False) as z:
            found = {k[len(STAMP):]: z[k] for k in z.files if k.startswith(STAMP)}
            state = {k: torch.from_numpy(z[k].copy()) for k in z.files
                     if not k.startswith(STAMP)}
    except FileNotFoundError:
        raise CheckpointError(storage.path(name), "the file the checkpoint refers to (it was "
                              "deleted, or the run's storage moved)", what="client state") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise CheckpointError(storage.path(name), f"a complete .npz state file "
                              f"({type(e).__name__}: {e})", what="client state") from None
    differ = _stamp_differs(found, stamp)
    if differ:
        raise CheckpointError(storage.path(name), f"a state file of this run (it was written by "
                              f"a run with {differ}; it belongs to another run directory)",
                              what="client state")
    owner = found.get(OWNER) if stamp else None
    if owner is not None and tuple(int(v) for v in owner) != (client, version):
        raise CheckpointError(storage.path(name), f"client {client}'s state of round "
                              f"{version + 1} (it holds client {int(owner[0])}'s of round "
                              f"{int(owner[1]) + 1}: a file copied over another)",
                              what="client state")
    return state


def _stamp_differs(found: dict, stamp: dict | None) -> str | None:
    """What differs between a file's stamp and the run's (None: nothing, or either absent)."""
    if not found or not stamp:
        return None
    for key in ("seed", "algorithm", "config"):
        if key not in found or not np.array_equal(found[key], stamp[key]):
            if key == "seed" and key in found:
                return f"seed = {int(found[key])}, this run's is {int(stamp[key])}"
            if key == "algorithm" and key in found:
                return (f"algorithm.name = {bytes(found[key]).decode(errors='replace')!r}, "
                        f"this run's is {bytes(stamp[key]).decode()!r}")
            return "other data, model or privacy settings"
    return None


def delete_versions(root: str, pairs) -> None:
    """Remove superseded state files ``(client, version)``; missing files are fine."""
    storage = Storage(root)
    for client, version in pairs:
        storage.delete(state_name(client, version))


def clear(root: str) -> None:
    """Remove every state file (a fresh run: leftovers of a run never checkpointed)."""
    Storage(root).clear()


def prune_after(root: str, versions: np.ndarray,
                pinned: set[tuple[int, int]] = frozenset()) -> int:
    """After a resume: delete every file that is not the checkpoint's version of its client
    (nor ``pinned`` by a kept checkpoint).

    Raises :class:`~rayfl.runtime.storage.CheckpointError` when a version the checkpoint refers
    to is missing (the run would otherwise continue from a silently lost state).
    """
    storage, removed, present = Storage(root), 0, set()
    for name in storage.files():
        if message_round(name) is not None:
            continue  # round messages: pruned by the server with the checkpoint's versions
        parsed = parse_version(os.path.basename(name))
        if parsed is not None and parsed[0] < len(versions) and versions[parsed[0]] == parsed[1]:
            present.add(parsed[0])
            continue
        if parsed in pinned:
            continue
        storage.delete(name)  # superseded, written after the checkpoint, or a torn write
        removed += 1
    _require(storage, versions, present)
    return removed


def verify_present(root: str, versions: np.ndarray) -> None:
    """Raise :class:`~rayfl.runtime.storage.CheckpointError` unless every version a checkpoint
    refers to is stored."""
    storage = Storage(root)
    present = set()
    for name in storage.files():
        if message_round(name) is not None:
            continue  # round messages: pruned by the server with the checkpoint's versions
        parsed = parse_version(os.path.basename(name))
        if parsed is not None and parsed[0] < len(versions) and versions[parsed[0]] == parsed[1]:
            present.add(parsed[0])
    _require(storage, versions, present)


def _require(storage: Storage, versions: np.ndarray, present: set[int]) -> None:
    missing = [int(c) for c in np.flatnonzero(versions >= 0) if int(c) not in present]
    if missing:
        c = missing[0]
        raise CheckpointError(storage.path(state_name(c, int(versions[c]))),
                              f"the file the checkpoint refers to ({len(missing)} client state "
                              "file(s) missing: deleted, or the run's storage moved)",
                              what="client state")
