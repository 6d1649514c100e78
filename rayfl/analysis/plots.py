"""The analysis figures (PNG by matplotlib's Agg renderer, built outside pyplot)."""

from __future__ import annotations

import numpy as np

from rayfl.deferred import deferred
from rayfl.metrics.plots import figure

lines = deferred("matplotlib.lines")

MARKERS = {"model": {"marker": "^", "color": "k", "ms": 8},  # the paper's black triangles
           "average": {"marker": "x", "color": "w", "ms": 10, "mew": 2.5},  # its white cross
           "mark": {"marker": "D", "color": "tab:orange", "mec": "k", "ms": 6}}


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path)


def _panels(n: int, width: float = 4.0, height: float = 3.2, rows: int = 1):
    fig = figure(figsize=(width * n, height * rows))
    return fig, fig.subplots(rows, n, squeeze=False)


def plot_line(line, path: str) -> None:
    """Loss and error along β·w1 + (1−β)·w2, with the two models marked (seed 004 Fig. 5)."""
    fig, axes = _panels(2)
    at = {float(b): i for i, b in enumerate(line.beta)}
    for ax, values, name in zip(axes[0], (line.loss, line.error), ("loss", "error")):
        ax.plot(line.beta, values, lw=1.5, color="C0")
        for beta, label in ((0.0, line.w2), (1.0, line.w1)):
            ax.plot(beta, values[at[beta]], "k^", ms=7)
            ax.annotate(label, (beta, values[at[beta]]), fontsize=7, xytext=(3, 6),
                        textcoords="offset points")
        ax.set_xlabel("β  (β·w1 + (1−β)·w2)")
        ax.set_ylabel(f"{name} on {line.data}")
        ax.grid(alpha=0.3)
    _save(fig, path)


def _contour(ax, res, z, title: str) -> None:
    top = np.quantile(z, 0.95)
    levels = np.linspace(z.min(), top if top > z.min() else z.min() + 1e-6, 20)
    cs = ax.contourf(res.a, res.b, z, levels=levels, cmap="viridis", extend="max")
    ax.contour(res.a, res.b, z, levels=levels, colors="k", linewidths=0.3, alpha=0.5)
    ax.figure.colorbar(cs, ax=ax, shrink=0.85, format="%.3g")
    i = np.unravel_index(np.argmin(z), z.shape)
    ax.plot(res.a[i[1]], res.b[i[0]], "*", color="w", mec="k", ms=9, label="grid minimum")
    for p in res.points:
        ax.plot(p["a"], p["b"], ls="", **MARKERS[p["kind"]])
        if p["kind"] != "average":
            ax.annotate(p["label"], (p["a"], p["b"]), fontsize=6, color="w", xytext=(4, 4),
                        textcoords="offset points")
    ax.set_title(title, fontsize=9)
    ax.set_aspect("equal", adjustable="box")


def plot_planes(results: list, path: str) -> None:
    """Loss (top row) and error (bottom row) on each plane: models ▲, their average ✕,
    marked models ◆ (projected), the grid's lowest point ★ (seed 004 Figs. 1, 8–10)."""
    ratios = [plane_aspect(res) for res in results]  # equal axes: width follows each plane
    fig = figure(figsize=(3.6 * sum(ratios) + 1.0 * len(results), 8.0))
    axes = fig.subplots(2, len(results), squeeze=False, gridspec_kw={"width_ratios": ratios})
    for j, res in enumerate(results):
        _contour(axes[0, j], res, res.loss, f"{res.name}: loss")
        _contour(axes[1, j], res, res.error, f"{res.name}: error")
    fig.suptitle(f"loss / error on {results[0].data}", fontsize=9)
    grey = {"mec": "k", "mfc": "0.6"}
    handles = [lines.Line2D([], [], ls="", label="the plane's three models", **MARKERS["model"]),
               lines.Line2D([], [], ls="", label="their plain average",
                      **{**MARKERS["average"], "color": "0.3"}),
               lines.Line2D([], [], ls="", label="marked model (projected)", **MARKERS["mark"]),
               lines.Line2D([], [], ls="", marker="*", ms=9, label="grid minimum", **grey)]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path)


def plane_aspect(res) -> float:
    """Width/height of a plane's grid, clipped to [0.5, 2.5] (the panel's width ratio)."""
    width = float(np.ptp(res.a)) or 1.0
    height = float(np.ptp(res.b)) or 1.0
    return float(np.clip(width / height, 0.5, 2.5))


def plot_decomposition(rows: list[dict], curves: list[dict], path: str) -> None:
    """Theorem 1's bias terms and locality over kept rounds, and error against #models."""
    fig, axes = _panels(3)
    t = [r["round"] for r in rows]
    ax = axes[0, 0]
    for key in ("train_bias", "heter_bias", "bias", "fma_mse"):
        ax.plot(t, [r[key] for r in rows], "o-", ms=3, label=key)
    ax.set_xlabel("kept round")
    ax.set_ylabel("MSE (one-hot) on the cohort's data")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    for key in ("locality", "locality_global"):
        ax.plot(t, [r[key] for r in rows], "o-", ms=3, label=key)
    ax.set_xlabel("kept round")
    ax.set_ylabel("max_k ‖w_k − w‖₂")
    ax.legend(fontsize=7)
    ax = axes[0, 2]
    for r in rows:
        pts = [(c["models"], c["error"]) for c in curves if c["round"] == r["round"]]
        ax.plot(*zip(*pts), "o-", ms=3, label=f"round {r['round']}")
    ax.set_xlabel("client models averaged")
    ax.set_ylabel("test error of their average")
    ax.legend(fontsize=7)
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    _save(fig, path)


def _over_rounds(ax, runs: dict, key: str, log: bool) -> None:
    for name, rows in runs.items():
        pts = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), lw=1.3, label=name)
    ax.set_xlabel("round")
    ax.set_ylabel(key)
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if len(runs) > 1:
        ax.legend(fontsize=7)


def plot_drift(runs: dict, keys: list[str], path: str) -> None:
    """One panel per metric over rounds, one line per run (drift columns on a log scale)."""
    fig, axes = _panels(len(keys), width=3.6)
    for ax, key in zip(axes[0], keys):
        _over_rounds(ax, runs, key, log=key in ("client_drift", "period_drift"))
    _save(fig, path)
