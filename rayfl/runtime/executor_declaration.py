"""What an executor class declares of itself (``on_ray``, ``copies_parts``, a classmethod
``build``) and the calls the runtime makes on what ``build`` returns — checked where an
executor is registered or named in a config (:mod:`rayfl.runtime.executor_kind` checks the
built one)."""

from __future__ import annotations

import inspect
from typing import Any

from rayfl.contract import describe

#: the calls the runtime makes on an executor (rayfl.runtime.loop.Executor)
CALLS = ("run", "summaries", "client_scores", "client_losses")


def declaration_problem(obj: Any) -> str | None:
    """What is wrong with an executor class's declarations, or None."""
    if not isinstance(obj, type):
        return f"an executor class (got {describe(obj)})"
    if not isinstance(getattr(obj, "on_ray", None), bool):
        return "an executor: a class with on_ray (True or False) and a classmethod build(hosting)"
    if not isinstance(getattr(obj, "copies_parts", False), bool):
        return f"copies_parts True or False (got {describe(obj.copies_parts)})"
    if not inspect.ismethod(getattr(obj, "build", None)):
        return "an executor: a class with on_ray (True or False) and a classmethod build(hosting)"
    return None
