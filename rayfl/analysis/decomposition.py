"""Seed 004's loss decomposition (Theorem 1) for the client models of kept rounds.

MSE on one-hot targets with f_w(x) the softmax output, as in the paper. For a kept round with
client models w_k (the sampled clients that finished), n_k rows each, p_k = n_k / Σ n_j and
D = ∪ D_k the cohort's training rows (the rows each client trained on that round):

    TrainBias(x) = Σ_k p_k 1[x ∈ D_k] (y − f_k(x))     (fit on the client's own data)
    HeterBias(x) = Σ_k p_k 1[x ∉ D_k] (y − f_k(x))     (forgetting of the data it does not hold)
    train_bias = mean_x ‖TrainBias(x)‖²,  heter_bias = mean_x ‖HeterBias(x)‖²,
    bias = mean_x ‖TrainBias + HeterBias‖² = MSE of the ensemble f_WENS = Σ p_k f_k (Lemma 1).

What is estimated and how is stated in :data:`ESTIMATORS` and written with every result.
"""

from __future__ import annotations

import numpy as np

from rayfl.analysis.evaluate import EvalData, predict, score
from rayfl.rng import stream
from rayfl.data.regime import RESPLIT, regime_rows

ESTIMATORS = {
    "expectations": "one kept model per client and round, so E_wk[f_wk] ≈ f_wk (spec 004 §5.3)",
    "train_bias, heter_bias, bias": "exact on D (or a seeded uniform subset of D with "
                                    "--max-samples); the bracket is taken on the class vector, "
                                    "TrainBias and HeterBias separately and summed (bias)",
    "var, cov": "NOT estimated: they need several models per client (draws from W_Dk); with one "
                "model Var = Cov = 0. Reported instead: diversity = mean_x Σ_k p_k ‖f_k − "
                "f_WENS‖² (the spread across clients: the p-weighted mean of the client models' "
                "MSE on D is bias + diversity) and the error of the average of m client "
                "models against m (the paper's Fig. 4 reading of the variance term)",
    "fma_mse, fma_gap": "MSE of w_FMA = Σ p_k w_k on D, and fma_mse − bias: the realised "
                        "O(Δ²) term of Theorem 1",
    "locality": "max_k ‖w_k − w_FMA‖₂ over all parameters (Lemma 1's Δ); locality_global: "
                "max_k ‖w_k − w_global‖₂ against the kept global (deployed) model",
    "own_mse, other_mse": "Σ_k p_k × mean MSE of f_k on D_k, and on D ∖ D_k (the per-client "
                          "reading of the two bias terms)",
    "error_vs_models": "error/loss on the evaluation data of the n_k-weighted average of m "
                       "client models, mean over random subsets of size m",
}


def bias_terms(probs: np.ndarray, y: np.ndarray, owner: np.ndarray,
               p: np.ndarray) -> dict[str, float]:
    """Theorem 1's bias terms from client outputs ``probs`` (K × n × C) on rows with labels
    ``y`` held by client ``owner`` (index into K), with aggregation weights ``p`` (Σ = 1)."""
    K, _, C = probs.shape
    probs = probs.astype(np.float64)
    resid = np.eye(C)[y][None] - probs  # y − f_k(x)
    own = owner[None, :] == np.arange(K)[:, None]  # (K, n): x ∈ D_k
    weighted = p[:, None, None] * resid
    tb = (weighted * own[..., None]).sum(0)
    hb = (weighted * ~own[..., None]).sum(0)
    mse = (resid ** 2).sum(-1)  # (K, n)
    ens = (p[:, None, None] * probs).sum(0)

    def sq(z):
        return float((z ** 2).sum(-1).mean())

    def masked_mean(mask):
        return float(sum(p[k] * mse[k][mask[k]].mean() for k in range(K) if mask[k].any()))

    return {"train_bias": sq(tb), "heter_bias": sq(hb), "bias": sq(tb + hb),
            "own_mse": masked_mean(own), "other_mse": masked_mean(~own),
            "diversity": float((p[:, None] * ((probs - ens) ** 2).sum(-1)).sum(0).mean())}


def cohort_rows(run, t: int, ids: list[int]) -> dict[int, np.ndarray]:
    """Row indices each client trained on in round ``t`` (1-based; regime re-splits
    included)."""
    reader = run.handle.open()
    data = run.cfg.data
    if data.regime in RESPLIT:
        return regime_rows(reader, data.regime, ids, t - 1, run.cfg.seed)  # loop index t - 1
    return {i: np.arange(reader.offsets[i], reader.offsets[i + 1]) for i in ids}


def subsets(k: int, count: int, seed: int) -> list[list[int]]:
    """Up to ``count`` random subsets of range(k) of each size m = 1..k (all of them at m=k)."""
    rng = np.random.default_rng(seed)
    return [sorted(rng.choice(k, m, replace=False)) for m in range(1, k)
            for _ in range(count)] + [list(range(k))]


def decompose_round(run, t: int, test: EvalData, max_samples: int | None = None,
                    count: int = 5, batch_size: int = 1000) -> tuple[dict, list[dict]]:
    """(terms of round ``t``, error-vs-number-of-models rows) for its kept client models."""
    cfg, handle = run.cfg, run.handle
    ids = run.clients(t)
    W = np.stack([run.load(f"client-{i}", t) for i in ids]).astype(np.float64)
    rows = cohort_rows(run, t, ids)
    n_k = np.array([len(rows[i]) for i in ids], dtype=np.float64)
    p = n_k / n_k.sum()
    index = np.concatenate([rows[i] for i in ids])
    owner = np.repeat(np.arange(len(ids)), n_k.astype(np.int64))
    if max_samples is not None and max_samples < len(index):
        pick = np.sort(stream(cfg.seed, t).choice(len(index), max_samples,
                                                                   replace=False))
        index, owner = index[pick], owner[pick]
    data = EvalData("train", index, "cohort training rows")
    y = np.asarray(handle.open().y[index], dtype=np.int64)
    out = predict(cfg, handle, data, np.zeros(W.shape[1]), W, np.vstack([np.eye(len(ids)), p]),
                  batch_size)
    terms = bias_terms(out[:-1], y, owner, p)
    fma = p @ W
    fma_mse = float(((np.eye(handle.num_classes)[y] - out[-1]) ** 2).sum(-1).mean())
    glob = run.load("global", t).astype(np.float64)
    row = {"round": t, "clients": len(ids), "rows": len(index), **terms,
           "fma_mse": fma_mse, "fma_gap": fma_mse - terms["bias"],
           "locality": float(np.linalg.norm(W - fma, axis=1).max()),
           "locality_global": float(np.linalg.norm(W - glob, axis=1).max())}

    picks = subsets(len(ids), count, cfg.seed + t)
    coeffs = np.zeros((len(picks) + 1, len(ids) + 1))
    for j, s in enumerate(picks):
        coeffs[j, s] = n_k[s] / n_k[s].sum()
    coeffs[-1, -1] = 1.0  # the kept global model
    res = score(cfg, handle, test, np.zeros(W.shape[1]), np.vstack([W, glob]), coeffs,
                batch_size)
    row["global_loss"], row["global_error"] = float(res[-1, 0]), float(1 - res[-1, 1])
    sizes = np.array([len(s) for s in picks])
    curve = [{"round": t, "models": int(m), "loss": float(res[:-1][sizes == m, 0].mean()),
              "error": float(1 - res[:-1][sizes == m, 1].mean()),
              "error_std": float(res[:-1][sizes == m, 1].std())}
             for m in range(1, len(ids) + 1)]
    return row, curve
