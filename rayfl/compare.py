"""``rayfl compare``: the same data, partition, sampling sequence and seed under several algorithms.

Each entry of ``--algorithms`` is an algorithm name, optionally followed by server wrappers,
``NAME+W1+W2`` (``fedavg+ima``: the wrappers innermost first, each with the base config's
settings for it in ``wrappers``, or its defaults; an entry without wrappers runs none). Every
run keeps the base config but its ``algorithm`` section, which becomes ``{name: ...}`` with
that algorithm's paper defaults; an
algorithm whose traits name ``compare_plain`` settings runs them at plain SGD's values at the
same effective step size lr / (1 − momentum) (FedMIM: its inertial step replaces local
momentum).
``aggregation.weighting`` stays the base's; at ``auto`` (the default) every algorithm gets its
paper's weighting (degree for fedmsi), and a base ``degree`` becomes ``auto`` for the algorithms
that do not define it.
With ``seeds`` (``--seeds 0,1,2``) every entry runs once per seed (``<entry>/seed-<s>/``) and
the table reports mean ± std over seeds. Writes ``comparison.md`` / ``comparison.parquet`` (per
entry: final accuracy, mean of the last ``eval.last_k`` evaluations, rounds to target, wall
time), ``comparison-runs.parquet`` (per run) and ``accuracy.png`` (one line per entry; with
several seeds the mean and a ±1 std band) into the comparison directory.
"""

from __future__ import annotations

import datetime as _dt
import os
import time

import numpy as np

from rayfl import config as config_mod
from rayfl import registry
from rayfl.config import Config
from rayfl.creatable import check_creatable
from rayfl.metrics.files import write_json, write_parquet
from rayfl.metrics.plots import plot_accuracy, plot_accuracy_bands
from rayfl.metrics.progress import Eta, hms
from rayfl.schema import ConfigError
from rayfl.simulation import preflight, run


def variant(base: dict, entry: str) -> dict:
    """The base config (plain dict) with its algorithm replaced by ``entry``."""
    name, *wrappers = entry.split("+")
    for w in wrappers:
        if w not in registry.names("wrapper"):
            raise ConfigError("--algorithms", entry, "NAME or NAME+WRAPPER with a wrapper of "
                                                     + ", ".join(registry.names("wrapper")))
    raw = dict(base)
    raw["algorithm"] = {"name": name}
    weighting = base.get("aggregation", {}).get("weighting", "auto")
    traits = registry.resolve("algorithm", name).traits
    if weighting not in ("auto", "samples", "uniform") + tuple(traits.weightings):
        raw["aggregation"] = {**base["aggregation"], "weighting": "auto"}
    raw = plain_sgd(raw, traits.compare_plain)
    raw.update(_with_wrappers(base, wrappers))
    raw["name"] = f"{base.get('name', 'run')}-{entry}"
    return raw


def _with_wrappers(base: dict, wrappers: list[str]) -> dict:
    """The base config's layer list with ``wrappers`` as its only server wrappers, innermost
    (each keeping the keys the base gives it), in the spelling the base uses."""
    key = "layers" if base.get("layers") else "wrappers"
    given = [{"name": e} if isinstance(e, str) else e for e in base.get(key) or []]
    configured = {e.get("name"): e for e in given}
    if key == "wrappers":
        return {key: [configured.get(w, {"name": w}) for w in wrappers]}
    others = [e for i, e in enumerate(given)
              if registry.resolve_layer(e.get("name"), f"layers[{i}].name")[0] != "wrapper"]
    return {"layers": [configured.get(w, {"name": w}) for w in wrappers] + others}


#: plain SGD's value of each local optimiser setting
PLAIN = {"momentum": 0.0, "weight_decay": 0.0, "clip_norm": None, "optimizer": "sgd"}


def plain_sgd(raw: dict, keys: tuple[str, ...]) -> dict:
    """``raw`` with the ``local`` settings ``keys`` at plain SGD's values and the learning rate
    at the same effective step size lr / (1 − momentum)."""
    if not keys:
        return raw
    local = raw["local"]
    rho = local.get("momentum", 0.0) or 0.0
    return {**raw, "local": {**local, **{k: PLAIN[k] for k in keys},
                             "lr": local["lr"] / (1 - rho)}}


def plan(source, entries: list[str], overrides: list[str] | None = None,
         seeds: list[int] | None = None) -> tuple[dict, dict[tuple[str, int], Config]]:
    """(base config dict, {(entry, seed): config}) — every variant validated before any runs."""
    base = config_mod.to_dict(config_mod.load(source, overrides))
    seeds = seeds or [base["seed"]]
    if len(set(seeds)) != len(seeds):
        raise ConfigError("--seeds", ",".join(map(str, seeds)), "distinct seeds")
    if len(set(entries)) != len(entries) or not entries:
        raise ConfigError("--algorithms", ",".join(entries), "distinct, non-empty entries")
    return base, {(e, seed): config_mod.from_dict({**variant(base, e), "seed": seed})
                  for e in entries for seed in seeds}


def compare(source, entries: list[str], overrides: list[str] | None = None,
            out_dir: str | None = None, quiet: bool = False,
            seeds: list[int] | None = None) -> tuple[str, list[dict]]:
    """Run every entry on every seed; returns (comparison directory, one table row per entry,
    with the mean and the std over seeds). Every variant's data, model and components are
    checked before the comparison directory is made: a refused one leaves nothing behind."""
    base, configs = plan(source, entries, overrides, seeds)
    seeds = sorted({seed for _, seed in configs}, key=[s for _, s in configs].index)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    check_creatable(out_dir or base["output_dir"], "--out" if out_dir else "output_dir")
    out_dir = out_dir or os.path.join(base["output_dir"], f"compare-{base['name']}-{stamp}")
    for cfg in configs.values():
        preflight(cfg)
    os.makedirs(out_dir, exist_ok=True)
    runs, curves, eta = [], {}, Eta()
    for i, ((entry, seed), cfg) in enumerate(configs.items()):
        if not quiet:
            left = eta.left(len(configs) - i)
            print(f"== [{i + 1}/{len(configs)}] {entry} seed {seed}"
                  + ("" if left is None else f" | comparison ETA {hms(left)}"), flush=True)
        sub = entry if len(seeds) == 1 else os.path.join(entry, f"seed-{seed}")
        tick = time.perf_counter()
        result = run(cfg, run_dir=os.path.join(out_dir, sub), quiet=quiet)
        eta.add(time.perf_counter() - tick)
        s = result.summary
        runs.append({"algorithm": entry, "seed": seed, "final_accuracy": s["final_accuracy"],
                     "mean_last_k_evals_accuracy": _last_k(s),
                     "rounds_to_target": s["rounds_to_target"], "wall_time_s": s["wall_time_s"],
                     "model_sha256": s["model_sha256"], "run_dir": result.run_dir})
        curves.setdefault(entry, []).append(result.metrics.to_pylist())
    rows = [aggregate(entry, [r for r in runs if r["algorithm"] == entry]) for entry in entries]
    write_parquet(rows, os.path.join(out_dir, "comparison.parquet"))
    write_parquet(runs, os.path.join(out_dir, "comparison-runs.parquet"))
    write_json({"entries": entries, "seeds": seeds, "rows": rows, "runs": runs},
               os.path.join(out_dir, "comparison.json"))
    with open(os.path.join(out_dir, "comparison.md"), "w") as f:
        f.write(markdown_table(rows, base))
    title = f"{base['name']}: test accuracy on {base['data']['dataset']}"
    path = os.path.join(out_dir, "accuracy.png")
    if len(seeds) > 1:
        plot_accuracy_bands(curves, path, title=f"{title}, seeds {','.join(map(str, seeds))}")
    else:
        plot_accuracy({e: c[0] for e, c in curves.items()}, path, title=title)
    return out_dir, rows


def _last_k(summary: dict):
    return next(v for k, v in summary.items() if k.startswith("mean_last_"))


def _mean_std(values: list) -> tuple[float | None, float | None]:
    got = [v for v in values if v is not None]
    if not got:
        return None, None
    return float(np.mean(got)), float(np.std(got))


def aggregate(entry: str, runs: list[dict]) -> dict:
    """One entry's row: mean and (population) std over its seeds of each headline number;
    ``rounds_to_target`` averages the seeds that reached it (``reached`` counts them)."""
    row = {"algorithm": entry, "seeds": len(runs)}
    for key in ("final_accuracy", "mean_last_k_evals_accuracy", "rounds_to_target",
                "wall_time_s"):
        row[key], row[f"{key}_std"] = _mean_std([r[key] for r in runs])
    row["reached"] = sum(r["rounds_to_target"] is not None for r in runs)
    if len(runs) == 1:
        row["model_sha256"] = runs[0]["model_sha256"]
    return row


def _pct(v, std=None) -> str:
    if v is None:
        return "—"
    return f"{100 * v:.2f}" + ("" if std is None else f" ± {100 * std:.2f}")


def markdown_table(rows: list[dict], base: dict) -> str:
    """The comparison as a Markdown table (mean ± std over seeds when there are several)."""
    k = base["eval"]["last_k"]
    target = base["eval"]["target_accuracy"]
    many = any(r["seeds"] > 1 for r in rows)

    def sd(r, key):
        return r[f"{key}_std"] if many else None

    def rounds(r):
        if r["rounds_to_target"] is None:
            return "—"
        if not many:
            return f"{r['rounds_to_target']:.0f}"
        return (f"{r['rounds_to_target']:.1f} ± {r['rounds_to_target_std']:.1f} "
                f"({r['reached']}/{r['seeds']})")

    seeds = f" — mean ± std over {rows[0]['seeds']} seeds" if many else ""
    head = (f"| algorithm | final acc (%) | mean of last {k} evals (%) | rounds to "
            f"{_pct(target) + '%' if target else 'target'} | wall (s) |{seeds}\n"
            f"|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['algorithm']} | {_pct(r['final_accuracy'], sd(r, 'final_accuracy'))} "
        f"| {_pct(r['mean_last_k_evals_accuracy'], sd(r, 'mean_last_k_evals_accuracy'))} "
        f"| {rounds(r)} | {r['wall_time_s']:.0f} |\n" for r in rows)
    return head + body
