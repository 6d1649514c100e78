"""Server wrappers: transformations of an algorithm's server side that compose like optax's chain.

A wrapper is an :class:`~rayfl.algorithms.base.Algorithm` around another one (``inner``, itself
an algorithm or a wrapper). It overrides what it changes of the server — the aggregate the inner
update reads, the state after it, the client learning rate, the models it reports — and keeps its
own state beside the inner's under its ``own_keys``; everything else (client rule, client
procedure, capabilities, weights, flags) is the inner's, delegated explicitly below. The config's
``wrappers`` list, ``[{name: ima, window: 5}, {name: my_pkg.mod:MyWrapper}]``, applies them
innermost first, each a component resolved like an algorithm (a built-in name, a
``package.module:Name`` reference or a name given to :func:`rayfl.register_wrapper`), so

    wrappers: [A, B]   ⇒   B(A(algorithm))

A wrapper is one module and one registry line: it declares its keys as a ``Params`` dataclass,
its refusals as class flags or in :meth:`ServerWrapper.check_config`, a tuner preset as
``search_space()`` and, when it keeps the un-wrapped output as a further model, its name as
``inner_model`` (the analysis compares the two). IMA (:mod:`rayfl.algorithms.ima`) is one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rayfl import schema
from rayfl.algorithms.base import CAPABILITIES, Aggregate, Algorithm, ClientResult, \
    ClientTask, LocalRule, State, Vec
from rayfl.schema import ConfigError

#: the class flags a wrapper takes from the algorithm it wraps (see :class:`Algorithm`)
FLAGS = ("name", "paper_weighting", "extra_weightings", "client_state",
         "accepts_server_opt", "dp_post_processing", "asynchronous_ok", "synchronous_reason",
         "local_buffers", "buffers_reason")
#: the capabilities whose first argument is the server state (the inner sees only its keys),
#: and those of them that return the new server state (the wrapper's keys are kept)
READS_SERVER_STATE = ("round_message", "server_setup", "receive_client_models")
RETURNS_SERVER_STATE = ("server_setup", "receive_client_models")
#: the instance settings every algorithm has, taken from the wrapped one
SETTINGS = ("p", "server_lr", "weighting", "num_clients", "local_momentum", "server_opt")


class ServerWrapper(Algorithm):
    """Identity around ``inner``: subclasses override the server methods they change."""

    Params: ClassVar[type] = schema.NoParams
    #: the wrapper's own keys in the server state (stripped before the inner sees the state)
    own_keys: ClassVar[tuple[str, ...]] = ()
    #: why ``aggregation.mode`` fedbuff/fedasync refuse the wrapper (None: accepted)
    async_reason: ClassVar[str | None] = None
    #: why models with buffers (BatchNorm statistics) are refused (None: accepted)
    model_buffers_reason: ClassVar[str | None] = None
    #: it averages server models over rounds: refused around an algorithm whose class says
    #: why that is undefined for it (``Algorithm.averaging_reason``)
    averages_rounds: ClassVar[bool] = False
    #: the further model (:meth:`extra_models`) holding the un-wrapped output, if it keeps one
    inner_model: ClassVar[str | None] = None

    def __init__(self, inner: Algorithm, params: Any = None, *, rounds: int = 1):
        for attr in FLAGS + SETTINGS:
            setattr(self, attr, getattr(inner, attr))
        for capability in CAPABILITIES:
            method = getattr(inner, capability, None)
            if callable(method):
                if capability in READS_SERVER_STATE:
                    method = self._on_inner_state(method, capability in RETURNS_SERVER_STATE)
                setattr(self, capability, method)
        self.inner = inner
        self.params = params if params is not None else self.Params()
        self.rounds = rounds

    @classmethod
    def check_config(cls, params: Any, cfg: Any, where: str) -> None:
        """The wrapper's rules on the rest of the config (raise ConfigError on ``where``)."""

    def _on_inner_state(self, method, returns_state: bool):
        """``method(state, ...)`` of the inner on its own keys; a returned state keeps ours."""
        def call(state: State, *args):
            out = method(self.strip(state), *args)
            return {**out, **self.own(state)} if returns_state else out
        return call

    def own(self, state: State) -> State:
        """This wrapper's own entries of ``state``."""
        return {k: state[k] for k in self.own_keys if k in state}

    def strip(self, state: State) -> State:
        """``state`` without this wrapper's own keys: what the inner reads."""
        return {k: v for k, v in state.items() if k not in self.own_keys}

    def unwrap(self, source: Algorithm) -> Algorithm:
        """``source`` with its layer of this wrapper's class peeled off (for a fork's inner)."""
        return source.inner if type(source) is type(self) else source

    # ----- server side: the inner's unless a subclass changes it -------------------------
    def server_init(self, x0: Vec) -> State:
        return self.inner.server_init(x0)

    def broadcast(self, state: State, t: int) -> dict[str, Vec]:
        return self.inner.broadcast(self.strip(state), t)

    def local_lr(self, t: int, lr0: float, decay: float) -> float:
        return self.inner.local_lr(t, lr0, decay)

    def aggregation_weights(self, state: State, client_ids, num_samples) -> list[float]:
        return self.inner.aggregation_weights(self.strip(state), client_ids, num_samples)

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        new, metrics = self.inner.server_update(self.strip(state), agg, t)
        return {**new, **self.own(state)}, metrics

    def deployed(self, state: State) -> Vec:
        return self.inner.deployed(self.strip(state))

    def extra_models(self, state: State) -> dict[str, Vec]:
        return self.inner.extra_models(self.strip(state))

    def fork_state(self, state: State, next_round: int, source: Algorithm) -> State:
        return {**self.inner.fork_state(self.strip(state), next_round, self.unwrap(source)),
                **self.own(state)}

    # ----- client side: the inner's ----------------------------------------------------------
    def effective_steps(self, steps: int) -> float:
        return self.inner.effective_steps(steps)

    def client_begin(self, task: ClientTask) -> LocalRule:
        return self.inner.client_begin(task)

    def client_end(self, task: ClientTask, y: Vec, steps: int) -> ClientResult:
        return self.inner.client_end(task, y, steps)


def wrapper_classes(cfg: Any) -> list[tuple[str, type[ServerWrapper], Any]]:
    """(where, class, validated params) of every configured wrapper, innermost first."""
    return [(f"wrappers[{i}]", entry.component(), entry.params)
            for i, entry in enumerate(cfg.wrappers)]


def check_run(cfg: Any) -> None:
    """Every wrapper is a :class:`ServerWrapper`, may wrap the configured algorithm, and its own
    rules on the config hold (ConfigError on its entry)."""
    algorithm = cfg.algorithm.component()
    for (where, cls, params), entry in zip(wrapper_classes(cfg), cfg.wrappers):
        if not (isinstance(cls, type) and issubclass(cls, ServerWrapper)):
            raise ConfigError(f"{where}.name", entry.name,
                              "a ServerWrapper subclass (rayfl.algorithms.wrapper)")
        why = getattr(algorithm, "averaging_reason", None)
        if cls.averages_rounds and why:
            raise ConfigError(f"{where}.name", entry.name,
                              f"no wrapper averaging server models over rounds around "
                              f"{cfg.algorithm.name} ({why})")
        cls.check_config(params, cfg, where)


def wrap(algorithm: Algorithm, cfg: Any) -> Algorithm:
    """``algorithm`` inside the configured wrappers (innermost first)."""
    for _, cls, params in wrapper_classes(cfg):
        algorithm = cls(algorithm, params, rounds=cfg.rounds)
    return algorithm


def label(cfg: Any) -> str:
    """The run's algorithm as listed in tables and plots: ``fedavg``, ``fedavg+ima``."""
    return "+".join([cfg.algorithm.name] + [e.name for e in cfg.wrappers])
