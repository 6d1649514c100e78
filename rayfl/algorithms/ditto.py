"""Ditto, fair and robust personalisation (Li, Hu, Beirami & Smith, ICML 2021), as a client
procedure.

Each selected client k runs the global update of FedAvg (local SGD on F_k from w^t; the server
averages) and, beside it, updates its personal model v_k (Algorithm 1) for the same number of
steps on fresh minibatches:

    v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t)).

v_k (with its BatchNorm statistics) is the client's persistent state, w^t on its first round;
it is the model ``eval.clients`` scores as the client's ``personal_*`` accuracy. λ = 0 is local
training; as λ grows v_k is pulled to the global model. The global model's bytes are FedAvg's
whatever λ.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ClientTask, ServerParams, Traits, Vec


@dataclass(frozen=True)
class DittoParams(ServerParams):
    """Ditto hyper-parameters (the paper tunes λ over {0.05, 0.1, 0.2, 0.5, 1, 2})."""

    lam: float = schema.field(0.1, doc="λ: pull of the personal model toward the global one",
                              lo=0.0)


class Ditto(Algorithm):
    """FedAvg for the global model; a λ-regularised personal model per client."""

    name = "ditto"
    Params = DittoParams
    traits = Traits(client_state={"v": "model", "v_buffers": "buffers"}, server_opt=True,
                    dp_post_processing=True,  # the global update is FedAvg's; v_k stays local
                    capabilities={"personal_model"},
                    search_space={"algorithm.lam": {"low": 1e-2, "high": 2.0, "log": True}})

    def client_train(self, task: ClientTask, ctx):
        w = ctx.x
        y, opt = w.clone(), ctx.optimizer()  # the global update: FedAvg's local SGD
        for batch in ctx.batches():
            opt.step(y, ctx.loss_grad(y, batch)[1])
        uploaded_buffers = ctx.get_buffers()
        v = task.state["v"].clone() if task.state else w.clone()
        if task.state and "v_buffers" in task.state:
            ctx.set_buffers(task.state["v_buffers"])
        for batch in ctx.batches():  # the personal update, on fresh minibatches
            g = ctx.loss_grad(v, batch, record=False)[1]
            v.add_(g + self.p.lam * (v - w), alpha=-ctx.lr)
        state = {"v": v, "v_buffers": ctx.get_buffers()}
        ctx.set_buffers(uploaded_buffers)
        return ClientResult(y, {}, state)

    def personal_model(self, state: dict | None, x: Vec, group=None, buffers=None):
        """v_k with its statistics (the global model before the client's first round)."""
        if state is None:
            return x, None
        buffers = state.get("v_buffers")
        return state["v"], buffers if buffers is not None and buffers.numel() else None
