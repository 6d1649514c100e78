"""Personalised parts of one model: a parameter group each client keeps, a group no one trains.

The frame FedPer, LG-FedAvg, FedRep, FedBABU and FedBN share. A *personal* group P (``head``,
``body``, ``norm`` or a glob over parameter names, :class:`rayfl.models.flat.Layout`) lives in
the client's state: a client trains from the global model with its own P in place (the global
P on its first round), keeps its new P and uploads nothing of it — its update there is zero, so
the server's step (FedAvg on the shared parameters, or any ``server_opt``) leaves the global P
where it started. A *frozen* group F is never trained: each local step restores it. The model a
client is evaluated with (``personal_model``, ``eval.clients``) is the global model with the
client's P (and, with ``local_buffers``, its own BatchNorm statistics).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from rayfl.algorithms.base import Algorithm, ClientResult, Traits, Vec
from rayfl.schema import ConfigError


class PartialModel(Algorithm):
    """FedAvg on the shared parameters; ``personal_group`` kept per client, ``frozen_group``
    never trained (None: no such group)."""

    # the shared update is FedAvg's; P (the personal group's values) never leaves the client
    traits = Traits(client_state={"personal": "any"}, server_opt=True, dp_post_processing=True,
                    capabilities={"personal_model"})
    #: the ``algorithm.*`` keys naming parameter groups (checked against the model)
    group_keys: tuple[str, ...] = ("personal",)

    @property
    def personal_group(self) -> str | None:
        return self.p.personal

    @property
    def frozen_group(self) -> str | None:
        return None

    @classmethod
    def check_model(cls, params: Any, layout: Any, handle: Any) -> None:
        """Each group key must name a part of this model."""
        for key in cls.group_keys:
            value = getattr(params, key)
            try:
                layout.params_in(value)
            except ValueError:
                raise ConfigError(f"algorithm.{key}", value,
                                  f"a parameter group of the model: head, body, norm, "
                                  f"embedding, or a glob over {', '.join(layout.names)}"
                                  ) from None

    def start(self, task, ctx) -> Vec:
        """The global model with the client's own personal group in place."""
        y = ctx.x.clone()
        if task.state and self.personal_group is not None:
            y[ctx.group(self.personal_group)] = task.state["personal"]
        return y

    def steps(self, ctx, y: Vec, trainable=None, passes: int = 1) -> Vec:
        """``passes`` passes of the round's local schedule over ``y`` in place, with the
        configured local optimiser; ``trainable`` (a mask; None: all) and never the frozen
        group move."""
        fixed = None if trainable is None else ~trainable
        if self.frozen_group is not None:
            frozen = ctx.group(self.frozen_group)
            fixed = frozen if fixed is None else fixed | frozen
        kept = None if fixed is None else y.clone()
        opt = ctx.optimizer()
        for _ in range(passes):
            for batch in ctx.batches():
                opt.step(y, ctx.loss_grad(y, batch)[1])
                if fixed is not None:  # a selection, not a masked assignment (no host wait)
                    y.copy_(torch.where(fixed, kept, y))
        return y

    def finish(self, ctx, y: Vec):
        """(what is uploaded: ``y`` with the global personal group back, ClientResult with
        the client's new personal group)."""
        if self.personal_group is None:
            return ClientResult(y)
        mask = ctx.group(self.personal_group)
        own = y[mask].clone()
        y[mask] = ctx.x[mask]
        return ClientResult(y, {}, {"personal": own})

    def client_train(self, task, ctx):
        """Every parameter but the frozen ones trains jointly (FedPer, LG-FedAvg, FedBN,
        FedBABU)."""
        return self.finish(ctx, self.steps(ctx, self.start(task, ctx)))

    def personal_model(self, state: dict | None, x: Vec, group: Callable,
                       buffers: Vec | None = None):
        """The global model with the client's personal group (and its statistics, when the
        client keeps its own)."""
        y = x.clone()
        if state is None or self.personal_group is None:
            return y, None
        y[group(self.personal_group)] = state["personal"].to(y.device)
        buffers = buffers if self.traits.local_buffers else None
        return y, buffers if buffers is not None and buffers.numel() else None
