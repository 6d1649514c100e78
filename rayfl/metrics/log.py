"""The run directory's metrics: ``metrics.parquet`` (a row per round) and ``summary.json``.

Rounds are numbered from 1 wherever a user sees them (``metrics.parquet``'s ``round``, the
terminal, plots, ``keep.rounds``, ``models/round-NNNNN``); the server's loop index t is 0-based
and :meth:`MetricsLog.append` is where one becomes the other (round = t + 1).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import ray

from rayfl.availability.empty import is_empty
from rayfl.availability.plots import plot_online
from rayfl.metrics import provenance
from rayfl.metrics.client_eval import plot_run_clients
from rayfl.metrics.files import _plain, write_json, write_parquet
from rayfl.metrics.live import LiveMetrics
from rayfl.metrics.loggers import open_loggers
from rayfl.metrics.plots import plot_accuracy
from rayfl.models import sha256_of


@dataclass(frozen=True)
class RunRecord:
    """What a run's log states of its config: the summary's facts and the loggers' (built on
    the driver, :func:`rayfl.assemble.run_record`)."""

    name: str
    dataset: str
    algorithm: str  # the label: the algorithm with its wrappers
    rounds: int
    target_accuracy: float | None  # eval.target_accuracy
    last_k: int  # eval.last_k
    privacy: dict | None  # {"delta": δ, "privacy": the statement} (None: no privacy)
    loggers: Any  # the ``loggers`` section
    params: dict[str, str]  # the resolved config as dotted keys (MLflow's params)


class MetricsLog:
    """Rows in memory, rewritten atomically to Parquet after every round."""

    def __init__(self, run_dir: str, record: RunRecord):
        self.run_dir, self.record = run_dir, record
        self.path = os.path.join(run_dir, "metrics.parquet")
        self.rows: list[dict] = []
        self.live = LiveMetrics(record.name) if ray.is_initialized() else None  # Ray's gauges
        self.loggers = open_loggers(run_dir, record)

    def truncate(self, last_t: int) -> None:
        """Keep the rows up to loop index ``last_t`` (0-based; resume after a crash)."""
        if os.path.isfile(self.path):
            rows = pq.read_table(self.path).to_pylist()
            self.rows = [{k: v for k, v in r.items() if v is not None} for r in rows
                         if r["round"] <= last_t + 1]

    def append(self, row: dict) -> None:
        """Add the metrics of loop index ``row["round"]`` (0-based; stored 1-based), publish
        them as Ray metrics and hand them to the configured loggers."""
        row = {k: _plain(v) for k, v in row.items()}
        row["round"] = row["round"] + 1
        self.rows.append(row)
        if self.live is not None:
            self.live.publish(row)
        for logger in self.loggers:
            logger.log(row)

    def flush(self, rows: list[dict] | None = None) -> None:
        """Rewrite ``metrics.parquet`` (atomically) with the rows, or with ``rows`` (the rows
        as a round's commit took them)."""
        write_parquet(self.rows if rows is None else rows, self.path)

    def interrupt(self, status: str) -> None:
        """Tell the loggers the run stopped before its end: ``KILLED`` (paused, interrupted;
        ``rayfl resume`` continues) or ``FAILED`` (an error). A logger that cannot be told
        (its tracking server gone, say) does not hide why the run stopped."""
        for logger in self.loggers:
            try:
                logger.interrupt(status)
            except Exception as e:  # noqa: BLE001 - the run's own error is the one to raise
                print(f"rayfl: warning: {type(logger).__name__} could not mark the run {status} "
                      f"({type(e).__name__}: {e})", file=sys.stderr)

    def finish(self, final_model: np.ndarray, final_round: int,
               diverged_at: int | None = None, buffers: np.ndarray | None = None,
               stopped: tuple[int, str] | None = None, extra: dict | None = None) -> dict:
        """Write the final model (``final_model.npy``, and its buffers ``final_buffers.npy``
        when it has any), the summary (with ``extra``'s entries) and the accuracy plot; return
        the summary. ``final_round``: the rounds the run was to make (fewer than ``rounds``
        when ``privacy.target_epsilon`` binds).

        A diverged run's summary says so (``diverged``, ``diverged_at_round``, and the reason
        the last row gives); so does one ``stopped`` (loop index, reason) early because no
        client completed its rounds (``stopped``, ``stopped_at_round``)."""
        self.flush()  # the last row's checkpoint time
        np.save(os.path.join(self.run_dir, "final_model.npy"), final_model)
        if buffers is not None:
            np.save(os.path.join(self.run_dir, "final_buffers.npy"), buffers)
            final_model = np.concatenate([final_model, buffers])  # the hash covers both
        summary = summarize(self.rows, self.record, final_model, final_round)
        summary["diverged"] = diverged_at is not None
        if diverged_at is not None:
            summary["diverged_at_round"] = diverged_at + 1
            summary["diverged_reason"] = self.rows[-1].get("diverged_reason") if self.rows \
                else None
        if stopped is not None:
            summary["stopped_at_round"], summary["stopped"] = stopped[0] + 1, stopped[1]
        summary.update(extra or {})
        summary["provenance"] = provenance.load(self.run_dir)
        write_json(summary, os.path.join(self.run_dir, "summary.json"))
        plot_accuracy({summary["algorithm"]: self.rows},
                      os.path.join(self.run_dir, "accuracy.png"),
                      title=f"{os.path.basename(self.run_dir)}: {summary['algorithm']} on "
                            f"{self.record.dataset}, test accuracy")
        plot_online(self.rows, os.path.join(self.run_dir, "availability.png"))
        plot_run_clients(self.run_dir, self.rows, f"{os.path.basename(self.run_dir)}: "
                                                  f"{summary['algorithm']}, per-client accuracy")
        for logger in self.loggers:
            logger.close("FAILED" if diverged_at is not None or stopped else "FINISHED")
        return summary


def summarize(rows: list[dict], record: RunRecord, final_model: np.ndarray,
              final_round: int) -> dict:
    """Final accuracy, the mean over the last ``eval.last_k`` *evaluations*
    (``mean_last_K_evals_accuracy``), the first round (1-based) reaching the target, wall time
    and the model hash (of ``final_model``: the parameters, then the buffers if any); with
    privacy, ε and whether the run ended at the ``final_round`` that ``privacy.target_epsilon``
    set before ``rounds`` (not when it diverged or starved before)."""
    evals = [(r["round"], r["test_accuracy"]) for r in rows
             if r.get("test_accuracy") is not None]
    accs = [a for _, a in evals]
    target, last_k = record.target_accuracy, record.last_k
    reached = next((t for t, a in evals if target is not None and a >= target), None)
    dp = {} if record.privacy is None else {
        "epsilon": rows[-1].get("dp_epsilon", 0.0) if rows else 0.0,
        "delta": record.privacy["delta"],
        "stopped_at_target_epsilon": final_round < record.rounds and len(rows) >= final_round,
        "privacy": record.privacy["privacy"]}
    return {
        **dp,
        "name": record.name,
        "algorithm": record.algorithm,
        "rounds": len(rows),
        "final_accuracy": accs[-1] if accs else None,
        f"mean_last_{last_k}_evals_accuracy": float(np.mean(accs[-last_k:]))
        if accs else None,
        "evaluations": len(accs),
        "empty_rounds": sum(map(is_empty, rows)),
        "final_test_loss": next((r["test_loss"] for r in reversed(rows) if "test_loss" in r),
                                None),
        "target_accuracy": target,
        "rounds_to_target": reached,
        "wall_time_s": rows[-1]["elapsed_s"] if rows else 0.0,
        "mean_round_s": float(np.mean([r["round_s"] for r in rows])) if rows else 0.0,
        "virtual_time_s": rows[-1].get("virtual_time_s", 0.0) if rows else 0.0,
        "virtual_hours_to_target": None if reached is None else
        next(r.get("virtual_time_s", 0.0) for r in rows if r["round"] == reached) / 3600,
        "model_sha256": sha256_of(final_model),
    }
