"""Drift diagnostics (seed 000): a run's client and period drift, and the four-regime experiment.

Per round the run logs ``client_drift`` = mean_k ‖Δ_k − Δ̄‖² (spread of the client updates
around their mean), ``period_drift`` = ‖Δ̄_t − Δ̄_{t−1}‖² (change of the aggregated update),
``update_norm`` = ‖Δ̄‖ and the sampled set's label distance to the population (total variation,
``label_tv``). The regime experiment runs FedAvg's config under ``data.regime`` = iid,
period_only, client_only and both with the same seed, hence the same sampling sequence, and
compares accuracy over rounds (the paper's Fig. 3b).
"""

from __future__ import annotations

import datetime as _dt
import os

import numpy as np

from rayfl import config as config_mod
from rayfl.simulation import run

DRIFT_COLUMNS = ("update_norm", "client_drift", "period_drift")
REGIMES = ("iid", "period_only", "client_only", "both")


def drift_rows(metrics: list[dict], label_key: str = "label_tv") -> list[dict]:
    """Per round: the drift columns present in the run's metrics (and test accuracy)."""
    keys = [k for k in (*DRIFT_COLUMNS, label_key, "test_accuracy")
            if any(r.get(k) is not None for r in metrics)]
    return [{"round": r["round"], **{k: r.get(k) for k in keys}} for r in metrics]


def drift_summary(rows: list[dict]) -> dict:
    """Mean of every drift column over the rounds that have it, and period/client drift."""
    keys = [k for k in rows[0] if k not in ("round", "test_accuracy")] if rows else []
    means = {k: float(np.mean([r[k] for r in rows if r[k] is not None])) for k in keys}
    if means.get("client_drift") and "period_drift" in means:
        means["period_over_client_drift"] = means["period_drift"] / means["client_drift"]
    return means


def regime_configs(source, overrides: list[str] | None, regimes) -> dict:
    """One validated config per regime (same seed, so the same sampling sequence)."""
    base = config_mod.load(source, overrides)
    return {r: config_mod.load(base, [f"data.regime={r}", f"name={base.name}-{r}"])
            for r in regimes}


def run_regimes(configs: dict, out_dir: str | None = None,
                quiet: bool = False) -> tuple[str, dict]:
    """Run every regime's config (from :func:`regime_configs`) into ``out_dir/<regime>``;
    returns (out_dir, {regime: metrics rows})."""
    first = next(iter(configs.values()))
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or os.path.join(first.output_dir, f"drift-{first.name}-{stamp}")
    os.makedirs(out_dir, exist_ok=True)
    curves = {}
    for regime, cfg in configs.items():
        if not quiet:
            print(f"== data.regime={regime}", flush=True)
        curves[regime] = run(cfg, run_dir=os.path.join(out_dir, regime),
                             quiet=quiet).metrics.to_pylist()
    return out_dir, curves


def regime_table(curves: dict, last_k: int, label_key: str = "label_tv") -> list[dict]:
    """Per regime: final accuracy, mean of the last k evaluations, mean drift measures."""
    out = []
    for regime, rows in curves.items():
        accs = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
        out.append({"regime": regime, "final_accuracy": accs[-1] if accs else None,
                    f"mean_last_{last_k}_evals_accuracy": float(np.mean(accs[-last_k:]))
                    if accs else None, **drift_summary(drift_rows(rows, label_key))})
    return out
