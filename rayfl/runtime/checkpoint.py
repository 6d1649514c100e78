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
import io
import json
import math
import os
import pickle

import numpy as np
import pyarrow.parquet as pq
import torch

from rayfl.runtime.state_store import prune_after, read_state, verify_present
from rayfl.runtime.storage import CheckpointError, Storage, join
from rayfl.schema import ConfigError

NAME = "checkpoints/checkpoint.pt"
IDENTITY = "identity"  # the payload key of the writing run's identity (:func:`identity`)
FIRST = ("seed", "algorithm.name")  # the keys an identity mismatch names first
UNNAMED = ("name",)  # result keys left out of it: runs alike but for them share a trajectory
#: config keys that shape the client state a fork inherits (a fork cannot change them)
SHARED = ("data.", "model.", "algorithm.name", "privacy.", "seed")
FORMAT = "rayfl-checkpoint/2"  # /2: the server state is a tree of slots (rayfl.layers)
FORMATS = ("rayfl-checkpoint/1", FORMAT)  # /1 (rayfl 0.1): one flat dict, read by migration
_TENSOR, _ARRAY, _TUPLE, _FLOAT, _SLOT = "$tensor", "$ndarray", "$tuple", "$float", "$slot"


@dataclasses.dataclass(frozen=True)
class Slot:
    """A dataclass of a checkpoint as read back: its class name and fields (the run's own
    classes rebuild it, :func:`restore`; nothing named in a file is imported)."""

    name: str
    fields: dict

    @property
    def slot_name(self) -> str:
        """The class name it was written as (what a structure check reports)."""
        return self.name


def path_of(location: str) -> str:
    """The run's checkpoint file (a path or URI)."""
    return Storage(location).path(NAME)


def _encode(obj, tensors: list[torch.Tensor]):
    """``obj`` as JSON-able data; tensors and arrays are appended to ``tensors`` by index."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach().cpu().contiguous())
        return {_TENSOR: len(tensors) - 1}
    if isinstance(obj, np.ndarray):
        tensors.append(torch.from_numpy(np.ascontiguousarray(obj)).clone())
        return {_ARRAY: len(tensors) - 1}
    if isinstance(obj, np.generic):
        obj = obj.item()
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_FLOAT: repr(obj)}
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, tensors) for v in obj]
        return {_TUPLE: items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        return {k: _encode(v, tensors) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_SLOT: [type(obj).__name__, {f.name: _encode(getattr(obj, f.name), tensors)
                                             for f in dataclasses.fields(obj)}]}
    raise TypeError(f"a checkpoint holds tensors, arrays and plain data only, not "
                    f"{type(obj).__name__}")


def unencodable(obj, where: str = "") -> str | None:
    """What in ``obj`` a checkpoint cannot hold (the types :func:`_encode` takes: tensors,
    arrays, numbers, strings, None, lists, tuples and str-keyed dicts of them), or None; read
    without copying anything."""
    if obj is None or isinstance(obj, (torch.Tensor, np.ndarray, np.generic, bool, int, float,
                                       str)):
        if isinstance(obj, np.ndarray) and not _tensor_dtype(obj.dtype):
            return f"a {obj.dtype} array{where and f' at {where}'}"
        return None
    if isinstance(obj, (list, tuple)):
        return next((p for i, v in enumerate(obj) if (p := unencodable(v, f"{where}[{i}]"))),
                    None)
    if isinstance(obj, dict):
        key = next((k for k in obj if not isinstance(k, str)), None)
        if key is not None:
            return f"the non-string key {key!r}{where and f' in {where}'}"
        return next((p for k, v in obj.items() if (p := unencodable(v, f"{where}[{k!r}]"))),
                    None)
    return f"{type(obj).__name__}{where and f' at {where}'}"


def _tensor_dtype(dtype: np.dtype) -> bool:
    """Whether torch holds arrays of ``dtype`` (not objects or strings)."""
    try:
        torch.from_numpy(np.empty(0, dtype=dtype))
        return True
    except TypeError:
        return False


def _decode(obj, tensors: list[torch.Tensor]):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (key, value), = obj.items()
        if key == _TENSOR:
            return tensors[value]
        if key == _ARRAY:
            return tensors[value].numpy()
        if key == _TUPLE:
            return tuple(_decode(v, tensors) for v in value)
        if key == _FLOAT:
            return float(value)
        if key == _SLOT:
            return Slot(value[0], _decode(value[1], tensors))
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _digest(text: str, tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256(text.encode())
    for t in tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    return h.hexdigest()


def _writer(payload: dict):
    """A function writing ``payload``'s checkpoint file (tensors, arrays and plain data) to an
    open binary file; encoding errors surface here, before any file is touched."""
    tensors: list[torch.Tensor] = []
    text = json.dumps(_encode(payload, tensors), allow_nan=False)
    record = {"format": FORMAT, "json": text, "tensors": tensors,
              "sha256": _digest(text, tensors)}
    return lambda f: torch.save(record, f)


def encode(payload: dict) -> bytes:
    """The checkpoint file's bytes for ``payload``."""
    buf = io.BytesIO()
    _writer(payload)(buf)
    return buf.getvalue()


def decode(data: bytes, where: str) -> dict:
    """The payload in checkpoint bytes; :class:`CheckpointError` naming ``where`` if damaged."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(where, f"a complete rayfl checkpoint ({why})")

    try:
        raw = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:  # the weights-only unpickler refused foreign content
        raise bad("damaged, or holding objects other than tensors and plain data") from None
    except Exception as e:  # noqa: BLE001 — any failure of the (code-free) reader: damaged
        raise bad(f"unreadable: {(str(e).splitlines() or [type(e).__name__])[0][:160]}") from None
    if not isinstance(raw, dict) or raw.get("format") not in FORMATS:
        raise bad(f"not a {FORMAT} file")
    text, tensors = raw.get("json"), raw.get("tensors")
    if not isinstance(text, str) or not isinstance(tensors, list) or not all(
            isinstance(t, torch.Tensor) for t in tensors):
        raise bad("malformed contents")
    if raw.get("sha256") != _digest(text, tensors):
        raise bad("checksum mismatch: the file is corrupted")
    return _decode(json.loads(text), tensors)


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
    if isinstance(payload.get("versions"), np.ndarray):
        payload = {**payload, "versions": _sparse(payload["versions"])}
    storage, writer = Storage(location), _writer(payload)
    if keep:
        storage.write_with(kept_name(payload["round"] + 1), writer, durable=True)
    storage.write_with(NAME, writer, durable=True)


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
    from rayfl import config as config_mod
    from rayfl.rundir import result_keys

    values = {k: v for k, v in result_keys(config_mod.to_dict(cfg)).items() if k not in UNNAMED}
    return json.loads(json.dumps(values, allow_nan=False))


def state_stamp(values: dict) -> dict[str, np.ndarray]:
    """What each client-state file of the run of identity ``values`` (:func:`identity`, or its
    fingerprint's) records of it (:mod:`rayfl.runtime.state_store`): the seed, the algorithm and
    a digest of the other :data:`SHARED` values away from their defaults (a fork shares its
    source's files, and a key a later version adds keeps the digest)."""
    from rayfl.rundir import default_of

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
    from rayfl.rundir import default_of, differences

    found = ck.get(IDENTITY) if isinstance(ck, dict) else None
    if not isinstance(found, dict) or values is None:
        return
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
        from rayfl.rundir import started_with

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
    from rayfl.layers import mismatch

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
