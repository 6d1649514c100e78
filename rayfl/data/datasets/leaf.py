"""FEMNIST in LEAF's json format (``train/*.json``, ``test/*.json``), with each row's writer."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from rayfl.data.datasets import Arrays
from rayfl.schema import ConfigError

natural = True  # every training row carries its writer/user (partition: natural)

PIXELS, CLASSES = 784, 62

HINT = ("run LEAF's data/femnist/preprocess.sh (https://github.com/TalwalkarLab/leaf) and set "
        "data.root to its data/femnist/data folder")


def _files(root: str | None, split: str, name: str = "femnist", hint: str = HINT) -> list[str]:
    files = sorted(glob.glob(os.path.join(os.path.expanduser(root), split, "*.json"))) \
        if root else []
    if not files:
        raise ConfigError("data.root", root, f"a LEAF {name} folder with {split}/*.json files "
                          f"(keys users, num_samples, user_data); {hint}")
    return files


def json_files(root: str | None) -> list[str]:
    """Every ``train/*.json`` and ``test/*.json`` under ``root`` (a ``sources`` helper)."""
    if not root:
        return []
    return sorted(p for split in ("train", "test")
                  for p in glob.glob(os.path.join(os.path.expanduser(root), split, "*.json")))


def _read_json(path: str, name: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise ConfigError("data.root", path, f"a LEAF {name} json file ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]})") from None
    if not isinstance(blob, dict) or not isinstance(blob.get("users"), list) or \
            not isinstance(blob.get("num_samples"), list) or \
            not isinstance(blob.get("user_data"), dict):
        raise ConfigError("data.root", path, f"a LEAF {name} json file: an object with users "
                          "(a list), num_samples (a list) and user_data (an object)")
    return blob


def _user_rows(path: str, name: str, blob: dict, i: int) -> tuple[str, list, list]:
    """(user, x, y) of the i-th user of a LEAF file, its counts checked against num_samples."""
    user, counts = blob["users"][i], blob["num_samples"]

    def refuse(problem):
        return ConfigError("data.root", path, f"a LEAF {name} json file ({problem})")

    data = blob["user_data"].get(user) if isinstance(user, str) else None
    if not isinstance(data, dict) or not isinstance(data.get("x"), list) or \
            not isinstance(data.get("y"), list):
        raise refuse(f"user {user!r} has no user_data entry with lists x and y")
    x, y = data["x"], data["y"]
    if len(x) != len(y):
        raise refuse(f"user {user!r} has {len(x)} rows in x but {len(y)} labels in y")
    if not y:
        raise refuse(f"user {user!r} has no samples")
    if len(counts) != len(blob["users"]) or type(counts[i]) is not int or counts[i] != len(y):
        declared = repr(counts[i]) if i < len(counts) else "no entry"
        raise refuse(f"num_samples says {declared} for user {user!r}, who has {len(y)} "
                     "samples (a whole number each, one per user)")
    return user, x, y


def read_users(root: str | None, split: str, name: str, hint: str,
               rows: Callable[[list, list], Any] | None = None) -> dict[str, Any]:
    """user -> its rows over every LEAF json file of one split: ``{"x": [...], "y": [...]}``,
    or what ``rows(x, y)`` makes of them. Every file is checked — its keys, each user's x and y
    of equal length matching ``num_samples``, no user twice — and a ValueError that ``rows``
    raises on a user's rows becomes a ConfigError naming the file and the user."""
    out, seen = {}, {}
    for path in _files(root, split, name, hint):
        blob = _read_json(path, name)
        for i in range(len(blob["users"])):
            user, x, y = _user_rows(path, name, blob, i)
            if user in seen:
                raise ConfigError("data.root", path, f"each {split} user in one LEAF {name} "
                                  f"json file ({user!r} is also in {seen[user]})")
            seen[user] = path
            try:
                out[user] = {"x": x, "y": y} if rows is None else rows(x, y)
            except (ValueError, TypeError) as e:
                raise ConfigError("data.root", path, f"a LEAF {name} json file (user "
                                  f"{user!r}: {e})") from None
    if not out:
        raise ConfigError("data.root", os.path.join(root, split), f"LEAF {name} json files "
                          f"listing at least one {split} user (none lists any)")
    return out


def _pixels(x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    """One writer's rows: 784 finite pixels in [0, 1] stored as uint8 (×255, rounded), and
    labels 0..61."""
    try:
        px = np.asarray(x)
    except (ValueError, TypeError):
        px = None
    if px is None or px.dtype.kind not in "fiu":  # strings, objects, ragged rows
        raise ValueError(f"x rows of {PIXELS} numbers (rows of unequal lengths or values "
                         "that are not numbers, such as strings)")
    px = px.astype(np.float32, copy=False)
    if px.ndim != 2 or px.shape[1] != PIXELS:
        raise ValueError(f"x rows of {PIXELS} pixels (found rows of "
                         f"{px.shape[1] if px.ndim == 2 else 'other shapes'})")
    bad = ~np.isfinite(px) | (px < 0) | (px > 1)
    if bad.any():
        r, c = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise ValueError(f"finite pixels in [0, 1] (row {r} holds {px[r, c].item()})")
    return np.rint(px * 255).astype(np.uint8), labels(y, CLASSES)


def labels(y: list, classes: int) -> np.ndarray:
    """int64 labels 0..classes-1 from a LEAF ``y`` list: whole numbers, read as LEAF's
    ``int(e)`` reads them (ints, whole floats, numeric strings, booleans); a ValueError names
    the first other value."""
    out = np.empty(len(y), dtype=np.int64)
    for i, v in enumerate(y):
        try:
            whole = int(v)
            exact = float(v) == whole
        except (TypeError, ValueError, OverflowError):
            whole, exact = -1, False
        if not exact or not 0 <= whole < classes:
            raise ValueError(f"labels in 0..{classes - 1} (y[{i}] is {v!r})")
        out[i] = whole
    return out


def sources(cfg) -> list[str]:
    """The json files that :func:`load` reads."""
    return json_files(cfg.root)


def load(cfg, seed: int) -> Arrays:
    """Pixels in [0, 1] stored as uint8 (LEAF's floats ×255, rounded); 62 classes; writers
    sorted by id become groups 0..G-1."""
    train = read_users(cfg.root, "train", "femnist", HINT, _pixels)
    test = read_users(cfg.root, "test", "femnist", HINT, _pixels)
    users = sorted(train)
    sizes = [len(train[u][1]) for u in users]
    test_users = sorted(test)
    return Arrays(np.concatenate([train[u][0] for u in users]),
                  np.concatenate([train[u][1] for u in users]),
                  np.concatenate([test[u][0] for u in test_users]),
                  np.concatenate([test[u][1] for u in test_users]),
                  input_shape=(1, 28, 28), num_classes=CLASSES, scale=1 / 255,
                  groups=np.repeat(np.arange(len(users)), sizes))
