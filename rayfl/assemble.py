"""The run's parts built from its config, each from its own sections, once on the driver: the
layer stack (the algorithm with its server optimiser and the layers around it,
:class:`~rayfl.layers.Stack`, :mod:`rayfl.layer_list`), the client workers' parts, what the
round planner is made of and the server's own settings; the server and the actors get them by
value."""

from __future__ import annotations

from rayfl import layer_list
from rayfl.algorithms import registry, wrapper
from rayfl.algorithms.checks import effective_weighting
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.availability import Sampling
from rayfl.contract import ComponentError, calling, describe, expect, name_of
from rayfl.layer_list import built
from rayfl.layers import Facts, Stack
from rayfl.config import to_dict
from rayfl.metrics.log import RunRecord
from rayfl.metrics.loggers import flat_params
from rayfl.privacy.statement import statement
from rayfl.runtime import checkpoint, run_state, storage
from rayfl.runtime.async_config import Settings as AsyncSettings
from rayfl.runtime.client_actor import WorkerParts
from rayfl.runtime.local import spec_from_config
from rayfl.runtime.server import ServerSettings
from rayfl.schema import ConfigError


def stack(cfg, num_clients: int) -> Stack:
    """The run's :class:`~rayfl.layers.Stack`: the configured algorithm with its server
    optimiser and the configured layers around it."""
    cls = registry.get(cfg.algorithm.name)
    # heavy-ball momentum is what SCAFFOLD's and FedNova's step normaliser must know; Adam has none
    momentum = cfg.local.momentum if cfg.local.optimizer == "sgd" else 0.0
    with calling(name_of(cls, "__init__")):  # the user's own failure while being built
        weighting = effective_weighting(cls, cfg.aggregation.weighting, cfg.privacy)
        algo = cls(cfg.algorithm.params, weighting=weighting, num_clients=num_clients,
                   local_momentum=momentum)
    if cfg.server_opt is None:
        opt = algo.default_server_opt()
    else:
        o = cfg.server_opt
        lr = cfg.algorithm.params.server_lr if o.lr is None else o.lr
        opt = server_opt_of(o, lr)
    facts = Facts(cfg.seed, cfg.rounds, cfg.clients_per_round, num_clients, opt.adaptive)
    return Stack.of(algo, opt, built(cfg, facts))


def worker_parts(cfg, num_clients: int, run_stack: Stack | None = None) -> WorkerParts:
    """What every client worker of the run is built from (``run_stack``: the run's, built
    already; None: a stack of their own)."""
    rt = cfg.runtime
    return WorkerParts(run_stack or stack(cfg, num_clients), cfg.model,
                       spec_from_config(cfg.local), cfg.seed, rt.cpus_per_actor,
                       rt.gpus_per_actor, checkpoint.state_stamp(checkpoint.identity(cfg)),
                       rt.deterministic_gpu)


def sampling(cfg) -> Sampling:
    """What the run's round planner is made of: the ``availability`` and ``selection``
    sections, clients a round, the seed, each client's steps (``local``) and whether
    ``privacy.sampling`` is Poisson's."""
    return Sampling(cfg.availability, cfg.selection, cfg.clients_per_round, cfg.seed,
                    spec_from_config(cfg.local),
                    cfg.privacy is not None and cfg.privacy.sampling == "poisson")


def server_settings(cfg, num_clients: int, x: tuple, run_dir: str) -> ServerSettings:
    """The server's own settings for the run in ``run_dir`` over ``num_clients`` training
    clients, whose model is a vector of ``x`` = (length, dtype)."""
    ag = cfg.aggregation
    return ServerSettings(
        cfg.rounds, cfg.seed, cfg.loss_ceiling, cfg.model, cfg.local, cfg.eval, cfg.checkpoint,
        cfg.keep, cfg.runtime, cfg.availability.max_empty_rounds,
        None if ag.mode == "sync" else AsyncSettings.of(ag, cfg.clients_per_round),
        run_state.expected(ag, cfg.privacy, num_clients, x),
        storage.run_location(cfg, run_dir), checkpoint.identity(cfg), run_record(cfg))


def run_record(cfg) -> RunRecord:
    """What the run's log states of its config (its summary, MLflow's params)."""
    privacy = None if cfg.privacy is None else {
        "delta": cfg.privacy.delta, "privacy": statement(cfg.privacy, bool(cfg.eval.clients))}
    return RunRecord(cfg.name, cfg.data.dataset,
                     wrapper.label(cfg.algorithm, layer_list.wrappers(cfg)), cfg.rounds,
                     cfg.eval.target_accuracy, cfg.eval.last_k, privacy, cfg.loggers,
                     flat_params(to_dict(cfg)))


def server_opt_of(section, lr: float):
    """The ``server_opt`` section's optimiser at learning rate ``lr``, its contract checked: a
    :class:`~rayfl.algorithms.server_opt.ServerOpt` (one ComponentError line otherwise; a
    ConfigError on ``server_opt.name`` when what it names cannot be called so)."""
    component = section.component()
    where = name_of(component)
    expected = "a callable optimizer(section, lr) returning a ServerOpt"
    if not callable(component):
        raise ConfigError("server_opt.name", section.name, f"{expected} (it names "
                                                           f"{describe(component)})")
    try:
        with calling(where):
            opt = component(section, lr)
    except ComponentError as e:
        if e.frames:  # raised in the user's own code: named by its frames
            raise
        raise ConfigError("server_opt.name", section.name,
                          f"{expected} (calling {where}(section, lr) {e.problem})") from None
    expect(isinstance(opt, ServerOpt), where,
           f"returned {describe(opt)}, not a ServerOpt(init, update) "
           "(rayfl.algorithms.server_opt)")
    return opt
