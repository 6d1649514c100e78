"""The seeded random streams of a run, in one place.

Every random draw comes from a generator keyed by the run's seed and a purpose tag (and, where
it varies, the round and the client), so a result never depends on which actor drew it, on how
many actors there are, or on a pause and resume. A tag names one purpose; no two purposes share
one. Adding a stream means adding its tag here.
"""

from __future__ import annotations

import numpy as np

# ----- clients' local training and evaluation -------------------------------------------------
BATCHES = 1  # a client's minibatch order in a round (key: seed, round, client, BATCHES)
EVAL_SAMPLE = 0xC11E  # which clients the per-client evaluation scores
FINETUNE = 0xF17E  # a client's fine-tuning minibatches in the per-client evaluation
# ----- aggregation transforms --------------------------------------------------------------------
DP_NOISE = 0xD9  # DP-FedAvg's noise on the round's sum
DP_COUNT = 0xDA  # adaptive clipping's noise on the unclipped count
SECAGG_ROUNDING = 0x5A  # SecAgg's randomised rounding to the field
QSGD = 0xC5  # QSGD's stochastic quantisation
RANDK = 0xC6  # rand-k's coordinates
ATTACKERS = 0xBAD  # which clients attack
ATTACK_NOISE = 0xBAD1  # a Gaussian attacker's noise


def stream(seed: int, *key: int) -> np.random.Generator:
    """The generator keyed by (seed, *key)."""
    return np.random.default_rng([seed, *key])


def client_stream(seed: int, t: int, client: int, purpose: int = BATCHES) -> np.random.Generator:
    """The generator of one (seed, round, client, purpose): independent of actor placement."""
    return np.random.default_rng([seed, t, client, purpose])
