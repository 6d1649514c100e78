"""Whether rayfl may create a directory where a config or a flag names one (a run, a data cache,
an analysis's output), checked by trying: permission bits do not tell."""

from __future__ import annotations

import os
import tempfile

from rayfl.schema import ConfigError


def check_creatable(path: str, key: str) -> str:
    """``path`` is a directory or can be made one: its nearest existing ancestor is a directory
    in which this process can really create an entry (a probe directory, removed at once: the
    permission bits do not tell, e.g. for root under /proc). Returns that ancestor."""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        parent, probe = full, True
    else:
        if os.path.lexists(full):
            raise ConfigError(key, path, "a directory (a file of that name exists)")
        parent = os.path.dirname(full)
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        probe = os.path.isdir(parent)
    why = f"{parent} is not a directory"
    if probe:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".rayfl-probe-", dir=parent))
            return parent
        except OSError as e:
            why = f"cannot create in {parent}: {e.strerror}"
    raise ConfigError(key, path, f"a directory this user may create or write ({why})")
