"""DP-FedAvg, DP-FTRL and banded MF on Fashion-MNIST at ε = 2 and 8 (the table of
docs/howto/privacy.md).

    .venv/bin/python benchmarks/privacy/mechanisms.py run     # the runs not yet in the results
    .venv/bin/python benchmarks/privacy/mechanisms.py table   # the markdown table
    .venv/bin/python benchmarks/privacy/mechanisms.py noise   # the noise each mechanism adds

Each row takes configs/privacy/fmnist_mechanisms.yaml with its mechanism and availability,
calibrates the noise multiplier z so that the worst-case ε after the config's rounds is the
target (``rayfl.privacy.calibrate``, at the config's δ), runs it (runs/privacy-mechanisms/) and
appends one JSON line to benchmarks/privacy/mechanisms.jsonl as soon as it finishes.
Participation counts come from participation.parquet (DP-FTRL, banded MF); DP-FedAvg keeps no
such record, so its counts are the sampler's draws replayed for the run's seed (the same code
and generator keys the run used).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import rayfl
from rayfl import config as config_mod
from rayfl import privacy

CONFIG = os.path.join(ROOT, "configs", "privacy", "fmnist_mechanisms.yaml")
RESULTS = os.path.join(ROOT, "benchmarks", "privacy", "mechanisms.jsonl")
OUTPUT = os.path.join(ROOT, "runs", "privacy-mechanisms")
EPSILONS = (8.0, 2.0)
MECHANISMS = {  # row name -> overrides of the base config
    "DP-FedAvg": ["privacy.mechanism=dp_fedavg"],
    "DP-FTRL": ["privacy.mechanism=dp_ftrl", "privacy.min_separation=25",
                "privacy.honaker=true"],
    "banded MF": ["privacy.mechanism=banded_mf", "privacy.min_separation=25"],
}
AVAILABILITY = {"always": ["availability.model=always"],
                "diurnal": ["availability.model=diurnal"]}
MODELS = {"logreg": ["model.name=logreg"],  # 7,850 parameters
          "mlp": ["model.name=mlp"]}  # 784-100-100-10: 89,610 parameters, more noise to bear


REFERENCE = "clipping only"  # z = 0: the accuracy the noise costs is measured against it


def rows() -> list[tuple[str, str, str, float, list[str]]]:
    """(model, mechanism, availability, target ε, overrides) of every row, cheapest first."""
    out = []
    for model, m_over in MODELS.items():
        out.append((model, REFERENCE, "always", math.inf, m_over + MECHANISMS["DP-FedAvg"]
                    + AVAILABILITY["always"]))
        for eps in EPSILONS:
            for mech, over in MECHANISMS.items():
                for avail, a_over in AVAILABILITY.items():
                    if mech == "DP-FedAvg" and avail != "always":
                        continue  # refused: its ε rests on uniform sampling
                    out.append((model, mech, avail, eps, m_over + over + a_over))
    return out


def _key(r: dict) -> tuple[str, str, str, float]:
    return r.get("model", "logreg"), r["mechanism"], r["availability"], r["target_epsilon"]


def done() -> set[tuple[str, str, str, float]]:
    if not os.path.isfile(RESULTS):
        return set()
    with open(RESULTS) as f:
        return {_key(r) for r in map(json.loads, f)}


def replayed_counts(cfg) -> np.ndarray:
    """DP-FedAvg's participations per client: the sampler's plans for the run's seed."""
    from rayfl.availability import make_sampler
    from rayfl.runtime.local import spec_from_config
    from rayfl.simulation import _prepare

    handle = _prepare(cfg)
    sampler = make_sampler(cfg.availability, handle, cfg.clients_per_round, cfg.seed,
                           spec_from_config(cfg.local), selection=cfg.selection)
    counts = np.zeros(handle.num_clients, dtype=np.int64)
    for t in range(cfg.rounds):
        counts[sampler.plan(t).clients] += 1
    return counts


def run_one(model: str, mech: str, avail: str, eps: float, overrides: list[str]) -> dict:
    cfg = config_mod.load(CONFIG, overrides)
    z = 0.0 if mech == REFERENCE else privacy.calibrate(cfg, eps)
    name = f"{model}-{mech.replace(' ', '').lower()}-{avail}-eps{eps:g}"
    result = rayfl.run(CONFIG, overrides + [f"privacy.noise_multiplier={z!r}", f"name={name}",
                                            f"output_dir={OUTPUT}"], quiet=True)
    s = result.summary
    path = os.path.join(result.run_dir, "participation.parquet")
    if os.path.isfile(path):
        counts = np.array(pq.read_table(path).column("participations").to_pylist())
    else:
        counts = replayed_counts(cfg)
        counts = counts[counts > 0]
    metrics = result.metrics.to_pylist()
    return {"model": model, "mechanism": mech, "availability": avail, "target_epsilon": eps,
            "noise_multiplier": z, "epsilon": s["epsilon"],
            "epsilon_individual_median": s.get("participation", {}).get(
                "epsilon_individual_median"),
            "final_accuracy": s["final_accuracy"],
            "mean_last_accuracy": s[f"mean_last_{cfg.eval.last_k}_evals_accuracy"],
            "rounds": s["rounds"], "clients": len(counts),
            "participations_mean": float(counts.mean()), "participations_max": int(counts.max()),
            "clients_per_round_mean": float(np.mean([r["completed"] for r in metrics])),
            "mean_round_s": s["mean_round_s"], "run_dir": os.path.relpath(result.run_dir, ROOT)}


def table() -> str:
    with open(RESULTS) as f:
        results = [json.loads(line) for line in f]
    order = {r[:4]: i for i, r in enumerate(rows())}
    results.sort(key=lambda r: order.get(_key(r), 99))
    head = ("| model | ε (δ = 6.98e-5) | mechanism | availability | z | ε reached (worst case) "
            "| ε median client | final accuracy | clients per round | clients that took part | "
            "participations mean / max |")
    out = [head, "|" + "---|" * 11]
    for r in results:
        med = r["epsilon_individual_median"]
        out.append(
            f"| {r.get('model', 'logreg')} | {r['target_epsilon']:g} | {r['mechanism']} | "
            f"{r['availability']} | "
            f"{r['noise_multiplier']:.3f} | {r['epsilon']:.3f} | "
            f"{'—' if med is None else f'{med:.3f}'} | {100 * r['final_accuracy']:.2f}% | "
            f"{r['clients_per_round_mean']:.1f} | {r['clients']} | "
            f"{r['participations_mean']:.2f} / {r['participations_max']} |")
    return "\n".join(out)


def noise_table(rounds: int = 100, separation: int = 25, participations: int = 4) -> str:
    """The standard deviation of the noise in the model after ``rounds`` rounds, per coordinate
    in units of S, at the noise multiplier that gives ε = 8 and 2 (δ = 6.98e-5) to a client taking
    part ``participations`` times at least ``separation`` rounds apart (DP-FedAvg: sampling
    200 of 6,000 uniformly, no bound): the variance of the mechanisms' own generators over
    20,000 coordinates (one seed), no training."""
    from rayfl.privacy import banded, tree

    def final_variance(source) -> float:  # Var of the prefix noise after `rounds` rounds
        dim, total = 20_000, np.zeros(20_000)
        for t in range(rounds):
            total += source.round_noise(t, dim)
        return float(total.var())

    base = [f"rounds={rounds}"]
    sep = f"privacy.min_separation={separation}"
    lines = {"DP-FedAvg (independent, amplified)": (["privacy.mechanism=dp_fedavg"],
                                                     lambda: float(rounds)),
             "DP-FTRL, one tree": (["privacy.mechanism=dp_ftrl", sep],
                                   lambda: final_variance(tree.TreeNoise(0))),
             "DP-FTRL, one tree, Honaker": (["privacy.mechanism=dp_ftrl", sep,
                                             "privacy.honaker=true"],
                                            lambda: final_variance(tree.TreeNoise(0, None, True))),
             f"DP-FTRL, restart every {separation}, Honaker": (
                 ["privacy.mechanism=dp_ftrl", sep, f"privacy.restart={separation}",
                  "privacy.honaker=true"],
                 lambda: final_variance(tree.TreeNoise(0, separation, True)))}
    for method in ("sqrt", "optimized"):
        for bands in (1, 5, separation):
            lines[f"banded MF, {bands} bands, {method}"] = (
                ["privacy.mechanism=banded_mf", sep, f"privacy.bands={bands}",
                 f"privacy.band_coefficients={method}"],
                lambda b=bands, m=method: final_variance(banded.BandedNoise(
                    0, banded.coefficients(b, m, rounds))))
    out = ["| mechanism | z at ε = 8 | noise std at ε = 8 | z at ε = 2 | noise std at ε = 2 |",
           "|---|---|---|---|---|"]
    for name, (overrides, variance) in lines.items():
        cfg = config_mod.load(CONFIG, base + overrides)
        v = variance()
        cells = []
        for eps in EPSILONS:
            z = privacy.calibrate(cfg, eps)
            cells += [f"{z:.3f}", f"{z * np.sqrt(v):.2f}"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "table", "noise"])
    args = parser.parse_args()
    if args.command != "run":
        print(table() if args.command == "table" else noise_table())
        return
    for model, mech, avail, eps, overrides in rows():
        if (model, mech, avail, eps) in done():
            continue
        record = run_one(model, mech, avail, eps, overrides)
        with open(RESULTS, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
