"""``aggregation.*``, ``compression.*`` and ``privacy.*``: how client updates are combined,
compressed and privatised (see ``rayfl.transforms``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from rayfl.privacy.rules import check_section
from rayfl.schema import ConfigError, field
from rayfl.transforms import validate


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
    """User-level differential privacy: clip every update, add Gaussian noise to the sum, divide
    by clients_per_round; the noise is DP-FedAvg's (independent each round), DP-FTRL's (tree
    aggregation) or banded MF's (correlated across rounds; see `rayfl.privacy`)."""

    mechanism: Literal["dp_fedavg", "dp_ftrl", "banded_mf"] = field(
        "dp_fedavg", doc="dp_fedavg: independent noise, ε by amplification from uniform "
                         "sampling (availability always, uniform selection); dp_ftrl: "
                         "tree-aggregation noise (Kairouz et al. 2021); banded_mf: banded "
                         "matrix-factorisation noise (Choquette-Choo et al. 2023); the last "
                         "two take ε from the participation bound (min_separation, "
                         "max_participations) the server enforces, under any availability")
    noise_multiplier: float = field(1.0, doc="z: the noise on the sum of clipped updates has "
                                             "standard deviation z·clip_norm (dp_ftrl: per tree "
                                             "node; banded_mf: per row of C·G; at most 1e6: "
                                             "the float32 noise overflows beyond)", lo=0.0,
                                   hi=1e6)
    clip_norm: float = field(1.0, doc="S: every client's update Δ_i is scaled to ‖Δ_i‖ ≤ S "
                                      "(at most 1e18: the float32 sums of clipped updates and "
                                      "noise overflow beyond)", lo=0.0, lo_open=True, hi=1e18)
    delta: float = field(1e-5, doc="δ of the (ε, δ) guarantee; keep it below 1/clients",
                         lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    sampling: Literal["fixed", "poisson"] = field(
        "fixed", doc="fixed: clients_per_round of the clients without replacement (RDP "
                     "accountant, replace-one neighbours: one client's update swapped for "
                     "another's moves the sum by 2·clip_norm); poisson: each client with "
                     "probability clients_per_round / clients (dp_fedavg only: dp_ftrl and "
                     "banded_mf take clients_per_round of the eligible online clients); poisson is "
                     "accounted for add-or-remove-one neighbours, dp_ftrl and banded_mf for "
                     "zero-out neighbours (a client's updates replaced by zeros)")
    accountant: Literal["rdp", "pld"] = field(
        "rdp", doc="dp-accounting's RDP or PLD accountant (dp_fedavg: pld with poisson "
                   "sampling only)")
    target_epsilon: Optional[float] = field(
        None, doc="stop after the last round whose ε stays within this (null: run every round)",
        lo=0.0, lo_open=True)
    adaptive_clip: Optional[AdaptiveClipConfig] = field(
        None, doc="let clip_norm (its start) track a target quantile of the update norms "
                  "(keys target_quantile, learning_rate, count_noise); dp_clip_norm per round")

    min_separation: Optional[int] = field(
        None, doc="dp_ftrl/banded_mf: b, the fewest rounds between two participations of a "
                  "client: the server never samples a client within b rounds of its last "
                  "(null: 1 for dp_ftrl, bands for banded_mf)", lo=1)
    max_participations: Optional[int] = field(
        None, doc="dp_ftrl/banded_mf: k, the most rounds a client takes part in; the server "
                  "samples it no more after that (null: as many as min_separation allows)",
        lo=1)
    bands: Optional[int] = field(
        None, doc="banded_mf: b̂, the bands of the lower-triangular Toeplitz C (1: "
                  "independent noise); at most min_separation (null: min_separation)", lo=1)
    band_coefficients: Optional[Literal["sqrt", "optimized"]] = field(
        None, doc="banded_mf: sqrt, the square-root factorisation of the prefix sums "
                  "truncated to the bands and normalised to ‖c‖ = 1; optimized, the bands "
                  "minimising the expected total squared error of the rounds' prefix sums "
                  "(L-BFGS; null: optimized)")
    restart: Optional[int] = field(
        None, doc="dp_ftrl: start a new tree every this many rounds (null: one tree for the "
                  "run)", lo=1)
    honaker: bool = field(False, doc="dp_ftrl: Honaker's variance-reduced estimator of the "
                                     "prefix sums (same ε, less noise)")
    public_reports: list[str] = field(
        factory=list, doc="payload keys a layer's or algorithm's client half sends beside the "
                          "noised update that you declare public on purpose (a wrapper's "
                          "'loss', say): they leave the clients unnoised, so ε is labelled as "
                          "excluding them (summary.json, the progress line); any other such "
                          "report is refused, since the account does not cover it")
    audit_canaries: int = field(
        0, doc="the empirical privacy audit: this many canary clients, each a fixed random "
               "direction of norm clip_norm that takes part like a client and enters the sum "
               "before the noise; the run writes privacy_audit.json with the ε the final "
               "model shows (`rayfl privacy audit RUN_DIR`; 0: none)", lo=0)

    def check(self, prefix: str) -> None:
        if self.audit_canaries == 1:
            raise ConfigError(f"{prefix}.audit_canaries", 1, "0 (no audit) or at least 2 (a "
                                                             "Gaussian is fitted to their "
                                                             "cosines)")
        check_section(self, prefix)
