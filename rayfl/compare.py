"""``rayfl compare``: the same data, partition, sampling sequence and seed under several algorithms.

Each entry of ``--algorithms`` is an algorithm name, optionally with ``+ima`` (IMA with the
config's ``ima`` settings, or its defaults). Every run keeps the base config but its
``algorithm`` section, which becomes ``{name: ...}`` with that algorithm's paper defaults; an
algorithm class may adjust its own run with a ``compare_variant(raw) -> raw`` classmethod (FedMIM
runs plain SGD at the same effective step size, its inertial step replacing local momentum).
``aggregation.weighting`` stays the base's; at ``auto`` (the default) every algorithm gets its
paper's weighting (degree for fedmsi), and a base ``degree`` becomes ``auto`` for the algorithms
that do not define it.
Writes ``comparison.md`` / ``comparison.parquet`` (final and last-k accuracy, rounds to target,
wall time) and ``accuracy.png`` into the comparison directory.
"""

from __future__ import annotations

import datetime as _dt
import os

from rayfl import config as config_mod
from rayfl import registry
from rayfl.metrics.log import write_json, write_parquet
from rayfl.metrics.plots import plot_accuracy
from rayfl.schema import ConfigError


def variant(base: dict, entry: str) -> dict:
    """The base config (plain dict) with its algorithm replaced by ``entry``."""
    name, _, extra = entry.partition("+")
    if extra not in ("", "ima"):
        raise ConfigError("--algorithms", entry, "NAME or NAME+ima")
    raw = dict(base)
    raw["algorithm"] = {"name": name}
    weighting = base.get("aggregation", {}).get("weighting", "auto")
    defined = getattr(registry.resolve("algorithm", name), "extra_weightings", ())
    if weighting not in ("auto", "samples", "uniform") + tuple(defined):
        raw["aggregation"] = {**base["aggregation"], "weighting": "auto"}
    adjust = getattr(registry.resolve("algorithm", name), "compare_variant", None)
    if adjust is not None:
        raw = adjust(raw)
    if extra == "ima":
        raw["ima"] = base.get("ima") or {}
    else:
        raw.pop("ima", None)
    raw["name"] = f"{base.get('name', 'run')}-{entry}"
    return raw


def compare(source, entries: list[str], overrides: list[str] | None = None,
            out_dir: str | None = None, quiet: bool = False) -> tuple[str, list[dict]]:
    """Run every entry; returns (comparison directory, table rows)."""
    from rayfl.simulation import run

    base = config_mod.to_dict(config_mod.load(source, overrides))
    configs = {e: config_mod.from_dict(variant(base, e)) for e in entries}  # validate all first
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or os.path.join(base["output_dir"], f"compare-{base['name']}-{stamp}")
    os.makedirs(out_dir, exist_ok=True)
    rows, curves = [], {}
    for entry, cfg in configs.items():
        if not quiet:
            print(f"== {entry}", flush=True)
        result = run(cfg, run_dir=os.path.join(out_dir, entry), quiet=quiet)
        s = result.summary
        last_k = next(v for k, v in s.items() if k.startswith("mean_last_"))
        rows.append({"algorithm": entry, "final_accuracy": s["final_accuracy"],
                     "mean_last_k_accuracy": last_k, "rounds_to_target": s["rounds_to_target"],
                     "wall_time_s": s["wall_time_s"], "model_sha256": s["model_sha256"]})
        curves[entry] = result.metrics.to_pylist()
    write_parquet(rows, os.path.join(out_dir, "comparison.parquet"))
    write_json({"entries": entries, "rows": rows}, os.path.join(out_dir, "comparison.json"))
    with open(os.path.join(out_dir, "comparison.md"), "w") as f:
        f.write(markdown_table(rows, base))
    plot_accuracy(curves, os.path.join(out_dir, "accuracy.png"),
                  title=f"{base['data']['dataset']}: test accuracy")
    return out_dir, rows


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.2f}"


def markdown_table(rows: list[dict], base: dict) -> str:
    """The comparison as a Markdown table."""
    k = base["eval"]["last_k"]
    target = base["eval"]["target_accuracy"]
    head = (f"| algorithm | final acc (%) | mean last-{k} acc (%) | rounds to "
            f"{_pct(target) + '%' if target else 'target'} | wall (s) |\n|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['algorithm']} | {_pct(r['final_accuracy'])} | {_pct(r['mean_last_k_accuracy'])} "
        f"| {r['rounds_to_target'] or '—'} | {r['wall_time_s']:.0f} |\n" for r in rows)
    return head + body
