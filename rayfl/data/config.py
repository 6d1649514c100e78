"""``data.*``: dataset, client population, partition and drift regime."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, Optional

from rayfl import registry
from rayfl.schema import ConfigError, field


def is_natural(dataset) -> bool:
    """Whether a dataset component gives every training row a writer/user (``natural = True``),
    so that ``partition: natural`` can split by it."""
    return bool(getattr(dataset, "natural", False))


def memory_bytes() -> int:
    """Physical memory of this machine (the limit sizes are checked against)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


def check_memory(d: "DataConfig") -> None:
    """Refuse sizes whose arrays could not fit in memory, before anything allocates them.

    Counted: per-client bookkeeping (offsets, sizes, state versions, sampling pools: ~64 bytes a
    client) and, for the generated datasets, their float32 rows."""
    limit = memory_bytes()
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
class DataConfig(registry.Named):
    """Where the data comes from and how it is split among clients."""

    KIND = "dataset"
    NAME_FIELD = "dataset"

    dataset: str = field(
        "fmnist", doc="dataset: a built-in (listed under `data.dataset` below) or "
                      "package.module:Name, an object with load(data_cfg, seed) -> Arrays")
    root: Optional[str] = field(None, doc="directory with the dataset's files (default: the "
                                          "dataset's standard location; nothing is downloaded "
                                          "unless data.fetch)")
    fetch: bool = field(False, doc="download the dataset first when its folder (data.root, "
                                   "else ~/.cache/rayfl-data/DATASET) is missing or empty, "
                                   "checked as `rayfl data fetch` does, before the partition is "
                                   "built: cifar10, cifar100, emnist, femnist, fmnist (unless "
                                   "its Debian package is installed), sent140, stackoverflow, "
                                   "shakespeare, tff_shakespeare; other datasets are refused")
    num_clients: int = field(100, doc="registered clients N, validation clients included; for "
                                      "partition=natural the first N writers/users", lo=1)
    partition: Literal["iid", "dirichlet", "label_dirichlet", "shards", "natural"] = field(
        "dirichlet", doc="iid; dirichlet: each class split among clients by Dir(α), sizes "
                         "unequal (NIID-bench labeldir); label_dirichlet: each client's label "
                         "mix q ~ Dir(α·C·p) (Hsu et al., FedDyn) at the sizes data.sizes sets "
                         "(FedEve, FedMIM, AdaBest); shards: data.shards_per_client label-sorted "
                         "shards each (IMA #C); natural: one client per writer/user")
    alpha: float = field(0.1, doc="Dirichlet concentration α (also the client_only regime's)",
                         lo=0.0, lo_open=True)
    min_samples: int = field(10, doc="dirichlet: redraw until every client has this many", lo=1)
    sizes: Literal["equal", "lognormal"] = field(
        "equal", doc="client sizes for iid, label_dirichlet and synthetic_fedprox: equal (±1), "
                     "or log-normal around the mean with σ = data.sigma (AdaBest unbalanced)")
    sigma: float = field(0.3, doc="σ of log-normal client sizes (sizes=lognormal)", lo=0.0)
    shards_per_client: int = field(2, doc="shards: #C label-sorted shards per client", lo=1)
    validation_clients: int = field(0, doc="the last K clients hold validation data only: never "
                                           "sampled for training, read via reader.validation()",
                                    lo=0)
    regime: Optional[Literal["iid", "period_only", "client_only", "both"]] = field(
        None, doc="FedEve drift experiment: iid and client_only store an iid partition, "
                  "period_only and both the configured non-iid one; period_only (client_only) "
                  "re-splits the sampled clients' pooled rows iid (Dirichlet α) every round; "
                  "client_only needs one label per row (not next-token data)")
    client_holdout: float = field(0.0, doc="fraction h of every training client's rows held "
                                           "out of training for per-client evaluation "
                                           "(eval.clients): ⌊h·n_i⌋, keyed by the seed; 0 keeps "
                                           "the partition as is", lo=0.0, hi=1.0, hi_open=True)
    cache_dir: Optional[str] = field(None, doc="partition cache (default $RAYFL_CACHE or "
                                               "~/.cache/rayfl, resolved on each node)")
    emnist_split: Literal["letters", "digits", "balanced", "byclass", "bymerge", "mnist"] = field(
        "letters", doc="emnist: which EMNIST split's IDX files to read")
    # synthetic datasets (for tests and scale runs)
    features: int = field(20, doc="synthetic*: input dimension (FedProx uses 60)", lo=1)
    classes: int = field(10, doc="synthetic*: number of classes", lo=2)
    samples_per_client: int = field(50, doc="synthetic*: mean samples per client", lo=1)
    test_samples: int = field(1000, doc="synthetic*: test set size", lo=1)
    synthetic_alpha: float = field(1.0, doc="synthetic_fedprox: α, spread of client models",
                                   lo=0.0)
    synthetic_beta: float = field(1.0, doc="synthetic_fedprox: β, spread of client inputs",
                                  lo=0.0)
    params: Any = field(None, doc="validated Params of the chosen dataset", flatten=True)

    def check(self, prefix: str) -> None:
        """Rules of the section itself; a dataset's own rules are its ``check_section``."""
        if not callable(getattr(self.component(), "load", None)):
            raise ConfigError(f"{prefix}.dataset", self.dataset,
                              "a dataset: an object with load(data_cfg, seed) -> Arrays (this "
                              "one has no load method)")
        if self.partition == "natural" and not is_natural(self.component()):
            natural = [n for n in registry.names("dataset")
                       if is_natural(registry.resolve("dataset", n))]
            raise ConfigError(f"{prefix}.partition", self.partition,
                              f"a dataset with writers/users ({', '.join(natural)}), not "
                              f"data.dataset = {self.dataset!r}; or another partition")
        if self.sizes != "equal" and self.partition not in ("iid", "label_dirichlet") and \
                not getattr(self.component(), "generates_sizes", False):
            raise ConfigError(f"{prefix}.sizes", self.sizes,
                              "'equal' unless data.partition is iid or label_dirichlet, or "
                              f"data.dataset is synthetic_fedprox (the {self.partition} "
                              "partition decides its own sizes)")
        check_memory(self)
        if self.validation_clients >= self.num_clients:
            raise ConfigError(f"{prefix}.validation_clients", self.validation_clients,
                              f"fewer than data.num_clients = {self.num_clients}")
        if self.regime in ("period_only", "both") and self.partition == "iid":
            raise ConfigError(f"{prefix}.regime", self.regime,
                              "a non-iid data.partition (dirichlet, label_dirichlet, shards or "
                              "natural) to drift from")

    @property
    def stored_partition(self) -> str:
        """The partition written to disk: the regime forces iid for iid and client_only."""
        return "iid" if self.regime in ("iid", "client_only") else self.partition
