"""FedProx's Synthetic(α, β) (Li et al. 2020): every client its own softmax model and inputs.

Client k draws u_k ~ N(0, α²), W_k, b_k ~ N(u_k, 1), B_k ~ N(0, β²), v_k ~ N(B_k, 1);
its inputs are x ~ N(v_k, diag(j^-1.2)) and labels y = argmax(W_kᵀx + b_k) (as in the authors'
generator, α and β are standard deviations). Generated in fixed blocks of clients, so any
number of clients costs arrays, never a Python object per client.
"""

from __future__ import annotations

import numpy as np

from rayfl.rng import SYNTHETIC_FEDPROX, stream

from rayfl.data.datasets import Arrays

natural = True  # every training row carries its writer/user (partition: natural)
generates_sizes = True  # data.sizes shapes the clients it generates, whatever the partition

BLOCK = 256  # clients generated together (part of the stream layout: changing it changes data)


def client_sizes(cfg, rng: np.random.Generator) -> np.ndarray:
    """n_k: ``samples_per_client`` each, or log-normal around it with σ = ``data.sigma``."""
    n = cfg.num_clients
    if cfg.sizes == "equal":
        return np.full(n, cfg.samples_per_client, dtype=np.int64)
    draw = rng.lognormal(np.log(cfg.samples_per_client), cfg.sigma, size=n)
    return np.maximum(np.rint(draw), 1).astype(np.int64)


def load(cfg, seed: int) -> Arrays:
    """Float32 rows of ``data.features`` inputs, ``data.classes`` labels, grouped by client."""
    d, c, n = cfg.features, cfg.classes, cfg.num_clients
    rng = stream(seed, SYNTHETIC_FEDPROX)
    sizes = client_sizes(cfg, rng)
    tests = rng.multinomial(cfg.test_samples, sizes / sizes.sum())
    sd = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt of the covariance diagonal
    out = {part: (np.empty((int(k.sum()), d), dtype=np.float32), np.empty(int(k.sum()), np.int64),
                  np.r_[0, np.cumsum(k)]) for part, k in (("tr", sizes), ("te", tests))}
    for lo in range(0, n, BLOCK):
        hi = min(lo + BLOCK, n)
        r = stream(seed, SYNTHETIC_FEDPROX, lo)
        u = r.normal(0, cfg.synthetic_alpha, hi - lo)
        w = r.normal(u[:, None, None], 1, (hi - lo, d, c))
        b = r.normal(u[:, None], 1, (hi - lo, c))
        v = r.normal(r.normal(0, cfg.synthetic_beta, hi - lo)[:, None], 1, (hi - lo, d))
        for part, counts in (("tr", sizes[lo:hi]), ("te", tests[lo:hi])):
            xs, ys, offsets = out[part]
            who = np.repeat(np.arange(hi - lo), counts)
            x = v[who] + r.normal(0, 1, (len(who), d)) * sd
            xs[offsets[lo]:offsets[hi]] = x
            ys[offsets[lo]:offsets[hi]] = np.argmax(np.einsum("rd,rdc->rc", x, w[who]) + b[who],
                                                    axis=1)
    (x_tr, y_tr, _), (x_te, y_te, _) = out["tr"], out["te"]
    return Arrays(x_tr, y_tr, x_te, y_te, input_shape=(d,),
                  num_classes=c, groups=np.repeat(np.arange(n), sizes))
