"""A thousand clients a round under each privacy mechanism: the per-round cost on 2 cores.

    .venv/bin/python benchmarks/privacy/cohort.py [--clients 100000] [--per-round 1000]
        [--rounds 30] [--features 20]

Synthetic logistic data (10 rows a client, 10 classes, ``--features`` features), FedAvg with
logistic regression on 2 single-CPU Ray actors; one run without privacy, then DP-FedAvg
(fixed-size sampling), DP-FTRL (Honaker, b = 50) and banded MF (optimised bands, b = 50). It
prints each run's median wall seconds a round (the first round and the last, which evaluates,
left out), and the median of the server's own parts: planning (availability, the participation
filter) and aggregation (clipping's sum, the noise, the server step); a round's seconds include
the accountant's ε of the round. A short run first warms the data store's pages. Time it only on
an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import rayfl

MECHANISMS = {
    "no privacy": [],
    "dp_fedavg": ["privacy.mechanism=dp_fedavg", "aggregation.weighting=uniform"],
    "dp_ftrl": ["privacy.mechanism=dp_ftrl", "privacy.min_separation=50", "privacy.honaker=true",
                "aggregation.weighting=uniform"],
    "banded_mf": ["privacy.mechanism=banded_mf", "privacy.min_separation=50",
                  "aggregation.weighting=uniform"],
}


def base(clients: int, per_round: int, rounds: int, features: int, out: str) -> dict:
    return {"name": "cohort", "seed": 0, "rounds": rounds, "clients_per_round": per_round,
            "output_dir": out,
            "data": {"dataset": "synthetic", "partition": "label_dirichlet", "alpha": 0.3,
                     "num_clients": clients, "samples_per_client": 10, "features": features,
                     "classes": 10, "test_samples": 1000, "cache_dir": os.path.join(out, "cache")},
            "model": {"name": "logreg"}, "local": {"epochs": 1, "batch_size": 10, "lr": 0.1},
            "runtime": {"num_actors": 2, "cpus_per_actor": 1},
            "eval": {"every": rounds}, "checkpoint": {"every": rounds}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--per-round", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--features", type=int, default=20)
    args = ap.parse_args()
    print(f"{args.clients:,} clients, {args.per_round:,} a round, {args.rounds} rounds, "
          f"logreg on {args.features} features\n")
    print("| mechanism | median s / round | plan s | aggregate s | eligible (last round) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as out:
        cfg = base(args.clients, args.per_round, args.rounds, args.features, out)
        rayfl.run(cfg, ["rounds=3"], quiet=True)  # warms the data store's pages: not reported
        for name, overrides in MECHANISMS.items():
            result = rayfl.run(cfg, overrides, quiet=True)
            rows = result.metrics.to_pylist()[1:-1]
            med = {k: statistics.median(r[k] for r in rows)
                   for k in ("round_s", "plan_s", "aggregate_s")}
            eligible = rows[-1].get("eligible", "—")
            print(f"| {name} | {med['round_s']:.3f} | {med['plan_s']:.4f} | "
                  f"{med['aggregate_s']:.4f} | {eligible} |", flush=True)


if __name__ == "__main__":
    main()
