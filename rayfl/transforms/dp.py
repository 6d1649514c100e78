"""DP-FedAvg's Gaussian mechanism as an aggregation transform (see :mod:`rayfl.privacy`), and
DP-FTRL's and banded MF's correlated noise as its subclass :class:`CorrelatedDP`.

Client side: Δ_i ← Δ_i · min(1, S / ‖Δ_i‖) (every client's contribution has norm ≤ S). Server
side: Δ̄ = (Σ_i Δ_i + N(0, z²S² I)) / K with K the expected number of participants, whatever the
number that completed (the fixed-denominator estimator; weights are 1). The noise comes from a
generator keyed by (seed, round), so a resumed run adds the same noise. Per-client quantities
the runtime would otherwise report from the round's sums (Σ‖Δ_i‖², the unnoised count) are
withheld from the algorithm: ``delta_sq_sum`` is NaN and ``weight_sum`` is K.

Adaptive clipping (Andrew et al., NeurIPS 2021, geometric update): S is server state S_t sent to
the clients with the model; each client also reports b_i − ½ with b_i = 1[‖Δ_i‖ ≤ S_t]
(sensitivity ½); the server forms b̃ = (Σ (b_i − ½) + N(0, σ_b²)) / K + ½ (K the expected count,
as for the update) and sets S_{t+1} = S_t · exp(−η_C (b̃ − γ)), so S tracks the γ quantile of the
update norms. The update's noise multiplier becomes z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), so the pair
of Gaussian releases costs exactly what one Gaussian mechanism with multiplier z costs (the
paper's Theorem 1): the accountant's ε for z stays correct.

With ``privacy.audit_canaries`` the server half also adds the audit's canary clients' updates
to the clipped sum before the noise (:mod:`rayfl.privacy.audit`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from rayfl import rng, schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.contract import ComponentError
from rayfl.layers import ClientContext, Facts, LayerTraits, summed_uploads
from rayfl.privacy import Account, bands_of
from rayfl.privacy.audit import Canaries
from rayfl.privacy.banded import BandedNoise, coefficients
from rayfl.privacy.tree import TreeNoise
from rayfl.transforms.base import Transform


@dataclass(frozen=True)
class GaussianDPParams:
    """The Gaussian mechanism's settings (from the ``privacy`` section)."""

    noise_multiplier: float = schema.field(1.0, doc="z: noise std is z·S", lo=0.0)
    clip_norm: float = schema.field(1.0, doc="S: per-client update norm bound (the initial S "
                                             "with adaptive clipping)", lo=0.0, lo_open=True)
    expected_clients: int = schema.field(1, doc="K: the fixed denominator", lo=1)
    target_quantile: float | None = schema.field(
        None, doc="γ: adaptive clipping's target quantile (None: S stays fixed)", lo=0.0, hi=1.0)
    clip_lr: float = schema.field(0.2, doc="η_C: geometric step of the clip norm", lo=0.0)
    count_noise: float | None = schema.field(
        None, doc="σ_b: noise std on the clipped count (None: K/20, the paper's choice)",
        lo=0.0, lo_open=True)


def update_noise_multiplier(z: float, count_noise: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the update's multiplier when the count takes its share."""
    rest = z ** -2 - (2 * count_noise) ** -2
    return math.inf if rest <= 0 else rest ** -0.5


@dataclass(frozen=True)
class ClipNorm:
    """Adaptive clipping's server slot: S_t, the clip norm the next round's clients use."""

    value: float


class GaussianDP(Transform):
    """Clip each client update to S; add N(0, (zS)²) to the sum; divide by K."""

    name = "dp_gaussian"
    Params = GaussianDPParams
    traits = LayerTraits(privatises=True, upload_sums=True)
    #: the reports the user declared public (``privacy.public_reports``)
    public_reports: tuple[str, ...] = ()
    #: the mechanism's name in the privacy section, for its refusals
    mechanism = "dp_fedavg"
    #: the privacy audit's canary clients (``privacy.audit_canaries``; None: no audit)
    canaries: "Canaries | None" = None
    #: what the server accounts for this mechanism (None: built without a privacy section)
    account: Account | None = None

    @classmethod
    def of(cls, privacy, facts: Facts) -> "GaussianDP":
        """The mechanism of a run's ``privacy`` section (:class:`CorrelatedDP` for dp_ftrl and
        banded_mf)."""
        if privacy.mechanism != "dp_fedavg":
            return CorrelatedDP.of(privacy, facts)
        ad = privacy.adaptive_clip
        return cls(GaussianDPParams(
            privacy.noise_multiplier, privacy.clip_norm, facts.clients_per_round,
            None if ad is None else ad.target_quantile, 0.2 if ad is None else ad.learning_rate,
            None if ad is None else ad.count_noise), facts).declaring(privacy)

    def declaring(self, privacy) -> "GaussianDP":
        """This mechanism with its privacy section's name, its public reports, the audit's
        canary clients (none when ``audit_canaries`` is 0) and its account."""
        self.mechanism, self.public_reports = privacy.mechanism, tuple(privacy.public_reports)
        self.canaries = Canaries.of(privacy, self.facts)
        f = self.facts
        self.account = Account.of(privacy, f.rounds, f.num_clients, f.clients_per_round)
        return self

    def check_reports(self, sent: list[tuple[str, str]], t: int | None) -> None:
        """Refuse the first (sender, key) of ``sent`` not declared public: it left a client
        unnoised, outside the account."""
        for sender, key in sent:
            if key not in self.public_reports:
                raise ComponentError(
                    sender, f"sent {key!r} to the server beside the noised update under "
                    f"privacy.mechanism {self.mechanism}: it leaves every client unclipped and "
                    "unnoised, outside the privacy account. Stop sending it under privacy, or "
                    f"declare it public on purpose with privacy.public_reports: [{key}] (ε is "
                    "then labelled as excluding it)", t)

    @property
    def adaptive(self) -> bool:
        return self.p.target_quantile is not None

    @property
    def count_noise(self) -> float:
        """σ_b (K/20 unless set)."""
        return self.p.count_noise if self.p.count_noise is not None else \
            self.p.expected_clients / 20

    @property
    def update_multiplier(self) -> float:
        """The multiplier of the update's noise: z, or z_Δ with adaptive clipping."""
        z = self.p.noise_multiplier
        return update_noise_multiplier(z, self.count_noise) if self.adaptive and z > 0 else z

    def init(self, x0: Vec) -> ClipNorm | None:
        return ClipNorm(self.p.clip_norm) if self.adaptive else None

    def clip(self, slot: ClipNorm | None) -> float:
        """S of the round a slot belongs to."""
        return self.p.clip_norm if slot is None else slot.value

    def broadcast(self, slot: ClipNorm | None, t: int) -> dict[str, Vec]:
        return {} if slot is None else \
            {"clip_norm": torch.tensor([slot.value], dtype=torch.float64)}

    def client_apply(self, delta: Vec, t: int, client: int, ctx: ClientContext) -> Vec:
        s = float(ctx.broadcast["clip_norm"][0]) if "clip_norm" in ctx.broadcast else \
            self.p.clip_norm
        norm = float(torch.linalg.vector_norm(delta.double()))
        if self.adaptive:
            ctx.payload["unclipped"] = 0.5 if norm <= s else -0.5  # b_i − ½
        return delta if norm <= s else delta * (s / norm)

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        return self.client_apply(delta, t, client, ClientContext(t, client))

    def noise(self, t: int, dim: int, clip: float) -> np.ndarray:
        """Round t's noise vector (float64), std z·S per coordinate (z_Δ·S_t when adaptive)."""
        draw = rng.stream(self.seed, t, rng.DP_NOISE)
        return draw.standard_normal(dim) * (self.update_multiplier * clip)

    def count_estimate(self, centred: float, t: int) -> float:
        """b̃ = (Σ (b_i − ½) + N(0, σ_b²)) / K + ½."""
        draw = rng.stream(self.seed, t, rng.DP_COUNT)
        return (centred + draw.standard_normal() * self.count_noise) / self.p.expected_clients \
            + 0.5

    def round_noise(self, slot, t: int, dim: int, clip: float):
        """(round t's noise on the sum, the slot after it): independent draws here."""
        return self.noise(t, dim, clip), slot

    def aggregate(self, slot: ClipNorm | None, agg: Aggregate, sums: dict, srv
                  ) -> tuple[Aggregate, ClipNorm | None, dict]:
        t, k, used = srv.t, float(self.p.expected_clients), self.clip(slot)
        dim = agg.delta_sum.numel()
        noise, slot = self.round_noise(slot, t, dim, used)
        total = agg.delta_sum
        if self.canaries is not None:  # the audit's canaries: clipped updates like the rest
            total = total + torch.from_numpy(self.canaries.round_sum(t, dim, used)).to(
                total.dtype)
        noisy = total + torch.from_numpy(noise).to(agg.delta_sum.dtype)
        agg = self.noised_uploads(agg, t, used)
        if self.adaptive:
            b = self.count_estimate(float(sums.get("unclipped", 0.0)), t)
            slot = ClipNorm(used * math.exp(-self.p.clip_lr * (b - self.p.target_quantile)))
        return (dataclasses.replace(agg, delta_sum=noisy, delta_mean=noisy / k, weight_sum=k,
                                    delta_sq_sum=float("nan")),
                slot, {"dp_clip_norm": used})

    def noised_uploads(self, agg: Aggregate, t: int, clip: float) -> Aggregate:
        """The aggregate with every summed Upload entry noised as the update is (std z·S per
        number: each client clipped them with its update to one norm S), from a stream of
        their own, in the order of their keys."""
        keys = sorted(summed_uploads(agg.extras, agg.uploaded))
        if not keys:
            return agg
        sizes = [agg.extras[k].numel() for k in keys]
        draw = rng.stream(self.seed, t, rng.DP_UPLOAD_NOISE)
        noise = torch.from_numpy(draw.standard_normal(sum(sizes))
                                 * (self.update_multiplier * clip))
        extras = dict(agg.extras)
        for k, part in zip(keys, noise.split(sizes)):
            extras[k] = extras[k] + part.reshape(extras[k].shape).to(extras[k].dtype)
        return dataclasses.replace(agg, extras=extras)

    def from_legacy(self, old: dict) -> ClipNorm | None:
        """The slot of a rayfl 0.1 checkpoint's ``{clip_norm, used}``."""
        return ClipNorm(float(old["clip_norm"])) if self.adaptive and "clip_norm" in old \
            else self.init(None)


class CorrelatedDP(GaussianDP):
    """DP-FedAvg's clipping and fixed denominator, with noise correlated across rounds: round t's
    sum receives z·S times DP-FTRL's n_t − n_{t−1} (:class:`rayfl.privacy.tree.TreeNoise`) or
    banded MF's w_t = (C⁻¹Z)_t (:class:`rayfl.privacy.banded.BandedNoise`). The generator's
    state (the tree's O(log t) node values, or the last b − 1 noise vectors) is this layer's
    server slot: checkpointed, resumed and forked to the same bytes."""

    name = "dp_correlated"
    traits = dataclasses.replace(GaussianDP.traits, uploads=(
        "its noise is correlated across rounds through a state shaped like the model, and "
        "Upload entries would need such a state of their own"))

    def __init__(self, params: GaussianDPParams, facts: Facts,
                 source: "TreeNoise | BandedNoise"):
        super().__init__(params, facts)
        self.source = source

    @classmethod
    def of(cls, privacy, facts: Facts) -> "CorrelatedDP":
        if privacy.mechanism == "dp_ftrl":
            source = TreeNoise(facts.seed, privacy.restart, privacy.honaker)
        else:
            source = BandedNoise(facts.seed, coefficients(
                bands_of(privacy), privacy.band_coefficients or "optimized", facts.rounds))
        return cls(GaussianDPParams(privacy.noise_multiplier, privacy.clip_norm,
                                    facts.clients_per_round), facts, source).declaring(privacy)

    def init(self, x0: Vec) -> dict:
        return self.source.fresh_state()

    def clip(self, slot: dict) -> float:
        return self.p.clip_norm  # fixed: its releases share noise calibrated to one S

    def broadcast(self, slot: dict, t: int) -> dict[str, Vec]:
        return {}

    def round_noise(self, slot: dict, t: int, dim: int, clip: float):
        """Round t's share of the correlated noise, std z·S per released entry, from the
        generator's state in ``slot``; the state after it."""
        self.source.load_state(slot)
        noise = self.source.round_noise(t, dim) * (self.p.noise_multiplier * clip)
        return noise, self.source.state()
