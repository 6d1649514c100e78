"""Atomic checkpoints of the server side: algorithm state, client-state versions, counters.

Client state itself lives in the versioned state store; a checkpoint records which version of
each client's state belongs to it (``versions``), so writing one costs the server state only.

A checkpoint loads without executing code: it is a ``torch.save`` file holding only a list of
tensors, a JSON text describing everything else (numbers, strings, lists, dicts, tuples and
references to the tensors) and a SHA-256 over both, read back with ``torch.load(...,
weights_only=True)``. A truncated, corrupted or foreign file is a :class:`CheckpointError`
naming it.
It lives at ``<location>/checkpoints/checkpoint.pt``, where the location is the run's storage
(the run directory, or an object-store URI; see :mod:`rayfl.runtime.storage`). Checkpoints of
the rounds in ``checkpoint.keep`` are also kept as ``checkpoints/round-NNNNN.pt`` (1-based), and
the client-state versions they refer to are pinned: never deleted as superseded, so ``rayfl
fork`` can branch from them.

Every checkpoint carries the identity of the run that wrote it (``identity``: the config values
that can change its results, seed and algorithm among them, as in ``fingerprint.json``), and
``rayfl resume`` and ``rayfl fork`` refuse one whose identity is not the run's — a checkpoint
copied or linked in from another run — naming the first key that differs, before anything
else. Checkpoints of rayfl 0.1 and 0.2 carry none and are taken as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable

import numpy as np
import pyarrow.parquet as pq
import torch

from rayfl import config as config_mod
from rayfl.layers import mismatch
from rayfl.rundir import changes_results, default_of, differences, result_keys, started_with
from rayfl.runtime.checkpoint_file import Slot, decode, writer
from rayfl.runtime.state_store import prune_after, read_state, verify_present
from rayfl.runtime.storage import CheckpointError, Storage, join
from rayfl.schema import ConfigError

NAME = "checkpoints/checkpoint.pt"
IDENTITY = "identity"  # the payload key of the writing run's identity (:func:`identity`)
FIRST = ("seed", "algorithm.name")  # the keys an identity mismatch names first
UNNAMED = ("name",)  # result keys left out of it: runs alike but for them share a trajectory
#: config keys that shape the client state a fork inherits (a fork cannot change them)
SHARED = ("data.", "model.", "algorithm.name", "privacy.", "seed")


def path_of(location: str) -> str:
    """The run's checkpoint file (a path or URI)."""
    return Storage(location).path(NAME)


def kept_name(round_: int) -> str:
    """The kept checkpoint of 1-based round ``round_`` (relative to the run's location)."""
    return f"checkpoints/round-{round_:05d}.pt"


def _sparse(versions: np.ndarray) -> dict:
    """Client-state versions as (clients holding state, their versions): a checkpoint's size
    follows the clients that trained, not the registered population."""
    held = np.flatnonzero(versions >= 0)
    return {"size": len(versions), "clients": held.astype(np.int64),
            "rounds": versions[held].astype(np.int32)}


def _dense(versions) -> np.ndarray:
    """The version array (−1: no state) from :func:`_sparse`'s form (or a dense array)."""
    if not isinstance(versions, dict):
        return versions
    out = np.full(int(versions["size"]), -1, dtype=np.int32)
    out[versions["clients"]] = versions["rounds"]
    return out


def save(location: str, payload: dict, keep: bool = False) -> None:
    """Write the checkpoint atomically (a crash leaves the previous one intact); ``keep``: also
    as the kept checkpoint of its round (written first, so the latest never lags it)."""
    prepared(payload)(location, keep)


def prepared(payload: dict) -> Callable[[str, bool], None]:
    """:func:`save` of ``payload`` as it is now (encoded, its tensors and arrays copied), to be
    called later — from another thread, say, while the values change."""
    if isinstance(payload.get("versions"), np.ndarray):
        payload = {**payload, "versions": _sparse(payload["versions"])}
    write, round_ = writer(payload), payload["round"]

    def save_to(location: str, keep: bool = False) -> None:
        storage = Storage(location)
        if keep:
            storage.write_with(kept_name(round_ + 1), write, durable=True)
        storage.write_with(NAME, write, durable=True)
    return save_to


def load(location: str, name: str = NAME) -> dict:
    """The last committed checkpoint under ``location`` (or the one called ``name``)."""
    storage = Storage(location)
    try:
        data = storage.read(name)
    except FileNotFoundError:
        raise CheckpointError(storage.path(name), "an existing checkpoint") from None
    ck = decode(data, storage.path(name))
    if isinstance(ck, dict) and isinstance(ck.get("versions"), dict):
        try:
            ck["versions"] = _dense(ck["versions"])
        except (KeyError, TypeError, ValueError, IndexError):
            raise CheckpointError(storage.path(name), "a checkpoint holding client-"
                              "state versions (they are malformed)") from None
    return ck


def kept_rounds(location: str) -> list[int]:
    """The 1-based rounds with a kept checkpoint under ``location``."""
    out = []
    for name in Storage(location).files():
        stem = name.rpartition("/")[2]
        if stem.startswith("round-") and stem.endswith(".pt") and stem[6:-3].isdigit():
            out.append(int(stem[6:-3]))
    return sorted(out)


def load_kept(location: str, round_: int) -> dict:
    """The kept checkpoint of 1-based round ``round_``; a clear error naming the kept rounds."""
    kept = kept_rounds(location)
    if round_ not in kept:
        raise ConfigError("--at", round_, "a round with a kept checkpoint (kept: " + (
            ", ".join(map(str, kept)) or "none; set checkpoint.keep in the run's config") + ")")
    return load(location, kept_name(round_))


def pinned_versions(location: str) -> set[tuple[int, int]]:
    """(client, version) of every client state a kept checkpoint refers to."""
    pinned: set[tuple[int, int]] = set()
    for r in kept_rounds(location):
        versions = load(location, kept_name(r))["versions"]
        pinned.update((int(c), int(versions[c])) for c in np.flatnonzero(versions >= 0))
    return pinned


def identity(cfg) -> dict:
    """A run's identity as its checkpoints record it: the config values that can change its
    results (:func:`rayfl.rundir.result_keys`) but its name, in JSON's types as
    ``fingerprint.json`` holds them."""
    values = {k: v for k, v in result_keys(config_mod.to_dict(cfg)).items() if k not in UNNAMED}
    return json.loads(json.dumps(values, allow_nan=False))


def state_stamp(values: dict) -> dict[str, np.ndarray]:
    """What each client-state file of the run of identity ``values`` (:func:`identity`, or its
    fingerprint's) records of it (:mod:`rayfl.runtime.state_store`): the seed, the algorithm and
    a digest of the other :data:`SHARED` values away from their defaults (a fork shares its
    source's files, and a key a later version adds keeps the digest)."""
    shared = {k: v for k, v in values.items()
              if any(k == f or k.startswith(f) for f in SHARED) and v != default_of(k)}
    digest = hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).digest()
    return {"seed": np.array(values["seed"], dtype=np.int64),
            "algorithm": np.frombuffer(str(values["algorithm.name"]).encode(), dtype=np.uint8),
            "config": np.frombuffer(digest, dtype=np.uint8)}


def check_states(state_root: str, versions: np.ndarray, values: dict | None,
                 sample: int = 8) -> None:
    """Refuse client-state files of another run among the first ``sample`` the checkpoint's
    ``versions`` refer to (:class:`CheckpointError` naming the file and what differs); every
    file is checked again when an actor reads it, so a sample keeps a resume's cost that of a
    checkpoint, not of a round."""
    if values is None or "seed" not in values or "algorithm.name" not in values:
        return
    stamp, storage = state_stamp(values), Storage(state_root)
    for c in np.flatnonzero(versions >= 0)[:sample]:
        read_state(storage, int(c), int(versions[c]), stamp)


def check_identity(ck: dict, values: dict | None, where: str) -> None:
    """Refuse (:class:`CheckpointError` naming ``where`` and the first key that differs) a
    checkpoint written by a run other than the one that started with ``values``; a checkpoint
    without an identity (rayfl 0.1, 0.2) or a run without ``values`` is not checked."""
    found = ck.get(IDENTITY) if isinstance(ck, dict) else None
    if not isinstance(found, dict) or values is None:
        return
    found = {k: v for k, v in found.items() if changes_results(k)}  # an older rayfl kept more
    differ = [k for k in differences(values, found)  # a key of another rayfl version: default
              if k not in UNNAMED and not (k not in found and values[k] == default_of(k))]
    if not differ:
        return
    key = next((k for k in FIRST if k in differ), differ[0])
    unset = "<unset>"
    more = f"; {len(differ) - 1} other key(s) differ too" if len(differ) > 1 else ""
    raise CheckpointError(where, f"a checkpoint of this run (it was written by a run with {key} "
                          f"= {found.get(key, unset)!r}, this run's is {values.get(key, unset)!r}"
                          f"{more}; it belongs to another run directory)")


def verify(location: str, values: dict | None = None) -> None:
    """Check, before a resume starts anything, that the checkpoint under ``location`` loads, was
    written by the run that started with ``values`` (:func:`check_identity`), and that every
    client-state file it refers to is stored, a sample of them by this run
    (:func:`check_states`); :class:`CheckpointError` otherwise."""
    ck = load(location)
    check_identity(ck, values, path_of(location))
    versions = ck.get("versions") if isinstance(ck, dict) else None
    if not isinstance(versions, np.ndarray) or versions.ndim != 1:
        raise CheckpointError(path_of(location), "a checkpoint holding client-state versions")
    verify_present(join(location, "state"), versions)
    check_states(join(location, "state"), versions, values)


def exists(location: str) -> bool:
    """Whether ``location`` has a committed checkpoint."""
    return Storage(location).exists(NAME)


def resume_point(location: str, run_dir: str) -> bool:
    """Where ``rayfl resume`` of ``run_dir`` starts: True from its newest checkpoint (verified),
    False from scratch — only when the run never committed a checkpoint. A newest checkpoint
    that is damaged, or missing although the run committed one, is a CheckpointError naming it and
    the kept checkpoints there are, instead of a silent restart from round 1."""
    if exists(location):
        try:
            verify(location, started_with(run_dir))
        except CheckpointError as e:
            raise CheckpointError(e.path, f"{e.expected}; {_alternatives(location, run_dir)}",
                                  e.what) from None
        return True
    why = _committed_before(location, run_dir)
    if why:
        raise CheckpointError(path_of(location), f"the run's newest checkpoint (it is "
                          f"missing, though {why}; resuming from scratch would rewrite the "
                          f"run); {_alternatives(location, run_dir)}")
    return False


def _committed_before(location: str, run_dir: str) -> str | None:
    """What shows that the run in ``run_dir`` committed a checkpoint (None: nothing does): a
    kept one; a finished run's summary (its last round always checkpoints); a metrics row whose
    ``checkpoint_s`` timed one (each row times the checkpoint after the round before it)."""
    if kept_rounds(location):
        return "kept checkpoints are there"
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        if isinstance(summary, dict) and not summary.get("diverged") and \
                not summary.get("stopped"):
            return "summary.json says the run finished"
    except (OSError, ValueError):
        pass
    try:
        timed = pq.read_table(os.path.join(run_dir, "metrics.parquet"),
                              columns=["round", "checkpoint_s"]).to_pylist()
    except Exception:  # noqa: BLE001 - no or an unreadable table: refused on its own later
        return None
    after = [r["round"] - 1 for r in timed if (r["checkpoint_s"] or 0) > 0]
    return f"metrics.parquet records the checkpoint after round {max(after)}" if after else None


def _alternatives(location: str, run_dir: str) -> str:
    """What the user can do instead: fork from a kept checkpoint, or start a new run."""
    kept = kept_rounds(location)
    if not kept:
        return "no kept checkpoint (checkpoint.keep) is there to continue from: start a new run"
    return (f"kept checkpoints: rounds {', '.join(map(str, kept))}; rayfl fork {run_dir} --at "
            f"{kept[-1]} continues from one in a new run directory")


def prune_state(state_root: str, versions, pinned: set[tuple[int, int]] = frozenset()) -> int:
    """Drop client-state files neither the checkpoint nor a kept one references."""
    return prune_after(state_root, versions, pinned)


def restore(template, found, where: str):
    """``found`` (a checkpoint's tree as read) rebuilt in the classes of ``template`` (the run's
    fresh tree); a :class:`CheckpointError` naming ``where`` and the first difference when the two
    are not the same structure."""
    tree = _rebuild(template, found)
    problem = mismatch(template, tree)
    if problem:
        raise CheckpointError(where, f"a checkpoint of this run's layers ({problem})")
    return tree


def _rebuild(template, found):
    if isinstance(found, Slot):
        if not (dataclasses.is_dataclass(template) and type(template).__name__ == found.name):
            return found  # left as read: the structure check names it
        return dataclasses.replace(template, **{
            f.name: _rebuild(getattr(template, f.name), found.fields.get(f.name))
            for f in dataclasses.fields(template) if f.name in found.fields})
    if isinstance(found, tuple) and isinstance(template, tuple) and len(found) == len(template):
        return tuple(_rebuild(a, b) for a, b in zip(template, found))
    if isinstance(found, dict) and isinstance(template, dict):
        return {k: _rebuild(template.get(k), v) for k, v in found.items()}
    return found


def server_state(stack, ck: dict, where: str):
    """The checkpoint's server state tree for a run's ``stack`` (:class:`~rayfl.layers.Stack`),
    checked against it by structure; a rayfl 0.1 checkpoint's flat state is migrated."""
    found = ck.get("state")
    if isinstance(found, dict) and "x" in found:  # rayfl 0.1
        return stack.from_legacy(found, ck.get("transforms"), ck.get("buffers"))
    if not isinstance(found, Slot) or not isinstance(found.fields.get("x"), torch.Tensor):
        raise CheckpointError(where, "a checkpoint holding a server state")
    template = stack.init(found.fields["x"], found.fields.get("buffers"))
    return restore(template, found, where)
