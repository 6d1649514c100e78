"""A compact recommender for MovieLens (NeuMF, He et al. 2017) and its ranking metrics.

The model reads ``(user, item)`` index rows and returns two logits ``[0, s]``: cross-entropy on
them is the logistic loss on the score ``s``, so the ordinary classification runtime trains it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class NCF(nn.Module):
    """NeuMF: a GMF branch (p_u ⊙ q_i) and an MLP tower on [p'_u; q'_i], fused by one linear."""

    def __init__(self, users: int, items: int, dim: int = 32):
        super().__init__()
        self.gmf_user, self.gmf_item = nn.Embedding(users, dim), nn.Embedding(items, dim)
        self.mlp_user, self.mlp_item = nn.Embedding(users, dim), nn.Embedding(items, dim)
        self.tower = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(),
                                   nn.Linear(dim, dim // 2 or 1), nn.ReLU())
        self.out = nn.Linear(dim + (dim // 2 or 1), 1)
        for emb in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(emb.weight, std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, i = x[:, 0], x[:, 1]
        gmf = self.gmf_user(u) * self.gmf_item(i)
        mlp = self.tower(torch.cat([self.mlp_user(u), self.mlp_item(i)], 1))
        s = self.out(torch.cat([gmf, mlp], 1))
        return torch.cat([torch.zeros_like(s), s], 1)


def ncf(input_shape, num_classes, *, vocab: tuple[int, int], embedding_dim: int = 32) -> nn.Module:
    """NeuMF over ``vocab = (users, items)`` (MovieLens; FedEve's recommendation task)."""
    return NCF(vocab[0], vocab[1], embedding_dim)


ncf.takes_ids = True  # embeds integer (user, item) ids


def rec_metrics(scores, labels, group_size: int, k: int = 10) -> dict[str, float]:
    """HR@k, NDCG@k (leave-one-out: one positive per group) and AUC.

    ``scores``/``labels`` list consecutive groups of ``group_size`` candidates, each with one
    positive. The positive's rank counts the negatives scored at least as high (ties count
    against it). AUC is over all test positives × negatives (FedEve App. B.1), ties ½.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1, group_size)
    y = np.asarray(labels).reshape(-1, group_size)
    pos = s[np.arange(len(s)), y.argmax(1)]
    rank = (s >= pos[:, None]).sum(1) - 1  # 0-based
    hit = rank < k
    flat, lab = s.reshape(-1), y.reshape(-1) == 1
    order = np.argsort(flat, kind="stable")
    ranks = np.empty(len(flat))
    sorted_s = flat[order]
    first = np.searchsorted(sorted_s, sorted_s, side="left")
    last = np.searchsorted(sorted_s, sorted_s, side="right")
    ranks[order] = (first + last + 1) / 2  # 1-based average ranks
    n_pos, n_neg = int(lab.sum()), int((~lab).sum())
    auc = (ranks[lab].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1)
    return {f"hr@{k}": float(hit.mean()),
            f"ndcg@{k}": float(np.where(hit, 1 / np.log2(rank + 2), 0.0).mean()),
            "auc": float(auc)}
