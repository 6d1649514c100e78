"""The run config: YAML → typed, validated sections, with dotted ``key=value`` overrides.

Everything is checked here, before Ray starts: unknown keys, wrong types, out-of-range values
and missing files raise :class:`ConfigError` naming the key, the value and what was expected.
Every key with its default and meaning is listed by ``rayfl keys`` and in ``configs/README.md``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Literal, Optional

import yaml

from rayfl import schema
from rayfl.availability.config import AvailabilityConfig
from rayfl.data.config import DataConfig
from rayfl.schema import ConfigError, field


@dataclass(frozen=True)
class ModelConfig:
    """Which network clients train (see ``rayfl.models``)."""

    name: str = field("fmnist_cnn", doc="model zoo name: logreg, mlp, fmnist_cnn, cifar_cnn "
                                        "(IMA), adabest_cnn, lenet5, resnet18_gn, ncf (MovieLens)")
    hidden: Optional[list[int]] = field(None, doc="hidden widths for mlp (default 100,100)")
    groups: int = field(2, doc="GroupNorm groups in resnet18_gn (IMA: 2); must divide 64", lo=1)
    embedding_dim: int = field(32, doc="ncf: user/item embedding width", lo=1)

    def check(self, prefix: str) -> None:
        from rayfl.models import MODELS

        if self.name not in MODELS:
            raise ConfigError(f"{prefix}.name", self.name, "one of " + ", ".join(sorted(MODELS)))
        if self.hidden is not None and (not self.hidden or min(self.hidden) < 1):
            raise ConfigError(f"{prefix}.hidden", self.hidden, "a non-empty list of widths >= 1")
        if 64 % self.groups:
            raise ConfigError(f"{prefix}.groups", self.groups, "a divisor of 64 (ResNet-18's "
                              "narrowest layer)")


@dataclass(frozen=True)
class AlgorithmConfig:
    """The algorithm and its hyper-parameters (every other key is the algorithm's own)."""

    name: str = field("fedavg", doc="algorithm name (see `rayfl algorithms`)")
    params: Any = field(None, doc="validated hyper-parameters of the chosen algorithm")


@dataclass(frozen=True)
class IMAConfig:
    """Iterative moving averaging (seed 004) around the chosen server algorithm."""

    window: int = field(5, doc="P: number of recent global models averaged", lo=1)
    start: float = field(0.75, doc="t_s as a fraction of rounds (<1) or a round index (>=1)",
                         lo=0.0)
    decay_after: float = field(0.97, doc="per-round local lr decay from t_s on", lo=0.0, hi=1.0,
                               lo_open=True)
    reset_server_moments: bool = field(True, doc="zero FedAdam/Yogi moments at t_s")


@dataclass(frozen=True)
class LocalConfig:
    """Local training on each client."""

    epochs: int = field(1, doc="local epochs E (ignored when steps is set)", lo=1)
    steps: Optional[int] = field(None, doc="fixed local steps K instead of epochs", lo=1)
    batch_size: int = field(50, doc="minibatch size B", lo=1)
    lr: float = field(0.01, doc="initial local learning rate η_0", lo=0.0, lo_open=True)
    lr_decay: float = field(1.0, doc="per-round lr factor: η_l(t) = η_0·decay^t", lo=0.0, hi=1.0,
                            lo_open=True)
    momentum: float = field(0.0, doc="SGD momentum (reset every round)", lo=0.0, hi=1.0,
                            hi_open=True)
    weight_decay: float = field(0.0, doc="L2 weight decay", lo=0.0)
    clip_norm: Optional[float] = field(None, doc="clip each step's direction to this norm",
                                       lo=0.0, lo_open=True)
    optimizer: Literal["sgd", "adam"] = field("sgd", doc="local optimiser")


@dataclass(frozen=True)
class AggregationConfig:
    """How client updates are weighted."""

    weighting: Literal["auto", "samples", "uniform", "degree"] = field(
        "auto", doc="p_i ∝ n_i (samples), 1 (uniform), or similarity degree (fedmsi); auto: "
                    "the algorithm's paper (uniform for adabest and fedmim, else samples)")


@dataclass(frozen=True)
class RuntimeConfig:
    """Ray resources and execution."""

    address: Optional[str] = field(None, doc="null: start a local Ray; 'auto', 'ray://...' or "
                                             "host:port joins a cluster")
    num_actors: int = field(2, doc="client actors (each hosts many virtual clients)", lo=1)
    cpus_per_actor: float = field(1.0, doc="CPUs reserved per client actor (torch threads = "
                                           "max(1, floor))", lo=0.0, lo_open=True)
    gpus_per_actor: float = field(0.0, doc="fractional GPU per actor (0.25 → four per GPU)",
                                  lo=0.0)
    logical_shards: int = field(16, doc="fixed groups a round's clients are summed in; sums are "
                                       "combined in group order so results do not depend on "
                                       "num_actors", lo=1)
    state_memory_mb: float = field(256.0, doc="memory budget for cached client state (all "
                                              "actors together); the rest stays on disk", lo=0.0)
    ray_num_cpus: Optional[int] = field(None, doc="CPUs for a local Ray (default: the machine's)",
                                        lo=1)
    ray_num_gpus: Optional[int] = field(None, doc="GPUs a local Ray declares (default: those "
                                                    "detected; a logical count works without "
                                                    "one)", lo=0)
    dashboard: bool = field(False, doc="start the Ray dashboard with a local Ray")


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation of the deployed model on the test set."""

    every: int = field(1, doc="evaluate every this many rounds (and always the last)", lo=1)
    batch_size: int = field(1000, doc="evaluation batch size", lo=1)
    last_k: int = field(10, doc="summary reports the mean of the last k evaluations", lo=1)
    target_accuracy: Optional[float] = field(None, doc="report the first round reaching it",
                                             lo=0.0, hi=1.0)


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints for resume."""

    every: int = field(1, doc="checkpoint every this many rounds (and the last)", lo=1)


@dataclass(frozen=True)
class KeepConfig:
    """Models kept on disk for later analysis (``rayfl analyze``); nothing is held in memory."""

    rounds: list[int] = field(factory=list, doc="rounds (1-based, as in metrics.parquet) whose "
                                                "start model, sampled clients' final local "
                                                "models and new global model are saved under "
                                                "models/round-NNNNN/")
    last: int = field(0, doc="also keep the last this many rounds", lo=0)


@dataclass(frozen=True)
class LoggersConfig:
    """Experiment trackers that receive every metrics row (``pip install 'rayfl[tracking]'``)."""

    tensorboard: bool = field(False, doc="write TensorBoard event files to <run_dir>/tensorboard "
                                         "(tensorboard --logdir RUN_DIR); needs tensorboardX")
    mlflow: bool = field(False, doc="log the config as params and every row as metrics to an "
                                    "MLflow run; needs mlflow (or mlflow-skinny)")
    mlflow_uri: Optional[str] = field(None, doc="MLflow tracking URI (default: the local store "
                                                "mlruns next to the run directory, i.e. "
                                                "<output_dir>/mlruns)")
    mlflow_experiment: Optional[str] = field(None, doc="MLflow experiment (default: the run "
                                                       "name)")

    def check(self, prefix: str) -> None:
        import importlib.util

        for key, module in (("tensorboard", "tensorboardX"), ("mlflow", "mlflow")):
            if getattr(self, key) and importlib.util.find_spec(module) is None:
                raise ConfigError(f"{prefix}.{key}", True, f"the {module} package installed "
                                                          f"(pip install 'rayfl[tracking]')")


@dataclass(frozen=True)
class Config:
    """One experiment."""

    name: str = field("run", doc="run name (run directory prefix, actor names, metric tags)")
    seed: int = field(0, doc="master seed: every random draw is keyed by it", lo=0)
    rounds: int = field(10, doc="communication rounds R", lo=1)
    clients_per_round: int = field(10, doc="clients sampled per round", lo=1)
    output_dir: str = field("runs", doc="parent directory of run directories")
    data: DataConfig = field(factory=DataConfig)
    model: ModelConfig = field(factory=ModelConfig)
    algorithm: AlgorithmConfig = field(factory=AlgorithmConfig)
    ima: Optional[IMAConfig] = field(None, doc="enable IMA (seed 004) with these settings")
    local: LocalConfig = field(factory=LocalConfig)
    aggregation: AggregationConfig = field(factory=AggregationConfig)
    availability: AvailabilityConfig = field(factory=AvailabilityConfig)
    runtime: RuntimeConfig = field(factory=RuntimeConfig)
    eval: EvalConfig = field(factory=EvalConfig)
    checkpoint: CheckpointConfig = field(factory=CheckpointConfig)
    keep: KeepConfig = field(factory=KeepConfig)
    loggers: LoggersConfig = field(factory=LoggersConfig)

    def check(self, prefix: str) -> None:
        trainable = self.data.num_clients - self.data.validation_clients
        if self.clients_per_round > trainable:
            raise ConfigError("clients_per_round", self.clients_per_round,
                              f"at most data.num_clients - data.validation_clients = {trainable}")
        bad = [r for r in self.keep.rounds if not 1 <= r <= self.rounds]
        if bad:
            raise ConfigError("keep.rounds", bad[0], f"a round in [1, {self.rounds}] (rounds "
                                                     f"count from 1)")
        if self.runtime.num_actors > self.runtime.logical_shards:
            raise ConfigError("runtime.num_actors", self.runtime.num_actors,
                              f"at most runtime.logical_shards = {self.runtime.logical_shards}")


def _build_algorithm(raw: Any) -> AlgorithmConfig:
    from rayfl.algorithms import registry

    raw = dict(raw or {})
    name = raw.pop("name", "fedavg")
    if name not in registry.names():
        raise ConfigError("algorithm.name", name, "one of " + ", ".join(registry.names()))
    params = schema.build(registry.get(name).Params, raw, "algorithm")
    return AlgorithmConfig(name=name, params=params)


def from_dict(raw: dict) -> Config:
    """Validate a plain dict (as loaded from YAML) into a :class:`Config`."""
    from rayfl.algorithms import registry

    if not isinstance(raw, dict):
        raise ConfigError("<root>", raw, "a mapping of config keys")
    raw = dict(raw)
    algorithm = _build_algorithm(raw.pop("algorithm", None))
    cfg = dataclasses.replace(schema.build(Config, raw), algorithm=algorithm)
    registry.get(algorithm.name).check_config(algorithm.params, cfg)
    return cfg


def to_dict(cfg: Config) -> dict:
    """Plain dict that :func:`from_dict` turns back into the same config."""
    out = schema.to_dict(cfg)
    algo = cfg.algorithm
    out["algorithm"] = {"name": algo.name, **schema.to_dict(algo.params)}
    return out


def _parse_value(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` strings (values parsed as YAML) to a plain config dict."""
    raw = _deep_copy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, None, "an override of the form key=value (e.g. rounds=3)")
        key, text = item.split("=", 1)
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(key, text, f"'{part}' to be a section, not {child!r}")
            node = child
        node[parts[-1]] = _parse_value(text)
    return raw


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def read_yaml(path: str) -> dict:
    """Load a YAML config file, with a clear error when it is missing or malformed."""
    if not os.path.isfile(path):
        raise ConfigError("config", path, "an existing YAML file")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError("config", path, f"valid YAML ({e})") from None
    return raw or {}


def load(source: Any, overrides: list[str] | None = None) -> Config:
    """A :class:`Config` from a path, a dict or a config (overrides applied on top)."""
    if isinstance(source, Config):
        if not overrides:
            return source
        source = to_dict(source)
    raw = read_yaml(source) if isinstance(source, (str, os.PathLike)) else source
    return from_dict(apply_overrides(raw or {}, overrides or []))


def dump(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML (atomically)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
    os.replace(tmp, path)
