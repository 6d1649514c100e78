"""``local.*``, ``runtime.*``, ``checkpoint.*`` and ``keep.*``: local training, Ray resources,
checkpoints and kept models (see ``rayfl.runtime``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

from rayfl import registry
from rayfl.runtime.executor_declaration import declaration_problem
from rayfl.runtime.storage import check_location
from rayfl.schema import ConfigError, field

MAX_ACTORS = 4096  # client actors: each is a process
MAX_SHARDS = 2**20  # logical groups per round
ADDRESS_PATTERN = re.compile(r"auto|local|ray://[^\s/:]+(:\d{1,5})?|[^\s/:]+:\d{1,5}")


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
class RuntimeConfig:
    """Ray resources and execution."""

    executor: str = field(
        "ray", doc="where clients train: ray (client actors), threads (runtime.num_actors threads "
                   "of this process, no Ray) or inprocess (this process, one client after "
                   "another: debugging, notebooks); same model bytes on each")
    address: Optional[str] = field(None, doc="null: start a local Ray; 'auto', 'ray://...' or "
                                             "host:port joins a cluster")
    num_actors: int = field(2, doc="client actors (each hosts many virtual clients)", lo=1,
                            hi=MAX_ACTORS)
    cpus_per_actor: float = field(1.0, doc="CPUs reserved per client actor (torch threads = "
                                           "max(1, floor))", lo=0.0, lo_open=True)
    gpus_per_actor: float = field(0.0, doc="fractional GPU per actor (0.25 → four per GPU)",
                                  lo=0.0)
    deterministic_gpu: bool = field(
        False, doc="client actors on a GPU use only deterministic kernels "
                   "(torch.use_deterministic_algorithms, cuBLAS's fixed workspace): the same "
                   "bytes run to run and for any num_actors, at a cost docs/performance.md "
                   "measures; CPU kernels are deterministic already (no effect there)")
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
        1800.0, doc="real seconds a busy client actor may go without answering a call (a call "
                    "trains one group), and the server likewise, before it counts as hung: a "
                    "hung client actor is restarted and its groups re-run; null: wait forever "
                    "(executor ray only)",
        lo=0.0, lo_open=True)
    max_actor_restarts: int = field(
        3, doc="restarts of each client actor that died or hung (its groups are re-run, the "
               "result is unchanged); then the run stops, resumable (executor ray only)", lo=0)
    storage: Optional[str] = field(None, doc="where client state and checkpoints live: null = "
                                             "the run directory; a path or a pyarrow.fs URI "
                                             "(s3://bucket/prefix?region=..., gs://...) holds "
                                             "<storage>/<run name>/ (needed on a cluster whose "
                                             "nodes share no file system)")
    connect_timeout_s: float = field(15.0, doc="seconds to wait for the Ray head at "
                                               "runtime.address before giving up", lo=0.0,
                                     lo_open=True, hi=3600.0)

    def check(self, prefix: str) -> None:
        if not registry.is_builtin("executor", self.executor):  # a user's: it must import
            problem = declaration_problem(registry.resolve("executor", self.executor))
            if problem:
                raise ConfigError(f"{prefix}.executor", self.executor, problem)
        if self.address is not None and not ADDRESS_PATTERN.fullmatch(self.address):
            raise ConfigError(f"{prefix}.address", self.address,
                              "null, 'auto', 'ray://HOST[:PORT]' or HOST:PORT")
        if self.address is not None and ":" in self.address.removeprefix("ray://"):
            port = int(self.address.rsplit(":", 1)[1])
            if not 0 < port < 65536:
                raise ConfigError(f"{prefix}.address", self.address, "a port in [1, 65535]")
        if self.num_actors > self.logical_shards:
            raise ConfigError(f"{prefix}.num_actors", self.num_actors,
                              f"at most runtime.logical_shards = {self.logical_shards}")
        if self.storage is not None:
            check_location(f"{prefix}.storage", self.storage)


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
