"""PNG of the online population over virtual time: where period drift comes from, at a glance."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_online(rows: list[dict] | str | os.PathLike, png_path: str | os.PathLike) -> None:
    """Clients online, completed and dropped per round, and the participants' label distance to
    the population (``label_tv``), against virtual hours (against rounds if the clock stood still).

    ``rows`` are metrics rows (dicts as in ``metrics.parquet``) or the path of that file.
    """
    if isinstance(rows, (str, os.PathLike)):
        rows = pq.read_table(rows).to_pylist()
    rows = [r for r in rows if r.get("online") is not None]
    starts = [(r.get("virtual_time_s") or 0.0) - (r.get("virtual_round_s") or 0.0) for r in rows]
    if rows and max(starts) > 0:
        x, xlabel = [s / 3600.0 for s in starts], "virtual time (hours)"
    else:
        x, xlabel = [r.get("round", i) + 1 for i, r in enumerate(rows)], "round"
    fig = Figure(figsize=(6.4, 5.6), dpi=120)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    top.plot(x, [r["online"] for r in rows], lw=1.5, label="online")
    top.set_ylabel("clients online")
    right = top.twinx()
    right.plot(x, [r.get("completed", 0) for r in rows], lw=1.0, color="tab:orange",
               label="completed")
    right.plot(x, [r.get("dropped", 0) for r in rows], lw=1.0, color="tab:red", label="dropped")
    right.set_ylabel("clients per round")
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    top.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper right")
    top.set_title("Client availability")
    top.grid(alpha=0.3)
    tv = [(xi, r["label_tv"]) for xi, r in zip(x, rows) if r.get("label_tv") is not None]
    if tv:
        bottom.plot(*zip(*tv), lw=1.0, color="tab:green")
    bottom.set_ylabel("label TV to population")
    bottom.set_xlabel(xlabel)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
