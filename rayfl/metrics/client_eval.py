"""Per-client accuracy as users see it: summary columns of ``metrics.parquet``, every client's
score in ``client_eval.parquet`` and the figure ``client_accuracy.png``.

Accuracies are fractions in the files and percent in the figure, like the test accuracy. Over
the m evaluated clients (each client counts once, whatever its size): the mean, the 10th, 50th
and 90th percentiles (numpy's linear interpolation) and ``worst10``, the mean accuracy of the
⌈m/10⌉ clients that score lowest.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pyarrow.parquet as pq

from rayfl.metrics.files import write_parquet
from rayfl.metrics.plots import evaluated, figure, ticker
from rayfl.metrics.tables import read_rows

STATS = ("mean", "p10", "p50", "p90", "worst10")

#: the columns of one client's row of scores (what the per-client evaluation returns)
COLUMNS = ("client", "samples", "accuracy", "loss", "personal_accuracy", "personal_loss")


def distribution(acc: np.ndarray) -> dict[str, float]:
    """:data:`STATS` of per-client accuracies (NaN for none)."""
    acc = np.sort(np.asarray(acc, dtype=np.float64))
    if not len(acc):
        return {s: float("nan") for s in STATS}
    p10, p50, p90 = np.percentile(acc, [10, 50, 90])
    return {"mean": float(acc.mean()), "p10": float(p10), "p50": float(p50), "p90": float(p90),
            "worst10": float(acc[:math.ceil(len(acc) / 10)].mean())}


def summary_columns(scores: np.ndarray, personal: bool) -> dict:
    """The metrics row's per-client columns from :func:`~rayfl.runtime.client_eval.score_clients`
    rows: ``clients_evaluated``, ``client_accuracy_*`` and (fine-tuning on)
    ``personal_accuracy_*``."""
    out = {"clients_evaluated": len(scores)}
    names = ("client_accuracy", "personal_accuracy") if personal else ("client_accuracy",)
    for name in names:
        col = scores[:, COLUMNS.index(name.removeprefix("client_"))]
        out.update({f"{name}_{s}": v for s, v in distribution(col).items()})
    return out


class ClientEvalLog:
    """Every evaluated client's row (round 1-based, as in ``metrics.parquet``; the personal
    columns null without fine-tuning), rewritten atomically to ``client_eval.parquet`` after
    each evaluation."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, "client_eval.parquet")
        self.rows: list[dict] = []

    def append(self, round_: int, scores: np.ndarray) -> None:
        for s in scores:
            row = {"round": round_, **{c: float(v) if np.isfinite(v) else None
                                       for c, v in zip(COLUMNS, s)}}
            row["client"], row["samples"] = int(row["client"]), int(row["samples"])
            self.rows.append(row)

    def truncate(self, last_round: int) -> None:
        """Keep the rows of rounds up to ``last_round`` (1-based; resume after a crash)."""
        if os.path.isfile(self.path):
            self.rows = [r for r in pq.read_table(self.path).to_pylist()
                         if r["round"] <= last_round]

    def flush(self) -> None:
        write_parquet(self.rows, self.path)


def plot_client_accuracy(rows: list[dict], client_rows: list[dict], path: str,
                         title: str) -> bool:
    """Left: per-client test accuracy (%) over rounds, mean and median lines with 10–90th
    percentile bands (fine-tuned too when present), the global test accuracy for reference;
    right: histogram of the clients' accuracies at the last evaluation. False if nothing to
    draw (per-client evaluation off)."""
    evals = [r for r in rows if r.get("client_accuracy_mean") is not None]
    if not evals:
        return False
    fig = figure(figsize=(11, 5.6))
    ax, hist = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    x = [r["round"] for r in evals]
    for name, label, color in (("client_accuracy", "global model", "tab:blue"),
                               ("personal_accuracy", "after fine-tuning", "tab:orange")):
        if evals[0].get(f"{name}_mean") is None:
            continue
        pct = {s: [100 * r[f"{name}_{s}"] for r in evals] for s in STATS}
        ax.fill_between(x, pct["p10"], pct["p90"], color=color, alpha=0.2, lw=0,
                        label=f"{label}: 10th–90th percentile of clients")
        ax.plot(x, pct["mean"], color=color, lw=1.5, label=f"{label}: mean over clients")
        ax.plot(x, pct["p50"], color=color, lw=1.0, ls="--", label=f"{label}: median")
        ax.plot(x, pct["worst10"], color=color, lw=1.0, ls=":",
                label=f"{label}: worst 10 % of clients (mean)")
    test = evaluated(rows)
    if test:
        ax.plot(*zip(*[(t, 100 * v) for t, v in test]), color="black", lw=1.0, alpha=0.6,
                label="global test set (reference)")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_ylabel("accuracy on clients' held-out rows (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    last = max(r["round"] for r in client_rows) if client_rows else None
    final = [r for r in client_rows if r["round"] == last]
    bins = np.linspace(0, 100, 21)
    hist.hist([100 * r["accuracy"] for r in final], bins=bins, color="tab:blue", alpha=0.6,
              label="global model")
    personal = [100 * r["personal_accuracy"] for r in final
                if r.get("personal_accuracy") is not None and np.isfinite(r["personal_accuracy"])]
    if personal:
        hist.hist(personal, bins=bins, color="tab:orange", alpha=0.6, label="after fine-tuning")
    hist.set_xlabel("client accuracy (%)")
    hist.set_ylabel("clients")
    hist.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    hist.set_title(f"last evaluation (round {last}): {len(final)} clients")
    hist.legend(fontsize=7)
    hist.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True


def plot_run_clients(run_dir: str, rows: list[dict], title: str) -> str | None:
    """``client_accuracy.png`` of a run directory with per-client evaluation (else None)."""
    path = os.path.join(run_dir, "client_eval.parquet")
    if not os.path.isfile(path):
        return None
    png = os.path.join(run_dir, "client_accuracy.png")
    return png if plot_client_accuracy(rows, read_rows(path), png, title) \
        else None
