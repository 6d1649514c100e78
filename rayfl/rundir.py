"""Run-directory safety: where a new run may go, one writer at a time, and what resume accepts.

A new run goes into a new or empty directory (never over a user's files, never outside
``output_dir`` through its name); the process that writes a run directory holds an exclusive
lock on ``<run_dir>/.lock`` for as long as it runs; ``fingerprint.json``, written when the run
starts, records every config value that can change results, so ``resume`` refuses a
``config.yaml`` edited in those keys and names them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import typing

import pyarrow as pa
import pyarrow.parquet as pq

from rayfl.config import Config
from rayfl.creatable import check_creatable
from rayfl.schema import ConfigError

LOCK = ".lock"
FINGERPRINT = "fingerprint.json"
# keys that cannot change a run's results (where it runs and where files go; when a run of
# empty rounds stops it: raised, a stopped run resumes); every other key does.
# runtime.logical_shards is not among them: it fixes the order of the sums; nor are
# runtime.storage and name, which say where the run's checkpoints and client state are.
NEUTRAL = ("runtime.", "output_dir", "data.root", "data.fetch", "data.cache_dir",
           "checkpoint.every", "checkpoint.keep", "availability.max_empty_rounds", "loggers.")
NEUTRAL_EXCEPT = ("runtime.logical_shards", "runtime.storage")


def new_path(output_dir: str, name: str) -> str:
    """``<output_dir>/<name>-<timestamp>`` (made unique), checked to lie inside output_dir."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(output_dir, f"{name}-{stamp}")
    if os.path.dirname(os.path.abspath(base)) != os.path.abspath(output_dir):
        raise ConfigError("name", name, "a name that stays inside output_dir")
    path, i = base, 1
    while os.path.exists(path):
        path, i = f"{base}-{i}", i + 1
    return path


def check_new(run_dir: str, key: str = "--run-dir") -> None:
    """A new run may write ``run_dir``: absent, or an empty directory, in a writable place."""
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(key, run_dir, "a directory (a file of that name exists)")
    if os.path.isdir(run_dir):
        if os.path.exists(os.path.join(run_dir, "config.yaml")):
            raise ConfigError(key, run_dir, "a new or empty directory (it holds a run; use "
                              "`rayfl resume` to continue it)")
        entries = sorted(e for e in os.listdir(run_dir) if e != LOCK)  # a run that never began
        if entries:
            raise ConfigError(key, run_dir, f"a new or empty directory (it holds "
                              f"{len(entries)} entries that are not a run, e.g. {entries[0]!r})")
        if not os.access(run_dir, os.W_OK | os.X_OK):
            raise ConfigError(key, run_dir, "a directory this user may write")
        return
    _check_length(run_dir, check_creatable(run_dir, key), key)


def make(run_dir: str) -> list[str]:
    """Create ``run_dir`` and its missing parents; the directories created, outermost first."""
    created, path = [], os.path.abspath(run_dir)
    while not os.path.isdir(path):
        created.append(path)
        path = os.path.dirname(path)
    os.makedirs(run_dir, exist_ok=True)
    return created[::-1]


def rows_recorded(run_dir: str) -> int:
    """The rows ``metrics.parquet`` holds (0 when there is none yet)."""
    path = os.path.join(run_dir, "metrics.parquet")
    return pq.read_metadata(path).num_rows if os.path.exists(path) else 0


def unmake(run_dir: str, created: list[str]) -> None:
    """Remove a new run that recorded no round: ``run_dir`` and the directories of ``created``
    (outermost first, as :func:`make` returns them) that hold nothing else; a directory that
    existed before is emptied (it held nothing of the user's, :func:`check_new`: at most an
    earlier rayfl's lock file)."""
    if os.path.abspath(run_dir) in created:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        for entry in os.listdir(run_dir):
            path = os.path.join(run_dir, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
    for path in reversed(created):
        try:
            os.rmdir(path)
        except OSError:  # gone already, or holds what another process put there
            pass


def _check_length(run_dir: str, parent: str, key: str) -> None:
    """Every name in the path within the file system's NAME_MAX, the whole within PATH_MAX."""
    name_max, path_max = os.pathconf(parent, "PC_NAME_MAX"), os.pathconf(parent, "PC_PATH_MAX")
    full = os.path.abspath(run_dir)
    longest = max((len(os.fsencode(p)) for p in full.split(os.sep)), default=0)
    if longest > name_max or len(os.fsencode(full)) >= path_max - 64:  # room for files inside
        raise ConfigError(key, run_dir[:80] + ("..." if len(run_dir) > 80 else ""),
                          f"a path whose names are at most {name_max} bytes and whole at most "
                          f"{path_max - 64} bytes")


class Lock:
    """An exclusive ``flock`` on ``<run_dir>/.lock``, held until :meth:`release` (or exit)."""

    def __init__(self, run_dir: str):
        self.file = open(os.path.join(run_dir, LOCK), "a")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise ConfigError("run_dir", run_dir, "a run directory no other process is writing "
                              "(a `rayfl run` or `rayfl resume` of it is still going)") from None

    def release(self) -> None:
        """Let another process write the directory."""
        if not self.file.closed:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def result_keys(plain: dict) -> dict:
    """The flattened config values that can change results (see ``NEUTRAL``)."""
    return {k: v for k, v in sorted(_flatten(plain).items()) if changes_results(k)}


def changes_results(key: str) -> bool:
    """Whether a dotted config key can change results (one an older rayfl recorded may not)."""
    return key in NEUTRAL_EXCEPT or not any(key == n or key.startswith(n) for n in NEUTRAL)


def write_fingerprint(run_dir: str, plain: dict) -> None:
    """``fingerprint.json``: the result-changing values and their sha256."""
    values = result_keys(plain)
    blob = json.dumps(values, sort_keys=True, allow_nan=False)
    tmp = os.path.join(run_dir, FINGERPRINT + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"sha256": hashlib.sha256(blob.encode()).hexdigest(), "values": values}, f,
                  indent=1, allow_nan=False)
    os.replace(tmp, os.path.join(run_dir, FINGERPRINT))


def check_fingerprint(run_dir: str, plain: dict) -> None:
    """Refuse a config whose result-changing values differ from those the run started with."""
    path = os.path.join(run_dir, FINGERPRINT)
    if not os.path.isfile(path):
        raise ConfigError("run_dir", run_dir, "a directory rayfl run or fork made (it has "
                          "config.yaml but no fingerprint.json; start a new run)")
    try:
        with open(path) as f:
            old = json.load(f)["values"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("run_dir", path, f"a readable fingerprint.json ({type(e).__name__})") \
            from None
    old = {k: v for k, v in old.items() if changes_results(k)}  # an older rayfl kept more
    new = result_keys(plain)
    differ = differences(old, new)
    if differ:
        shown = "; ".join(f"{k}: {old.get(k, '<unset>')!r} → {new.get(k, '<unset>')!r}"
                          for k in differ[:5])
        raise ConfigError(", ".join(differ), os.path.join(run_dir, "config.yaml"),
                          f"the values the run started with ({shown}); on resume only "
                          "runtime.* (not logical_shards or storage), output_dir, data.root, "
                          "data.fetch, data.cache_dir, checkpoint.every, checkpoint.keep, "
                          "availability.max_empty_rounds and loggers.* may change")


def differences(old: dict, new: dict) -> list[str]:
    """The result-changing keys whose values differ from ``old`` to ``new`` (sorted); a key
    ``old`` lacks (added by a later rayfl version) counts as unchanged at its default."""
    unset = object()
    return sorted(k for k in set(old) | set(new) if old.get(k, unset) != new.get(k, unset)
                  and not (k not in old and new[k] == default_of(k)))


def started_with(run_dir: str) -> dict | None:
    """The result-changing values the run in ``run_dir`` started with (its fingerprint.json),
    or None when it has no readable one (:func:`check_fingerprint` refuses that)."""
    try:
        with open(os.path.join(run_dir, FINGERPRINT)) as f:
            values = json.load(f)["values"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(values, dict):
        return None
    return {k: v for k, v in values.items() if changes_results(k)}  # an older rayfl kept more


def default_of(key: str):
    """The default of a dotted run-config key (a key added by a later rayfl version, absent from
    an older run's fingerprint, counts as unchanged at its default); a sentinel for none."""
    node: typing.Any = Config
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) \
            else {}
        if part not in fields:
            return _NO_DEFAULT
        f = fields[part]
        hint = typing.get_type_hints(node).get(part)
        kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        nested = next((k for k in kinds if dataclasses.is_dataclass(k)), None)
        if nested is not None:
            node = nested
            continue
        if f.default is not dataclasses.MISSING:
            return f.default
        return f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else _NO_DEFAULT
    return _NO_DEFAULT


_NO_DEFAULT = object()


def check_metrics(run_dir: str, done: int = 0) -> None:
    """A run to resume (or fork) has a readable ``metrics.parquet`` holding a row of each of
    its first ``done`` rounds, once (rows of later rounds: written before a crash, dropped by
    the resume); with ``done`` 0, none at all is fine."""
    path = os.path.join(run_dir, "metrics.parquet")
    if not os.path.exists(path):
        if done:
            raise ConfigError("run_dir", path, f"the metrics rows of rounds 1–{done}, which the "
                              "run's checkpoint covers (the file is missing)")
        return
    try:
        rounds = pq.read_table(path).column("round").to_pylist()  # every column reads
    except (OSError, KeyError, pa.ArrowException) as e:
        raise ConfigError("run_dir", path, f"rayfl's metrics table, readable, with a 'round' "
                          f"column ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                          ) from None
    have = sorted(r for r in rounds if r is not None and r <= done)
    if have != list(range(1, done + 1)):
        missing = sorted(set(range(1, done + 1)) - set(have))
        twice = sorted({r for r in have if have.count(r) > 1})
        raise ConfigError("run_dir", path, f"one row of each of rounds 1–{done}, which the run's "
                          "checkpoint covers (" + (f"round {missing[0]} is missing" if missing
                                                    else f"round {twice[0]} is there twice") +
                          "; the table belongs to another run, or was edited)")
