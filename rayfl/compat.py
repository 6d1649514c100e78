"""Which combinations a run may ask for: one table of rules over the config and the layers' traits.

Every component declares what it is and what it refuses in its traits
(:class:`~rayfl.algorithms.base.Traits`, :class:`~rayfl.layers.LayerTraits`); this module is the
one place that reads them against the rest of the config. A :class:`Rule` is a condition, the
config key it refuses and the reason; :func:`check` raises the first one that holds as a
:class:`~rayfl.schema.ConfigError` naming the key (exit 2, before anything starts). Rules that
need the model (its BatchNorm buffers) run once the model is built (``check_model``).
Every rule reading two sections of the config is here; a section's rules on its own keys stay
in its ``check`` and a component's in its ``check_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rayfl import layer_list, privacy, registry
from rayfl.algorithms import registry as algorithms
from rayfl.algorithms.base import Algorithm
from rayfl.algorithms.checks import effective_weighting
from rayfl.models.flat import persistent_buffers
from rayfl.schema import ConfigError, to_dict


@dataclass(frozen=True)
class Run:
    """What the rules read: the config, the algorithm's class and traits, the configured layers
    (:class:`~rayfl.layer_list.Entry`, innermost first) and the model's facts when known."""

    cfg: Any
    cls: Any
    traits: Any
    layers: tuple
    buffers: bool = False  # the model has buffers (BatchNorm statistics)

    @property
    def wrappers(self) -> tuple:
        """(where, class) of each server wrapper."""
        return tuple((e.where, e.cls) for e in self.layers if e.kind == "wrapper")

    def named(self, where: str) -> str:
        """The name the config gives the layer at ``where`` (``layers[1]``)."""
        return next(e.name for e in self.layers if e.where == where)

    @property
    def name(self) -> str:
        return self.cfg.algorithm.name

    @property
    def weighting(self) -> str:
        """What ``aggregation.weighting`` means here (``auto`` resolved)."""
        return effective_weighting(self.cls, self.cfg.aggregation.weighting, self.cfg.privacy)

    @property
    def mode(self) -> str:
        return self.cfg.aggregation.mode

    def transport(self) -> tuple[str, str] | None:
        """(where, name) of the first transport layer configured — the server sees only the
        sum of the uploads (SecAgg); None: none is."""
        return next(((e.where, e.name) for e in self.layers if e.cls.traits.transport), None)


@dataclass(frozen=True)
class Rule:
    """When ``when(run)`` holds, ``key`` (with its value) is refused: ``expected(run)`` says
    what it must be instead, and why."""

    key: str | Callable[[Run], str]
    when: Callable[[Run], bool]
    expected: Callable[[Run], str]
    value: Callable[[Run], Any] | None = None
    needs_model: bool = False

    def check(self, run: Run) -> None:
        if self.when(run):
            key = self.key(run) if callable(self.key) else self.key
            value = self.value(run) if self.value is not None else _value(run.cfg, key)
            raise ConfigError(key, value, self.expected(run))


def _value(cfg: Any, key: str) -> Any:
    """The config's value at a dotted key (a section as a plain dict)."""
    node = cfg
    for part in key.split("."):
        node = getattr(node, part, None)
    return to_dict(node) if hasattr(node, "__dataclass_fields__") else node


def _takes_server_opt(cls) -> bool:
    return cls.traits.server_opt and cls.default_server_opt is Algorithm.default_server_opt


def _names(test: Callable[[Any], bool]) -> str:
    """The built-in algorithms whose class passes ``test``."""
    return ", ".join(n for n in algorithms.names() if test(algorithms.get(n)))


def _plain(key: str, plain: Any) -> Rule:
    return Rule(key, lambda r: r.traits.plain_sgd is not None and _value(r.cfg, key) != plain,
                lambda r: f"{plain} with {r.name} ({r.traits.plain_sgd})")


_ASYNC = "with aggregation.mode "

#: the rules, in the order they are checked
RULES: tuple[Rule, ...] = (
    # ----- the layer list: one spelling -----------------------------------------------------
    Rule("layers", lambda r: bool(r.cfg.layers and _older_spelling(r.cfg)),
         lambda r: f"one list: {' and '.join(_older_spelling(r.cfg))} given too "
                   f"({layer_list.BECAME})",
         value=lambda r: [e.get("name") for e in r.cfg.layers]),
    # ----- the run's sizes against its data and rounds --------------------------------------
    Rule("clients_per_round", lambda r: r.cfg.clients_per_round > _trainable(r.cfg),
         lambda r: f"at most data.num_clients - data.validation_clients = {_trainable(r.cfg)}"),
    *(Rule(key, lambda r, key=key: bool(_outside_rounds(r.cfg, key)),
           lambda r: f"a round in [1, {r.cfg.rounds}] (rounds count from 1)",
           value=lambda r, key=key: _outside_rounds(r.cfg, key)[0])
      for key in ("keep.rounds", "checkpoint.keep")),
    Rule("eval.clients", lambda r: r.cfg.eval.clients > _trainable(r.cfg),
         lambda r: f"at most data.num_clients - data.validation_clients = {_trainable(r.cfg)}"),
    Rule("eval.clients", lambda r: bool(r.cfg.eval.clients) and not r.cfg.data.client_holdout,
         lambda r: "0 unless data.client_holdout > 0 (the clients' held-out rows it scores on)"),
    # ----- the algorithm against the local optimiser ---------------------------------------
    Rule("aggregation.weighting",
         lambda r: r.cfg.aggregation.weighting not in ("auto", "samples", "uniform",
                                                       *r.traits.weightings),
         lambda r: f"one of {', '.join(('auto', 'samples', 'uniform', *r.traits.weightings))} "
                   f"with {r.name} ({r.cfg.aggregation.weighting} weighting is defined only "
                   f"for {_names(lambda c: r.cfg.aggregation.weighting in c.traits.weightings)})"),
    *(_plain(key, plain) for key, plain in (
        ("local.optimizer", "sgd"), ("local.momentum", 0.0), ("local.weight_decay", 0.0),
        ("local.clip_norm", None))),
    Rule("local.momentum",
         lambda r: r.traits.local_momentum is not None and bool(r.cfg.local.momentum),
         lambda r: f"0 with {r.name} ({r.traits.local_momentum})"),
    Rule("local.optimizer",
         lambda r: r.traits.adam is not None and r.cfg.local.optimizer == "adam",
         lambda r: f"sgd with {r.name} ({r.traits.adam})"),
    Rule("server_opt", lambda r: r.cfg.server_opt is not None and not _takes_server_opt(r.cls),
         lambda r: f"no server_opt with {r.name} (algorithms that take one: "
                   f"{_names(_takes_server_opt)}; fedavgm/fedadam/fedyogi/fedadagrad are "
                   "fedavg presets)"),
    Rule("eval.finetune_steps",
         lambda r: bool(r.cfg.eval.finetune_steps) and r.traits.has("personal_model"),
         lambda r: f"0 with {r.name} (its own model of each client is the personal_* score of "
                   "eval.clients)"),
    # ----- wrappers -------------------------------------------------------------------------
    Rule(lambda r: next(f"{w}.name" for w, c in r.wrappers if c.traits.averages_rounds),
         lambda r: r.traits.averaging is not None and any(c.traits.averages_rounds
                                                          for _, c in r.wrappers),
         lambda r: f"no wrapper averaging server models over rounds around {r.name} "
                   f"({r.traits.averaging})",
         value=lambda r: next(r.named(w) for w, c in r.wrappers if c.traits.averages_rounds)),
    # ----- a transport layer: the server sees only the sum ----------------------------------
    Rule("aggregation.weighting", lambda r: r.transport() is not None and r.weighting != "uniform",
         lambda r: f"uniform with {' = '.join(r.transport())} (secure aggregation reveals only "
                   "the sum of the updates)"),
    # ----- privacy (DP-FedAvg) ----------------------------------------------------------------
    Rule("algorithm.name",
         lambda r: r.cfg.privacy is not None and not r.traits.dp_post_processing,
         lambda r: f"with privacy, an algorithm whose server only post-processes the noised "
                   f"mean update ({_names(lambda c: c.traits.dp_post_processing)}, or your own "
                   "declaring Traits(dp_post_processing=True)); "
                   + (f"{r.name} sends or reads per-client quantities the mechanism does not "
                      "privatise" if registry.is_builtin("algorithm", r.name) else
                      f"{r.name} does not declare it")),
    Rule("aggregation.weighting", lambda r: r.cfg.privacy is not None and r.weighting != "uniform",
         lambda r: "uniform or auto with privacy (DP-FedAvg's fixed-denominator estimator "
                   "gives every client weight 1)"),
    Rule("availability.model",
         lambda r: _mechanism(r) == "dp_fedavg" and r.cfg.availability.model != "always",
         lambda r: "always with privacy (the accountant assumes uniform client sampling; "
                   "privacy.mechanism dp_ftrl or banded_mf runs under any availability)"),
    Rule("availability.overcommit",
         lambda r: _mechanism(r) == "dp_fedavg" and r.cfg.availability.overcommit != 1.0,
         lambda r: "1 with privacy (the accountant models clients_per_round draws)"),
    Rule("selection.name",
         lambda r: _mechanism(r) == "dp_fedavg" and r.cfg.selection.name != "uniform",
         lambda r: "uniform with privacy (the accountant assumes uniform client sampling; "
                   "loss-based selection also reads client data unprotected)"),
    # ----- privacy (DP-FTRL, banded MF): a bound on participation, not sampling ---------------
    Rule("selection.name",
         lambda r: _mechanism(r) not in (None, "dp_fedavg")
         and r.cfg.selection.component().reads_reports(),
         lambda r: f"a selector that reads no client reports with privacy.mechanism "
                   f"{_mechanism(r)} (the guarantee needs who takes part to be independent of "
                   "the clients' data; this one sees the training losses clients report "
                   "unprotected, through scores_candidates or observe)"),
    Rule("availability.correlate",
         lambda r: _mechanism(r) not in (None, "dp_fedavg")
         and r.cfg.availability.correlate != "none",
         lambda r: f"none with privacy.mechanism {_mechanism(r)} (who is online would follow "
                   "the clients' labels: the guarantee treats who takes part when as "
                   "independent of their data)"),
    Rule("aggregation.mode", lambda r: _mechanism(r) not in (None, "dp_fedavg")
         and r.mode != "sync",
         lambda r: f"sync with privacy.mechanism {_mechanism(r)} (the participation bound is "
                   "enforced where a synchronous round selects its cohort, and the noise is "
                   "indexed by rounds; the asynchronous modes dispatch one client at a time "
                   "and step on arrivals)"),
    # ----- privacy: its keys against the run -------------------------------------------------
    *(Rule(f"privacy.{key}", lambda r, key=key: _mechanism(r) is not None
           and getattr(r.cfg.privacy, key) is not None
           and getattr(r.cfg.privacy, key) > r.cfg.rounds,
           lambda r: f"at most rounds = {r.cfg.rounds}")
      for key in ("bands", "restart")),  # DP-FTRL's and banded MF's (None under dp_fedavg)
    Rule("privacy.public_reports",
         lambda r: _mechanism(r) is not None and bool(r.cfg.privacy.public_reports)
         and registry.is_builtin("algorithm", r.cfg.algorithm.component_name)
         and all(e.builtin for e in r.layers),
         lambda r: "[] when the algorithm and the layers are rayfl's own: none of them sends "
                   "a report beside the update"),
    Rule("privacy.adaptive_clip.count_noise",
         lambda r: _mechanism(r) is not None and r.cfg.privacy.adaptive_clip is not None
         and 2 * _count_noise(r.cfg) <= r.cfg.privacy.noise_multiplier,
         lambda r: f"σ_b > z/2 = {r.cfg.privacy.noise_multiplier / 2:g} (the count's noise "
                   f"takes a share of z; null means clients_per_round/20 = "
                   f"{r.cfg.clients_per_round / 20:g})"),
    Rule("privacy.target_epsilon",
         lambda r: _mechanism(r) is not None and r.cfg.privacy.target_epsilon is not None
         and _first_epsilon(r.cfg) > r.cfg.privacy.target_epsilon,
         lambda r: f"at least one round's ε = {_first_epsilon(r.cfg):.4g} (raise it, or the "
                   "noise)"),
    # ----- robust rules read single updates ---------------------------------------------------
    *(Rule(key, lambda r, when=when: any(c.traits.needs_updates for c in _layer_classes(r))
           and when(r), lambda r, why=why: f"{why(r)} with {_robust(r)}", value=value)
      for key, when, why, value in (
          ("privacy", lambda r: r.cfg.privacy is not None,
           lambda r: "no privacy section (DP-FedAvg privatises the sum, the rule reads single "
                     "updates)", lambda r: r.cfg.privacy.mechanism),
          (lambda r: r.transport()[0], lambda r: r.transport() is not None,
           lambda r: f"no {r.transport()[1]} step beside it (secure aggregation reveals only "
                     "the sum)", lambda r: r.transport()[1]),
          ("algorithm.name", lambda r: not r.traits.dp_post_processing,
           lambda r: "an algorithm whose server reads only the mean update (its other "
                     "per-client sums would not be robust)", lambda r: r.name),
          ("aggregation.mode", lambda r: r.mode == "fedasync",
           lambda r: "sync or fedbuff (fedasync steps the server on each client's update "
                     "alone: there are no updates to read at once)", lambda r: r.mode))),
    # ----- FedBuff / FedAsync -----------------------------------------------------------------
    Rule("aggregation.mode", lambda r: r.mode != "sync" and r.traits.asynchronous is not None,
         lambda r: f"sync with {r.name} ({r.traits.asynchronous}; algorithms defined "
                   f"asynchronously: {_names(lambda c: c.traits.asynchronous is None)})"),
    Rule("aggregation.mode", lambda r: r.mode != "sync" and r.traits.has("settle"),
         lambda r: f"sync with {r.name} (its client_settle reads the aggregate of the round a "
                   "client trained in; a client's update here joins a later server step)"),
    Rule(lambda r: next(f"{w}.name" for w, c in r.wrappers if c.traits.asynchronous),
         lambda r: r.mode != "sync" and any(c.traits.asynchronous for _, c in r.wrappers),
         lambda r: next(f"no {r.named(w)} wrapper ({c.traits.asynchronous}) {_ASYNC}{r.mode}"
                        for w, c in r.wrappers if c.traits.asynchronous),
         value=lambda r: next(r.named(w) for w, c in r.wrappers if c.traits.asynchronous)),
    *(Rule(key, lambda r, bad=bad: r.mode != "sync" and bad(r.cfg),
           lambda r, why=why: f"{why} {_ASYNC}{r.mode}", value=value)
      for key, bad, why, value in (
          ("privacy", lambda c: c.privacy is not None,
           "no privacy section (the accountant assumes uniformly sampled synchronous rounds)",
           lambda r: "(set)"),
          ("availability.deadline_s", lambda c: c.availability.deadline_s is not None,
           "null (a round deadline has no meaning without rounds)", None),
          ("availability.stragglers", lambda c: c.availability.stragglers > 0,
           "0 (device speeds already make clients late; stragglers cut a synchronous round)",
           None),
          ("availability.overcommit", lambda c: c.availability.overcommit != 1.0,
           "1 (slots are refilled as clients arrive; nothing to over-commit)", None),
          ("availability.interval_s", lambda c: c.availability.interval_s != 0.0,
           "0 (the server never idles between rounds)", None),
          ("selection.name", lambda c: c.selection.name != "uniform",
           "uniform (a freed slot is refilled at once; there is no round of candidates to "
           "score)", None),
          ("data.regime", lambda c: c.data.regime is not None,
           "null (the drift regimes re-split a synchronous round's data)", None),
          ("keep.rounds", lambda c: bool(c.keep.rounds),
           "empty (kept rounds are synchronous rounds)", None),
          ("keep.last", lambda c: c.keep.last > 0, "0 (kept rounds are synchronous rounds)",
           None))),
    Rule(lambda r: r.transport()[0] + ".name",
         lambda r: r.mode == "fedasync" and r.transport() is not None,
         lambda r: f"no {r.transport()[1]} with aggregation.mode fedasync (a sum of one update "
                   "reveals it, and the mixing step needs it decoded)",
         value=lambda r: r.transport()[1]),
    Rule("aggregation.staleness",
         lambda r: r.mode == "fedbuff" and r.transport() is not None
         and r.cfg.aggregation.staleness != "constant",
         lambda r: f"constant with {' = '.join(r.transport())} in aggregation.mode "
                   f"{r.mode} (the server sees only the sum and cannot weight each update by "
                   "its staleness)"),
    Rule("aggregation.concurrency",
         lambda r: r.mode != "sync" and _concurrency(r.cfg) > _trainable(r.cfg),
         lambda r: f"at most data.num_clients - data.validation_clients = {_trainable(r.cfg)}",
         value=lambda r: _concurrency(r.cfg)),
    # ----- models with buffers (BatchNorm statistics) -----------------------------------------
    *(Rule("model.name", lambda r, when=when: r.buffers and when(r),
           lambda r, why=why: "a model without buffers (BatchNorm statistics: use GroupNorm or "
                              f"no normalisation) {why(r)}", needs_model=True)
      for when, why in (
          (lambda r: r.traits.buffers is not None,
           lambda r: f"with {r.name} ({r.traits.buffers})"),
          (lambda r: r.cfg.privacy is not None,
           lambda r: "with a privacy section (the statistics are client data and would be "
                     "averaged without clipping or noise)"),
          (lambda r: any(c.traits.buffers for _, c in r.wrappers),
           lambda r: next(f"with wrapper {r.named(w)} ({c.traits.buffers})"
                          for w, c in r.wrappers if c.traits.buffers)),
          (lambda r: r.mode != "sync",
           lambda r: f"with aggregation.mode {r.mode} (statistics of models of different "
                     "ages)"))),
)


def _mechanism(run: Run) -> str | None:
    """The privacy mechanism (None: no privacy section)."""
    return None if run.cfg.privacy is None else run.cfg.privacy.mechanism


def _trainable(cfg) -> int:
    return cfg.data.num_clients - cfg.data.validation_clients


def _outside_rounds(cfg, key: str) -> list[int]:
    """The rounds listed at ``key`` outside [1, rounds]."""
    return [t for t in _value(cfg, key) if not 1 <= t <= cfg.rounds]


def _count_noise(cfg) -> float:
    """σ_b of adaptive clipping's noised count (null: clients_per_round / 20)."""
    given = cfg.privacy.adaptive_clip.count_noise
    return given if given is not None else cfg.clients_per_round / 20


def _first_epsilon(cfg) -> float:
    """ε after one round under the configured mechanism and accountant."""
    return privacy.accountant(cfg).epsilon(1)


def _concurrency(cfg) -> int:
    return cfg.aggregation.concurrency or cfg.clients_per_round


def _older_spelling(cfg) -> list[str]:
    """The keys of the layer list's older spelling the config gives entries in."""
    return [key for key, given in zip(layer_list.OLDER,
                                      (cfg.wrappers, cfg.aggregation.transforms)) if given]


def _layer_classes(run: Run) -> list:
    return [e.cls for e in run.layers]


def _robust(run: Run) -> str:
    """The first robust rule configured, as the config names it."""
    return next(e.name for e in run.layers if e.cls.traits.needs_updates)


def run_of(cfg, buffers: bool = False) -> Run:
    """The facts the rules read of a validated config."""
    cls = cfg.algorithm.component()
    return Run(cfg, cls, cls.traits, tuple(cfg.layer_entries()), buffers)


def check(cfg) -> None:
    """Every rule that needs no model (ConfigError naming the key of the first that fails)."""
    run = run_of(cfg)
    for rule in RULES:
        if not rule.needs_model:
            rule.check(run)


def check_model(cfg, module) -> None:
    """The rules that need the model: its buffers (BatchNorm statistics), its dimension against
    the privacy audit's canaries."""
    run = run_of(cfg, bool(persistent_buffers(module)))
    for rule in RULES:
        if rule.needs_model:
            rule.check(run)
    canaries = 0 if cfg.privacy is None else cfg.privacy.audit_canaries
    dim = sum(p.numel() for p in module.parameters())
    if 2 * canaries > dim:
        raise ConfigError("privacy.audit_canaries", canaries,
                          f"at most {dim // 2} for a model of {dim} parameters (the canaries' "
                          "and as many null directions' cosines need a dimension well above "
                          "their number; more parameters, or fewer canaries)")
