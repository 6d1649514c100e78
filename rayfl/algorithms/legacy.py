"""Components written for rayfl 0.1's interface: refused with one line saying what to change.

rayfl 0.2 made the state a tree of typed slots and the client one entry point
(:mod:`rayfl.algorithms.base`, :mod:`rayfl.layers`). A user's algorithm or wrapper that still
defines a 0.1 name would otherwise be silently ignored (a ``client_begin`` nobody calls) or fail
deep in a round; :func:`check` names the first such name and its 0.2 replacement before
anything starts (docs/howto/algorithm.md, "From rayfl 0.1").
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator

from rayfl import registry

from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.schema import ConfigError

#: an algorithm's 0.1 name -> what replaces it in 0.2
ALGORITHM = {
    "client_begin": "client_train(task, ctx) returning ClientResult(ctx.train(rule), payload, "
                    "state): the LocalRule goes to ctx.train",
    "client_end": "client_train(task, ctx): the payload and state go into its ClientResult",
    "server_step": "srv.step(direction) inside server_update(x, state, agg, srv)",
    "local_lr": "a server wrapper's client_lr(slot, t, inner) (rayfl.layers.Layer)",
    "fork_state": "nothing: fork checks the state tree by its structure",
    "receive_client_models": "a payload entry Rows(y) read as agg.extras[key] (rows, ids) in "
                             "server_update",
    "client_state": "traits = Traits(client_state={...})",
    "paper_weighting": "traits = Traits(weighting=...)",
    "extra_weightings": "traits = Traits(weightings=(...))",
    "accepts_server_opt": "traits = Traits(server_opt=True)",
    "dp_post_processing": "traits = Traits(dp_post_processing=True)",
    "asynchronous_ok": "traits = Traits(asynchronous=None)",
    "synchronous_reason": "traits = Traits(asynchronous='why')",
    "local_buffers": "traits = Traits(local_buffers=True)",
    "buffers_reason": "traits = Traits(buffers='why')",
    "averaging_reason": "traits = Traits(averaging='why')",
    "search_space": "traits = Traits(search_space={...})",
    "compare_variant": "traits = Traits(compare_plain=(...))",
}
#: a server wrapper's 0.1 name -> what replaces it in 0.2
WRAPPER = {
    "own_keys": "a slot of its own: init(x0) returns it, aggregate/after receive it",
    "server_update": "aggregate(slot, agg, sums, srv) before the update under it and "
                     "after(slot, x, srv) after it",
    "server_init": "init(x0), the wrapper's own slot",
    "local_lr": "client_lr(slot, t, inner)",
    "inner_model": "traits = LayerTraits(inner_model=...)",
    "async_reason": "traits = LayerTraits(asynchronous='why')",
    "model_buffers_reason": "traits = LayerTraits(buffers='why')",
    "averages_rounds": "traits = LayerTraits(averages_rounds=True)",
    "search_space": "traits = LayerTraits(search_space={...})",
}


def _old_names(cls: type, table: dict[str, str], base: type) -> list[str]:
    """The 0.1 names ``cls`` defines beyond what ``base`` (0.2's class) defines itself."""
    return [n for n in table if any(n in vars(k) for k in cls.__mro__ if k not in
                                    base.__mro__ and k is not object)]


def _arity(fn: Any) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return -1


def check(cfg: Any) -> None:
    """ConfigError on ``algorithm.name`` or a wrapper's ``name`` when the component is written
    against rayfl 0.1's interface, naming the first 0.1 name and its replacement."""
    cls = cfg.algorithm.component()
    if isinstance(cls, type) and issubclass(cls, Algorithm):
        _refuse("algorithm.name", cfg.algorithm.name, _old_names(cls, ALGORITHM, Algorithm),
                ALGORITHM)
        if "server_update" in vars(cls) and _arity(cls.server_update) == 4:
            _refuse("algorithm.name", cfg.algorithm.name, ["server_update(state, agg, t)"],
                    {"server_update(state, agg, t)": "server_update(x, state, agg, srv) "
                                                     "returning (x, state, metrics)"})
        if _arity(cls.check_config) == 2:  # a classmethod: (params, cfg) in 0.1
            _refuse("algorithm.name", cfg.algorithm.name, ["check_config(params, cfg)"],
                    {"check_config(params, cfg)": "check_config(params, cfg, where), its keys "
                                                  "named f'{where}.KEY'"})
    for where, name, wcls in _wrappers(cfg):
        if isinstance(wcls, type) and issubclass(wcls, ServerWrapper):
            _refuse(f"{where}.name", name, _old_names(wcls, WRAPPER, ServerWrapper), WRAPPER)


def _wrappers(cfg: Any) -> Iterator[tuple[str, str, Any]]:
    """(where, name, class) of each configured server wrapper, in either spelling."""
    if not cfg.layers:
        for i, entry in enumerate(cfg.wrappers):
            yield f"wrappers[{i}]", entry.name, entry.component()
    for i, entry in enumerate(cfg.layers):
        kind, cls = registry.resolve_layer(entry.get("name"), f"layers[{i}].name")
        if kind == "wrapper":
            yield f"layers[{i}]", entry["name"], cls


def _refuse(key: str, value: str, names: list[str], table: dict[str, str]) -> None:
    if names:
        raise ConfigError(key, value, f"a component of rayfl 0.2's interface (it defines "
                                      f"{names[0]}, rayfl 0.1's; use {table[names[0]]} — "
                                      "docs/howto/algorithm.md, 'From rayfl 0.1')")
