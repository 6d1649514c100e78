"""What a partition looks like: sizes, label mix per client, and a regime's per-round drift.

Backs ``rayfl data``; everything is vectorised over the store (no Python object per client).
"""

from __future__ import annotations

import os

import numpy as np

from rayfl.data import prepare
from rayfl.data.regime import regime_rows
from rayfl.data.table import client_table, head_lines, write_table
from rayfl.deferred import deferred
from rayfl.rng import SAMPLE, stream

mpl_figure = deferred("matplotlib.figure")  # a figure outside pyplot: the backend stays

CHUNK = 1 << 16  # clients per bincount block (bounds the clients × classes scratch)


def label_counts(reader, num_classes: int, clients: np.ndarray | None = None) -> np.ndarray:
    """(clients × classes) label counts of the given training clients (default: all)."""
    offsets = np.asarray(reader.offsets, dtype=np.int64)
    ids = np.arange(len(offsets) - 1) if clients is None else np.asarray(clients, np.int64)
    out = np.zeros((len(ids), num_classes), dtype=np.int64)
    for lo in range(0, len(ids), CHUNK):
        block = ids[lo:lo + CHUNK]
        sizes = offsets[block + 1] - offsets[block]
        ends = np.cumsum(sizes)
        rows = np.repeat(offsets[block] - (ends - sizes), sizes) + np.arange(ends[-1])
        owner = np.repeat(np.arange(len(block)), sizes)
        labels = np.asarray(reader.y[rows], dtype=np.int64)
        if labels.ndim == 2:  # one label per position: count every token but padding
            owner = np.repeat(owner, labels.shape[1])
            labels = labels.reshape(-1)
            keep = labels != reader.handle.ignore_index
            owner, labels = owner[keep], labels[keep]
        flat = np.bincount(owner * num_classes + labels, minlength=len(block) * num_classes)
        out[lo:lo + len(block)] = flat.reshape(len(block), num_classes)
    return out


def summary(handle, reader) -> tuple[dict, np.ndarray]:
    """Headline numbers of a partition (clients, sizes, classes per client, test/validation),
    and the label counts behind them."""
    counts = label_counts(reader, handle.num_classes)
    sizes = np.diff(np.asarray(reader.offsets, dtype=np.int64))  # rows (= label sums per row)
    present = (counts > 0).sum(1)
    return {
        "clients": handle.num_clients, "validation_clients": handle.num_validation_clients,
        "samples": int(sizes.sum()), "validation_samples": len(reader.validation()[1]),
        "test_samples": len(reader.test()[1]), "classes": handle.num_classes,
        "size_min": int(sizes.min()), "size_median": float(np.median(sizes)),
        "size_max": int(sizes.max()), "classes_min": int(present.min()),
        "classes_median": float(np.median(present)), "classes_max": int(present.max()),
    }, counts


def _tv(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return 0.5 * np.abs(p - q).sum(-1)


def _dist(counts: np.ndarray) -> np.ndarray:
    return counts / np.maximum(counts.sum(-1, keepdims=True), 1)


def regime_drift(reader, regime: str | None, clients_per_round: int, rounds: int, seed: int,
                 num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per round, for clients drawn uniformly (keyed by (seed, t)): period drift, the TV
    distance of the sampled pool's labels from the population's; and client drift, the mean TV
    distance of each sampled client's labels (after the regime's re-split) from the pool's."""
    population = _dist(np.bincount(reader.y, minlength=num_classes))
    n = len(reader.offsets) - 1
    period, client = np.zeros(rounds), np.zeros(rounds)
    for t in range(rounds):
        ids = stream(seed, t, SAMPLE).choice(n, clients_per_round, replace=False)
        rows = regime_rows(reader, regime, ids, t, seed)
        per = np.stack([np.bincount(reader.y[r], minlength=num_classes) for r in rows.values()])
        pool = _dist(per.sum(0))
        period[t] = _tv(pool, population)
        client[t] = _tv(_dist(per), pool).mean()
    return period, client


def plot_labels(counts: np.ndarray, path: str, max_clients: int = 100) -> str:
    """Heat map of the label mix of the first ``max_clients`` clients (rows) over classes."""
    shown = _dist(counts[:max_clients])
    fig = mpl_figure.Figure(figsize=(max(4, 0.25 * shown.shape[1] + 2), 6))
    ax = fig.add_subplot()
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1)
    ax.set_xlabel("class")
    ax.set_ylabel(f"client (first {len(shown)} of {len(counts)})")
    ax.set_title("label distribution per client")
    fig.colorbar(im, ax=ax, label="fraction of the client's samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def plot_drift(period: np.ndarray, client: np.ndarray, regime: str, path: str) -> str:
    """Line plot of :func:`regime_drift` over rounds."""
    fig = mpl_figure.Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.plot(period, label="period drift: TV(sampled pool, population)")
    ax.plot(client, label="client drift: mean TV(client, sampled pool)")
    ax.set_xlabel("round")
    ax.set_ylabel("label total variation")
    ax.set_ylim(0, 1)
    ax.set_title(f"regime {regime}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def report(cfg, out_dir: str, rounds: int | None = None, max_clients: int = 100,
           first_clients: int = 10, table_path: str | None = None) -> list[str]:
    """Prepare ``cfg``'s partition, write its plots to ``out_dir`` (and every client's row to
    ``table_path``); returns the printed lines, the first ``first_clients`` clients' rows
    among them."""
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    s, counts = summary(handle, reader)
    rows = np.diff(np.asarray(reader.offsets, dtype=np.int64))
    os.makedirs(out_dir, exist_ok=True)
    d = cfg.data
    lines = [
        f"dataset {d.dataset} | partition {d.stored_partition} | seed {cfg.seed} | {handle.path}",
        f"clients {s['clients']} training + {s['validation_clients']} validation "
        f"({s['validation_samples']} rows) | training samples {s['samples']} | test "
        f"{s['test_samples']}",
        f"samples per client: min {s['size_min']} / median {s['size_median']:g} / max "
        f"{s['size_max']}",
        f"classes {s['classes']} | classes per client: min {s['classes_min']} / median "
        f"{s['classes_median']:g} / max {s['classes_max']}",
        *([f"next-token rows of {handle.label_len} labels: classes count scored tokens "
            "(not padding)"] if handle.label_len else []),
        *head_lines(counts, reader.holdout_sizes(), first_clients, rows),
        "label heat map: " + plot_labels(counts, os.path.join(out_dir, "labels.png"),
                                         max_clients),
    ]
    if table_path is not None:
        lines.append("per-client table: " + write_table(
            client_table(counts, reader.holdout_sizes(), rows), table_path))
    if d.regime:
        r = rounds or cfg.rounds
        period, client = regime_drift(reader, d.regime, cfg.clients_per_round, r, cfg.seed,
                                      handle.num_classes)
        lines.append(f"regime {d.regime} over {r} rounds of {cfg.clients_per_round} clients: "
                     f"period drift {period.mean():.3f}, client drift {client.mean():.3f} "
                     "(mean label TV)")
        lines.append("drift plot: " + plot_drift(period, client, d.regime,
                                                 os.path.join(out_dir, "drift.png")))
    return lines
