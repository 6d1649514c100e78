"""PNG figures a person would rather look at than read."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy(runs: dict[str, list[dict]], path: str, title: str = "Test accuracy") -> None:
    """Test accuracy over rounds, one line per run."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, rows in runs.items():
        pts = [(r["round"] + 1, r["test_accuracy"]) for r in rows if "test_accuracy" in r]
        if pts:
            ax.plot(*zip(*pts), label=name, lw=1.5)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(runs) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
