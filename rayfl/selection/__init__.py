"""Client selection: which of the online clients a synchronous round samples (``selection.*``).

Built-ins: ``uniform`` (the default), ``power_of_choice`` (Cho, Wang & Joshi, 2022) and ``oort``
(Lai et al., 2021); a user's rule is a :class:`Selector` subclass named as
``package.module:Name`` or registered with ``rayfl.register_selector``.
"""

from __future__ import annotations

from rayfl.selection.base import SelectionContext, Selector
from rayfl.selection.config import SelectionConfig


def make_selector(cfg: SelectionConfig, ctx: SelectionContext) -> Selector:
    """The configured selector, fresh (a resumed run then loads its state)."""
    return cfg.component()(cfg.params, ctx)


__all__ = ["SelectionConfig", "SelectionContext", "Selector", "make_selector"]
