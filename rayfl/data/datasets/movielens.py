"""MovieLens-1M as implicit feedback, FedEve's protocol (leave-one-out, sampled negatives).

Every rating is a positive. Per user the latest rating (ties: larger movie id) is the test
positive, ranked against 99 distinct unrated movies; every training positive gets 4 unrated
negatives. Rows are ``(user, movie)`` index pairs with label 1/0, grouped by user.
"""

from __future__ import annotations

import os

import numpy as np

from rayfl.rng import MOVIELENS, stream
import pyarrow as pa
import pyarrow.csv as pacsv

from rayfl.data.datasets import Arrays, present, require
from rayfl.data.evaluators import ranking as evaluator  # noqa: F401 (HR/NDCG/AUC on test)
from rayfl.schema import ConfigError

natural = True  # every training row carries its writer/user (partition: natural)

FILES = ["ratings.dat", "users.dat", "movies.dat"]
HINT = ("unzip ml-1m.zip from https://grouplens.org/datasets/movielens/1m/ and set data.root to "
        "its ml-1m folder")
TRAIN_NEG, TEST_NEG = 4, 99


def _refuse(path: str, layout: str, e: Exception) -> ConfigError:
    return ConfigError("data.root", path, f"MovieLens-1M's {layout} lines "
                       f"({type(e).__name__}: {' '.join(str(e).split())[:200]})")


def _ids(path: str) -> np.ndarray:
    """First ``::`` field of every line (users.dat / movies.dat ids), sorted."""
    try:
        with open(path, "rb") as f:
            ids = [int(line.split(b"::", 1)[0]) for line in f if line.strip()]
    except ValueError as e:
        raise _refuse(path, "ID::... (a whole number first)", e) from None
    if not ids:
        raise _refuse(path, "ID::...", ValueError("the file has no lines"))
    return np.sort(np.array(ids))


def _ratings(path: str) -> np.ndarray:
    """(n, 3) int64 user id, movie id, timestamp from ``UserID::MovieID::Rating::Timestamp``."""
    names = ["u", "_1", "m", "_2", "r", "_3", "t"]
    try:
        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=names),
                               parse_options=pacsv.ParseOptions(delimiter=":"),
                               convert_options=pacsv.ConvertOptions(
                                   include_columns=["u", "m", "t"],
                                   column_types={c: pa.int64() for c in ("u", "m", "t")}))
    except (pa.ArrowException, ValueError) as e:
        raise _refuse(path, "UserID::MovieID::Rating::Timestamp", e) from None
    if table.num_rows == 0 or any(table.column(c).null_count for c in ("u", "m", "t")):
        raise _refuse(path, "UserID::MovieID::Rating::Timestamp",
                      ValueError("empty, or a line missing a field"))
    return np.stack([table.column(c).to_numpy().astype(np.int64) for c in ("u", "m", "t")], 1)


def _negatives(users: np.ndarray, rated: np.ndarray, items: int, rng: np.random.Generator,
               distinct: bool) -> np.ndarray:
    """One unrated item per entry of ``users`` (rejection sampling, vectorised); with
    ``distinct`` no user gets the same item twice."""
    out = rng.integers(0, items, size=len(users))
    bad = np.ones(len(users), dtype=bool)
    while bad.any():
        keys = users * items + out
        pos = np.minimum(np.searchsorted(rated, keys), len(rated) - 1)
        bad = rated[pos] == keys
        if distinct:
            first = np.zeros(len(keys), dtype=bool)
            first[np.unique(keys, return_index=True)[1]] = True
            bad |= ~first
        out[bad] = rng.integers(0, items, size=int(bad.sum()))
    return out


def sources(cfg) -> list[str]:
    """The three .dat files that :func:`load` reads (those present)."""
    return present(cfg.root, FILES)


def load(cfg, seed: int) -> Arrays:
    """Train/test (user, item) rows for the users with at least two ratings."""
    root = require(cfg.root, FILES, "MovieLens-1M's .dat files", HINT)
    user_ids, movie_ids = _ids(os.path.join(root, "users.dat")), _ids(os.path.join(root,
                                                                                   "movies.dat"))
    r = _ratings(os.path.join(root, "ratings.dat"))
    u, m = np.searchsorted(user_ids, r[:, 0]), np.searchsorted(movie_ids, r[:, 1])
    if (user_ids[np.minimum(u, len(user_ids) - 1)] != r[:, 0]).any() or \
            (movie_ids[np.minimum(m, len(movie_ids) - 1)] != r[:, 1]).any():
        raise ConfigError("data.root", root, "ratings.dat whose users and movies all appear "
                          "in users.dat and movies.dat")
    order = np.lexsort((m, r[:, 2], u))  # by user, then time, then movie
    u, m = u[order], m[order]
    counts = np.bincount(u, minlength=len(user_ids))
    keep = counts[u] >= 2
    if not keep.any():
        raise ConfigError("data.root", os.path.join(root, "ratings.dat"), "ratings of at least "
                          "one user who rated two movies (the latest is the test positive, the "
                          "others train)")
    u, m = u[keep], m[keep]
    last = np.r_[u[1:] != u[:-1], True]  # each user's latest rating is the test positive
    items = len(movie_ids)
    rated = np.unique(u * items + m)
    unrated = items - np.bincount(rated // items, minlength=len(user_ids))
    short = np.flatnonzero((unrated < TEST_NEG) & (np.bincount(u, minlength=len(user_ids)) > 0))
    if len(short):
        raise ConfigError("data.root", os.path.join(root, "ratings.dat"),
                          f"every user with two ratings or more to leave at least {TEST_NEG} of "
                          f"the {items} movies unrated (the test ranks a user's latest rating "
                          f"against {TEST_NEG} distinct unrated movies); user "
                          f"{user_ids[short[0]]} leaves {unrated[short[0]]}")
    rng = stream(seed, MOVIELENS)
    tu, tm, pu = u[~last], m[~last], u[last]
    nu = np.repeat(tu, TRAIN_NEG)
    nm = _negatives(nu, rated, items, rng, distinct=False)
    qu = np.repeat(pu, TEST_NEG)
    qm = _negatives(qu, rated, items, rng, distinct=True)
    train_u = np.concatenate([tu, nu])
    x_train = np.stack([train_u, np.concatenate([tm, nm])], 1).astype(np.int32)
    y_train = np.r_[np.ones(len(tu)), np.zeros(len(nu))].astype(np.int64)
    test = np.concatenate([np.stack([pu, m[last]], 1)[:, None],
                           np.stack([qu, qm], 1).reshape(len(pu), TEST_NEG, 2)], 1)
    y_test = np.zeros((len(pu), 1 + TEST_NEG), dtype=np.int64)
    y_test[:, 0] = 1
    groups = np.searchsorted(np.unique(pu), train_u)
    return Arrays(x_train, y_train, test.reshape(-1, 2).astype(np.int32), y_test.reshape(-1),
                  input_shape=(2,), num_classes=2, groups=groups, kind="ids",
                  vocab=(len(user_ids), items), eval_group=1 + TEST_NEG)
