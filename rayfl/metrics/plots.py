"""PNG figures a person would rather look at than read.

Figures are built outside pyplot and written as PNG by matplotlib's Agg renderer. Rounds are
numbered from 1 as in ``metrics.parquet``; accuracies are drawn in percent, as the
terminal prints them. Rows whose evaluation is missing (``eval.every > 1``) are skipped, so the
lines join the evaluated rounds.
"""

from __future__ import annotations

import numpy as np

from rayfl.deferred import deferred

mpl_figure, ticker = deferred("matplotlib.figure"), deferred("matplotlib.ticker")


def figure(**kwargs) -> mpl_figure.Figure:
    """A figure of its own, outside pyplot: writing it never touches the backend or the open
    figures of the process (a notebook that imports rayfl keeps its inline plots)."""
    return mpl_figure.Figure(dpi=120, **kwargs)


def evaluated(rows: list[dict], key: str = "test_accuracy") -> list[tuple[int, float]]:
    """(round, value) of the rows that hold a finite ``key`` (missing and None skipped)."""
    return [(r["round"], float(r[key])) for r in rows
            if r.get(key) is not None and np.isfinite(r[key])]


def _finish(fig, ax, path: str, title: str, legend: bool) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def plot_accuracy(runs: dict[str, list[dict]], path: str, title: str = "Test accuracy") -> int:
    """Test accuracy (%) over rounds, one line per run (its name in the legend).

    Returns the number of lines drawn.
    """
    fig = figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    drawn = 0
    for name, rows in runs.items():
        pts = evaluated(rows)
        if pts:
            x, y = zip(*pts)
            ax.plot(x, [100 * v for v in y], label=name, lw=1.5, marker="." if len(x) < 30
                    else None)
            drawn += 1
    _finish(fig, ax, path, title, drawn > 0)
    return drawn


def seed_band(runs: list[list[dict]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean, std) of test accuracy over seeds, on the rounds every seed evaluated."""
    series = [dict(evaluated(rows)) for rows in runs]
    common = sorted(set.intersection(*(set(s) for s in series))) if series else []
    values = np.array([[s[t] for t in common] for s in series], dtype=np.float64)
    if not common:
        return np.array([]), np.array([]), np.array([])
    return np.array(common), values.mean(0), values.std(0)


def plot_accuracy_bands(groups: dict[str, list[list[dict]]], path: str,
                        title: str = "Test accuracy") -> int:
    """Mean test accuracy (%) over seeds per group with a ±1 std band; returns lines drawn."""
    fig = figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    drawn = 0
    for name, runs in groups.items():
        x, mean, std = seed_band(runs)
        if len(x):
            line, = ax.plot(x, 100 * mean, lw=1.5, label=f"{name} (mean of {len(runs)} seeds)")
            ax.fill_between(x, 100 * (mean - std), 100 * (mean + std), alpha=0.2,
                            color=line.get_color(), lw=0)
            drawn += 1
    ax.plot([], [], " ", label="band: ± 1 std over seeds")
    _finish(fig, ax, path, title, drawn > 0)
    return drawn
