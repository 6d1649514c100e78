"""IMA (seed 004) Table I, Fashion-MNIST CNN rows, at the paper's protocol; resumable.

For each partition (Dirichlet α = 0.1; #C = 2 label-sorted shards) and seed: a FedAvg run of
300 rounds that keeps its checkpoint of round t_s − P + 1 = 221, then FedAvg+IMA (t_s = 225,
P = 5, lr × 0.97 per round after t_s) forked from it, sharing the first 221 rounds. Runs that
finished are reused, runs that stopped are resumed, so the command can be re-run until the table
is complete. Metric: the mean test accuracy of the last 10 rounds, as in the paper
(``mean_last_10_evals_accuracy``: the config evaluates every 10th round and each of the last 10).

    python benchmarks/papers/ima_table1.py --out runs/papers/ima --seeds 0,1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import rayfl
from rayfl.fork import fork

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "papers",
                      "ima_fmnist.yaml")
FORK_AT = 221  # t_s − P + 1 with t_s = ⌊0.75 · 300⌋ = 225 and P = 5: IMA's window is empty here
PARTITIONS = {"alpha0.1": ["data.partition=dirichlet", "data.alpha=0.1"],
              "C2": ["data.partition=shards", "data.shards_per_client=2"]}
PAPER = {"alpha0.1": (80.13, 83.06), "C2": (81.17, 84.68)}  # FedAvg (FedAvg+IMA), Table I


def _finished(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, "summary.json")
    return json.load(open(path)) if os.path.isfile(path) else None


def _run(run_dir: str, start) -> dict:
    """The run's summary: read when finished, resumed when stopped, else started."""
    done = _finished(run_dir)
    if done is not None:
        return done
    if os.path.isfile(os.path.join(run_dir, "config.yaml")):
        return rayfl.resume(run_dir, quiet=True).summary
    return start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/papers/ima")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--partitions", default=",".join(PARTITIONS))
    ap.add_argument("overrides", nargs="*", help="extra overrides (e.g. runtime.num_actors=2)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for part in args.partitions.split(","):
        accs: dict[str, list[float]] = {"fedavg": [], "fedavg+ima": []}
        for seed in seeds:
            base_dir = os.path.abspath(os.path.join(args.out, f"fedavg-{part}-s{seed}"))
            over = [*PARTITIONS[part], f"seed={seed}", "wrappers=[]",
                    f"checkpoint.keep=[{FORK_AT}]", f"name=fedavg-{part}", *args.overrides]
            base = _run(base_dir, lambda: rayfl.run(CONFIG, over, run_dir=base_dir,
                                                    quiet=True).summary)
            ima_dir = os.path.abspath(os.path.join(args.out, f"ima-{part}-s{seed}"))
            ima = _run(ima_dir, lambda: fork(base_dir, FORK_AT, [
                "wrappers.ima.window=5", "wrappers.ima.start=0.75",
                "wrappers.ima.decay_after=0.97", f"name=ima-{part}"],
                run_dir=ima_dir, quiet=True).summary)
            accs["fedavg"].append(100 * base["mean_last_10_evals_accuracy"])
            accs["fedavg+ima"].append(100 * ima["mean_last_10_evals_accuracy"])
            print(f"{part} seed {seed}: fedavg {accs['fedavg'][-1]:.2f}  "
                  f"+ima {accs['fedavg+ima'][-1]:.2f}", flush=True)
        rows.append((part, accs))
    print("\n| partition | paper FedAvg (+IMA) | rayfl FedAvg | rayfl FedAvg+IMA | "
          "paper gain | rayfl gain | seeds |")
    print("|---|---|---|---|---|---|---|")
    for part, accs in rows:
        p0, p1 = PAPER[part]
        gains = [b - a for a, b in zip(accs["fedavg"], accs["fedavg+ima"])]
        print(f"| {part} | {p0:.2f} ({p1:.2f}) | {_ms(accs['fedavg'])} | "
              f"{_ms(accs['fedavg+ima'])} | {p1 - p0:+.2f} | {_ms(gains, '+')} | "
              f"{','.join(map(str, seeds))} |")


def _ms(values: list[float], sign: str = "") -> str:
    mean = statistics.fmean(values)
    sd = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{mean:{sign}.2f}{sd}"


if __name__ == "__main__":
    main()
