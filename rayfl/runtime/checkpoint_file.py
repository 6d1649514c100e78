"""The checkpoint file's format: a ``torch.save`` file holding only a list of tensors, a JSON
text describing everything else (numbers, strings, lists, dicts, tuples, dataclasses as named
slots, references to the tensors) and a SHA-256 over both, read back with ``torch.load(...,
weights_only=True)`` — a file that loads without executing code. What a checkpoint means (its
keys, its run's identity, resume) is :mod:`rayfl.runtime.checkpoint`."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import pickle

import numpy as np
import torch

from rayfl.runtime.storage import CheckpointError

FORMAT = "rayfl-checkpoint/2"  # /2: the server state is a tree of slots (rayfl.layers)
FORMATS = ("rayfl-checkpoint/1", FORMAT)  # /1 (rayfl 0.1): one flat dict, read by migration
_TENSOR, _ARRAY, _TUPLE, _FLOAT, _SLOT = "$tensor", "$ndarray", "$tuple", "$float", "$slot"


@dataclasses.dataclass(frozen=True)
class Slot:
    """A dataclass of a checkpoint as read back: its class name and fields (the run's own
    classes rebuild it, :func:`rayfl.runtime.checkpoint.restore`; nothing named in a file is imported)."""

    name: str
    fields: dict

    @property
    def slot_name(self) -> str:
        """The class name it was written as (what a structure check reports)."""
        return self.name


def _encode(obj, tensors: list[torch.Tensor]):
    """``obj`` as JSON-able data; tensors and arrays are appended to ``tensors`` by index."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach().to("cpu", copy=True).contiguous())  # not the live one
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
    if isinstance(obj, Slot):  # a checkpoint's dataclass as read: written back as it was
        return {_SLOT: [obj.name, {k: _encode(v, tensors) for k, v in obj.fields.items()}]}
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


def unencodable_tree(value, where: str = "") -> str | None:
    """What in ``value`` a checkpoint cannot hold (None: nothing), a slot's dataclass field by
    field (a server state's tree)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return next((p for f in dataclasses.fields(value)
                     if (p := unencodable_tree(getattr(value, f.name), f"{where}.{f.name}"))),
                    None)
    return unencodable(value, where)


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


def writer(payload: dict):
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
    writer(payload)(buf)
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
