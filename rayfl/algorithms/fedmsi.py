"""Similarity-perturbed local SGD (seed 002, Buttaci & Calafiore, "Aiding Global Convergence in
Federated Learning via Local Perturbation and Mutual Similarity Information"; the paper names no
method, here ``fedmsi``).

Set-up (once): client i sends m_i, the unit top right-singular vector of its raw flattened inputs
(no centring, no scaling); the server orients every m_i so that Σ_k m_i[k] > 0 (the sign of a
singular vector is arbitrary; raw pixels are non-negative, so the Perron vector is one-signed) and
builds the similarity graph
    mis(i,j) = ½ (1 − m_iᵀ m_j) clamped to ≥ 1e-12,   A_ij = −ln mis(i,j),   A_ii = 0,
dense for N ≤ ``dense_max_clients``, else each client's ``knn`` most similar clients (largest
A_ij), symmetrised by union, computed in row blocks so no N × N matrix is ever built. The
aggregation weight is p_i ∝ deg_i = Σ_j A_ij (``aggregation.weighting: degree``, which ``auto``
means here: the paper weights by degree, for its method and its FedAvg baseline, and its Lemma 1
needs those weights); ``samples`` and ``uniform`` remain available.

Local step, with an anchor u_i fixed for the round:
    y ← y − η_l g(β y + (1 − β) u_i)          (β = 1 is FedAvg)
    u_i = Σ_{j∈S_{t−1}} A_ij y_j / Σ_{j∈S_{t−1}} A_ij
over the previous round's participants and their final local models (kept by the server);
u_i = x_0 in round 0. When none of i's neighbours took part in round t − 1 (common with a kNN
graph at low participation) the anchor is the round's x_t (``anchor_fallback: global``, the
default; ``x0`` keeps pulling such clients toward the initial model).
With full participation and a dense graph this is the paper's rule exactly.

Broadcast: the runtime sends one dict to every client and does not tell :meth:`broadcast` who is
sampled, so it carries the previous participants' models (|S_{t−1}| × d) plus the non-zero
A_ij with j ∈ S_{t−1} as (row = client id, col = index into those models, value) sorted by row;
a client finds its own entries by binary search on its id. Per-client anchors would cost
|S_t| × d as well and need S_t at broadcast time.

Paper defaults (documented, not imposed here): β = 0.7 (grid 0.5 / 0.7 / 0.9), η_l = 1e-3 fixed,
weight decay 1e-4, B = 256, E = 10 local epochs, full participation, degree weighting also for
the FedAvg baseline. Weight decay is added by the runtime at y, not at the perturbed point.
The rule only moves the gradient point, so clipping (of that gradient) and Adam act as on a plain
model; under IMA the window holds the degree-weighted mean x, and anchors stay last round's
client models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch

from rayfl import schema
from rayfl.algorithms.base import (PLAIN_SGD, Aggregate, Algorithm, ClientResult, ClientTask,
                                   Collected, LocalRule, Rows, ServerParams, ServerRound, Traits,
                                   Vec)

MIS_FLOOR = 1e-12
_BLOCK_ELEMS = 1 << 24  # similarity entries per block when building the kNN graph


@dataclass(frozen=True)
class FedMSIParams(ServerParams):
    """Perturbation strength and similarity-graph size limits."""

    beta: float = schema.field(0.7, doc="β: gradient at β·y + (1−β)·u_i (1 = FedAvg)",
                               lo=0.0, hi=1.0, lo_open=True)
    dense_max_clients: int = schema.field(
        2000, doc="dense N×N similarity graph up to this many clients, kNN graph above", lo=0)
    knn: int = schema.field(20, doc="neighbours per client in the sparse (kNN) graph", lo=1)
    anchor_fallback: Literal["x0", "global"] = schema.field(
        "global", doc="anchor when no neighbour took part last round: x0 (initial model) or "
                  "global (the round's x_t)")


# ----- set-up: message and graph ---------------------------------------------------------------
def top_singular_vector(x) -> torch.Tensor:
    """Unit top right-singular vector of the raw inputs flattened to (n, D), float64."""
    if isinstance(x, torch.Tensor):
        a = x.detach().cpu().to(torch.float64)
    else:  # a copy: memory-mapped client data is read-only
        a = torch.from_numpy(np.array(x, dtype=np.float64))
    a = a.reshape(len(a), -1)
    n, dim = a.shape
    if n == 0:
        return torch.zeros(dim, dtype=torch.float64)
    if n > dim:  # eigenvector of the D×D Gram matrix: cheaper than an SVD of a tall matrix
        _, vecs = torch.linalg.eigh(a.T @ a)
        v = vecs[:, -1]
    else:
        v = torch.linalg.svd(a, full_matrices=False).Vh[0]
    norm = v.norm()
    return v / norm if norm > 0 else v


def orient(m: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit norm and signed so that each row sums to > 0.

    A row summing to ~0 (inputs of both signs) is signed by its largest-magnitude entry.
    """
    m = m.to(torch.float64)
    norms = m.norm(dim=1, keepdim=True)
    m = torch.where(norms > 0, m / norms.clamp_min(1e-300), m)
    s = m.sum(dim=1)
    pivot = m.gather(1, m.abs().argmax(dim=1, keepdim=True)).squeeze(1)
    sign = torch.where(s.abs() > 1e-12, torch.sign(s), torch.sign(pivot))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return m * sign[:, None]


def affinity(sim: torch.Tensor) -> torch.Tensor:
    """A = −ln(max(½(1 − m_iᵀm_j), 1e-12)) from cosine similarities."""
    return -torch.log(torch.clamp(0.5 * (1.0 - sim), min=MIS_FLOOR))


def dense_graph(m: torch.Tensor) -> torch.Tensor:
    """The dense N × N adjacency (exactly symmetric, zero diagonal)."""
    a = torch.triu(affinity(m @ m.T), diagonal=1)
    return a + a.T


def knn_graph(m: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse adjacency as CSR (crow, col, val): each client's k largest A_ij, union-symmetrised.

    Neighbours are searched in float32, ``_BLOCK_ELEMS / N`` rows at a time; a kept pair's value
    is then computed once, in float64, from its two rows, so the graph is exactly symmetric.
    """
    n = m.shape[0]
    k = min(k, n - 1)
    if k <= 0:
        return torch.zeros(n + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long), \
            torch.zeros(0, dtype=torch.float64)
    block = max(1, _BLOCK_ELEMS // n)
    m32t = m.to(torch.float32).T.contiguous()
    src, dst = [], []
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        sim = m32t[:, lo:hi].T @ m32t
        sim[torch.arange(hi - lo), torch.arange(lo, hi)] = -float("inf")  # no self-loops
        nbr = torch.topk(sim, k, dim=1).indices  # most similar = largest A_ij
        src.append(torch.arange(lo, hi).repeat_interleave(k))
        dst.append(nbr.reshape(-1))
    i, j = torch.cat(src), torch.cat(dst)
    key = torch.unique(torch.minimum(i, j) * n + torch.maximum(i, j))  # each pair once
    a, b = key // n, key % n
    val = affinity((m[a] * m[b]).sum(dim=1))
    rows, cols, vals = torch.cat([a, b]), torch.cat([b, a]), torch.cat([val, val])
    order = torch.argsort(rows * n + cols)
    rows, cols, vals = rows[order], cols[order], vals[order]
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    return crow, cols, vals


def csr_to_dense(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """Dense view of a CSR graph (for tests and small N)."""
    n = crow.numel() - 1
    rows = torch.repeat_interleave(torch.arange(n), crow[1:] - crow[:-1])
    out = torch.zeros(n, n, dtype=val.dtype)
    out[rows, col] = val
    return out


# ----- the algorithm ---------------------------------------------------------------------------
class _PerturbRule(LocalRule):
    """Gradient at β y + (1 − β) u."""

    def __init__(self, beta: float, anchor: Vec):
        self.beta = beta
        self.shift = (1.0 - beta) * anchor

    def grad_point(self, y: Vec) -> Vec:
        return y * self.beta + self.shift


@dataclass(frozen=True)
class FedMSIState:
    """x_0; after the set-up, the similarity graph (dense ``A``, or CSR ``crow``/``col``/``val``
    for the kNN graph) over the client ``ids`` and the degrees; after a round, the previous
    participants' final models and the A entries their anchors need."""

    LEGACY: ClassVar[dict[str, str]] = {f"msi_{k}": k for k in (
        "x0", "ids", "A", "crow", "col", "val", "deg", "prev", "row", "col_idx", "w")}

    x0: Vec
    ids: Vec | None = None  # sorted; graph rows follow this order
    A: Vec | None = None
    crow: Vec | None = None
    col: Vec | None = None
    val: Vec | None = None
    deg: Vec | None = None
    prev: Vec | None = None  # |S_{t−1}| × d
    row: Vec | None = None  # (client id, model index, A value) of the anchors' entries
    col_idx: Vec | None = None
    w: Vec | None = None


class FedMSI(Algorithm):
    """Server state: :class:`FedMSIState`; broadcast: x and the previous round's models."""

    name = "fedmsi"
    Params = FedMSIParams
    traits = Traits(
        weighting="degree", weightings=("degree",), server_opt=True,
        capabilities={"setup"},
        asynchronous="its anchors are the final models of the previous round's participants",
        search_space={"algorithm.beta": {"low": 0.3, "high": 1.0}})

    @classmethod
    def check_config(cls, params: FedMSIParams, cfg, where: str) -> None:
        trainable = cfg.data.num_clients - cfg.data.validation_clients
        if trainable > params.dense_max_clients and params.knn >= trainable:
            raise schema.ConfigError(f"{where}.knn", params.knn,
                                     f"fewer than the {trainable} training clients (the kNN "
                                     f"graph is used above {where}.dense_max_clients)")

    # ----- set-up ------------------------------------------------------------------------
    def client_setup(self, x, y) -> Vec:
        """m_i: unit top right-singular vector of the raw inputs (the server re-checks the sign)."""
        return orient(top_singular_vector(x)[None])[0]

    def server_setup(self, state: FedMSIState, client_ids, summaries: Vec) -> FedMSIState:
        ids = torch.as_tensor(np.asarray(client_ids), dtype=torch.long).reshape(-1)
        order = torch.argsort(ids)
        ids = ids[order]
        m = orient(torch.as_tensor(summaries)[order])
        if len(ids) <= self.p.dense_max_clients:
            a = dense_graph(m)
            return dataclasses.replace(state, ids=ids, A=a, deg=a.sum(dim=1))
        crow, col, val = knn_graph(m, self.p.knn)
        rows = torch.repeat_interleave(torch.arange(len(ids)), crow[1:] - crow[:-1])
        deg = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, rows, val)
        return dataclasses.replace(state, ids=ids, crow=crow, col=col, val=val, deg=deg)

    def server_init(self, x0: Vec) -> FedMSIState:
        return FedMSIState(x0.clone())

    # ----- graph access ------------------------------------------------------------------
    @staticmethod
    def _positions(state: FedMSIState, client_ids) -> torch.Tensor:
        ids = state.ids
        want = torch.as_tensor(np.asarray(client_ids), dtype=torch.long).reshape(-1)
        pos = torch.searchsorted(ids, want)
        if (pos >= len(ids)).any() or (ids[pos.clamp(max=len(ids) - 1)] != want).any():
            raise KeyError(f"fedmsi: client ids {want.tolist()} not all in the similarity graph")
        return pos

    @staticmethod
    def _row(state: FedMSIState, p: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Neighbour positions and A values of graph row ``p`` (non-zero entries only)."""
        if state.A is not None:
            row = state.A[p]
            nz = torch.nonzero(row).reshape(-1)
            return nz, row[nz]
        lo, hi = int(state.crow[p]), int(state.crow[p + 1])
        return state.col[lo:hi], state.val[lo:hi]

    def aggregation_weights(self, state: FedMSIState, client_ids, num_samples) -> list[float]:
        if self.weighting != "degree":
            return super().aggregation_weights(state, client_ids, num_samples)
        if state.deg is None:
            raise RuntimeError("fedmsi: degree weighting needs server_setup (the similarity graph)")
        return [float(v) for v in state.deg[self._positions(state, client_ids)]]

    # ----- round -------------------------------------------------------------------------
    def anchors(self, state: FedMSIState, client_ids, models: Vec) -> FedMSIState:
        """Keep the round's final models and the A entries (i, j ∈ S_t) the anchors need."""
        new = dataclasses.replace(state, prev=None, row=None, col_idx=None, w=None)
        if state.ids is None or len(client_ids) == 0:
            return new
        ids = state.ids
        rows, cols, vals = [], [], []
        for c, p in enumerate(self._positions(state, client_ids).tolist()):
            nbr, a = self._row(state, p)  # A symmetric: column p of A = row p
            rows.append(ids[nbr])
            cols.append(torch.full_like(nbr, c))
            vals.append(a)
        row, col, val = torch.cat(rows), torch.cat(cols), torch.cat(vals)
        order = torch.argsort(row * len(client_ids) + col)  # by client id, then model index
        return dataclasses.replace(new, prev=models.clone(), row=row[order],
                                   col_idx=col[order], w=val[order])

    def server_update(self, x: Vec, state: FedMSIState, agg: Aggregate, srv: ServerRound):
        models = agg.extras.get("y")
        if isinstance(models, Collected):
            state = self.anchors(state, models.ids, models.rows)
        return super().server_update(x, state, agg, srv)

    def broadcast(self, x: Vec, state: FedMSIState, t: int) -> dict[str, Vec]:
        bc = {"x": x}
        if state.prev is not None:
            bc.update(msi_prev=state.prev, msi_row=state.row, msi_col_idx=state.col_idx,
                      msi_w=state.w)
            if self.p.anchor_fallback == "x0":
                bc["msi_x0"] = state.x0
        return bc

    def anchor(self, bc: dict[str, Vec], client_id: int) -> Vec:
        """u_i from the broadcast (x_0 / x_t when i has no neighbour among S_{t−1})."""
        x = bc["x"]
        if "msi_prev" not in bc:  # round 0: u_i = x_0 (= the round's x)
            return x
        rows = bc["msi_row"]
        key = torch.tensor([int(client_id)], dtype=rows.dtype, device=rows.device)
        lo = int(torch.searchsorted(rows, key))
        hi = int(torch.searchsorted(rows, key, right=True))
        w = bc["msi_w"][lo:hi]
        total = float(w.sum()) if hi > lo else 0.0
        if total <= 0:
            return bc["msi_x0"] if self.p.anchor_fallback == "x0" else x
        prev = bc["msi_prev"][bc["msi_col_idx"][lo:hi]]
        return (w.to(prev.dtype) @ prev) / total

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        beta = self.p.beta
        rule = PLAIN_SGD if beta == 1.0 else \
            _PerturbRule(beta, self.anchor(task.bc, task.client_id))  # β = 1: FedAvg exactly
        y = ctx.train(rule)
        return ClientResult(y, {"y": Rows(y)})
