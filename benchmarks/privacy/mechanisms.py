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
    "DP-FedAvg": ["privacy.mechanism=dp_fedavg"],  # fixed-size sampling: replace-one
    "DP-FedAvg, Poisson": ["privacy.mechanism=dp_fedavg", "privacy.sampling=poisson"],
    "DP-FTRL": ["privacy.mechanism=dp_ftrl", "privacy.min_separation=25",
                "privacy.honaker=true"],
    "banded MF": ["privacy.mechanism=banded_mf", "privacy.min_separation=25"],
}
AVAILABILITY = {"always": ["availability.model=always"],
                "diurnal": ["availability.model=diurnal"]}
MODELS = {"logreg": ["model.name=logreg"],  # 7,850 parameters
          "mlp": ["model.name=mlp"]}  # 784-100-100-10: 89,610 parameters, more noise to bear
SEEDS = {"logreg": (0,), "mlp": (0, 1, 2)}
REFERENCE = "clipping only"  # z = 0: the accuracy the noise costs is measured against it

Key = tuple[str, str, str, float, int]  # model, mechanism, availability, target ε, seed


def rows() -> list[tuple[Key, list[str]]]:
    """(key, overrides) of every run, seed by seed, cheapest first."""
    out = []
    for seed in sorted({s for seeds in SEEDS.values() for s in seeds}):
        for model, m_over in MODELS.items():
            if seed not in SEEDS[model]:
                continue
            base = m_over + [f"seed={seed}"]
            out.append(((model, REFERENCE, "always", math.inf, seed),
                        base + MECHANISMS["DP-FedAvg"] + AVAILABILITY["always"]))
            for eps in EPSILONS:
                for mech, over in MECHANISMS.items():
                    for avail, a_over in AVAILABILITY.items():
                        if mech.startswith("DP-FedAvg") and avail != "always":
                            continue  # refused: its ε rests on uniform sampling
                        out.append(((model, mech, avail, eps, seed), base + over + a_over))
    return out


def _key(r: dict) -> Key:
    return (r.get("model", "logreg"), r["mechanism"], r["availability"], r["target_epsilon"],
            r.get("seed", 0))


def done() -> set[Key]:
    if not os.path.isfile(RESULTS):
        return set()
    with open(RESULTS) as f:
        return {_key(r) for r in map(json.loads, f)}


def replayed_counts(cfg) -> np.ndarray:
    """DP-FedAvg's participations per client: the sampler's plans for the run's seed."""
    from rayfl.availability import make_sampler
    from rayfl.runtime.local import spec_from_config
    from rayfl.simulation import preflight as _prepare

    handle = _prepare(cfg)
    poisson = cfg.privacy.sampling == "poisson"
    sampler = make_sampler(cfg.availability, handle, cfg.clients_per_round, cfg.seed,
                           spec_from_config(cfg.local), selection=cfg.selection,
                           poisson_rate=cfg.clients_per_round / handle.num_clients if poisson
                           else None)
    counts = np.zeros(handle.num_clients, dtype=np.int64)
    for t in range(cfg.rounds):
        counts[sampler.plan(t).clients] += 1
    return counts


def run_one(key: Key, overrides: list[str]) -> dict:
    model, mech, avail, eps, seed = key
    cfg = config_mod.load(CONFIG, overrides)
    z = 0.0 if mech == REFERENCE else privacy.calibrate(cfg, eps)
    short = mech.replace(' ', '').replace(',', '-').lower()
    name = f"{model}-{short}-{avail}-eps{eps:g}-seed{seed}"
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
            "seed": seed,
            "noise_multiplier": z, "epsilon": s["epsilon"],
            "relation": s["privacy"]["neighbouring_relation"] if z > 0 else None,
            "epsilon_individual_median": s.get("participation", {}).get(
                "epsilon_individual_median"),
            "final_accuracy": s["final_accuracy"],
            "mean_last_accuracy": s[f"mean_last_{cfg.eval.last_k}_evals_accuracy"],
            "rounds": s["rounds"], "clients": len(counts),
            "participations_mean": float(counts.mean()), "participations_max": int(counts.max()),
            "clients_per_round_mean": float(np.mean([r["completed"] for r in metrics])),
            "mean_round_s": s["mean_round_s"], "run_dir": os.path.relpath(result.run_dir, ROOT)}


def table() -> str:
    """One line per row of :func:`rows` with a result; accuracy over the seeds that finished."""
    with open(RESULTS) as f:
        results = [json.loads(line) for line in f]
    by_row: dict[tuple, list[dict]] = {}
    for r in sorted(results, key=lambda r: r.get("seed", 0)):
        by_row.setdefault(_key(r)[:4], []).append(r)
    head = ("| model | ε (δ = 6.98e-5) | mechanism | neighbours | availability | z "
            "| ε reached (worst case) "
            "| ε median client | final accuracy | clients per round | clients that took part | "
            "participations mean / max |")
    out = [head, "|" + "---|" * 12]
    for key in dict.fromkeys(k[:4] for k, _ in rows()):
        if key not in by_row:
            continue
        seeds = by_row[key]
        r, accs = seeds[0], [100 * x["final_accuracy"] for x in seeds]
        acc = f"{accs[0]:.2f}%" if len(accs) == 1 else (
            f"{np.mean(accs):.2f}% ({', '.join(f'{a:.2f}' for a in accs)}; {len(accs)} seeds)")
        med = r["epsilon_individual_median"]
        out.append(
            f"| {r.get('model', 'logreg')} | {r['target_epsilon']:g} | {r['mechanism']} | "
            f"{r['relation'] or '—'} | {r['availability']} | {r['noise_multiplier']:.3f} | "
            f"{'∞' if r['epsilon'] is None else format(r['epsilon'], '.3f')} | "
            f"{'—' if med is None else f'{med:.3f}'} | {acc} | "
            f"{r['clients_per_round_mean']:.1f} | {r['clients']} | "
            f"{r['participations_mean']:.2f} / {r['participations_max']} |")
    return "\n".join(out)


def noise_table(rounds: int = 100, separation: int = 25) -> str:
    """The noise in the model, per coordinate in units of S: its standard deviation after
    ``rounds`` rounds and its root mean square over the rounds, at the noise multiplier that
    gives ε = 8 and 2 (δ = 6.98e-5) to a client taking part at most ⌈rounds / separation⌉ times
    at least ``separation`` rounds apart (DP-FedAvg: 200 of 6,000 sampled uniformly, no bound).
    Measured on the mechanisms' own generators over 20,000 coordinates (one seed); no
    training."""
    from rayfl.privacy import banded, tree

    def variances(source) -> tuple[float, float]:  # (after the last round, mean over rounds)
        dim, total, each = 20_000, np.zeros(20_000), []
        for t in range(rounds):
            total += source.round_noise(t, dim)
            each.append(total.var())
        return float(each[-1]), float(np.mean(each))

    base = [f"rounds={rounds}"]
    sep = f"privacy.min_separation={separation}"
    independent = lambda: (float(rounds), (rounds + 1) / 2)  # noqa: E731
    lines = {"DP-FedAvg, fixed size (replace-one)": (["privacy.mechanism=dp_fedavg"],
                                                     independent),
             "DP-FedAvg, Poisson (add-or-remove-one)": (
                 ["privacy.mechanism=dp_fedavg", "privacy.sampling=poisson"], independent),
             "DP-FTRL, one tree": (["privacy.mechanism=dp_ftrl", sep],
                                   lambda: variances(tree.TreeNoise(0))),
             "DP-FTRL, one tree, Honaker": (["privacy.mechanism=dp_ftrl", sep,
                                             "privacy.honaker=true"],
                                            lambda: variances(tree.TreeNoise(0, None, True))),
             f"DP-FTRL, restart every {separation}, Honaker": (
                 ["privacy.mechanism=dp_ftrl", sep, f"privacy.restart={separation}",
                  "privacy.honaker=true"],
                 lambda: variances(tree.TreeNoise(0, separation, True)))}
    for method in ("sqrt", "optimized"):
        for bands in (1, 5, separation):
            lines[f"banded MF, {bands} bands, {method}"] = (
                ["privacy.mechanism=banded_mf", sep, f"privacy.bands={bands}",
                 f"privacy.band_coefficients={method}"],
                lambda b=bands, m=method: variances(banded.BandedNoise(
                    0, banded.coefficients(b, m, rounds))))
    out = [("| mechanism | ε = 8: z | std after | RMS over rounds | ε = 2: z | std after | "
           "RMS over rounds |"), "|---|---|---|---|---|---|---|"]
    for name, (overrides, variance) in lines.items():
        cfg = config_mod.load(CONFIG, base + overrides)
        last, mean = variance()
        cells = []
        for eps in EPSILONS:
            z = privacy.calibrate(cfg, eps)
            cells += [f"{z:.3f}", f"{z * np.sqrt(last):.2f}", f"{z * np.sqrt(mean):.2f}"]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "table", "noise"])
    args = parser.parse_args()
    if args.command != "run":
        print(table() if args.command == "table" else noise_table())
        return
    for key, overrides in rows():
        if key in done():
            continue
        record = run_one(key, overrides)
        with open(RESULTS, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
