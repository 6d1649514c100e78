"""``selection.*``: who the server picks among the online clients (see ``rayfl.selection``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayfl import registry
from rayfl.schema import field


@dataclass(frozen=True)
class SelectionConfig(registry.Named):
    """Client selection: a built-in rule or a user's ``package.module:Name`` Selector."""

    KIND = "selector"

    name: str = field("uniform", doc="who is sampled among the online clients: a built-in "
                                     "(listed under `selection.name` below) or "
                                     "package.module:Name, a Selector subclass")
    params: Any = field(None, doc="validated Params of the chosen selector", flatten=True)
