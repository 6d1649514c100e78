"""FedSpeed (Sun et al., ICLR 2023, "FedSpeed: Larger Local Interval, Less Communication Round,
and Higher Generalization Accuracy"): a prox-correction term and a merged perturbed gradient.

Client i in round t, from x_{i,0} = x^t, K local steps on minibatches b:
    g̃₁ = ∇f_i(x_{i,k}; b),   x̆ = x_{i,k} + ρ g̃₁/‖g̃₁‖,   g̃₂ = ∇f_i(x̆; b),
    g_{i,k} = (1 − α) g̃₁ + α g̃₂,
    x_{i,k+1} = x_{i,k} − η_l (g_{i,k} − ĝ_i^{t−1} + (1/λ)(x_{i,k} − x^t));
then the prox-correction ĝ_i^t = ĝ_i^{t−1} − (1/λ)(x_{i,K} − x^t) and x̂_i^t = x_{i,K} − λ ĝ_i^t.
The server adds the corrections' mean to the mean of the local models,
    x^{t+1} = mean_{i∈S_t} x_{i,K} + h̄,   h̄ = mean over all N clients of −λ ĝ_i,
as the authors' code does; under full participation this is the paper's mean of the x̂_i.
That is FedDyn's server with α = 1/λ (h̄ = −h/α there), and the local step is FedDyn's with
the merged gradient: ρ = 0 is FedDyn with α = 1/λ, byte for byte (the class extends it).

The perturbation is normalised as in SAM and the authors' code (ε = ρ g̃₁/‖g̃₁‖); the
correction is added after clipping and weight decay, like every algorithm's. On quadratics
with ρ = 0 and full participation the fixed point is the exact optimum, which FedAvg's is not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import ClientTask, ServerParams
from rayfl.algorithms.feddyn import FedDyn
from rayfl.algorithms.fedsam import perturbed


@dataclass(frozen=True)
class FedSpeedParams(ServerParams):
    """FedSpeed hyper-parameters (the authors' code's defaults: ρ = 0.1, 1/λ = 0.1, α = 1)."""

    rho: float = schema.field(0.1, doc="perturbation radius ρ of the extra gradient", lo=0.0)
    alpha: float = schema.field(1.0, doc="weight α of the perturbed gradient in g = (1 − α) g̃₁ "
                                "+ α g̃₂", lo=0.0, hi=1.0)
    lam: float = schema.field(10.0, doc="prox coefficient λ (the correction pulls by 1/λ)",
                              lo=0.0, lo_open=True)


class FedSpeed(FedDyn):
    """FedDyn's server and prox-correction (α = 1/λ) with a merged perturbed local gradient."""

    name = "fedspeed"
    Params = FedSpeedParams
    traits = dataclasses.replace(
        FedDyn.traits, weighting="uniform",  # the plain mean of the local models
        asynchronous="its server and prox-corrections are FedDyn's",
        search_space={"algorithm.rho": {"low": 1e-3, "high": 0.5, "log": True},
                      "algorithm.lam": {"low": 0.1, "high": 100.0, "log": True}})

    @property
    def reg(self) -> float:
        return 1.0 / self.p.lam

    def client_train(self, task: ClientTask, ctx):
        rule, alpha = self.rule(task), self.p.alpha
        y, opt = ctx.x.clone(), ctx.optimizer()
        for batch in ctx.batches():
            if self.p.rho and alpha:
                g1, point = perturbed(ctx, y, batch, self.p.rho)
                g2 = ctx.loss_grad(point, batch)[1]
                g = g2 if alpha == 1.0 else (1 - alpha) * g1 + alpha * g2
            else:
                g = ctx.loss_grad(y, batch)[1]
            opt.step(y, g, rule)
        return self.result(task, y)
