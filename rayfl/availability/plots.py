"""PNG of the online population over virtual time: where period drift comes from, at a glance."""

from __future__ import annotations

import os

from rayfl.deferred import deferred
from rayfl.metrics.plots import figure
from rayfl.metrics.tables import read_rows

backend_agg = deferred("matplotlib.backends.backend_agg")


def plot_online(rows: list[dict] | str | os.PathLike, png_path: str | os.PathLike) -> None:
    """Clients online, completed and dropped per round, and the participants' label distance to
    the population (``label_tv``), against virtual hours (against rounds if the clock stood still).

    ``rows`` are metrics rows (dicts as in ``metrics.parquet``) or the path of that file.
    """
    if isinstance(rows, (str, os.PathLike)):
        rows = read_rows(rows)
    rows = [r for r in rows if r.get("online") is not None]
    starts = [(r.get("virtual_time_s") or 0.0) - (r.get("virtual_round_s") or 0.0) for r in rows]
    if rows and max(starts) > 0:
        x, xlabel = [s / 3600.0 for s in starts], "virtual time (hours)"
    else:
        x, xlabel = [r.get("round", i + 1) for i, r in enumerate(rows)], "round"
    fig = figure(figsize=(6.4, 5.6))
    backend_agg.FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    top.plot(x, [r["online"] for r in rows], lw=1.5, label="online")
    top.set_ylabel("clients online")
    _from_zero(top, [r["online"] for r in rows])
    right = top.twinx()
    right.plot(x, [r.get("completed", 0) for r in rows], lw=1.0, color="tab:orange",
               label="completed")
    right.plot(x, [r.get("dropped", 0) for r in rows], lw=1.0, color="tab:red", label="dropped")
    right.set_ylabel("clients per round")
    _from_zero(right, [v for r in rows for v in (r.get("completed", 0), r.get("dropped", 0))])
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    top.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper right")
    top.set_title("Client availability: online (left axis), completed and dropped (right)")
    top.grid(alpha=0.3)
    tv = [(xi, r["label_tv"]) for xi, r in zip(x, rows) if r.get("label_tv") is not None]
    if tv:
        bottom.plot(*zip(*tv), lw=1.0, color="tab:green")
    bottom.set_ylabel("label TV to population")
    bottom.set_ylim(0, 1)
    bottom.set_xlabel(xlabel)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)


def _from_zero(ax, values: list) -> None:
    """Counts from 0 to 30 % above their maximum (room for the legend), so a constant is a
    flat line at its value rather than the middle of a ±4 % window."""
    top = max([v or 0 for v in values], default=0)
    ax.set_ylim(0, max(1.0, 1.3 * top))
