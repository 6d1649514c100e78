"""Did you mean: the closest known key to a mistyped one, for :class:`~rayfl.schema.ConfigError`.

Compares with :func:`difflib.get_close_matches` against the keys valid where the mistake is, then
(for a key that belongs one level down, e.g. ``lr`` for ``local.lr``) against the dotted keys of
the sections there.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from typing import get_args, get_type_hints


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``name`` (difflib ratio ≥ 0.6), or None."""
    match = difflib.get_close_matches(str(name), sorted(set(candidates)), n=1, cutoff=0.6)
    return match[0] if match else None


def section_keys(cls: type) -> list[str]:
    """``section.key`` for every field of ``cls`` that is a (possibly optional) config section."""
    out = []
    for name, hint in get_type_hints(cls).items():
        for sub in (hint, *get_args(hint)):
            if dataclasses.is_dataclass(sub):
                out += [f"{name}.{f.name}" for f in dataclasses.fields(sub) if f.init]
    return out


def no_such_key(name: str, prefix: str, valid: Iterable[str], deeper: Iterable[str] = ()) -> str:
    """The ``expected`` text of an unknown key's error: the best guess first, then every key
    valid here. ``deeper``: dotted keys one level down, guessed from when nothing here is
    close."""
    valid = sorted(set(valid))
    guess = closest(name, valid)
    where = f"{prefix}." if prefix else ""
    if guess is None:
        down: dict[str, str] = {}
        for k in deeper:  # the first section's key wins a tie (local.lr before server_opt.lr)
            down.setdefault(k.rsplit(".", 1)[1], k)
        guess = down.get(str(name)) or closest(name, deeper)
        if guess is None and (hit := closest(name, down)) is not None:
            guess = down[hit]
    hint = f" (did you mean '{where}{guess}'?)" if guess else ""
    return f"no such key{hint}; valid keys here: {', '.join(valid)}"
