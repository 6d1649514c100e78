"""The run config: YAML → typed, validated sections, with dotted ``key=value`` overrides.

Everything is checked here, before Ray starts: unknown keys, wrong types, out-of-range values
and missing files raise :class:`ConfigError` naming the key, the value and what was expected.
Every key with its default and meaning is listed by ``rayfl keys`` and in ``configs/README.md``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

import yaml

from rayfl import registry, schema, yamlio
from rayfl.availability.config import AvailabilityConfig
from rayfl.selection.config import SelectionConfig
from rayfl.data.config import DataConfig
from rayfl.schema import ConfigError, field


MAX_ACTORS = 4096  # client actors: each is a process
MAX_SHARDS = 2**20  # logical groups per round
MAX_ROUNDS = 10**6  # rounds (server updates): more is a typo, not an experiment
NAME_PATTERN = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,99}")
ADDRESS_PATTERN = re.compile(r"auto|local|ray://[^\s/:]+(:\d{1,5})?|[^\s/:]+:\d{1,5}")


def memory_bytes() -> int:
    """Physical memory of this machine (the limit sizes are checked against)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def check_memory(cfg: "Config") -> None:
    """Refuse sizes whose arrays could not fit in memory, before anything allocates them.

    Counted: per-client bookkeeping (offsets, sizes, state versions, sampling pools: ~64 bytes a
    client) and, for the generated datasets, their float32 rows."""
    d, limit = cfg.data, memory_bytes()
    per_client = 64 * d.num_clients
    if per_client > limit:
        raise ConfigError("data.num_clients", d.num_clients,
                          f"a client count whose bookkeeping (~64 bytes each) fits in this "
                          f"machine's {limit / 2**30:.0f} GiB")
    if d.dataset.startswith("synthetic"):
        rows = d.num_clients * d.samples_per_client + d.test_samples
        need = 4 * rows * (d.features + 1) + 8 * d.classes * d.features + per_client
        if need > limit:
            default = DataConfig()
            sizes = ("num_clients", "samples_per_client", "test_samples", "features", "classes")
            key = max(sizes, key=lambda k: getattr(d, k) / getattr(default, k))  # the outlier
            raise ConfigError(f"data.{key}", getattr(d, key),
                              f"a synthetic dataset that fits in memory: (num_clients × "
                              f"samples_per_client + test_samples) × features floats need "
                              f"{need / 2**30:.3g} GiB of this machine's {limit / 2**30:.0f} GiB")


@dataclass(frozen=True)
class ModelConfig(registry.Named):
    """Which network clients train (see ``rayfl.models``)."""

    KIND = "model"

    name: str = field("fmnist_cnn", doc="model: a built-in (listed under `model.name` below) "
                                        "or package.module:Name, a builder (input_shape, "
                                        "num_classes, **params) -> torch.nn.Module")
    hidden: Optional[list[int]] = field(None, doc="hidden widths for mlp (default 100,100)")
    groups: int = field(2, doc="GroupNorm groups in resnet18_gn (IMA: 2); must divide 64", lo=1)
    embedding_dim: int = field(32, doc="ncf: user/item embedding width", lo=1, hi=2**16)
    channels_last: bool = field(True, doc="convolution weights and activations in channels-last "
                                "(NHWC) layout: faster convolutions on CPU and GPU, the same "
                                "math (float rounding differs from false)")
    params: Any = field(None, doc="validated Params of the chosen model", flatten=True)

    def check(self, prefix: str) -> None:
        if self.hidden is not None and (not self.hidden or min(self.hidden) < 1 or
                                        max(self.hidden) > 2**16):
            raise ConfigError(f"{prefix}.hidden", self.hidden, "a non-empty list of widths in "
                              "[1, 65536]")
        if 64 % self.groups:
            raise ConfigError(f"{prefix}.groups", self.groups, "a divisor of 64 (ResNet-18's "
                              "narrowest layer)")


@dataclass(frozen=True)
class AlgorithmConfig(registry.Named):
    """The algorithm and its hyper-parameters (every other key is the algorithm's own)."""

    KIND = "algorithm"

    name: str = field("fedavg", doc="algorithm: a built-in (see `rayfl algorithms`) or "
                                    "package.module:Name, an Algorithm subclass")
    params: Any = field(None, doc="validated hyper-parameters of the chosen algorithm",
                        flatten=True)


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

    epochs: int = field(1, doc="local epochs E (ignored when steps is set)", lo=1, hi=10_000)
    steps: Optional[int] = field(None, doc="fixed local steps K instead of epochs", lo=1,
                                 hi=10_000_000)
    batch_size: int = field(50, doc="minibatch size B", lo=1)
    lr: float = field(0.01, doc="initial local learning rate η_0", lo=0.0, lo_open=True)
    lr_decay: float = field(1.0, doc="per-round lr factor: η_l(t) = η_0·decay^t", lo=0.0, hi=1.0,
                            lo_open=True)
    momentum: float = field(0.0, doc="SGD heavy-ball momentum ρ (buffer reset every round; "
                                     "0 with adam)", lo=0.0, hi=1.0, hi_open=True)
    weight_decay: float = field(0.0, doc="L2 weight decay: wd·y added to the clipped loss "
                                         "gradient, as torch's SGD/Adam weight_decay", lo=0.0)
    clip_norm: Optional[float] = field(None, doc="clip the minibatch loss gradient to this norm "
                                                 "(torch clip_grad_norm_, eps 1e-6) before weight "
                                                 "decay and the algorithm's correction",
                                       lo=0.0, lo_open=True)
    optimizer: Literal["sgd", "adam"] = field(
        "sgd", doc="local optimiser, as torch.optim.SGD / torch.optim.Adam (betas 0.9, 0.999, "
                   "eps 1e-8, state reset every round) on loss gradient + weight decay + the "
                   "algorithm's correction; adam is refused by scaffold, fednova, adabest, fedmim")

    def check(self, prefix: str) -> None:
        if self.optimizer == "adam" and self.momentum:
            raise ConfigError(f"{prefix}.momentum", self.momentum,
                              "0 with optimizer adam (Adam's β1 = 0.9 is its momentum)")


@dataclass(frozen=True)
class AggregationConfig:
    """How client updates are weighted, and when the server applies them."""

    weighting: Literal["auto", "samples", "uniform", "degree"] = field(
        "auto", doc="p_i ∝ n_i (samples), 1 (uniform), or similarity degree (fedmsi only); "
                    "auto: uniform with privacy (DP-FedAvg), else the algorithm's paper "
                    "(uniform for adabest and fedmim, degree for fedmsi, else samples)")
    transforms: list[dict] = field(
        factory=list, doc="aggregation transforms applied in order to each client update and "
                          "the round's sum, e.g. [{name: clip, max_norm: 1.0}] (see "
                          "`rayfl keys`: identity, clip, qsgd, topk, randk, secagg, median, "
                          "trimmed_mean, krum, attack)")
    mode: Literal["sync", "fedbuff", "fedasync"] = field(
        "sync", doc="sync: synchronous rounds; fedbuff: event-driven on the virtual clock, the "
                    "server steps every buffer_size arrivals (Nguyen et al. 2022); fedasync: it "
                    "mixes in every arrival, x ← (1 − α_t) x + α_t y (Xie et al. 2019); in both "
                    "async modes `rounds` counts server updates")
    concurrency: Optional[int] = field(
        None, doc="fedbuff/fedasync: clients training at once (a freed slot is refilled at "
                  "once from the online clients not in flight); null: clients_per_round", lo=1)
    buffer_size: Optional[int] = field(
        None, doc="fedbuff: arrivals per server update K (null: clients_per_round); fedasync: "
                  "1 (null or 1)", lo=1)
    staleness: Literal["constant", "polynomial", "hinge"] = field(
        "polynomial", doc="fedbuff/fedasync: staleness weight s(τ), τ = server updates since the "
                          "client's model was sent: constant 1; polynomial (1 + τ)^−a; hinge 1 "
                          "for τ ≤ b, else 1/(a (τ − b) + 1)")
    staleness_a: float = field(0.5, doc="a of the polynomial and hinge staleness weights",
                               lo=0.0)
    staleness_b: int = field(4, doc="b of the hinge staleness weight (updates this stale or "
                                    "fresher weigh 1)", lo=0)
    max_staleness: Optional[int] = field(
        None, doc="fedbuff/fedasync: discard arrivals staler than this many server updates "
                  "(counted as `discarded`); null: keep all", lo=0)
    mixing: float = field(0.6, doc="fedasync: α, the mixing weight α_t = α·s(τ) of an arrival "
                                   "(the server step x ← x − η_g α_t (x − y) is the mixing at "
                                   "η_g = 1)", lo=0.0, hi=1.0, lo_open=True)

    def check(self, prefix: str) -> None:
        from rayfl.transforms import validate

        validate(self.transforms, f"{prefix}.transforms")
        if self.mode == "fedasync" and self.buffer_size not in (None, 1):
            raise ConfigError(f"{prefix}.buffer_size", self.buffer_size,
                              "null or 1 with mode fedasync (it applies every arrival)")


@dataclass(frozen=True)
class AdaptiveClipConfig:
    """Adaptive clipping (Andrew et al., NeurIPS 2021): S tracks a quantile of update norms."""

    target_quantile: float = field(0.5, doc="γ: the share of clients whose update norm should "
                                            "stay within S", lo=0.0, hi=1.0)
    learning_rate: float = field(0.2, doc="η_C: S ← S·exp(−η_C (b̃ − γ)) each round, b̃ the "
                                          "noised share of unclipped clients", lo=0.0,
                                 lo_open=True)
    count_noise: Optional[float] = field(
        None, doc="σ_b: std of the noise on the unclipped count (null: clients_per_round / 20); "
                  "the update's multiplier becomes (z⁻² − (2σ_b)⁻²)^(−1/2) so ε stays that of "
                  "z; needs 2σ_b > z", lo=0.0, lo_open=True)


@dataclass(frozen=True)
class CompressionConfig:
    """Client-to-server compression (one step after aggregation.transforms, before privacy)."""

    method: Literal["qsgd", "topk", "randk"] = field(
        "qsgd", doc="qsgd: stochastic quantisation to 2^(bits-1) - 1 levels (unbiased); topk: "
                    "the largest fraction of coordinates; randk: a random fraction (seeded)")
    bits: int = field(8, doc="qsgd: bits per coordinate, sign included (2: ternary)", lo=2,
                      hi=16)
    fraction: float = field(0.01, doc="topk/randk: share of coordinates sent", lo=0.0, hi=1.0,
                            lo_open=True)
    error_feedback: bool = field(False, doc="keep what compression dropped as persistent "
                                            "client state (state store) and add it to the "
                                            "client's next update")


@dataclass(frozen=True)
class PrivacyConfig:
    """User-level differential privacy: DP-FedAvg (clip, Gaussian noise, fixed denominator)."""

    noise_multiplier: float = field(1.0, doc="z: the noise on the sum of clipped updates has "
                                             "standard deviation z·clip_norm", lo=0.0)
    clip_norm: float = field(1.0, doc="S: every client's update Δ_i is scaled to ‖Δ_i‖ ≤ S",
                             lo=0.0, lo_open=True)
    delta: float = field(1e-5, doc="δ of the (ε, δ) guarantee; keep it below 1/clients",
                         lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    sampling: Literal["fixed", "poisson"] = field(
        "fixed", doc="fixed: clients_per_round of the clients without replacement (RDP "
                     "accountant, replace-one neighbours); poisson: each client with "
                     "probability clients_per_round / clients")
    accountant: Literal["rdp", "pld"] = field(
        "rdp", doc="dp-accounting's RDP or PLD accountant (pld: poisson sampling only)")
    target_epsilon: Optional[float] = field(
        None, doc="stop after the last round whose ε stays within this (null: run every round)",
        lo=0.0, lo_open=True)
    adaptive_clip: Optional[AdaptiveClipConfig] = field(
        None, doc="let clip_norm (its start) track a target quantile of the update norms "
                  "(keys target_quantile, learning_rate, count_noise); dp_clip_norm per round")

    def check(self, prefix: str) -> None:
        if self.accountant == "pld" and self.sampling != "poisson":
            raise ConfigError(f"{prefix}.accountant", self.accountant,
                              "rdp with sampling: fixed (dp-accounting's PLD accountant models "
                              "Poisson sampling only)")


@dataclass(frozen=True)
class ServerOptConfig:
    """A server optimizer for the algorithm's server step (algorithms that accept one)."""

    name: Literal["sgd", "momentum", "adam", "yogi", "adagrad"] = field(
        "sgd", doc="x ← x − step: sgd, momentum, adam, yogi or adagrad (Reddi et al. 2021)")
    lr: Optional[float] = field(None, doc="server lr (null: algorithm.server_lr)", lo=0.0,
                                lo_open=True)
    momentum: float = field(0.9, doc="β of momentum", lo=0.0, hi=1.0, hi_open=True)
    nesterov: bool = field(False, doc="Nesterov form of momentum")
    beta1: float = field(0.9, doc="first-moment decay β1 (adam, yogi, adagrad)", lo=0.0,
                         hi=1.0, hi_open=True)
    beta2: float = field(0.99, doc="second-moment decay β2 (adam, yogi)", lo=0.0, hi=1.0,
                         hi_open=True)
    tau: float = field(1e-3, doc="adaptivity τ added to √v", lo=0.0, lo_open=True)
    v_init: Optional[float] = field(None, doc="initial second moment (null: τ²)", lo=0.0)


@dataclass(frozen=True)
class RuntimeConfig:
    """Ray resources and execution."""

    executor: Literal["ray", "inprocess"] = field(
        "ray", doc="where clients train: ray (client actors) or inprocess (this process, no Ray: "
                   "debugging, notebooks); same model bytes either way")
    address: Optional[str] = field(None, doc="null: start a local Ray; 'auto', 'ray://...' or "
                                             "host:port joins a cluster")
    num_actors: int = field(2, doc="client actors (each hosts many virtual clients)", lo=1,
                            hi=MAX_ACTORS)
    cpus_per_actor: float = field(1.0, doc="CPUs reserved per client actor (torch threads = "
                                           "max(1, floor))", lo=0.0, lo_open=True)
    gpus_per_actor: float = field(0.0, doc="fractional GPU per actor (0.25 → four per GPU)",
                                  lo=0.0)
    logical_shards: int = field(16, doc="fixed groups a round's clients are summed in; sums are "
                                       "combined in group order so results do not depend on "
                                       "num_actors", lo=1, hi=MAX_SHARDS)
    state_memory_mb: float = field(256.0, doc="memory budget for cached client state (all "
                                              "actors together); the rest stays on disk", lo=0.0)
    ray_num_cpus: Optional[int] = field(None, doc="CPUs for a local Ray (default: the machine's)",
                                        lo=1)
    ray_num_gpus: Optional[int] = field(None, doc="GPUs a local Ray declares (default: those "
                                                    "detected; a logical count works without "
                                                    "one)", lo=0)
    dashboard: bool = field(False, doc="start the Ray dashboard with a local Ray")
    actor_timeout_s: Optional[float] = field(
        1800.0, doc="real seconds a client actor may take for its share of a round (and the "
                    "server to answer) before it counts as hung: a hung client actor is "
                    "restarted and its groups re-run; null: wait forever", lo=0.0, lo_open=True)
    max_actor_restarts: int = field(
        3, doc="restarts of each client actor that died or hung (its groups are re-run, the "
               "result is unchanged); then the run stops, resumable", lo=0)
    storage: Optional[str] = field(None, doc="where client state and checkpoints live: null = "
                                             "the run directory; a path or a pyarrow.fs URI "
                                             "(s3://bucket/prefix?region=..., gs://...) holds "
                                             "<storage>/<run name>/ (needed on a cluster whose "
                                             "nodes share no file system)")
    connect_timeout_s: float = field(15.0, doc="seconds to wait for the Ray head at "
                                               "runtime.address before giving up", lo=0.0,
                                     lo_open=True, hi=3600.0)

    def check(self, prefix: str) -> None:
        if self.address is not None and not ADDRESS_PATTERN.fullmatch(self.address):
            raise ConfigError(f"{prefix}.address", self.address,
                              "null, 'auto', 'ray://HOST[:PORT]' or HOST:PORT")
        if self.address is not None and ":" in self.address.removeprefix("ray://"):
            port = int(self.address.rsplit(":", 1)[1])
            if not 0 < port < 65536:
                raise ConfigError(f"{prefix}.address", self.address, "a port in [1, 65535]")
        if self.storage is not None:
            from rayfl.runtime.storage import check_location

            check_location(f"{prefix}.storage", self.storage)


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation of the deployed model on the test set."""

    every: int = field(1, doc="evaluate every this many rounds (and always the last)", lo=1)
    last_rounds: int = field(0, doc="also evaluate each of the last this many rounds: a "
                                    "paper's mean over its last rounds at eval.every > 1",
                             lo=0)
    batch_size: int = field(1000, doc="evaluation batch size", lo=1)
    test_rows: Optional[int] = field(None, doc="score a seeded uniform sample of this many "
                                               "test rows, the same rows at every evaluation "
                                               "(`rayfl analyze ... --max-samples` with the "
                                               "run's seed draws the same); null: every row",
                                     lo=1)
    last_k: int = field(10, doc="summary reports the mean of the last k evaluations", lo=1)
    target_accuracy: Optional[float] = field(None, doc="report the first round reaching it",
                                             lo=0.0, hi=1.0)
    clients: int = field(0, doc="per-client evaluation: every evaluation also scores the "
                                "deployed model on the held-out rows (data.client_holdout) of "
                                "this many training clients, a sample keyed by (seed, round); "
                                "metrics.parquet gets client_accuracy_mean/_p10/_p50/_p90/"
                                "_worst10, client_eval.parquet every client's; a personalised "
                                "algorithm (ditto) has each client's own model scored too, "
                                "as personal_accuracy_*; 0: off", lo=0)
    finetune_steps: int = field(0, doc="per-client evaluation: also score each client's model "
                                       "after this many local SGD steps (batch local.batch_size) "
                                       "on its own training rows (personal_accuracy_*); "
                                       "nothing persists; 0 with a personalised algorithm",
                                lo=0)
    finetune_lr: Optional[float] = field(None, doc="learning rate of those steps (default: "
                                                   "local.lr)", lo=0.0, lo_open=True)


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints for resume."""

    every: int = field(1, doc="checkpoint every this many rounds (and the last)", lo=1)
    keep: list[int] = field(factory=list, doc="rounds (1-based) whose checkpoints are kept as "
                                              "checkpoints/round-NNNNN.pt, with the client state "
                                              "they refer to, so `rayfl fork RUN_DIR --at N` can "
                                              "branch a new run from them")


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

    name: str = field("run", doc="run name (run directory prefix, actor names, metric tags): "
                                 "letters, digits and . _ + - (at most 100, no leading dot)")
    seed: int = field(0, doc="master seed: every random draw is keyed by it", lo=0,
                      hi=2**64 - 1)
    rounds: int = field(10, doc="communication rounds R (server updates in the asynchronous "
                        "modes)", lo=1, hi=MAX_ROUNDS)
    clients_per_round: int = field(10, doc="clients sampled per round", lo=1)
    loss_ceiling: Optional[float] = field(
        1e6, doc="the run stops as diverged (flagged in summary.json and metrics.parquet, exit "
                 "status 3) when a training, test or validation loss exceeds this; NaN/inf "
                 "always stop it; null: no ceiling", lo=0.0, lo_open=True)
    output_dir: str = field("runs", doc="parent directory of run directories")
    data: DataConfig = field(factory=DataConfig)
    model: ModelConfig = field(factory=ModelConfig)
    algorithm: AlgorithmConfig = field(factory=AlgorithmConfig)
    ima: Optional[IMAConfig] = field(None, doc="enable IMA (seed 004) with these settings")
    local: LocalConfig = field(factory=LocalConfig)
    aggregation: AggregationConfig = field(factory=AggregationConfig)
    privacy: Optional[PrivacyConfig] = field(
        None, doc="user-level differential privacy (DP-FedAvg); ε per round in metrics.parquet")
    compression: Optional[CompressionConfig] = field(
        None, doc="compress client updates (qsgd, topk, randk, optional error feedback); "
                  "upload_bytes per round, and the virtual clock's upload time")
    server_opt: Optional[ServerOptConfig] = field(
        None, doc="replace the algorithm's server step x ← x − η_g D by this optimizer on D "
                  "(fedavg, fedprox, scaffold, feddyn, fedmsi; fedavgm/fedadam/... are presets)")
    availability: AvailabilityConfig = field(factory=AvailabilityConfig)
    selection: SelectionConfig = field(factory=SelectionConfig)
    runtime: RuntimeConfig = field(factory=RuntimeConfig)
    eval: EvalConfig = field(factory=EvalConfig)
    checkpoint: CheckpointConfig = field(factory=CheckpointConfig)
    keep: KeepConfig = field(factory=KeepConfig)
    loggers: LoggersConfig = field(factory=LoggersConfig)

    def check(self, prefix: str) -> None:
        if not NAME_PATTERN.fullmatch(self.name):
            raise ConfigError("name", self.name, "1 to 100 letters, digits, '.', '_', '+' or "
                              "'-', not starting with '.' (it names a directory inside "
                              "output_dir)")
        if self.ima is not None:
            start = self.ima.start  # as rayfl.algorithms.ima reads it
            t_s = math.floor(start * self.rounds + 1e-9) if start < 1 else math.floor(
                start + 1e-9)
            if t_s >= self.rounds:
                raise ConfigError("ima.start", self.ima.start,
                                  f"a fraction < 1 or a round index < rounds = {self.rounds} "
                                  f"(it starts IMA at round {t_s}, after the last round)")
        check_memory(self)
        trainable = self.data.num_clients - self.data.validation_clients
        if self.clients_per_round > trainable:
            raise ConfigError("clients_per_round", self.clients_per_round,
                              f"at most data.num_clients - data.validation_clients = {trainable}")
        for key, rounds in (("keep.rounds", self.keep.rounds),
                            ("checkpoint.keep", self.checkpoint.keep)):
            bad = [r for r in rounds if not 1 <= r <= self.rounds]
            if bad:
                raise ConfigError(key, bad[0], f"a round in [1, {self.rounds}] (rounds count "
                                               f"from 1)")
        if self.eval.clients > trainable:
            raise ConfigError("eval.clients", self.eval.clients,
                              f"at most data.num_clients - data.validation_clients = {trainable}")
        if self.eval.clients and not self.data.client_holdout:
            raise ConfigError("eval.clients", self.eval.clients,
                              "0 unless data.client_holdout > 0 (the clients' held-out rows it "
                              "scores on)")
        if self.runtime.num_actors > self.runtime.logical_shards:
            raise ConfigError("runtime.num_actors", self.runtime.num_actors,
                              f"at most runtime.logical_shards = {self.runtime.logical_shards}")


def from_dict(raw: dict) -> Config:
    """Validate a plain dict (as loaded from YAML) into a :class:`Config`."""
    if not isinstance(raw, dict):
        raise ConfigError("<root>", raw, "a mapping of config keys")
    for section in ("algorithm", "selection"):  # `algorithm: scaffold` is `{name: scaffold}`
        if isinstance(raw.get(section), str):
            raw = {**raw, section: {"name": raw[section]}}
    cfg = schema.build(Config, raw)
    cls = cfg.algorithm.component()
    check_weighting(cls, cfg)
    cls.check_config(cfg.algorithm.params, cfg)
    check_server_opt(cls, cfg)
    check_privacy(cls, cfg)
    check_personal(cls, cfg)
    cfg.selection.component().check_config(cfg.selection.params, cfg)
    from rayfl.transforms import check_run

    check_run(cfg)
    check_asynchronous(cls, cfg)
    return cfg


def check_personal(cls, cfg: Config) -> None:
    """Fine-tuning the global model and a personalised algorithm's own model would both be a
    client's ``personal_*`` score: one of them."""
    from rayfl.algorithms.base import has

    if cfg.eval.finetune_steps and has(cls, "personal_model"):
        raise ConfigError("eval.finetune_steps", cfg.eval.finetune_steps,
                          f"0 with {cfg.algorithm.name} (its own model of each client is the "
                          "personal_* score of eval.clients)")


def check_asynchronous(cls, cfg: Config) -> None:
    """FedBuff/FedAsync only where their math holds (:mod:`rayfl.runtime.async_config`)."""
    if cfg.aggregation.mode != "sync":
        from rayfl.runtime.async_config import check_config

        check_config(cls, cfg)


def check_server_opt(cls, cfg: Config) -> None:
    """A ``server_opt`` section only for algorithms whose server step takes one."""
    if cfg.server_opt is None:
        return
    from rayfl.algorithms import registry

    def takes(c) -> bool:
        return c.accepts_server_opt and not c.is_preset()

    if not takes(cls):
        names = ", ".join(n for n in registry.names() if takes(registry.get(n)))
        raise ConfigError("server_opt", schema.to_dict(cfg.server_opt),
                          f"no server_opt with {cls.name} (algorithms that take one: {names}; "
                          "fedavgm/fedadam/fedyogi/fedadagrad are fedavg presets)")


def check_privacy(cls, cfg: Config) -> None:
    """DP-FedAvg's assumptions: uniform sampling, unit weights, a server update that only
    post-processes the noised mean."""
    if cfg.privacy is None:
        return
    from rayfl.algorithms import registry
    from rayfl.algorithms.checks import effective_weighting

    if not cls.dp_post_processing:
        ok = ", ".join(n for n in registry.names() if registry.get(n).dp_post_processing)
        raise ConfigError("privacy", cls.name, f"an algorithm whose server only post-processes "
                          f"the noised mean update ({ok}); {cls.name} sends or reads per-client "
                          "quantities the mechanism does not privatise")
    weighting = cfg.aggregation.weighting
    if effective_weighting(cls, cfg) != "uniform":
        raise ConfigError("aggregation.weighting", weighting,
                          "uniform or auto with privacy (DP-FedAvg's fixed-denominator estimator gives "
                          "every client weight 1)")
    if cfg.availability.model != "always":
        raise ConfigError("availability.model", cfg.availability.model,
                          "always with privacy (the accountant assumes uniform client sampling)")
    if cfg.availability.overcommit != 1.0:
        raise ConfigError("availability.overcommit", cfg.availability.overcommit,
                          "1 with privacy (the accountant models clients_per_round draws)")
    if cfg.selection.name != "uniform":
        raise ConfigError("selection.name", cfg.selection.name,
                          "uniform with privacy (the accountant assumes uniform client "
                          "sampling; loss-based selection also reads client data unprotected)")
    ad = cfg.privacy.adaptive_clip
    if ad is not None:
        sigma = ad.count_noise if ad.count_noise is not None else cfg.clients_per_round / 20
        if 2 * sigma <= cfg.privacy.noise_multiplier:
            raise ConfigError("privacy.adaptive_clip.count_noise", ad.count_noise,
                              f"σ_b > z/2 = {cfg.privacy.noise_multiplier / 2:g} (the count's "
                              f"noise takes a share of z; null means clients_per_round/20 = "
                              f"{cfg.clients_per_round / 20:g})")
    target = cfg.privacy.target_epsilon
    if target is not None:
        from rayfl import privacy

        first = privacy.epsilon(1, **privacy.accounting(cfg))
        if first > target:
            raise ConfigError("privacy.target_epsilon", target,
                              f"at least one round's ε = {first:.4g} (raise it, or the noise)")


def check_weighting(cls, cfg: Config) -> None:
    """``aggregation.weighting`` must mean something for the algorithm (degree: fedmsi only)."""
    weighting = cfg.aggregation.weighting
    allowed = ("auto", "samples", "uniform") + tuple(cls.extra_weightings)
    if weighting not in allowed:
        raise ConfigError("aggregation.weighting", weighting,
                          f"one of {', '.join(allowed)} with {cls.name} ({weighting} weighting "
                          "is defined only for " + _definers(weighting) + ")")


def _definers(weighting: str) -> str:
    from rayfl.algorithms import registry

    return ", ".join(n for n in registry.names()
                     if weighting in registry.get(n).extra_weightings)


def to_dict(cfg: Config) -> dict:
    """Plain dict that :func:`from_dict` turns back into the same config (each component's
    parameters sit beside its name)."""
    return schema.to_dict(cfg)


def _parse_value(key: str, text: str) -> Any:
    if text == "":
        return ""
    try:
        return yamlio.parse(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise ConfigError(key, text, f"a YAML value ({yamlio.one_line(e)})") from None


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
        node[parts[-1]] = _parse_value(key, text)
    return raw


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def read_yaml(path: str) -> dict:
    """Load a YAML config file, with a clear error when it is missing, malformed or empty."""
    if not os.path.isfile(path):
        raise ConfigError("config", path, "an existing YAML file")
    try:
        with open(path, "rb") as f:
            raw = yamlio.parse(f.read())
    except yamlio.DuplicateKeyError as e:
        raise ConfigError(str(e.key), f"{path}:{e.line}", "each key once per mapping (this "
                          "one is given twice)") from None
    except yaml.YAMLError as e:
        raise ConfigError("config", path, f"valid YAML ({yamlio.one_line(e)})") from None
    except RecursionError:
        raise ConfigError("config", path, "YAML nested at most a few hundred levels") from None
    except OSError as e:
        raise ConfigError("config", path, f"a readable file ({e.strerror})") from None
    if raw is None:
        raise ConfigError("config", path, "a YAML mapping of config keys (the file holds none)")
    if not isinstance(raw, dict):
        raise ConfigError("config", path, f"a YAML mapping of config keys, not a "
                          f"{type(raw).__name__}")
    return raw


def load(source: Any, overrides: list[str] | None = None) -> Config:
    """A :class:`Config` from a path, a dict or a config (overrides applied on top)."""
    if isinstance(source, Config):
        if not overrides:
            return source
        source = to_dict(source)
    raw = read_yaml(source) if isinstance(source, (str, os.PathLike)) else source
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError("<root>", raw, "a mapping of config keys")
    return from_dict(apply_overrides(expand_shorthands(raw or {}), overrides or []))


def expand_shorthands(raw: dict) -> dict:
    """``algorithm: scaffold`` is short for ``algorithm: {name: scaffold}``."""
    if isinstance(raw.get("algorithm"), str):
        return {**raw, "algorithm": {"name": raw["algorithm"]}}
    return raw


def dump(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML (atomically)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
    os.replace(tmp, path)
