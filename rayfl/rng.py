"""The seeded random streams of a run, in one place.

Every random draw comes from a generator keyed by the run's seed and a purpose tag (and, where
it varies, the round and the client), so a result never depends on which actor drew it, on how
many actors there are, or on a pause and resume. A tag names one purpose; no two purposes share
one. Adding a stream means adding its tag here.
"""

from __future__ import annotations

import numpy as np
import torch

# ----- clients' local training and evaluation -------------------------------------------------
BATCHES = 1  # a client's minibatch order in a round (key: seed, round, client, BATCHES)
TORCH_GLOBAL = 0x7047  # torch's own generator while a client trains (a model's dropout)
FINETUNE_TORCH = 0x7048  # torch's own generator while a client fine-tunes in the evaluation
EVAL_SAMPLE = 0xC11E  # which clients the per-client evaluation scores
FINETUNE = 0xF17E  # a client's fine-tuning minibatches in the per-client evaluation
# ----- aggregation transforms --------------------------------------------------------------------
DP_NOISE = 0xD9  # DP-FedAvg's noise on the round's sum
DP_COUNT = 0xDA  # adaptive clipping's noise on the unclipped count
DP_UPLOAD_NOISE = 0xDB  # DP-FedAvg's noise on the sums of an algorithm's Upload entries
TREE_NODES = 0xF7  # DP-FTRL's node noises (key: seed, TREE_NODES, tree, level, index)
BAND_NOISE = 0xF8  # banded MF's Z_t (key: seed, BAND_NOISE, t)
SECAGG_ROUNDING = 0x5A  # SecAgg's randomised rounding to the field
QSGD = 0xC5  # QSGD's stochastic quantisation
RANDK = 0xC6  # rand-k's coordinates
ATTACKERS = 0xBAD  # which clients attack
ATTACK_NOISE = 0xBAD1  # a Gaussian attacker's noise
AUDIT_CANARY = 0xA0D1  # the privacy audit's canary directions (key: seed, canary, AUDIT_CANARY)
AUDIT_NULL = 0xA0D0  # its null directions, never inserted (key: seed, index, AUDIT_NULL)
AUDIT_SAMPLE = 0xA0D5  # which canaries take part (key: seed, round, AUDIT_SAMPLE)


# ----- who takes part: availability, sampling, devices ------------------------------------------
SAMPLE = 0x5A4D  # which online clients are sampled (key: seed, round, SAMPLE)
ONLINE = 0x0A71  # per-round online coin flips (bernoulli, diurnal)
DROPOUT = 0xD209  # mid-round failures
STRAGGLE = 0x5792  # which clients straggle and how much work they finish (FedProx)
PROPENSITY = 0xBE7A  # per-client online probabilities (bernoulli)
ZONE = 0x2011E  # time-zone assignment (diurnal)
LABEL_RANK = 0x1ABE  # order of labels when availability follows data
DEVICE = 0xDE71  # compute speed and bandwidth per client
# ----- data -----------------------------------------------------------------------------
PARTITION = 0xDA7A  # the partition of a dataset's rows among clients
HOLDOUT = 0x401D  # the rows each client holds out for per-client evaluation
REGIME = 0xD21F7  # the drift regimes' per-round re-split
SHAKESPEARE_SPLIT = 0x5A4C  # each role's train/test draw (shakespeare)
SYNTHETIC = 0x5EED  # the synthetic dataset's draws
SYNTHETIC_FEDPROX = 0xFED9  # FedProx's synthetic(α, β) draws
MOVIELENS = 0x4D4C  # MovieLens' negative samples


def stream(seed: int, *key: int) -> np.random.Generator:
    """The generator keyed by (seed, *key)."""
    return np.random.default_rng([seed, *key])


_WORD = 1 << 32


def client_stream(seed: int, t: int, client: int, purpose: int = BATCHES) -> np.random.Generator:
    """The generator of one (seed, round, client, purpose): independent of actor placement.
    A key of 32-bit words seeds from a uint32 array, which NumPy's SeedSequence takes as the
    same entropy as the list of ints, without converting each int (twice as fast; it runs once
    per client per round)."""
    key = (int(seed), int(t), int(client), int(purpose))
    if all(0 <= k < _WORD for k in key):
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            np.array(key, dtype=np.uint32))))
    return np.random.default_rng(list(key))


_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's finaliser: 64 well-mixed bits of ``z``."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
    return z ^ (z >> 31)


def seed_torch(seed: int, t: int, client: int, device, purpose: int = TORCH_GLOBAL) -> None:
    """Seed torch's CPU generator (and the current CUDA device's, on one) for one
    (seed, round, client, purpose): what a model draws from it while the client trains
    (dropout) is then the same on any actor, in any order. A few arithmetic operations, not a
    SeedSequence: it runs once per client per round."""
    z = 0
    for k in (seed, t, client, purpose):
        z = _mix((z + (int(k) & _MASK) + 0x9E3779B97F4A7C15) & _MASK)
    z &= (1 << 63) - 1
    torch.default_generator.manual_seed(z)
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.manual_seed(z)
