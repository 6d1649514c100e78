"""PNG of the online population over virtual time: where period drift comes from, at a glance."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def plot_online(rows: list[dict] | str | os.PathLike, png_path: str | os.PathLike) -> None:
    """Online and completed clients per round against virtual hours (rounds if the clock is 0).

    ``rows`` are metrics rows (dicts with ``online``, ``completed``, ``virtual_time_s``,
    ``virtual_round_s``) or the path of a run's ``metrics.parquet``.
    """
    if isinstance(rows, (str, os.PathLike)):
        rows = pq.read_table(rows).to_pylist()
    rows = [r for r in rows if r.get("online") is not None]
    starts = [(r.get("virtual_time_s") or 0.0) - (r.get("virtual_round_s") or 0.0) for r in rows]
    if rows and max(starts) > 0:
        x, xlabel = [s / 3600.0 for s in starts], "virtual time (hours)"
    else:
        x, xlabel = [r.get("round", i) + 1 for i, r in enumerate(rows)], "round"
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(x, [r["online"] for r in rows], lw=1.5, label="online")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("clients online")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.plot(x, [r.get("completed", 0) for r in rows], lw=1.0, color="tab:orange",
               label="completed")
    right.plot(x, [r.get("dropped", 0) for r in rows], lw=1.0, color="tab:red", label="dropped")
    right.set_ylabel("clients per round")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper right")
    ax.set_title("Client availability")
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
