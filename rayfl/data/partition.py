"""Partitioners: map training samples to clients, deterministically from the seed.

Each returns ``(order, offsets)``: client ``i`` holds samples ``order[offsets[i]:offsets[i+1]]``.
Everything is vectorised, so a million clients cost arrays, not Python objects.
"""

from __future__ import annotations

import numpy as np

from rayfl.rng import PARTITION, stream

from rayfl.schema import ConfigError


def iid(n: int, num_clients: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle, then split into near-equal contiguous blocks."""
    order = rng.permutation(n)
    offsets = np.linspace(0, n, num_clients + 1).round().astype(np.int64)
    return order, offsets


def sized_iid(sizes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle, then cut into blocks of the given sizes (which sum to the sample count)."""
    return rng.permutation(int(sizes.sum())), np.r_[0, np.cumsum(sizes)].astype(np.int64)


def equal_sizes(n: int, num_clients: int) -> np.ndarray:
    """n split into sizes that differ by at most one (the same cut as :func:`iid`)."""
    return np.diff(np.linspace(0, n, num_clients + 1).round().astype(np.int64))


def lognormal_sizes(n: int, num_clients: int, sigma: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Sizes ∝ lognormal(log(n/N), σ) summing to n, each at least 1 (FedDyn/AdaBest unbalanced).

    Every client gets one sample; the other n−N are apportioned to the draws by largest remainder.
    """
    if n < num_clients:
        raise ValueError(f"{n} samples cannot give {num_clients} clients one each")
    draw = rng.lognormal(np.log(n / num_clients), sigma, size=num_clients)
    share = draw / draw.sum() * (n - num_clients)
    sizes = np.floor(share).astype(np.int64)
    extra = n - num_clients - int(sizes.sum())
    sizes[np.argsort(sizes - share, kind="stable")[:extra]] += 1
    return sizes + 1


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
              min_samples: int = 10, max_tries: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Label skew with unequal sizes: each class is split among clients by p_c ~ Dir(α·1_N).

    Redraws until every client holds at least ``min_samples`` (the NIID-bench
    ``noniid-labeldir`` procedure of Yurochkin et al. 2019; for Hsu et al.'s per-client
    q ~ Dir(α·p) see :func:`label_dirichlet`).
    """
    classes = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    for _ in range(max_tries):
        owner = np.empty(len(labels), dtype=np.int64)
        for idx in by_class:
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            owner[idx] = np.repeat(np.arange(num_clients), np.diff(np.r_[0, cuts, len(idx)]))
        counts = np.bincount(owner, minlength=num_clients)
        if counts.min() >= min_samples:
            break
    else:
        raise ConfigError("data.min_samples", min_samples,
                          f"a minimum that Dirichlet(α={alpha}) over {num_clients} clients can "
                          f"meet within {max_tries} draws; lower it or data.num_clients, or "
                          "raise data.alpha")
    order = np.argsort(owner, kind="stable")
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    return order, offsets


def label_counts(class_counts: np.ndarray, sizes: np.ndarray, alpha: float,
                 rng: np.random.Generator) -> np.ndarray:
    """(clients × classes) sample counts with row sums ``sizes`` and column sums ``class_counts``,
    each client's mix following its own q_i ~ Dir(α·C·p) (p: class frequencies; FedDyn's Dir(α)
    when classes are balanced).

    Clients request multinomial(n_i, q_i) over the classes that still have samples; a class
    asked for more than it has is granted by a multivariate-hypergeometric draw among the
    requests, and unmet requests retry over the remaining classes (≤ C+1 passes, vectorised).
    """
    remaining = class_counts.astype(np.int64).copy()
    prior = remaining / remaining.sum()
    q = rng.dirichlet(np.maximum(alpha * len(prior) * prior, 1e-12), size=len(sizes))
    counts = np.zeros((len(sizes), len(prior)), dtype=np.int64)
    need = sizes.astype(np.int64).copy()
    while need.any():
        active = np.flatnonzero(need)
        avail = remaining > 0
        w = np.where(avail, q[active], 0.0)
        s = w.sum(1, keepdims=True)
        w = np.where((s > 0) & np.isfinite(s), w / np.where(s > 0, s, 1), avail / avail.sum())
        req = rng.multinomial(need[active], w)
        for c in np.flatnonzero(req.sum(0) > remaining):
            req[:, c] = rng.multivariate_hypergeometric(req[:, c], int(remaining[c]))
        counts[active] += req
        remaining -= req.sum(0)
        need[active] -= req.sum(1)
    return counts


def assign(labels: np.ndarray, counts: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(order, offsets) giving client i ``counts[i, c]`` random samples of class index c."""
    classes = np.unique(labels)
    owner = np.empty(len(labels), dtype=np.int64)
    clients = np.arange(len(counts))
    for j, c in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        owner[idx] = np.repeat(clients, counts[:, j])
    return np.argsort(owner, kind="stable"), np.r_[0, np.cumsum(counts.sum(1))].astype(np.int64)


def label_dirichlet(labels: np.ndarray, sizes: np.ndarray, alpha: float,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hsu et al.'s label skew at fixed client sizes (FedEve, FedMIM, AdaBest balanced;
    log-normal sizes for AdaBest unbalanced): every sample assigned once, client i holds
    exactly ``sizes[i]``."""
    class_counts = np.unique(labels, return_counts=True)[1]
    return assign(labels, label_counts(class_counts, sizes, alpha, rng), rng)


def shards(labels: np.ndarray, num_clients: int, per_client: int,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pathological label skew (McMahan et al.; IMA's #C): sort by label, cut into
    ``num_clients × per_client`` near-equal shards, deal ``per_client`` random shards to each."""
    perm = rng.permutation(len(labels))
    by_label = perm[np.argsort(labels[perm], kind="stable")]
    cuts = np.linspace(0, len(labels), num_clients * per_client + 1).round().astype(np.int64)
    deal = rng.permutation(num_clients * per_client)
    lens = np.diff(cuts)[deal]
    starts = np.cumsum(lens) - lens
    order = by_label[np.repeat(cuts[deal] - starts, lens) + np.arange(int(lens.sum()))]
    sizes = lens.reshape(num_clients, per_client).sum(1)
    return order, np.r_[0, np.cumsum(sizes)].astype(np.int64)


def natural(groups: np.ndarray, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """One client per writer/user: the first ``num_clients`` groups, rows of later ones unused.
    Ids with gaps below ``num_clients`` (clients that would hold nothing while rows of higher
    ids are dropped) are refused, with what would be lost."""
    available = int(groups.max()) + 1 if len(groups) else 0
    if num_clients > available:
        raise ConfigError("data.num_clients", num_clients,
                          f"at most the {available} writers/users the dataset has "
                          "(partition=natural)")
    _check_gaps(groups, num_clients)
    keep = np.flatnonzero(groups < num_clients)
    order = keep[np.argsort(groups[keep], kind="stable")]
    counts = np.bincount(groups[keep], minlength=num_clients)
    return order, np.r_[0, np.cumsum(counts)].astype(np.int64)


def _check_gaps(groups: np.ndarray, num_clients: int) -> None:
    """A ConfigError on ``data.num_clients`` when an id below it names no row."""
    ids, rows = np.unique(groups, return_counts=True)
    below = ids < num_clients
    empty = num_clients - int(below.sum())
    if not empty:
        return
    first_gap = int(np.flatnonzero(np.r_[ids, -1] != np.arange(len(ids) + 1))[0])
    shown = ", ".join(map(str, ids[:6])) + (f", …, {ids[-1]}" if len(ids) > 6 else "")
    above = int((~below).sum())
    dropped = f" and {int(rows[~below].sum())} of {len(groups)} rows ({above} ids ≥ " \
        f"{num_clients}) dropped" if above else ""
    raise ConfigError("data.num_clients", num_clients, (
        f"ids 0..{num_clients - 1} that all name a writer/user (partition=natural: client i "
        f"holds writer/user i), but the dataset's {len(ids)} ids have gaps ({shown}): "
        f"{empty} clients would be empty{dropped}; number the writers/users "
        f"0..{len(ids) - 1} without gaps, or set data.num_clients ≤ {first_gap}"))


def split(cfg, arrays, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, offsets) for the configured (stored) partition of ``arrays``' training rows."""
    rng = stream(seed, PARTITION)
    labels, n, num = arrays.y_train, len(arrays.y_train), cfg.num_clients
    kind = cfg.stored_partition
    if kind == "natural":
        return natural(arrays.groups, num)
    if labels.ndim > 1 and kind != "iid":
        raise ConfigError("data.partition", kind, "iid or natural for a dataset with one label "
                          "per position (next-token prediction): label-skew partitions need "
                          "one label per row")
    if num > n:
        raise ConfigError("data.num_clients", num, f"at most the {n} training rows of "
                          f"{cfg.dataset} (every client needs data)")
    if kind == "shards":
        if num * cfg.shards_per_client > n:
            raise ConfigError("data.shards_per_client", cfg.shards_per_client,
                              f"at most {n // num} (data.num_clients × shards_per_client "
                              f"shards of the {n} training rows)")
        return shards(labels, num, cfg.shards_per_client, rng)
    if kind == "dirichlet":
        return dirichlet(labels, num, cfg.alpha, rng, cfg.min_samples)
    if cfg.sizes == "equal":
        if kind == "iid":
            return iid(n, num, rng)
        sizes = equal_sizes(n, num)
    else:
        sizes = lognormal_sizes(n, num, cfg.sigma, rng)
    return sized_iid(sizes, rng) if kind == "iid" else label_dirichlet(labels, sizes, cfg.alpha,
                                                                        rng)
