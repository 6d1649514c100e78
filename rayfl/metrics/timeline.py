"""``rayfl timeline``: runs side by side on the virtual clock (sync rounds vs FedBuff/FedAsync).

Reads each run directory's ``metrics.parquet`` and draws test accuracy against virtual hours
(one line per run) and, for event-driven runs, the staleness histogram over all their server
updates; prints, per run, the virtual time to each target accuracy.
"""

from __future__ import annotations

import os

import numpy as np

from rayfl.deferred import deferred
from rayfl.metrics.plots import figure
from rayfl.metrics.tables import read_rows
from rayfl.schema import ConfigError

backend_agg = deferred("matplotlib.backends.backend_agg")


def load_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.parquet")
    if not os.path.isfile(path):
        raise ConfigError("run_dir", run_dir, "a run directory holding metrics.parquet")
    return read_rows(path)


def time_to(rows: list[dict], target: float) -> float | None:
    """Virtual seconds at the first evaluation reaching ``target`` test accuracy (None: never)."""
    return next((r["virtual_time_s"] for r in rows if (r.get("test_accuracy") or 0) >= target),
                None)


def staleness_histogram(rows: list[dict]) -> np.ndarray:
    """Arrivals aggregated at each staleness τ = 0, 1, ..., summed over the server updates."""
    hists = [np.asarray(r["staleness_hist"]) for r in rows if r.get("staleness_hist")]
    out = np.zeros(max((len(h) for h in hists), default=0), dtype=np.int64)
    for h in hists:
        out[:len(h)] += h
    return out


def table(runs: dict[str, list[dict]], targets: list[float]) -> str:
    """Markdown: per run, updates, virtual hours, final accuracy and hours to each target."""
    head = ("| run | server updates | virtual hours | final acc (%) | "
            + " | ".join(f"hours to {100 * t:g}%" for t in targets) + " | mean staleness |\n"
            + "|---" * (5 + len(targets)) + "|\n")
    lines = []
    for name, rows in runs.items():
        accs = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
        hist = staleness_histogram(rows)
        mean_tau = f"{(hist * np.arange(len(hist))).sum() / hist.sum():.2f}" if hist.sum() \
            else "—"
        reach = [time_to(rows, t) for t in targets]
        lines.append(f"| {name} | {len(rows)} | {rows[-1]['virtual_time_s'] / 3600:.3f} | "
                     f"{100 * accs[-1]:.2f} | " if accs else f"| {name} | {len(rows)} | — | — | ")
        lines[-1] += " | ".join("—" if s is None else f"{s / 3600:.3f}" for s in reach)
        lines[-1] += f" | {mean_tau} |"
    return head + "\n".join(lines) + "\n"


def plot(runs: dict[str, list[dict]], path: str) -> None:
    """Accuracy against virtual hours (left) and, when some run aggregated stale updates, the
    staleness histograms (right)."""
    hists = {n: staleness_histogram(rows) for n, rows in runs.items()}
    hists = {n: h for n, h in hists.items() if h.sum()}
    fig = figure(figsize=(11, 4.2) if hists else (7, 4.2))
    backend_agg.FigureCanvasAgg(fig)
    acc, tau = fig.subplots(1, 2, width_ratios=[3, 2]) if hists else (fig.subplots(), None)
    for name, rows in runs.items():
        pts = [(r["virtual_time_s"] / 3600, 100 * r["test_accuracy"]) for r in rows
               if r.get("test_accuracy") is not None]
        if pts:
            acc.plot(*zip(*pts), lw=1.5, label=name)
    acc.set_xlabel("virtual time (hours)")
    acc.set_ylabel("test accuracy (%)")
    acc.set_title("Test accuracy on the virtual clock")
    acc.grid(alpha=0.3)
    acc.legend(fontsize=8)
    if tau is not None:
        width = 0.8 / len(hists)
        for i, (name, h) in enumerate(hists.items()):
            tau.bar(np.arange(len(h)) + i * width, h / h.sum(), width=width, label=name)
        tau.set_xlabel("staleness τ (server updates)")
        tau.set_ylabel("fraction of aggregated updates")
        tau.set_title("Staleness of aggregated updates")
        tau.grid(alpha=0.3)
        tau.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def timeline(run_dirs: list[str], out: str | None, targets: list[float]) -> tuple[str, str]:
    """Plot and tabulate the runs; returns (PNG path, Markdown table)."""
    runs = {}
    for d in run_dirs:
        name = os.path.basename(os.path.normpath(d))
        runs[name if name not in runs else d] = load_rows(d)
    out = out or os.path.join(run_dirs[0], "timeline.png")
    plot(runs, out)
    return out, table(runs, targets)
