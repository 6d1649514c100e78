"""What a partition was built from — the dataset's files and the code that read them — as digests
for the partition cache key, so that an edited dataset or loader is rebuilt, never served stale.

A dataset component names the files it reads with ``sources(data_cfg) -> list of paths``
(folders are walked); every built-in does. A user's loader without it counts ``data.root``
(when set) as its source. A dataset's files are identified by their path and their contents'
sha256 when they total at most :data:`HASHED_BYTES`, and otherwise by their path, size and
modification time in nanoseconds (as ``make`` and ``rsync`` judge): hashing gigabytes at every
start would cost more than the cache saves, and a dataset that large takes longer to build than
one tick of the file system's clock, so an edit after a build always moves the time. Small
files are hashed because an edit within the same tick as the build keeps their time.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import inspect
import os
import sys
from collections.abc import Iterable
from typing import Any

#: datasets whose files total at most this many bytes are identified by their contents
HASHED_BYTES = 64 << 20

_DATA = os.path.dirname(os.path.abspath(__file__))
#: the modules whose code decides a store's bytes: the loaders and their helpers, the
#: partitioners, the client hold-out and the writer
BUILD_MODULES = ("datasets/*.py", "partition.py", "holdout.py", "store.py")


def files(paths: Iterable[str]) -> list[str]:
    """The existing files among ``paths`` and inside the folders among them, as sorted absolute
    paths (a path that does not exist is left out: the loader names what it misses)."""
    found = set()
    for path in paths:
        path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        if os.path.isfile(path):
            found.add(path)
        for folder, _, names in os.walk(path) if os.path.isdir(path) else ():
            found.update(os.path.join(folder, n) for n in names)
    return sorted(p for p in found if os.path.isfile(p))


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest(paths: Iterable[str]) -> str:
    """sha256 over the identity of every file of ``paths``: path and contents, or — when they
    total more than :data:`HASHED_BYTES` — path, size and modification time."""
    found = files(paths)
    stats = [os.stat(p) for p in found]
    by_contents = sum(s.st_size for s in stats) <= HASHED_BYTES
    h = hashlib.sha256()
    for path, s in zip(found, stats):
        ident = _sha256(path) if by_contents else f"{s.st_size}:{s.st_mtime_ns}"
        h.update(f"{path}\0{ident}\0".encode())
    return h.hexdigest()


@functools.cache
def build_code() -> str:
    """sha256 of the source of :data:`BUILD_MODULES` (what rayfl's own code adds to a key)."""
    h = hashlib.sha256()
    for pattern in BUILD_MODULES:
        for path in sorted(glob.glob(os.path.join(_DATA, pattern))):
            h.update(os.path.relpath(path, _DATA).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def module_code(component: Any) -> str:
    """sha256 of the file of the module defining a user's ``component`` (the object's own
    source when it has no file, e.g. defined in a notebook; empty when neither is known)."""
    module = component if inspect.ismodule(component) else \
        sys.modules.get(getattr(component, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if path and os.path.isfile(path):
        return _sha256(path)
    try:
        source = inspect.getsource(component)
    except (OSError, TypeError):  # defined interactively: the name is all there is
        source = ""
    return hashlib.sha256(source.encode()).hexdigest()
