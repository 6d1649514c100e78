"""FedProx (Li et al., MLSys 2020) on Synthetic(1, 1) with 0 %, 50 % and 90 % stragglers; resumable.

The paper's three methods on its systems-heterogeneity protocol (``configs/papers/
fedprox_synthetic.yaml``: 30 clients, 10 a round, E = 20, B = 10, lr 0.01, 200 rounds): FedAvg
drops the stragglers (``availability.deadline_policy=drop``); FedProx keeps their partial work
(1..E−1 epochs, ``partial``) with μ = 0 and with μ = 1. The paper's claims, read from its
Figure 1 (curves, no table): keeping partial work beats dropping it as stragglers grow, and
μ = 1 makes training stable where μ = 0 oscillates; the abstract: +22 % absolute test accuracy
on average over its datasets in highly heterogeneous settings. Prints the table and draws
``fedprox_synthetic.png`` (test loss against rounds, a panel per straggler share).

    python benchmarks/papers/fedprox_synthetic.py --out runs/papers/fedprox --seeds 0,1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import pyarrow.parquet as pq

import rayfl

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "papers",
                      "fedprox_synthetic.yaml")
METHODS = {  # label: (run name, overrides)
    "FedAvg (drop)": ("fedavg", ["algorithm.name=fedavg", "availability.deadline_policy=drop"]),
    "FedProx μ=0": ("fedprox-mu0", ["algorithm.name=fedprox", "algorithm.mu=0",
                                    "availability.deadline_policy=partial"]),
    "FedProx μ=1": ("fedprox-mu1", ["algorithm.name=fedprox", "algorithm.mu=1",
                                    "availability.deadline_policy=partial"])}
STRAGGLERS = (0.0, 0.5, 0.9)


def _run(run_dir: str, overrides: list[str]) -> list[dict]:
    """The run's metrics rows: read when finished, else (re)started from scratch."""
    if not os.path.isfile(os.path.join(run_dir, "summary.json")):
        rayfl.run(CONFIG, overrides, run_dir=_fresh(run_dir), quiet=True)
    return pq.read_table(os.path.join(run_dir, "metrics.parquet")).to_pylist()


def _fresh(run_dir: str) -> str:
    """An unfinished run of this script is restarted: it takes seconds."""
    if os.path.isdir(run_dir):
        import shutil

        shutil.rmtree(run_dir)
    return run_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/papers/fedprox")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("overrides", nargs="*", help="extra overrides (e.g. rounds=20 to try it)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    curves: dict[float, dict[str, list[list[dict]]]] = {}
    table = []
    for share in STRAGGLERS:
        curves[share] = {}
        for method, (tag, over) in METHODS.items():
            runs = []
            for seed in seeds:
                run_dir = os.path.abspath(os.path.join(
                    args.out, f"{tag}-stragglers{int(100 * share)}-seed{seed}"))
                runs.append(_run(run_dir, [*over, f"availability.stragglers={share}",
                                           f"seed={seed}", "runtime.executor=inprocess",
                                           f"name={tag}", *args.overrides]))
            curves[share][method] = runs
            table.append((share, method, runs))
    print("| stragglers | method | final test acc (%) | mean last-10 acc (%) | "
          "final test loss | max test loss, last 50 rounds | seeds |")
    print("|---|---|---|---|---|---|---|")
    for share, method, runs in table:
        acc = [100 * r[-1]["test_accuracy"] for r in runs]
        last10 = [100 * statistics.fmean(x["test_accuracy"] for x in r[-10:]) for r in runs]
        loss = [r[-1]["test_loss"] for r in runs]
        worst = [max(x["test_loss"] for x in r[-50:]) for r in runs]
        print(f"| {100 * share:.0f} % | {method} | {_ms(acc)} | {_ms(last10)} | "
              f"{_ms(loss, 3)} | {_ms(worst, 3)} | {len(runs)} |")
    _plot(curves, os.path.join(args.out, "fedprox_synthetic.png"))
    with open(os.path.join(args.out, "table.json"), "w") as f:
        json.dump([{"stragglers": s, "method": m, "final_accuracy": [r[-1]["test_accuracy"]
                                                                     for r in runs]}
                   for s, m, runs in table], f, indent=1)


def _ms(values: list[float], digits: int = 2) -> str:
    sd = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.{digits}f}{sd}"


def _plot(curves, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4), sharey=True)
    for ax, (share, methods) in zip(axes, curves.items()):
        for method, runs in methods.items():
            for i, rows in enumerate(runs):
                ax.plot([r["round"] for r in rows], [r["test_loss"] for r in rows],
                        color=f"C{list(methods).index(method)}", alpha=0.8, lw=1,
                        label=method if i == 0 else None)
        ax.set_title(f"{100 * share:.0f} % stragglers")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test loss")
    axes[0].legend()
    fig.suptitle("FedProx Synthetic(1, 1): FedAvg drops stragglers, FedProx keeps their work")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
