"""Power of choice (Cho, Wang & Joshi, AISTATS 2022, "Towards Understanding Biased Client
Selection in Federated Learning"): each round draws d candidates among the online clients
without replacement with probability p_k = n_k / Σ n (their sample counts), computes each
candidate's training loss F_k(w^t) at the model the round starts from, and samples the m with
the highest loss (ties: the earlier drawn). d = m is uniform-by-size sampling; larger d biases
selection toward the clients the model fits worst."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rayfl import schema
from rayfl.schema import ConfigError
from rayfl.selection.base import Selector, SelectorTraits


@dataclass(frozen=True)
class PowerOfChoiceParams:
    """Power-of-choice keys."""

    candidates: int | None = schema.field(None, doc="d, the candidates a round scores (null: "
                                                    "twice the clients sampled)", lo=1)


class PowerOfChoice(Selector):
    """The d-candidate highest-loss rule."""

    name = "power_of_choice"
    Params = PowerOfChoiceParams
    scores_candidates = True

    #: the tuner's preset ``power_of_choice``: Power-of-Choice selects, with d searched from
    #: 1× to 5× the 10 clients a round of the shipped configs
    traits = SelectorTraits(search_space={
        "selection.name": {"type": "categorical", "choices": ["power_of_choice"]},
        "selection.candidates": {"type": "int", "low": 10, "high": 50}})

    def select(self, t, rng, online, m, losses):
        p = self.ctx.sizes[online] / self.ctx.sizes[online].sum()
        d = self.p.candidates if self.p.candidates is not None else 2 * m
        d = min(d, int(np.count_nonzero(p)))
        candidates = rng.choice(online, d, replace=False, p=p)
        order = np.argsort(candidates)
        scores = np.empty(d)
        scores[order] = losses(candidates[order])  # scored in ascending id order
        return candidates[np.argsort(-scores, kind="stable")[:m]]

    @classmethod
    def check_config(cls, params, cfg, where: str) -> None:
        drawn = math.ceil(round(cfg.clients_per_round * cfg.availability.overcommit, 9))
        if params.candidates is not None and params.candidates < drawn:
            raise ConfigError(f"{where}.candidates", params.candidates,
                              f"at least the {drawn} clients a round samples (clients_per_round "
                              "× availability.overcommit)")
